// The optimizer of §5.3: Adam (β1 0.9, β2 0.98, ε 1e-9) with the paper's learning-rate
// schedule lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), or a constant
// rate; plain SGD for tests; optional clipping of the global gradient norm; and an optional
// cool-down, the rate falling linearly to 0 over the last part of a run of known length (steps
// or minutes), which a fixed-length run can afford and the paper's endless schedule cannot.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "backend/device_tensors.h"
#include "tensor/tensor.h"

namespace tfm {

struct OptimizerOptions {
  std::string algorithm = "adam";  // "adam" | "sgd"
  std::string schedule = "noam";   // "noam" (the paper's) | "constant"
  double lr = 1e-3;                // constant schedule's rate
  double lr_factor = 1.0;          // multiplies the noam schedule
  int64_t warmup = 4000;
  float beta1 = 0.9f, beta2 = 0.98f, eps = 1e-9f;
  double clip_norm = 0;  // 0: no clipping
  double cooldown = 0;   // the last fraction of the run with the falling rate; 0: none
};

// The learning rate of step (1-based), `progress` (in [0, 1]) of the way through the run: the
// schedule's rate, times (1 - progress) / cooldown once progress passes 1 - cooldown.
double learning_rate(const OptimizerOptions& o, int64_t d_model, int64_t step, double progress = 0);

class Optimizer {
 public:
  // The updates run on the backend whose memory holds the parameters (the model's) and the
  // gradients; the moments are allocated there with the parameters' names and shapes.
  Optimizer(OptimizerOptions options, const DeviceTensors& parameters);

  // Applies one update with gradients (the parameters' names and shapes; optionally clipped
  // first, in place) at learning_rate(options, d_model, step() + 1, progress); step becomes
  // step() + 1. Returns the gradient norm before clipping. A non-finite norm (NaN / Inf in a
  // gradient) is returned without touching anything.
  double apply(DeviceTensors& parameters, DeviceTensors& gradients, int64_t d_model,
               double progress = 0);
  // The rate of the last update (0 before the first).
  double last_rate() const { return last_rate_; }

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  // Adam's moments: each set with the prefix of its names in checkpoints ("adam_m.<param>",
  // "adam_v.<param>"; none for SGD), in the backend's memory.
  std::vector<std::pair<std::string, const DeviceTensors*>> moments() const;
  // Whether every moment is finite (without copying them).
  bool state_is_finite() const;
  // The moments from `tensors` (a checkpoint's; each is freed once copied, so that the host
  // never holds a second full set).
  void load_state(TensorMap&& tensors, const std::string& where);
  const OptimizerOptions& options() const { return options_; }

 private:
  OptimizerOptions options_;
  const Backend* backend_;
  int64_t step_ = 0;
  double last_rate_ = 0;
  // Adam's moments, each one block in the backend's memory (empty for SGD).
  DeviceTensors first_moment_, second_moment_;
  // What Backend::adam_update reads to update every parameter in one call, in the backend's
  // memory: the parameters' addresses [count] (uploaded again only when one changes: the host
  // keeps its copy to tell) and their ranges in the gradient and moment blocks [count + 1].
  std::vector<float*> addresses_;
  DeviceBuffer<float*> device_addresses_;
  DeviceBuffer<int64_t> device_offsets_;

  // Uploads addresses_ where a parameter moved since the last call (or before the first).
  void point_at(DeviceTensors& parameters);
};

}  // namespace tfm
