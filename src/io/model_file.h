// Model files (.safetensors with the config in __metadata__, docs/model-file.md): reading with
// every header field and shape checked before any tensor, writing atomically, and the finite
// check every weight read from a file goes through. Here in io/ so that model/ does not depend
// on file formats.
#pragma once

#include <map>
#include <string>

#include "model/transformer.h"

namespace tfm {

// How a loaded model holds its weights: all in float32 (what training, saving and every
// precision need), or its linear weights in int8 only (tensor/int8_weights.h): inference with
// --compute-type int8 in a quarter of the memory, each weight quantised as soon as it is read.
enum class ModelWeights { kFloat32, kInt8Linears };

// What inference in `precision` loads: int8 holds its linear weights in int8 only.
inline ModelWeights model_weights_for(Precision precision) {
  return precision == Precision::kInt8 ? ModelWeights::kInt8Linears : ModelWeights::kFloat32;
}

// Reads a model .safetensors file (config from __metadata__.config); its weights must be finite
// (check_finite_parameters). The model runs on `backend`.
Model load_model(const std::string& path, const Backend& backend = cpu_backend(),
                 ModelWeights weights = ModelWeights::kFloat32);

// The config of a model file's header (its metadata and declared shapes, before any tensor is
// read), checked: valid, and every declared shape what it asks for. Throws Error naming `where`.
ModelConfig model_config_of_header(const std::map<std::string, std::string>& metadata,
                                   const std::map<std::string, Shape>& shapes,
                                   const std::string& where);

// True when every element of every tensor is finite.
bool all_finite(const TensorMap& tensors);

// Weights read from files (models, checkpoints, imports) are checked for NaN / Inf: throws Error
// naming `where`, the first bad tensor and index. allow_nonfinite_weights(true) (the CLI's
// --allow-nonfinite) turns the check off for the whole process.
void check_finite_parameters(const TensorMap& parameters, const std::string& where);
void allow_nonfinite_weights(bool allow);
// Writes config + parameters atomically.
void save_model(const Model& model, const std::string& path);

}  // namespace tfm
