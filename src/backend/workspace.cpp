// One planned block for a pass's buffers (backend/workspace.h).
#include "backend/workspace.h"

#include <algorithm>
#include <stdexcept>

#include "tensor/memory_budget.h"

namespace tfm {

namespace {

constexpr int64_t kPartAlignment = 64;  // a cache line, and more than any vector load needs
// Parts one after another would start at the same offset within a 4 KiB page whenever the sizes
// before them are multiples of 4 KiB (most activations are), and an operation reading one part
// while writing another then stalls on the CPU's 4K aliasing of loads behind stores. Five cache
// lines between parts give the next dozen parts distinct offsets (train step, base: 3.39 s
// without, 3.28 s with, 3.25 s for individually allocated buffers; by hand, 3 rounds each).
constexpr int64_t kStagger = 64 * 5;

int64_t aligned(int64_t bytes) {
  return (bytes + kPartAlignment - 1) / kPartAlignment * kPartAlignment;
}

}  // namespace

int64_t WorkspacePlan::needed_bytes() const {
  int64_t total = 0;
  for (const Part& part : parts_) total += part.bytes;
  return total;
}

std::vector<int64_t> WorkspacePlan::slot_bytes() const {
  std::vector<int64_t> largest;
  for (const Part& part : parts_) {
    if (part.slot < 0) continue;
    if (size_t(part.slot) >= largest.size()) largest.resize(size_t(part.slot) + 1, -1);
    largest[size_t(part.slot)] = std::max(largest[size_t(part.slot)], part.bytes);
  }
  return largest;  // -1: a slot no buffer named
}

int64_t WorkspacePlan::held_bytes() const {
  int64_t total = 0;
  for (const Part& part : parts_)
    if (part.slot < 0) total += part.bytes;
  for (int64_t bytes : slot_bytes()) total += std::max<int64_t>(bytes, 0);
  return total;
}

WorkspacePlan::Layout WorkspacePlan::layout() const {
  // Parts in the order first needed; a shared slot's where its first buffer was, the size of
  // its largest.
  const std::vector<int64_t> largest = slot_bytes();
  std::vector<int64_t> slot_offset(largest.size(), -1);
  Layout layout;
  layout.offsets.reserve(parts_.size());
  for (const Part& part : parts_) {
    if (part.slot < 0) {
      layout.offsets.push_back(layout.bytes);
      layout.bytes += aligned(part.bytes) + kStagger;
      continue;
    }
    int64_t& slot_at = slot_offset[size_t(part.slot)];
    if (slot_at < 0) {
      slot_at = layout.bytes;
      layout.bytes += aligned(largest[size_t(part.slot)]) + kStagger;
    }
    layout.offsets.push_back(slot_at);
  }
  return layout;
}

int64_t WorkspacePlan::block_bytes() const {
  return layout().bytes;
}

void WorkspacePlan::different_slots() {
  throw std::logic_error("a workspace buffer was planned in two shared slots (or in one and none)");
}

Workspace::~Workspace() {
  free_block();
}

void Workspace::free_block() {
  if (block_) backend_->deallocate(block_);
  backend_ = nullptr;
  block_ = nullptr;
  bytes_ = 0;
}

void Workspace::allocate(const Backend& backend, const WorkspacePlan& plan) {
  // What the buffers hold is freed before the new block exists, so the process never holds
  // both; then the memory the process has freed goes back to the system
  // (release_freed_memory): what setup freed (host copies of the weights, a previous block)
  // sits in holes that one large block cannot reuse, and would otherwise stay resident beside
  // it (train step, base: 1,844 MiB peak without this, 1,838 with, as with unplanned buffers).
  for (const WorkspacePlan::Part& part : plan.parts_) part.reset(part.buffer);
  free_block();
  release_freed_memory();
  const WorkspacePlan::Layout layout = plan.layout();
  block_ = backend.allocate(layout.bytes, true);
  backend_ = &backend;
  bytes_ = layout.bytes;
  // Each buffer is lent its own need at its part (one that a pass grows past it grows outside
  // the block, as any other).
  for (size_t i = 0; i < plan.parts_.size(); ++i) {
    const WorkspacePlan::Part& part = plan.parts_[i];
    part.borrow(part.buffer, backend, static_cast<char*>(block_) + layout.offsets[i], part.bytes);
  }
}

}  // namespace tfm
