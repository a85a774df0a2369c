// Optimizer: schedule, clipping and the per-tensor updates.
#include "train/optimizer.h"

#include <cmath>

#include "tensor/error.h"

namespace tfm {

double learning_rate(const OptimizerOptions& o, int64_t d_model, int64_t step) {
  if (o.schedule == "constant") return o.lr;
  const double s = double(std::max<int64_t>(step, 1));
  return o.lr_factor / std::sqrt(double(d_model)) *
         std::min(1.0 / std::sqrt(s), s * std::pow(double(std::max<int64_t>(o.warmup, 1)), -1.5));
}

Optimizer::Optimizer(OptimizerOptions options, const TensorMap& parameters, const Backend& backend)
    : options_(std::move(options)), backend_(&backend) {
  if (options_.algorithm != "adam" && options_.algorithm != "sgd")
    throw Error("unknown optimizer \"" + options_.algorithm + "\" (expected adam or sgd)");
  if (options_.schedule != "noam" && options_.schedule != "constant")
    throw Error("unknown learning-rate schedule \"" + options_.schedule +
                "\" (expected noam or constant)");
  if (options_.algorithm == "adam")
    for (const auto& [name, t] : parameters) {
      first_moment_.emplace(name, Tensor(t.shape));
      second_moment_.emplace(name, Tensor(t.shape));
    }
}

double Optimizer::apply(TensorMap& parameters, TensorMap& gradients, int64_t d_model) {
  double squares = 0;
  for (const auto& [name, g] : gradients) squares += backend_->sum_of_squares(g.ptr(), g.numel());
  const double norm = std::sqrt(squares);
  if (!std::isfinite(norm)) return norm;  // no update: the caller skips this step
  if (options_.clip_norm > 0 && norm > options_.clip_norm) {
    const float scale = float(options_.clip_norm / norm);
    for (auto& [name, g] : gradients) backend_->scale(g.ptr(), scale, g.numel());
  }
  ++step_;
  const double lr = learning_rate(options_, d_model, step_);
  for (auto& [name, p] : parameters) {
    Tensor& g = gradients.at(name);
    if (options_.algorithm == "sgd") {
      backend_->sgd_update(p.ptr(), g.ptr(), p.numel(), float(lr));
    } else {
      AdamHyperparameters h{float(lr), options_.beta1, options_.beta2, options_.eps};
      backend_->adam_update(p.ptr(), g.ptr(), first_moment_.at(name).ptr(),
                            second_moment_.at(name).ptr(), p.numel(), h, step_);
    }
  }
  return norm;
}

TensorMap Optimizer::state() const {
  TensorMap out;
  for (const auto& [name, t] : first_moment_) out.emplace("adam_m." + name, t);
  for (const auto& [name, t] : second_moment_) out.emplace("adam_v." + name, t);
  return out;
}

void Optimizer::load_state(TensorMap&& tensors, const std::string& where) {
  auto load = [&](TensorMap& moments, const std::string& prefix) {
    for (auto& [name, t] : moments) {
      auto it = tensors.find(prefix + name);
      if (it == tensors.end())
        throw Error(where + ": missing optimizer state \"" + prefix + name + "\"");
      if (it->second.shape != t.shape)
        throw Error(where + ": optimizer state \"" + prefix + name + "\" has the wrong shape");
      if (prefix == "adam_v.")  // Adam's second moment is a running mean of squares
        for (float x : it->second.data)
          if (x < 0)
            throw Error(where + ": optimizer state \"" + prefix + name +
                        "\" holds a negative value");
      t = std::move(it->second);
    }
  };
  load(first_moment_, "adam_m.");
  load(second_moment_, "adam_v.");
}

}  // namespace tfm
