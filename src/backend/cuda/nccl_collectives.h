// The CUDA backend's DeviceCollectives (backend/backend.h): a data-parallel job's gradient sums
// and parameter broadcasts on NCCL, GPU memory to GPU memory over NVLink or PCIe, instead of
// copies through host memory for MPI. NCCL is loaded with dlopen (libnccl.so.2: the runtime's
// search path, e.g. PyTorch's nvidia-nccl wheel on LD_LIBRARY_PATH) when a job first joins, so
// neither the build nor a single-GPU run needs it; where it is missing, or refuses the ranks
// (two on one GPU), the job sums through host memory as before, and says why.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"

namespace tfm {
namespace cuda {

// Backend::join_collectives for the GPU of `c`, on its stream.
std::unique_ptr<DeviceCollectives> join_nccl(const Context& c, int rank, int size,
                                             const CollectiveBootstrap& bootstrap,
                                             const CollectiveWait& wait, std::string* why_not);

}  // namespace cuda
}  // namespace tfm
