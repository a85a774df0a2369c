// load_model / save_model and the checks of what they read.
#include "io/model_file.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>

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

bool stores_int8_weights(const SafetensorsHeader& header) {
  for (const auto& [name, dtype] : header.dtypes)
    if (dtype == "I8") return true;
  return false;
}

ModelConfig model_config_of_header(const SafetensorsHeader& header, const std::string& where) {
  auto it = header.metadata.find("config");
  if (it == header.metadata.end())
    throw Error(where + ": not a transformer-cpp model (no \"config\" in __metadata__)");
  ModelConfig config = config_from_json_text(it->second, where);
  validate_config(config, where);
  // An I8 tensor is a linear weight or a token embedding whose F32 [rows] scales sit beside it;
  // the scales are not parameters of the config, so they leave the shapes before those are
  // checked.
  std::map<std::string, Shape> shapes = header.shapes;
  for (const auto& [name, dtype] : header.dtypes) {
    if (dtype != "I8") continue;
    const Shape& shape = header.shapes.at(name);
    if (!is_int8_weight(name) || shape.size() != 2)
      throw Error(where + ": tensor \"" + name +
                  "\" is I8, but only linear weights and token embeddings may be stored in int8");
    const std::string scale = name + kInt8ScaleSuffix;
    auto scale_dtype = header.dtypes.find(scale);
    if (scale_dtype == header.dtypes.end())
      throw Error(where + ": int8 tensor \"" + name + "\" has no \"" + scale + "\"");
    if (scale_dtype->second != "F32" || header.shapes.at(scale) != Shape{shape[0]})
      throw Error(where + ": \"" + scale + "\" must be F32 of shape [" + std::to_string(shape[0]) +
                  "], one scale per row of \"" + name + "\"");
    shapes.erase(scale);
  }
  check_parameter_shapes(config, shapes, where);
  return config;
}

Model load_model(const std::string& path, const Backend& backend, ModelWeights weights) {
  ModelConfig config;
  TensorMap tensors;
  Int8WeightMap int8;
  std::map<std::string, std::string> scale_owners;  // "<w>_scale" -> "<w>" for every I8 weight
  // The config and every declared shape are checked before any tensor is read; each tensor is
  // checked (and quantised) as soon as it is read, so int8 never holds the file in float32.
  read_safetensors(
      path,
      [&](const SafetensorsHeader& header) {
        config = model_config_of_header(header, path);
        for (const auto& [name, dtype] : header.dtypes)
          if (dtype == "I8") scale_owners.emplace(name + kInt8ScaleSuffix, name);
      },
      [&](const std::string& name, Tensor&& t) {
        check_finite_tensor(name, t, path);
        if (auto owner = scale_owners.find(name); owner != scale_owners.end()) {
          int8[owner->second].scales = std::move(t.data);
          return;
        }
        if (weights == ModelWeights::kInt8 && is_int8_weight(name)) {
          int8.emplace(name, quantize_weight_rows(t));
          std::vector<float>().swap(t.data);  // the shape stays
        }
        tensors.emplace(name, std::move(t));
      },
      [&](const std::string& name, Shape&& shape, std::vector<int8_t>&& values) {
        Int8Matrix& q = int8[name];
        q.shape = shape;
        q.values = std::move(values);
        Tensor placeholder;  // the shape, without data: the weight is held in int8
        placeholder.shape = std::move(shape);
        tensors.emplace(name, std::move(placeholder));
      });
  if (weights == ModelWeights::kFloat32) {
    // Stored int8 weights multiplied out: row r is values[r, :] · scales[r].
    for (auto& [name, q] : int8) {
      Tensor& w = tensors.at(name);
      w.data.resize(size_t(w.numel()));
      const int64_t rows = q.shape[0], cols = q.shape[1];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          w.data[size_t(r * cols + c)] =
              float(q.values[size_t(r * cols + c)]) * q.scales[size_t(r)];
    }
    int8.clear();
  }
  return Model(std::move(config), std::move(tensors), path, backend, std::move(int8));
}

void save_model(const Model& model, const std::string& path) {
  std::map<std::string, StoredTensor> stored;
  for (const auto& [name, tensor] : model.parameters()) {
    auto q = model.int8_weights().find(name);
    if (q == model.int8_weights().end()) {
      if (tensor.data.size() != size_t(tensor.numel()))
        throw std::logic_error("save_model: tensor \"" + name + "\" holds no data");
      stored.emplace(name, StoredTensor{"F32", tensor.shape, tensor.ptr()});
      continue;
    }
    if (q->second.values.size() != size_t(tensor.numel()))  // released by Model::prepared
      throw std::logic_error("save_model: the int8 rows of \"" + name + "\" were released");
    stored.emplace(name, StoredTensor{"I8", q->second.shape, q->second.values.data()});
    stored.emplace(name + kInt8ScaleSuffix,
                   StoredTensor{"F32", {q->second.shape[0]}, q->second.scales.data()});
  }
  write_safetensors(path, stored, {{"config", config_to_json_text(model.config())}});
}

}  // namespace tfm
