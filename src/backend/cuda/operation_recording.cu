// CUDA graphs for Backend::run_and_record / replay (operation_recording.h).
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cuda/operation_profile.h"
#include "backend/cuda/operation_recording.h"

namespace tfm {
namespace cuda {

namespace {

// An instantiated graph and the Context::memory_changes it was captured under.
class CudaGraph final : public RecordedOperations {
 public:
  CudaGraph(const Context& context, cudaGraphExec_t exec, uint64_t memory_changes)
      : context_(context), exec_(exec), memory_changes_(memory_changes) {}
  ~CudaGraph() override {
    // Never throws (destructors); the stream is drained first, so no launch of the graph is
    // still queued when it goes.
    if (cudaSetDevice(context_.device) != cudaSuccess) return;
    cudaStreamSynchronize(context_.stream);
    cudaGraphExecDestroy(exec_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  const Context& context() const { return context_; }
  cudaGraphExec_t exec() const { return exec_; }
  uint64_t memory_changes() const { return memory_changes_; }

 private:
  const Context& context_;
  cudaGraphExec_t exec_;
  uint64_t memory_changes_;
};

// The first capture that fails for a reason of its own, on stderr: the steps then run launched
// one by one, slower but the same, and only this line says why.
void warn_once(const std::string& failure) {
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr,
                 "warning: CUDA graphs: %s; decoding steps are launched one operation at a time "
                 "(TFM_CUDA_GRAPHS=0 turns the recording off)\n",
                 failure.c_str());
  });
}

}  // namespace

bool records_operations() {
  static const bool enabled = !turned_off("TFM_CUDA_GRAPHS");
  return enabled && !profiling();
}

std::shared_ptr<const RecordedOperations> run_and_record(const Context& c,
                                                         const std::function<void()>& operations) {
  c.activate();
  std::unique_lock<std::mutex> recording(c.recording_mutex);
  const uint64_t memory_changes = c.memory_changes.load(std::memory_order_acquire);
  cudaGraph_t graph = nullptr;
  bool captured = false;
  std::string failure;  // why capturing failed, where it was not an allocation it refused
  const cudaError_t began = cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal);
  if (began != cudaSuccess) {
    failure = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(began);
  } else {
    c.recording_thread.store(std::this_thread::get_id(), std::memory_order_release);
    bool completed = false;
    try {
      operations();
      completed = true;
    } catch (const RecordingRefused&) {  // the operations run uncaptured below
    } catch (const std::exception& e) {  // a call capturing does not allow, most likely
      failure = e.what();
    } catch (...) {
      failure = "an exception";
    }
    c.recording_thread.store(std::thread::id(), std::memory_order_release);
    const cudaError_t ended = cudaStreamEndCapture(c.stream, &graph);
    if (completed && ended != cudaSuccess)
      failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
    captured =
        completed && ended == cudaSuccess && graph != nullptr && c.frees_after_recording.empty();
  }
  for (void* memory : c.frees_after_recording) {
    c.memory_changes.fetch_add(1, std::memory_order_acq_rel);
    cudaFreeAsync(memory, c.stream);
  }
  c.frees_after_recording.clear();
  cudaGraphExec_t exec = nullptr;
  if (captured) {
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    if (instantiated != cudaSuccess) {
      exec = nullptr;
      failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(instantiated);
    }
  }
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture's error is not the next operation's
  recording.unlock();
  if (!exec) {
    if (!failure.empty()) warn_once(failure);
    operations();  // what failed for a reason of its own fails again here, and says so
    return nullptr;
  }
  auto recorded = std::make_shared<const CudaGraph>(c, exec, memory_changes);
  TFM_CUDA(cudaGraphLaunch(exec, c.stream));
  return recorded;
}

bool replay(const Context& c, const RecordedOperations& recording) {
  const auto* graph = dynamic_cast<const CudaGraph*>(&recording);
  if (!graph || &graph->context() != &c) return false;
  TFM_CUDA_OPERATION(c, "replay (CUDA graph)");
  if (graph->memory_changes() != c.memory_changes.load(std::memory_order_acquire)) return false;
  TFM_CUDA(cudaGraphLaunch(graph->exec(), c.stream));
  return true;
}

}  // namespace cuda
}  // namespace tfm
