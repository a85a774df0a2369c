// init_model(): deterministic for a given seed on every machine (tfm::Random).
#include "model/init.h"

#include <cmath>

#include "model/positional_encoding.h"
#include "tensor/memory_budget.h"
#include "tensor/random.h"

namespace tfm {

Model init_model(const ModelConfig& config, uint64_t seed, const Backend& backend) {
  validate_config(config, "init");
  check_memory((parameter_count(config) + sinusoid_table_elements(config)) * int64_t(sizeof(float)),
               "a model of this config");
  Random random(seed);
  TensorMap parameters;
  for (const auto& spec : parameter_specs(config)) {
    Tensor t(spec.shape);
    float* p = t.ptr();
    const int64_t n = t.numel();
    const bool token_embedding = spec.role == ParameterRole::kTokenEmbedding;
    if (token_embedding || spec.role == ParameterRole::kPositionEmbedding) {
      const float std_dev = 1.f / std::sqrt(float(config.d_model));
      for (int64_t i = 0; i < n; ++i) p[i] = random.normal() * std_dev;
      if (token_embedding)
        for (int64_t c = 0; c < config.d_model; ++c) p[config.pad_id * config.d_model + c] = 0.f;
    } else if (spec.role == ParameterRole::kNormScale) {
      for (int64_t i = 0; i < n; ++i) p[i] = 1.f;
    } else if (spec.role == ParameterRole::kAdditiveV) {
      // Xavier-uniform of each head's [1, d_k] map tanh(q + k) -> logit: with tanh outputs of
      // variance ~1/2 the initial logits have variance ~1 at every d_k.
      const float bound = std::sqrt(6.f / float(config.head_dim() + 1));
      for (int64_t i = 0; i < n; ++i) p[i] = random.uniform(-bound, bound);
    } else if (spec.role == ParameterRole::kLinearWeight) {  // Xavier-uniform on [out, in]
      const float bound = std::sqrt(6.f / float(spec.shape[0] + spec.shape[1]));
      for (int64_t i = 0; i < n; ++i) p[i] = random.uniform(-bound, bound);
    }  // biases and norm shifts stay zero
    parameters.emplace(spec.name, std::move(t));
  }
  return Model(config, std::move(parameters), "init", backend);
}

}  // namespace tfm
