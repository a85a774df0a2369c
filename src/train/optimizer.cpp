// Optimizer: schedule, clipping and the per-tensor updates.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tensor/error.h"

namespace tfm {

double learning_rate(const OptimizerOptions& o, int64_t d_model, int64_t step, double progress) {
  double cooled = 1;
  if (o.cooldown > 0 && progress > 1 - o.cooldown)
    cooled = std::clamp((1 - progress) / o.cooldown, 0.0, 1.0);
  if (o.schedule == "constant") return o.lr * cooled;
  const double s = double(std::max<int64_t>(step, 1));
  return cooled * o.lr_factor / std::sqrt(double(d_model)) *
         std::min(1.0 / std::sqrt(s), s * std::pow(double(std::max<int64_t>(o.warmup, 1)), -1.5));
}

Optimizer::Optimizer(OptimizerOptions options, const DeviceTensors& parameters)
    : options_(std::move(options)), backend_(&parameters.backend()) {
  if (options_.algorithm != "adam" && options_.algorithm != "sgd")
    throw Error("unknown optimizer \"" + options_.algorithm + "\" (expected adam or sgd)");
  if (options_.schedule != "noam" && options_.schedule != "constant")
    throw Error("unknown learning-rate schedule \"" + options_.schedule +
                "\" (expected noam or constant)");
  if (!(options_.cooldown >= 0 && options_.cooldown <= 1))
    throw Error("the cool-down must be a fraction of the run between 0 and 1");
  if (options_.algorithm == "adam") {
    first_moment_ = DeviceTensors::zeros_like(parameters);
    second_moment_ = DeviceTensors::zeros_like(parameters);
    // The moments' blocks and the gradients' (zeros_like of the same parameters) share one
    // layout, name by name.
    std::vector<int64_t> offsets;  // [tensors + 1]
    for (const auto& [name, moment] : first_moment_) offsets.push_back(moment.offset);
    offsets.push_back(first_moment_.numel());
    upload(*backend_, offsets.data(), int64_t(offsets.size()), device_offsets_);
  }
}

void Optimizer::point_at(DeviceTensors& parameters) {
  std::vector<float*> addresses;
  for (auto& [name, p] : parameters) addresses.push_back(p.ptr());
  if (addresses == addresses_) return;
  addresses_ = std::move(addresses);
  upload(*backend_, addresses_.data(), int64_t(addresses_.size()), device_addresses_);
}

double Optimizer::apply(DeviceTensors& parameters, DeviceTensors& gradients, int64_t d_model,
                        double progress) {
  // One block, so the norm and the clipping are one call each over all gradients.
  const double norm = std::sqrt(backend_->sum_of_squares(gradients.flat(), gradients.numel()));
  if (!std::isfinite(norm)) return norm;  // no update: the caller skips this step
  if (options_.clip_norm > 0 && norm > options_.clip_norm)
    backend_->scale(gradients.flat(), float(options_.clip_norm / norm), gradients.numel());
  ++step_;
  const double lr = learning_rate(options_, d_model, step_, progress);
  last_rate_ = lr;
  if (options_.algorithm == "sgd") {
    for (auto& [name, p] : parameters)
      backend_->sgd_update(p.ptr(), gradients.at(name).ptr(), p.numel(), float(lr));
    return norm;
  }
  if (parameters.size() != first_moment_.size() || gradients.numel() != first_moment_.numel())
    throw std::logic_error("Optimizer::apply: not the parameters the optimizer was made for");
  point_at(parameters);
  const AdamHyperparameters h{float(lr), options_.beta1, options_.beta2, options_.eps};
  backend_->adam_update(device_addresses_.data(), device_offsets_.data(),
                        int64_t(addresses_.size()), first_moment_.numel(), gradients.flat(),
                        first_moment_.flat(), second_moment_.flat(), h, step_);
  return norm;
}

std::vector<std::pair<std::string, const DeviceTensors*>> Optimizer::moments() const {
  if (first_moment_.empty()) return {};
  return {{"adam_m.", &first_moment_}, {"adam_v.", &second_moment_}};
}

bool Optimizer::state_is_finite() const {
  return all_finite(first_moment_) && all_finite(second_moment_);
}

void Optimizer::load_state(TensorMap&& tensors, const std::string& where) {
  auto load = [&](DeviceTensors& moments, const std::string& prefix) {
    for (auto& [name, entry] : moments) {
      auto it = tensors.find(prefix + name);
      if (it == tensors.end())
        throw Error(where + ": missing optimizer state \"" + prefix + name + "\"");
      if (it->second.shape != entry.shape)
        throw Error(where + ": optimizer state \"" + prefix + name + "\" has the wrong shape");
      if (prefix == "adam_v.")  // Adam's second moment is a running mean of squares
        for (float x : it->second.data)
          if (x < 0)
            throw Error(where + ": optimizer state \"" + prefix + name +
                        "\" holds a negative value");
      moments.copy_from_host(name, it->second.ptr());
      it->second = Tensor();  // freed now, not when the whole map goes
    }
  };
  load(first_moment_, "adam_m.");
  load(second_moment_, "adam_v.");
}

}  // namespace tfm
