// The optimizer's own rules: the paper's learning-rate schedule, the cool-down, clipping of the
// global norm, and a non-finite gradient's skipped update. Its steps against PyTorch's on every
// backend: optimizer_steps_test.cpp.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tensor/error.h"

namespace tfm {
namespace {

TEST(Optimizer, PaperScheduleWarmsUpThenDecays) {
  OptimizerOptions o;
  o.warmup = 4000;
  const double peak = learning_rate(o, 512, 4000);
  EXPECT_NEAR(peak, std::pow(512.0, -0.5) * std::pow(4000.0, -0.5), 1e-12);
  EXPECT_NEAR(learning_rate(o, 512, 1), std::pow(512.0, -0.5) * std::pow(4000.0, -1.5), 1e-15);
  EXPECT_LT(learning_rate(o, 512, 2000), peak);
  EXPECT_NEAR(learning_rate(o, 512, 16000), peak / 2, 1e-12);
  o.schedule = "constant";
  o.lr = 0.25;
  EXPECT_EQ(learning_rate(o, 512, 123), 0.25);
}

// The cool-down scales the schedule's rate by (1 - progress) / cooldown over the run's last
// `cooldown` fraction, whatever the schedule, and leaves the rest of the run untouched.
TEST(Optimizer, CooldownFallsLinearlyToZeroOverTheRunsLastFraction) {
  OptimizerOptions plain;
  plain.warmup = 100;
  OptimizerOptions cooled = plain;
  cooled.cooldown = 0.25;
  for (int64_t step : {1, 50, 100, 700}) {
    const double rate = learning_rate(plain, 256, step);
    EXPECT_EQ(learning_rate(cooled, 256, step, 0.0), rate);
    EXPECT_EQ(learning_rate(cooled, 256, step, 0.75), rate);  // the cool-down starts here
    EXPECT_NEAR(learning_rate(cooled, 256, step, 0.8), rate * 0.8, rate * 1e-12);
    EXPECT_NEAR(learning_rate(cooled, 256, step, 0.9), rate * 0.4, rate * 1e-12);
    EXPECT_EQ(learning_rate(cooled, 256, step, 1.0), 0.0);
    EXPECT_EQ(learning_rate(plain, 256, step, 0.99), rate);  // no cool-down: progress ignored
  }
  cooled.schedule = "constant";
  cooled.lr = 0.5;
  EXPECT_EQ(learning_rate(cooled, 256, 10, 0.5), 0.5);
  EXPECT_NEAR(learning_rate(cooled, 256, 10, 0.875), 0.25, 1e-15);
  cooled.cooldown = 1;  // the whole run: linear decay from the first step
  EXPECT_NEAR(learning_rate(cooled, 256, 10, 0.3), 0.35, 1e-15);
  // An update at 3/4 of a run whose last half cools down moves by half the rate.
  DeviceTensors params(cpu_backend(), {{"a", {1}}}, DeviceTensors::Layout::kPerTensor);
  DeviceTensors grads = DeviceTensors::zeros_like(params);
  grads.at("a").ptr()[0] = 2.f;
  cooled.algorithm = "sgd";
  cooled.cooldown = 0.5;
  Optimizer sgd(cooled, params);
  EXPECT_EQ(sgd.last_rate(), 0.0);
  sgd.apply(params, grads, 4, 0.75);
  EXPECT_EQ(sgd.last_rate(), 0.25);
  EXPECT_FLOAT_EQ(params.at("a").ptr()[0], -0.5f);
  cooled.cooldown = 1.5;
  EXPECT_THROW(Optimizer rejected(cooled, params), Error);
}

// The norm is over all gradients together (one block), not per tensor.
TEST(Optimizer, ClippingScalesTheGlobalNorm) {
  DeviceTensors params(cpu_backend(), {{"a", {1}}, {"b", {1}}}, DeviceTensors::Layout::kPerTensor);
  DeviceTensors grads = DeviceTensors::zeros_like(params);
  grads.at("a").ptr()[0] = 3.f;
  grads.at("b").ptr()[0] = 4.f;
  OptimizerOptions o;
  o.algorithm = "sgd";
  o.schedule = "constant";
  o.lr = 1.0;
  o.clip_norm = 1.0;
  Optimizer sgd(o, params);
  EXPECT_NEAR(sgd.apply(params, grads, 4), 5.0, 1e-9);
  EXPECT_NEAR(params.at("a").ptr()[0], -0.6f, 1e-6);
  EXPECT_NEAR(params.at("b").ptr()[0], -0.8f, 1e-6);
}

TEST(Optimizer, NonFiniteGradientLeavesEverythingUntouched) {
  DeviceTensors params(cpu_backend(), {{"a", {3}}}, DeviceTensors::Layout::kPerTensor);
  const float start[3] = {1.f, 2.f, 3.f};
  params.copy_from_host("a", start);
  DeviceTensors grads = DeviceTensors::zeros_like(params);
  const float good[3] = {0.5f, -0.25f, 1.f};
  grads.copy_from_host("a", good);
  OptimizerOptions o;
  o.schedule = "constant";
  o.lr = 0.1;
  Optimizer adam(o, params);
  adam.apply(params, grads, 4);  // one good step: moments become non-zero
  auto moments = [&adam] {
    TensorMap host;
    for (const auto& [prefix, set] : adam.moments()) host.merge(set->to_host(prefix));
    return host;
  };
  const TensorMap params_before = params.to_host(), moments_before = moments();
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    const float with_bad[3] = {0.5f, bad, 1.f};
    grads.copy_from_host("a", with_bad);
    EXPECT_FALSE(std::isfinite(adam.apply(params, grads, 4)));
    EXPECT_EQ(adam.step(), 1);
    EXPECT_EQ(params.to_host().at("a").data, params_before.at("a").data);
    for (const auto& [name, t] : moments()) EXPECT_EQ(t.data, moments_before.at(name).data);
  }
}

}  // namespace
}  // namespace tfm
