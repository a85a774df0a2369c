// Weight matrices held in int8, one scale per row (the format of --compute-type int8, as
// CTranslate2 quantises): row r of W is approximated by values[r, :] · scales[r], with
// scales[r] = max_c |W[r, c]| / 127 and values rounded to the nearest integer in [−127, 127].
// A model loaded for int8 inference keeps its linear weights and token embeddings only in this
// form (a quarter of float32's memory); every backend prepares its products from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tfm {

// A view of int8 rows: the row count and width are the user's (a Linear's out × in).
struct Int8Rows {
  const int8_t* values = nullptr;  // [rows, cols]
  const float* scales = nullptr;   // [rows]
};

struct Int8Matrix {
  Shape shape;                 // [rows, cols]
  std::vector<int8_t> values;  // [rows, cols]
  std::vector<float> scales;   // [rows]
  Int8Rows view() const { return {values.data(), scales.data()}; }
};

// Int8 weights by parameter name ("decoder.layers.0.ffn.fc1.weight").
using Int8WeightMap = std::map<std::string, Int8Matrix>;

// values[n, k] and scales[n] of w[n, k] by the rule above (scale 1 for an all-zero row). NaN
// becomes 127; callers check finiteness first.
void quantize_weight_rows(const float* w, int64_t n, int64_t k, int8_t* values, float* scales);

// The tensor quantised (2-D only).
Int8Matrix quantize_weight_rows(const Tensor& w);

}  // namespace tfm
