// One planned block for a pass's buffers (backend/workspace.h).
#include "backend/workspace.h"

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

int64_t WorkspacePlan::block_bytes() const {
  int64_t total = 0;
  for (const Part& part : parts_) total += aligned(part.bytes) + kStagger;
  return total;
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
  const int64_t bytes = plan.block_bytes();
  block_ = backend.allocate(bytes, true);
  backend_ = &backend;
  bytes_ = bytes;
  int64_t offset = 0;
  for (const WorkspacePlan::Part& part : plan.parts_) {
    part.borrow(part.buffer, backend, static_cast<char*>(block_) + offset, part.bytes);
    offset += aligned(part.bytes) + kStagger;
  }
}

}  // namespace tfm
