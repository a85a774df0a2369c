// Model files (.safetensors with the config in __metadata__, docs/model-file.md): reading with
// every header field and shape checked before any tensor, writing atomically, and the finite
// check every weight read from a file goes through. Here in io/ so that model/ does not depend
// on file formats.
#pragma once

#include <map>
#include <string>

#include "backend/device_int8_weights.h"
#include "backend/device_tensors.h"
#include "io/safetensors.h"
#include "model/transformer.h"

namespace tfm {

// How a loaded model holds its weights: all in float32 (what training, saving and every
// precision need), or its linear weights and token embeddings in int8 only
// (tensor/int8_weights.h): inference with --compute-type int8 in a quarter of the memory, each
// such matrix quantised as soon as it is read.
enum class ModelWeights { kFloat32, kInt8 };

// What inference in `precision` loads: int8 holds its int8 matrices in int8 only.
inline ModelWeights model_weights_for(Precision precision) {
  return precision == Precision::kInt8 ? ModelWeights::kInt8 : ModelWeights::kFloat32;
}

// Reads a model .safetensors file (config from __metadata__.config); its weights must be finite
// (check_finite_parameters). The model runs on `backend`. A file that stores its linear
// weights in int8 (docs/model-file.md, "int8 weights") loads them as they are for kInt8
// and multiplied out by their row scales for kFloat32.
Model load_model(const std::string& path, const Backend& backend,
                 ModelWeights weights = ModelWeights::kFloat32);

// The config of a model file's header (its metadata, declared shapes and dtypes, before any
// tensor is read), checked: valid, every declared shape what it asks for, and every I8 tensor a
// linear weight with its F32 row scales. Throws Error naming `where`.
ModelConfig model_config_of_header(const SafetensorsHeader& header, const std::string& where);

// The suffix of the row scales that go with a linear weight stored in int8:
// "<linear>.weight" (I8 [out, in]) and "<linear>.weight_scale" (F32 [out]).
inline constexpr const char* kInt8ScaleSuffix = "_scale";

// Whether a model file's header stores matrices in int8.
bool stores_int8_weights(const SafetensorsHeader& header);

// Weights read from files (models, checkpoints, imports) are checked for NaN / Inf: throws Error
// naming `where`, the first bad tensor and index. allow_nonfinite_weights(true) (the CLI's
// --allow-nonfinite) turns the check off for the whole process.
void check_finite_parameters(const TensorMap& parameters, const std::string& where);
void allow_nonfinite_weights(bool allow);
// What write_safetensors writes for a set of tensors, each named prefix + name: pointers into
// the set where the host can read the backend's memory (no copy: a checkpoint adds nothing to
// training's peak memory), else host copies kept in `staged` until the write. Names already in
// `stored` are left as they are (a weight stored in int8); any other released tensor is a
// std::logic_error.
void store_tensors(const DeviceTensors& tensors, const std::string& prefix,
                   std::map<std::string, StoredTensor>& stored, TensorMap& staged);
// Writes config + parameters atomically: all float32, or, for a model that holds its linear
// weights in int8 (Model::holds_int8_weights), those as I8 with their row scales.
void save_model(const Model& model, const std::string& path);

}  // namespace tfm
