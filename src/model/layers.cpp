// Forward passes of the individual layers.
#include "model/layers.h"

#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace tfm {

float* ensure_size(std::vector<float>& buffer, int64_t n) {
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

void linear_forward(const LinearWeights& w, const float* x, int64_t rows, float* y) {
  gemm(false, true, rows, w.out, w.in, 1.f, x, w.in, w.weight, w.in, 0.f, y, w.out);
  if (w.bias) add_bias(y, w.bias, rows, w.out);
}

void multi_head_attention_forward(const AttentionWeights& w, int64_t heads,
                                  const AttentionInputs& in, AttentionWorkspace& ws, float* out) {
  const int64_t d = w.q.out;
  const int64_t query_rows = in.batch * in.query_len, key_rows = in.batch * in.key_len;
  float* q = ensure_size(ws.q, query_rows * d);              // [B, Tq, D]
  float* k = ensure_size(ws.k, key_rows * d);                // [B, Tk, D]
  float* v = ensure_size(ws.v, key_rows * d);                // [B, Tk, D]
  float* context = ensure_size(ws.context, query_rows * d);  // [B, Tq, D]
  float* probs = ensure_size(ws.probs, in.batch * heads * in.query_len * in.key_len);
  linear_forward(w.q, in.query_input, query_rows, q);
  linear_forward(w.k, in.memory_input, key_rows, k);
  linear_forward(w.v, in.memory_input, key_rows, v);
  AttentionShape shape;
  shape.batch = in.batch;
  shape.heads = heads;
  shape.query_len = in.query_len;
  shape.key_len = in.key_len;
  shape.head_dim = d / heads;
  shape.q_row_stride = shape.k_row_stride = shape.v_row_stride = shape.out_row_stride = d;
  attention_forward(shape, in.mask, q, k, v, probs, context);
  linear_forward(w.o, context, query_rows, out);
}

void feed_forward_forward(const FeedForwardWeights& w, Activation act, const float* x, int64_t rows,
                          std::vector<float>& hidden, float* out) {
  float* h = ensure_size(hidden, rows * w.fc1.out);  // [rows, d_ff]
  gemm(false, true, rows, w.fc1.out, w.fc1.in, 1.f, x, w.fc1.in, w.fc1.weight, w.fc1.in, 0.f, h,
       w.fc1.out);
  add_bias_activation(h, w.fc1.bias, rows, w.fc1.out, act);
  linear_forward(w.fc2, h, rows, out);
}

void fill_sinusoid_table(const ModelConfig& config, float* table) {
  const int64_t d = config.d_model;
  for (int64_t p = 0; p < config.max_positions; ++p) {
    float* out = table + p * d;
    const double position = double(p);
    if (config.sinusoid_layout == SinusoidLayout::kInterleaved) {
      for (int64_t i = 0; 2 * i < d; ++i) {
        const double angle = position / std::pow(10000.0, double(2 * i) / double(d));
        out[2 * i] = float(std::sin(angle));
        if (2 * i + 1 < d) out[2 * i + 1] = float(std::cos(angle));
      }
    } else {
      const int64_t half = d / 2;
      const double increment = std::log(10000.0) / double(half - 1);
      for (int64_t j = 0; j < half; ++j) {
        const double angle = position * std::exp(-double(j) * increment);
        out[j] = float(std::sin(angle));
        out[half + j] = float(std::cos(angle));
      }
    }
  }
}

void embed_forward(const ModelConfig& config, const float* table, const float* position_table,
                   const int32_t* ids, int64_t batch, int64_t len, int64_t first_position,
                   float* out) {
  const int64_t d = config.d_model;
  const float scale = config.scale_embeddings ? std::sqrt(float(d)) : 1.f;
#pragma omp parallel for schedule(static) if (batch * len * d > 65536)
  for (int64_t row = 0; row < batch * len; ++row) {
    const int64_t t = row % len;
    const float* embedding = table + int64_t(ids[row]) * d;
    float* o = out + row * d;  // [D]
    if (position_table) {
      const float* pe = position_table + (first_position + t + config.position_offset) * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] = embedding[c] * scale + pe[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] = embedding[c] * scale;
    }
  }
}

}  // namespace tfm
