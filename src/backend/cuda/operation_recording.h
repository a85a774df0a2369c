// Backend::run_and_record and replay on CUDA: the operations a caller queues are captured from
// the context's stream into a CUDA graph, which one launch then queues again. A base-model
// decoding step is some 75 launches of a few microseconds each at batch 64, so the host's
// launching, not the GPU, set its pace; a graph's launch costs about one of them.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"

namespace tfm {
namespace cuda {

// Whether this process records: not where TFM_CUDA_GRAPHS=0 (every step launched operation by
// operation, to compare), nor while TFM_CUDA_PROFILE times each operation.
bool records_operations();

// Runs `operations` captured into a graph and launches it; or, where capturing fails (an
// operation that cannot be captured, an allocation: RecordingRefused), runs them as they come
// and returns null. The first failure other than a refused allocation is one "warning: CUDA
// graphs: ..." line on stderr.
std::shared_ptr<const RecordedOperations> run_and_record(const Context& c,
                                                         const std::function<void()>& operations);

// Launches a graph from run_and_record: false where memory changed since (Context::memory_changes).
bool replay(const Context& c, const RecordedOperations& recording);

}  // namespace cuda
}  // namespace tfm
