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

bool finite(const float* values, int64_t n) {
  // An exponent of all ones is Inf or NaN; the integer test is branch-free and vectorises.
  uint32_t special = 0;
  for (int64_t i = 0; i < n; ++i)
    special |= uint32_t((std::bit_cast<uint32_t>(values[i]) & 0x7f800000u) == 0x7f800000u);
  return special == 0;
}

// Throws Error naming the first non-finite element of values[n], unless --allow-nonfinite.
void check_finite_tensor(const std::string& name, const float* values, int64_t n,
                         const std::string& where) {
  if (g_allow_nonfinite_weights || finite(values, n)) return;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i]))
      throw Error(where + ": tensor \"" + name + "\" holds " +
                  (std::isnan(values[i]) ? "NaN" : "an infinity") + " at index " +
                  std::to_string(i) + " (--allow-nonfinite loads it anyway)");
}

}  // namespace

void check_finite_parameters(const TensorMap& parameters, const std::string& where) {
  for (const auto& [name, t] : parameters)
    check_finite_tensor(name, t.ptr(), int64_t(t.data.size()), where);
}

void store_tensors(const DeviceTensors& tensors, const std::string& prefix,
                   std::map<std::string, StoredTensor>& stored, TensorMap& staged) {
  for (const auto& [name, entry] : tensors) {
    if (stored.count(prefix + name)) continue;
    if (!entry.data && entry.numel() > 0)
      throw std::logic_error("store_tensors: tensor \"" + name + "\" was released");
    Tensor& copy = staged[prefix + name];  // stays empty where the host reads the set
    copy.shape = entry.shape;
    const float* values = host_readable(tensors.backend(), entry.ptr(), entry.numel(), copy.data);
    stored[prefix + name] = StoredTensor{"F32", entry.shape, values};
  }
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
  const std::map<std::string, ParameterRole> roles = parameter_roles(config);
  for (const auto& [name, dtype] : header.dtypes) {
    if (dtype != "I8") continue;
    const Shape& shape = header.shapes.at(name);
    const auto role = roles.find(name);
    if (role == roles.end() || !int8_may_hold(role->second) || shape.size() != 2)
      throw Error(where + ": tensor " + quoted_for_message(name) +
                  " is I8, but only linear weights and token embeddings may be stored in int8");
    const std::string scale = name + kInt8ScaleSuffix;
    auto scale_dtype = header.dtypes.find(scale);
    if (scale_dtype == header.dtypes.end())
      throw Error(where + ": int8 tensor " + quoted_for_message(name) + " has no " +
                  quoted_for_message(scale));
    if (scale_dtype->second != "F32" || header.shapes.at(scale) != Shape{shape[0]})
      throw Error(where + ": " + quoted_for_message(scale) + " must be F32 of shape [" +
                  std::to_string(shape[0]) + "], one scale per row of " + quoted_for_message(name));
    shapes.erase(scale);
  }
  check_parameter_shapes(config, shapes, where);
  return config;
}

Model load_model(const std::string& path, const Backend& backend, ModelWeights weights) {
  ModelConfig config;
  DeviceTensors parameters;  // [per tensor]
  DeviceInt8Weights int8;    // weights stored in int8 (or quantised for kInt8)
  std::map<std::string, std::string> scale_owners;  // "<w>_scale" -> "<w>" for every I8 weight
  // Tensors are read straight into the backend's memory where the host can write it; else
  // through these, one tensor at a time.
  const bool host = backend.memory_is_host();
  std::vector<float> staging;         // [numel] a float tensor
  std::vector<int8_t> staging_int8;   // [rows, cols]
  std::vector<float> staging_scales;  // [rows]
  auto at_most_one_copy = [&](auto& buffer, auto& staged, int64_t n) {
    if (host) return buffer.allocate_uninitialized(backend, n);
    staged.resize(size_t(n));
    return staged.data();
  };
  auto keep = [&](auto& buffer, const auto* values, int64_t n) {
    if (values != buffer.data()) upload(backend, values, n, buffer);
  };
  // The config and every declared shape are checked before any tensor is read; each tensor is
  // checked (and quantised) as soon as it is read, so int8 never holds the file in float32.
  SafetensorsReceiver receiver;
  std::map<std::string, ParameterRole> roles;  // of the config's parameters, by name
  auto quantised = [&](const std::string& name) {
    const auto role = roles.find(name);
    return weights == ModelWeights::kInt8 && role != roles.end() && int8_may_hold(role->second);
  };
  receiver.place = [&](const std::string& name, const Shape& shape) -> float* {
    if (auto owner = scale_owners.find(name); owner != scale_owners.end())
      return at_most_one_copy(int8[owner->second].scales, staging_scales, shape[0]);
    // Allocated as it is read (as std::vector would be: the allocator sees the same sequence);
    // one held in int8 never is.
    if (!quantised(name)) {
      float* entry = parameters.allocate(name, false);
      if (host) return entry;
    }
    staging.resize(size_t(Tensor::numel_of(shape)));
    return staging.data();
  };
  receiver.filled = [&](const std::string& name, const Shape& shape, float* values) {
    const int64_t n = Tensor::numel_of(shape);
    check_finite_tensor(name, values, n, path);
    if (auto owner = scale_owners.find(name); owner != scale_owners.end()) {
      keep(int8[owner->second].scales, values, shape[0]);
    } else if (quantised(name)) {
      DeviceInt8Matrix& q = int8[name];
      q.shape = shape;
      int8_t* rows = at_most_one_copy(q.values, staging_int8, n);
      float* scales = at_most_one_copy(q.scales, staging_scales, shape[0]);
      quantize_weight_rows(values, shape[0], shape[1], rows, scales);
      keep(q.values, rows, n);
      keep(q.scales, scales, shape[0]);
      std::vector<float>().swap(staging);  // freed now, as a tensor of its own would be
    } else if (values != parameters.at(name).data) {
      parameters.copy_from_host(name, values);
    }
  };
  receiver.place_int8 = [&](const std::string& name, const Shape& shape) -> int8_t* {
    if (weights == ModelWeights::kFloat32) parameters.allocate(name, false);  // multiplied out
    DeviceInt8Matrix& q = int8[name];
    q.shape = shape;
    return at_most_one_copy(q.values, staging_int8, Tensor::numel_of(shape));
  };
  receiver.int8_filled = [&](const std::string& name, const Shape& shape, int8_t* values) {
    keep(int8[name].values, values, Tensor::numel_of(shape));
  };
  read_safetensors(
      path,
      [&](const SafetensorsHeader& header) {
        if (header.metadata.count("training_state"))  // train's checkpoint.safetensors
          throw Error(path +
                      ": a training checkpoint (the model with its optimizer state) is for "
                      "train --resume; the model is the model.safetensors beside it");
        config = model_config_of_header(header, path);
        roles = parameter_roles(config);
        std::map<std::string, Shape> shapes = header.shapes;
        for (const auto& [name, dtype] : header.dtypes)
          if (dtype == "I8") {
            scale_owners.emplace(name + kInt8ScaleSuffix, name);
            shapes.erase(name + kInt8ScaleSuffix);
          }
        parameters = DeviceTensors::unallocated(backend, shapes);
      },
      &receiver);
  if (weights == ModelWeights::kFloat32) {
    // Stored int8 weights multiplied out: row r is values[r, :] · scales[r].
    for (auto& [name, q] : int8) {
      const int64_t rows = q.shape[0], cols = q.shape[1];
      const int8_t* values = host_readable(backend, q.view().values, rows * cols, staging_int8);
      const float* scales = host_readable(backend, q.view().scales, rows, staging_scales);
      float* w =
          host ? parameters.at(name).data : (staging.resize(size_t(rows * cols)), staging.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          w[r * cols + c] = float(values[r * cols + c]) * scales[r];
      if (!host) parameters.copy_from_host(name, w);
    }
    int8.clear();
  }
  return Model(std::move(config), std::move(parameters), path, std::move(int8));
}

void save_model(const Model& model, const std::string& path) {
  std::map<std::string, StoredTensor> stored;
  TensorMap staged;  // tensors in memory the host cannot read, copied
  std::map<std::string, Int8Matrix> staged_int8;
  const Backend& backend = model.backend();
  for (const auto& [name, q] : model.int8_weights()) {
    if (q.values.size() != Tensor::numel_of(q.shape))  // released by Model::prepared
      throw std::logic_error("save_model: the int8 rows of \"" + name + "\" were released");
    Int8Matrix& copy = staged_int8[name];  // stays empty where the host reads the backend
    stored.emplace(
        name, StoredTensor{"I8", q.shape,
                           host_readable(backend, q.values.data(), q.values.size(), copy.values)});
    stored.emplace(
        name + kInt8ScaleSuffix,
        StoredTensor{"F32",
                     {q.shape[0]},
                     host_readable(backend, q.scales.data(), q.scales.size(), copy.scales)});
  }
  store_tensors(model.parameters(), "", stored, staged);  // the float32 ones
  write_safetensors(path, stored, {{"config", config_to_json_text(model.config())}});
}

}  // namespace tfm
