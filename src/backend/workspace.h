// The activation memory of a pass as one allocation, planned from the batch shapes it will run
// (llm.c allocates its activations once from (B, T) the same way). Each layer lists the buffers
// of its forward and of its backward, and how many elements each needs for a batch shape, once
// (a *_buffers template over a sizer: Allocate below for the pass, WorkspacePlan for the plan); a
// WorkspacePlan keeps each buffer's largest need over every shape planned; Workspace::allocate
// gives every planned buffer its part of one block on the backend. The passes then find their
// buffers large enough and allocate nothing, the footprint is known (and checked) before the first
// step, and a device backend gets one allocation instead of hundreds. A buffer asked for more than
// its plan still grows on its own (correct, only outside the block); the tests prove the plans and
// the passes agree exactly.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/device_buffer.h"

namespace tfm {

// Buffers planned in one slot share one part of the block, the size of the slot's largest: each
// holds values that are dead by the time the next buffer of the slot is written (a forward
// pass's values read by the next operation alone, never by the backward). The caller names the
// slots and owns that claim; a pass over planned buffers, bit for bit the same as over buffers
// of their own (tests/backend_memory_test.cpp), is its check. A buffer keeps one slot, or
// none, in every pass planned.
struct SharedSlot {
  int index = 0;  // >= 0
};

class WorkspacePlan {
 public:
  // It points at the buffers of the structure that holds it, so it stays where it is made.
  WorkspacePlan() = default;
  WorkspacePlan(const WorkspacePlan&) = delete;
  WorkspacePlan& operator=(const WorkspacePlan&) = delete;

  // `buffer` needs at least `elements` elements (the plan keeps the largest need). The buffer
  // must stay where it is until Workspace::allocate has run.
  template <typename T>
  void need(DeviceBuffer<T>& buffer, int64_t elements) {
    add(buffer, elements, -1);
  }
  // The same, `buffer` sharing its memory with the other buffers of `slot` (SharedSlot).
  template <typename T>
  void need(DeviceBuffer<T>& buffer, int64_t elements, SharedSlot slot) {
    add(buffer, elements, slot.index);
  }

  // Σ of every buffer's need (what the passes ask for), and the block that holds them (each
  // part starts on a 64-byte boundary, a few cache lines after the previous part; a shared
  // slot's buffers are one part).
  int64_t needed_bytes() const;
  int64_t block_bytes() const;
  // What the block holds: the unshared buffers' needs and each shared slot's largest.
  int64_t held_bytes() const;
  int64_t buffers() const { return int64_t(parts_.size()); }

 private:
  friend class Workspace;
  struct Part {
    void* buffer;   // a DeviceBuffer<T>
    int64_t bytes;  // its largest need
    int slot;       // SharedSlot::index, or -1: a part of its own
    void (*reset)(void* buffer);
    void (*borrow)(void* buffer, const Backend& backend, void* memory, int64_t bytes);
  };
  template <typename T>
  void add(DeviceBuffer<T>& buffer, int64_t elements, int slot) {
    const int64_t bytes = elements * int64_t(sizeof(T));
    auto [it, added] = index_.try_emplace(&buffer, parts_.size());
    if (added) {
      parts_.push_back({&buffer, bytes, slot,
                        [](void* b) { static_cast<DeviceBuffer<T>*>(b)->reset(); },
                        [](void* b, const Backend& backend, void* memory, int64_t bytes) {
                          static_cast<DeviceBuffer<T>*>(b)->borrow(backend, static_cast<T*>(memory),
                                                                   bytes / int64_t(sizeof(T)));
                        }});
      return;
    }
    Part& part = parts_[it->second];
    if (part.slot != slot) different_slots();
    if (bytes > part.bytes) part.bytes = bytes;
  }
  [[noreturn]] static void different_slots();
  // Each shared slot's largest need, by index.
  std::vector<int64_t> slot_bytes() const;
  // Where each part starts in the block (by parts_' index; a shared slot's buffers at its one
  // part) and the block's size: what block_bytes reports and Workspace::allocate lays out.
  struct Layout {
    std::vector<int64_t> offsets;  // [parts_.size()]
    int64_t bytes = 0;
  };
  Layout layout() const;
  std::vector<Part> parts_;  // in the order first needed
  std::unordered_map<const void*, size_t> index_;
};

// The other sizer of a layer's buffer list: where WorkspacePlan::need records a need, this
// gives the buffer at least that size now (ensure_size). Each layer lists its buffers and their
// sizes once, in a template over the sizer (its *_buffers function); its plan walks the list
// with the WorkspacePlan and its pass walks it with an Allocate first, then reads the buffers.
// So a pass and its plan cannot disagree on a buffer or a size.
struct Allocate {
  const Backend& backend;
  template <typename T>
  void need(DeviceBuffer<T>& buffer, int64_t elements) const {
    ensure_size(backend, buffer, elements);
  }
  template <typename T>
  void need(DeviceBuffer<T>& buffer, int64_t elements, SharedSlot) const {
    ensure_size(backend, buffer, elements);
  }
};

// Owns the block the planned buffers borrow. Declare it before those buffers in the structure
// that holds them (so it is destroyed after them), and let no planned buffer move out of it.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();

  // Drops what every buffer of `plan` holds (contents are not kept: call it between passes),
  // frees the previous block (so `plan` must name every buffer that borrowed from it: keep one
  // plan and let it grow), and gives each buffer its part of one new zeroed block on
  // `backend`.
  void allocate(const Backend& backend, const WorkspacePlan& plan);
  int64_t bytes() const { return bytes_; }  // the block's size (0 before allocate)

 private:
  void free_block();
  const Backend* backend_ = nullptr;
  void* block_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace tfm
