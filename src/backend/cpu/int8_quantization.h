// The CPU side of int8 products (Precision::kInt8), as CTranslate2 quantises: each weight row
// (one output feature) symmetric with its own scale, each activation row quantised at every
// product with its own scale. The products then run on integers with int32
// accumulation (oneDNN's u8·s8 matmul, VNNI), and dequantize_products turns them back into
// floats. Activations are stored shifted by +128 as unsigned bytes because VNNI multiplies
// unsigned by signed bytes; the shift is removed exactly with the weights' column sums.
#pragma once

#include <cstdint>

namespace tfm {

// The weights' side is tensor/int8_weights.h (the format a model holds them in).

// column_sums[r] = Σ_c q[r, c] of int8 rows q[n, k]: what removes the activations' +128 shift.
void int8_row_sums(const int8_t* q, int64_t n, int64_t k, int32_t* column_sums);

// q[m, k] = round(x / scale[r]) + 128 in [1, 255] with scale[r] = max_c |x[r, c]| / 127 (1 for
// an all-zero row); x has row stride ldx. Rounds halves up.
void quantize_activation_rows(const float* x, int64_t m, int64_t k, int64_t ldx, uint8_t* q,
                              float* scales);

// y[r, c] = (products[r, c] − 128 · column_sums[c]) · row_scales[r] · column_scales[c], where
// products [m, n] = q_x · q_wᵀ of the two quantised operands; y has row stride ldy. Then
// + bias[c] where bias is given and max(·, 0) where relu, as a separate pass over y would.
void dequantize_products(const int32_t* products, int64_t m, int64_t n, const int32_t* column_sums,
                         const float* row_scales, const float* column_scales, float* y, int64_t ldy,
                         const float* bias = nullptr, bool relu = false);

}  // namespace tfm
