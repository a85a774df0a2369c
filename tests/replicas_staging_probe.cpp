// Run by MpiTrain.ReplicasOnAnotherBackendsMemoryGoThroughHostCopies under `mpirun -np 2`: the
// all-reduce and broadcast of Replicas on tensors held by a backend whose memory is not the
// host's, as a GPU's gradients are (GuardPageBackend: the CPU's kernels behind memory that says
// it is not the host's, so host code must go through copy_to_host / copy_from_host, which it
// counts; a copy of the wrong length faults on its guard page). Each rank prints "rank R: ok",
// or "rank R: error: ..." and ends the job (as the trainer does: the other rank would wait).
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/device_buffer.h"
#include "backend/device_tensors.h"
#include "guard_page_backend.h"
#include "train/replicas.h"

namespace {

using tfm::DeviceTensors;

// What rank `rank` puts at element i: small multiples of 1/4, so every sum is exact in float.
float rank_value(int rank, int64_t i) {
  return float((rank + 1) * (i % 97)) + 0.25f * float(rank);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void run(tfm::Replicas& replicas) {
  check(replicas.size() == 2, "expected 2 ranks, got " + std::to_string(replicas.size()));
  const tfm::GuardPageBackend device;
  check(!device.memory_is_host(), "the stand-in device claims host memory");
  // Sizes that end at no bucket or page boundary: [3, 5] and [70,001].
  const std::map<std::string, tfm::Shape> shapes = {{"a", {3, 5}}, {"b", {70001}}};

  // The gradients' all-reduce: one block.
  DeviceTensors gradients(device, shapes);
  const int64_t total = gradients.numel();
  std::vector<float> mine(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) mine[size_t(i)] = rank_value(replicas.rank(), i);
  device.copy_from_host(mine.data(), total * int64_t(sizeof(float)), gradients.flat());
  const int64_t copied_before_sum = device.bytes_copied_with_host();
  replicas.sum_tensors(gradients);
  // Down and up once each: MPI was handed a host copy, not the device's memory.
  check(device.bytes_copied_with_host() - copied_before_sum == 2 * total * int64_t(sizeof(float)),
        "sum_tensors did not copy the gradients to the host and back");
  std::vector<float> staged;
  const float* summed = tfm::host_readable(device, gradients.flat(), total, staged);
  for (int64_t i = 0; i < total; ++i) {
    const float expected = rank_value(0, i) + rank_value(1, i);
    if (summed[size_t(i)] != expected)
      throw std::runtime_error("sum_tensors: element " + std::to_string(i) + " is " +
                               std::to_string(summed[size_t(i)]) + ", expected " +
                               std::to_string(expected));
  }

  // The parameters' broadcast: one allocation per tensor, rank 0's values everywhere.
  DeviceTensors parameters(device, shapes, DeviceTensors::Layout::kPerTensor);
  for (auto& [name, entry] : parameters) {
    std::vector<float> values(static_cast<size_t>(entry.numel()));
    for (int64_t i = 0; i < entry.numel(); ++i)
      values[size_t(i)] = rank_value(replicas.rank(), i + int64_t(name.size()));
    device.copy_from_host(values.data(), entry.numel() * int64_t(sizeof(float)), entry.ptr());
  }
  const int64_t copied_before_broadcast = device.bytes_copied_with_host();
  replicas.broadcast_tensors(parameters);
  // Rank 0 copies each tensor down (and up again); the others copy rank 0's values up.
  check(device.bytes_copied_with_host() - copied_before_broadcast ==
            (replicas.primary() ? 2 : 1) * total * int64_t(sizeof(float)),
        "broadcast_tensors did not go through host copies");
  for (auto& [name, entry] : parameters) {
    const float* values = tfm::host_readable(device, entry.ptr(), entry.numel(), staged);
    for (int64_t i = 0; i < entry.numel(); ++i)
      check(values[size_t(i)] == rank_value(0, i + int64_t(name.size())),
            "broadcast_tensors: " + name + "[" + std::to_string(i) + "] is not rank 0's");
  }
  check(replicas.all_equal(tfm::checksum_tensors(parameters)),
        "the ranks' checksums differ after the broadcast");
}

}  // namespace

int main() {
  tfm::Replicas& replicas = tfm::Replicas::world();
  replicas.set_timeout(60);
  try {
    run(replicas);
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", replicas.rank(), e.what());
    tfm::abort_replicas(1);
    return 1;
  }
  std::printf("rank %d: ok\n", replicas.rank());
  return 0;
}
