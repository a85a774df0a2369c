// load_model / save_model and the checks of what they read.
#include "io/model_file.h"

#include <cmath>

#include "io/safetensors.h"
#include "tensor/error.h"

namespace tfm {

namespace {
bool g_allow_nonfinite_weights = false;
}  // namespace

void allow_nonfinite_weights(bool allow) {
  g_allow_nonfinite_weights = allow;
}

bool all_finite(const TensorMap& tensors) {
  for (const auto& [name, t] : tensors) {
    bool finite = true;
    for (float x : t.data) finite &= std::isfinite(x);  // branch-free: vectorises
    if (!finite) return false;
  }
  return true;
}

void check_finite_parameters(const TensorMap& parameters, const std::string& where) {
  if (g_allow_nonfinite_weights || all_finite(parameters)) return;
  for (const auto& [name, t] : parameters) {
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw Error(where + ": tensor \"" + name + "\" holds " +
                    (std::isnan(t.data[i]) ? "NaN" : "an infinity") + " at index " +
                    std::to_string(i) + " (--allow-nonfinite loads it anyway)");
  }
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

Model load_model(const std::string& path, const Backend& backend) {
  ModelConfig config;
  // The config and every declared shape are checked before any tensor is read.
  SafetensorsFile file = read_safetensors(path, [&](const auto& metadata, const auto& shapes) {
    config = model_config_of_header(metadata, shapes, path);
  });
  check_finite_parameters(file.tensors, path);
  return Model(std::move(config), std::move(file.tensors), path, backend);
}

void save_model(const Model& model, const std::string& path) {
  write_safetensors(path, model.parameters(), {{"config", config_to_json_text(model.config())}});
}

}  // namespace tfm
