// Forward passes of the individual layers.
#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tfm {

uint64_t dropout_key(uint64_t seed, uint64_t site) {
  uint64_t z = seed ^ (site * 0xD1B54A32D192ED03ull);
  z = (z ^ (z >> 32)) * 0x9E3779B97F4A7C15ull;
  return z ^ (z >> 29);
}

void linear_forward(const Backend& backend, const LinearWeights& w, const float* x, int64_t rows,
                    float* y) {
  if (w.prepared)
    w.prepared->multiply(x, rows, w.in, y, w.out);
  else if (!w.weight)
    throw std::logic_error("linear_forward: a weight held in int8 is read only once prepared");
  else
    backend.matmul(false, true, rows, w.out, w.in, 1.f, x, w.in, w.weight, w.in, 0.f, y, w.out,
                   w.precision);
  if (w.bias) backend.add_bias(y, w.bias, rows, w.out);
}

void linear_backward(const Backend& backend, const LinearWeights& w, const Linear<float>& g,
                     const float* x, const float* dy, int64_t rows, float* dx, bool accumulate_dx) {
  if (dx)
    backend.matmul(false, false, rows, w.in, w.out, 1.f, dy, w.out, w.weight, w.in,
                   accumulate_dx ? 1.f : 0.f, dx, w.in, w.precision);
  backend.matmul(true, false, w.out, w.in, rows, 1.f, dy, w.out, x, w.in, 1.f, g.weight, w.in,
                 w.precision);
  if (g.bias) backend.bias_backward(dy, rows, w.out, g.bias);
}

namespace {

AttentionShape attention_shape(const AttentionWeights& w, const AttentionInputs& in, int64_t heads,
                               int64_t d) {
  AttentionShape shape;
  shape.score = w.score();
  shape.batch = in.batch;
  shape.heads = heads;
  shape.query_len = in.query_len;
  shape.key_len = in.key_len;
  shape.head_dim = d / heads;
  shape.q_row_stride = shape.k_row_stride = shape.v_row_stride = shape.out_row_stride = d;
  return shape;
}

}  // namespace

namespace {

// Q, K, V of one attention call and their row strides.
struct Projections {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
};

// Q from query_input, and K, V from memory_input unless it is null, into the cache: one stacked
// product where the weights are prepared for it, else one product each (what backward reads).
Projections project(const Backend& backend, const AttentionWeights& w, const float* query_input,
                    const float* memory_input, int64_t query_rows, int64_t key_rows,
                    AttentionCache& cache) {
  const int64_t d = w.q.out;
  if (w.qkv.prepared && query_input == memory_input) {
    float* qkv = ensure_size(cache.q, query_rows * 3 * d);  // [B, T, 3D] rows q | k | v
    linear_forward(backend, w.qkv, query_input, query_rows, qkv);
    return {qkv, qkv + d, qkv + 2 * d, 3 * d, 3 * d, 3 * d};
  }
  float* q = ensure_size(cache.q, query_rows * d);  // [B, Tq, D]
  linear_forward(backend, w.q, query_input, query_rows, q);
  if (!memory_input) return {q, nullptr, nullptr, d, 0, 0};
  if (w.kv.prepared) {
    float* kv = ensure_size(cache.k, key_rows * 2 * d);  // [B, Tk, 2D] rows k | v
    linear_forward(backend, w.kv, memory_input, key_rows, kv);
    return {q, kv, kv + d, d, 2 * d, 2 * d};
  }
  float* k = ensure_size(cache.k, key_rows * d);  // [B, Tk, D]
  float* v = ensure_size(cache.v, key_rows * d);  // [B, Tk, D]
  linear_forward(backend, w.k, memory_input, key_rows, k);
  linear_forward(backend, w.v, memory_input, key_rows, v);
  return {q, k, v, d, d, d};
}

}  // namespace

void multi_head_attention_forward(const Backend& backend, const AttentionWeights& w, int64_t heads,
                                  const AttentionInputs& in, AttentionCache& cache, float* out) {
  const int64_t d = w.q.out;
  const int64_t query_rows = in.batch * in.query_len, key_rows = in.batch * in.key_len;
  float* context = ensure_size(cache.context, query_rows * d);  // [B, Tq, D]
  const int64_t prob_count = in.batch * heads * in.query_len * in.key_len;
  const bool keep = cache.keep_weights || in.dropout > 0.f;  // dropout needs the weights
  float* probs = keep ? ensure_size(cache.probs, prob_count) : nullptr;  // [B, H, Tq, Tk]
  AttentionShape shape = attention_shape(w, in, heads, d);
  // Incremental decoding projects only this position: its q, k, v in self-attention (k and v
  // are appended to the cache), its q alone in cross-attention (the keys are cached already).
  const bool appends = in.cached && in.cached->key_rows;
  Projections p =
      project(backend, w, in.query_input, in.cached && !appends ? nullptr : in.memory_input,
              query_rows, in.cached ? query_rows : key_rows, cache);
  if (appends) {
    const CachedKeysValues& kv = *in.cached;
    std::vector<int64_t>& rows = cache.append_rows;  // [B] cache row of each query's position
    rows.resize(size_t(in.batch));
    for (int64_t i = 0; i < in.batch; ++i)
      rows[size_t(i)] = kv.key_rows[i * kv.key_rows_stride + in.mask.query_offset];
    backend.scatter_rows(p.k, p.k_stride, rows.data(), in.batch, d, kv.keys, kv.row_stride);
    backend.scatter_rows(p.v, p.v_stride, rows.data(), in.batch, d, kv.values, kv.row_stride);
  }
  if (in.cached) {
    p.k = in.cached->keys;
    p.v = in.cached->values;
    p.k_stride = p.v_stride = in.cached->row_stride;
    shape.key_rows = in.cached->key_rows;
    shape.key_rows_stride = in.cached->key_rows_stride;
  }
  shape.q_row_stride = p.q_stride;
  shape.k_row_stride = p.k_stride;
  shape.v_row_stride = p.v_stride;
  AttentionDropout dropout;
  if (in.dropout > 0.f) {
    dropout.p = in.dropout;
    dropout.mask = ensure_size(cache.dropout_mask, prob_count);
    dropout.key = in.dropout_key;
  }
  backend.attention_forward(shape, in.mask, p.q, p.k, p.v, probs, context, dropout);
  linear_forward(backend, w.o, context, query_rows, out);
}

void multi_head_attention_backward(const Backend& backend, const AttentionWeights& w,
                                   const Attention<float>& g, int64_t heads,
                                   const AttentionInputs& in, AttentionCache& cache,
                                   const float* d_out, BackwardScratch& scratch,
                                   float* d_query_input, bool accumulate, float* d_memory_input) {
  const int64_t d = w.q.out;
  const int64_t query_rows = in.batch * in.query_len, key_rows = in.batch * in.key_len;
  float* d_context = ensure_size(scratch.d_context, query_rows * d);  // [B, Tq, D]
  float* dq = ensure_size(scratch.dq, query_rows * d);                // [B, Tq, D]
  float* dk = ensure_size(scratch.dk, key_rows * d);                  // [B, Tk, D]
  float* dv = ensure_size(scratch.dv, key_rows * d);                  // [B, Tk, D]
  linear_backward(backend, w.o, g.o, cache.context.data(), d_out, query_rows, d_context, false);
  AttentionDropout dropout;
  if (in.dropout > 0.f) {
    dropout.p = in.dropout;
    dropout.mask = cache.dropout_mask.data();
  }
  backend.attention_backward(attention_shape(w, in, heads, d), in.mask, cache.q.data(),
                             cache.k.data(), cache.v.data(), cache.probs.data(), dropout, d_context,
                             dq, dk, dv, g.additive_v);
  linear_backward(backend, w.q, g.q, in.query_input, dq, query_rows, d_query_input, accumulate);
  // With dot-product scores the key bias adds q·b_k to every logit of a query's row, which
  // softmax ignores: its gradient is exactly zero. Computing it would give float rounding noise,
  // which Adam's m/√v scales up to steps of ~lr (and which differs between data-parallel
  // replicas), so it stays zero. Inside additive scores' tanh(q + k) the bias does matter.
  Linear<float> key_grads = g.k;
  if (w.scoring != AttentionScoring::kAdditive) key_grads.bias = nullptr;
  linear_backward(backend, w.k, key_grads, in.memory_input, dk, key_rows, d_memory_input, true);
  linear_backward(backend, w.v, g.v, in.memory_input, dv, key_rows, d_memory_input, true);
}

void feed_forward_forward(const Backend& backend, const FeedForwardWeights& w, Activation act,
                          const float* x, int64_t rows, float dropout, uint64_t key,
                          FeedForwardCache& cache, float* out) {
  float* pre = ensure_size(cache.pre_activation, rows * w.fc1.out);  // [rows, d_ff]
  float* hidden = cache.keep_pre_activation ? ensure_size(cache.hidden, rows * w.fc1.out)
                                            : pre;  // [rows, d_ff]
  // fc1 without its bias, which add_bias_activation adds in the same pass as the activation.
  LinearWeights fc1 = w.fc1;
  fc1.bias = nullptr;
  linear_forward(backend, fc1, x, rows, pre);
  backend.add_bias_activation(pre, w.fc1.bias, hidden, rows, w.fc1.out, act);
  if (dropout > 0.f) {
    uint8_t* mask = ensure_size(cache.dropout_mask, rows * w.fc1.out);
    backend.dropout_mask(mask, rows * w.fc1.out, dropout, key);
    backend.apply_dropout(hidden, mask, rows * w.fc1.out, dropout);
  }
  linear_forward(backend, w.fc2, hidden, rows, out);
}

void feed_forward_backward(const Backend& backend, const FeedForwardWeights& w,
                           const FeedForward<float>& g, Activation act, const float* x,
                           int64_t rows, float dropout, FeedForwardCache& cache, const float* d_out,
                           BackwardScratch& scratch, float* dx, bool accumulate) {
  const int64_t hidden_size = rows * w.fc1.out;
  float* d_hidden = ensure_size(scratch.d_hidden, hidden_size);  // [rows, d_ff]
  linear_backward(backend, w.fc2, g.fc2, cache.hidden.data(), d_out, rows, d_hidden, false);
  if (dropout > 0.f)
    backend.apply_dropout(d_hidden, cache.dropout_mask.data(), hidden_size, dropout);
  backend.activation_backward(d_hidden, cache.pre_activation.data(), hidden_size, act);
  linear_backward(backend, w.fc1, g.fc1, x, d_hidden, rows, dx, accumulate);
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

void embed_forward(const Backend& backend, const ModelConfig& config, const EmbeddingTable& table,
                   const float* position_table, const int32_t* ids, int64_t batch, int64_t len,
                   int64_t first_position, float* out) {
  const int64_t d = config.d_model;
  const float scale = config.scale_embeddings ? std::sqrt(float(d)) : 1.f;
  const int64_t first = first_position + config.position_offset;
  if (table.values)
    backend.embedding_forward(table.values, position_table, ids, batch * len, len, d, scale, first,
                              out);
  else
    backend.embedding_forward_int8(table.int8, position_table, ids, batch * len, len, d, scale,
                                   first, out);
}

void embed_backward(const Backend& backend, const ModelConfig& config, const float* d_out,
                    const int32_t* ids, int64_t batch, int64_t len, float* d_table,
                    float* d_positions) {
  const int64_t d = config.d_model;
  const float scale = config.scale_embeddings ? std::sqrt(float(d)) : 1.f;
  backend.embedding_backward(d_out, ids, batch * len, len, d, scale, config.position_offset,
                             d_table, d_positions);
}

}  // namespace tfm
