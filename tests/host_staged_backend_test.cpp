// HostStagedBackend's own bookkeeping, which the BackendOps suite's StagedCpu instantiation
// (tests/backend_ops_test.cpp, where its argument ranges are checked) does not see: every block
// it stages in the device's memory is freed, when the device's operation throws too and once a
// prepared matrix is made from staged parts; its own memory is the host's.
#include "host_staged_backend.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "guard_page_backend.h"

namespace tfm {
namespace {

TEST(HostStagedBackend, FreesEveryStagedBlockAlsoWhenTheDeviceThrows) {
  const GuardPageBackend device;
  const HostStagedBackend staged(device);
  EXPECT_FALSE(device.memory_is_host());
  EXPECT_TRUE(staged.memory_is_host());
  EXPECT_EQ(staged.name(), device.name());

  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // [2, 3]
  std::vector<float> c(4, 0.f);
  staged.matmul(false, true, 2, 2, 3, 1.f, a.data(), 3, a.data(), 3, 0.f, c.data(), 2,
                Precision::kFloat32);
  EXPECT_EQ(c, (std::vector<float>{14, 32, 32, 77}));
  EXPECT_EQ(device.live_blocks(), 0);

  EXPECT_THROW(staged.matmul(false, true, 2, 2, 3, 1.f, a.data(), 3, a.data(), 3, 0.f, c.data(), 2,
                             Precision::kInt8),
               std::invalid_argument);
  EXPECT_EQ(device.live_blocks(), 0);

  const auto prepared = staged.prepare_matrix({a.data()}, {2}, 3, Precision::kFloat32);
  EXPECT_EQ(device.live_blocks(), 0);  // the parts are gone; the matrix is the device's own
  std::vector<float> y(4, 0.f);
  prepared->multiply(a.data(), 2, 3, y.data(), 2);
  EXPECT_EQ(y, (std::vector<float>{14, 32, 32, 77}));
  EXPECT_EQ(device.live_blocks(), 0);

  void* host = staged.allocate(12, true);  // plain host memory, readable here
  EXPECT_EQ(static_cast<const char*>(host)[11], 0);
  staged.deallocate(host);
  EXPECT_EQ(device.live_blocks(), 0);
}

}  // namespace
}  // namespace tfm
