// Weight matrices held in int8 (tensor/int8_weights.h's format: values and a scale per row) in a
// backend's memory: what a model loaded for --compute-type int8 holds instead of its float32
// linear weights and embeddings, so that preparing its products and looking up its embeddings
// read only memory the backend allocated. Files see them through to_host().
#pragma once

#include <map>
#include <string>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "tensor/int8_weights.h"

namespace tfm {

struct DeviceInt8Matrix {
  Shape shape;                  // [rows, cols]
  DeviceBuffer<int8_t> values;  // [rows, cols]; empty once released
  DeviceBuffer<float> scales;   // [rows]
  Int8Rows view() const { return {values.data(), scales.data()}; }
  // A host copy (values empty once released).
  Int8Matrix to_host() const;
};

// Int8 weights by parameter name ("decoder.layers.0.ffn.fc1.weight").
using DeviceInt8Weights = std::map<std::string, DeviceInt8Matrix>;

// `host` copied into `backend`'s memory, each matrix freed on the host once copied.
DeviceInt8Weights upload_int8_weights(const Backend& backend, Int8WeightMap&& host);

}  // namespace tfm
