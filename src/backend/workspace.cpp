// One planned block for a pass's buffers (backend/workspace.h).
#include "backend/workspace.h"

namespace tfm {

namespace {

constexpr int64_t kPartAlignment = 64;  // a cache line, and more than any vector load needs

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
  for (const Part& part : parts_) total += aligned(part.bytes);
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
  // both.
  for (const WorkspacePlan::Part& part : plan.parts_) part.reset(part.buffer);
  free_block();
  const int64_t bytes = plan.block_bytes();
  block_ = backend.allocate(bytes, true);
  backend_ = &backend;
  bytes_ = bytes;
  int64_t offset = 0;
  for (const WorkspacePlan::Part& part : plan.parts_) {
    part.borrow(part.buffer, backend, static_cast<char*>(block_) + offset, part.bytes);
    offset += aligned(part.bytes);
  }
}

}  // namespace tfm
