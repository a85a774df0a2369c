// load_model / save_model and the checks of what they read.
#include "io/model_file.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "io/safetensors.h"
#include "tensor/error.h"

namespace tfm {

namespace {
bool g_allow_nonfinite_weights = false;
}  // namespace

void allow_nonfinite_weights(bool allow) {
  g_allow_nonfinite_weights = allow;
}

namespace {

bool finite(const Tensor& t) {
  // An exponent of all ones is Inf or NaN; the integer test is branch-free and vectorises.
  uint32_t special = 0;
  for (float x : t.data)
    special |= uint32_t((std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u);
  return special == 0;
}

// Throws Error naming the first non-finite element of `t`, unless --allow-nonfinite.
void check_finite_tensor(const std::string& name, const Tensor& t, const std::string& where) {
  if (g_allow_nonfinite_weights || finite(t)) return;
  for (size_t i = 0; i < t.data.size(); ++i)
    if (!std::isfinite(t.data[i]))
      throw Error(where + ": tensor \"" + name + "\" holds " +
                  (std::isnan(t.data[i]) ? "NaN" : "an infinity") + " at index " +
                  std::to_string(i) + " (--allow-nonfinite loads it anyway)");
}

}  // namespace

bool all_finite(const TensorMap& tensors) {
  for (const auto& [name, t] : tensors)
    if (!finite(t)) return false;
  return true;
}

void check_finite_parameters(const TensorMap& parameters, const std::string& where) {
  for (const auto& [name, t] : parameters) check_finite_tensor(name, t, where);
}

ModelConfig model_config_of_header(const std::map<std::string, std::string>& metadata,
                                   const std::map<std::string, Shape>& shapes,
                                   const std::string& where) {
  auto it = metadata.find("config");
  if (it == metadata.end())
    throw Error(where + ": not a transformer-cpp model (no \"config\" in __metadata__)");
  ModelConfig config = config_from_json_text(it->second, where);
  validate_config(config, where);
  check_parameter_shapes(config, shapes, where);
  return config;
}

Model load_model(const std::string& path, const Backend& backend, ModelWeights weights) {
  ModelConfig config;
  TensorMap tensors;
  Int8WeightMap int8;
  // The config and every declared shape are checked before any tensor is read; each tensor is
  // checked (and quantised) as soon as it is read, so int8 never holds the file in float32.
  read_safetensors(
      path,
      [&](const auto& metadata, const auto& shapes) {
        config = model_config_of_header(metadata, shapes, path);
      },
      [&](const std::string& name, Tensor&& t) {
        check_finite_tensor(name, t, path);
        if (weights == ModelWeights::kInt8Linears && is_linear_weight(name)) {
          int8.emplace(name, quantize_weight_rows(t));
          std::vector<float>().swap(t.data);  // the shape stays
        }
        tensors.emplace(name, std::move(t));
      });
  return Model(std::move(config), std::move(tensors), path, backend, std::move(int8));
}

void save_model(const Model& model, const std::string& path) {
  write_safetensors(path, model.parameters(), {{"config", config_to_json_text(model.config())}});
}

}  // namespace tfm
