// Multi-head attention forward / backward.
#include "model/multi_head_attention.h"

#include <algorithm>
#include <stdexcept>

#include "model/workspace_slots.h"

namespace tfm {

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
  // Training in bfloat16 lets the attention's own products round their operands too; its
  // weights (cache.probs) are read by this backward alone (only train/loss.cpp makes such
  // weights, and nothing there reads an attention's probs), so the backend may keep there what
  // its backward rebuilds them from. Forward and backward take their shapes from here, as the
  // flag requires.
  if (rounds_to_bfloat16(w.q)) {
    shape.products = Precision::kBFloat16;
    shape.weights_for_backward_only = true;
  }
  return shape;
}

// Whether a call's projections write Q, K and V in bfloat16 alone: training in bfloat16 where the
// backend's attention reads nothing else for this call, forward and backward
// (Backend::attention_reads_rounded_inputs). The one answer the plan and the forward take; the
// backward takes the forward's (AttentionCache::projected_in_bfloat16).
bool projects_in_bfloat16(const Backend& backend, const AttentionWeights& w,
                          const AttentionShape& shape, const AttentionMask& mask, float dropout) {
  if (!rounds_to_bfloat16(w.q) || shape.batch * shape.query_len == 0 || shape.key_len == 0)
    return false;
  AttentionDropout attention_dropout;
  attention_dropout.p = dropout;
  return backend.attention_reads_rounded_inputs(shape, mask, attention_dropout);
}

// The floats a call's forward keeps for its backward in cache.probs (Backend::
// attention_weights_floats: the weights [B, H, Tq, Tk], or less). The one answer the plan and
// the forward take (a forward over cached rows keeps the weights: no backward reads them).
int64_t weight_floats(const Backend& backend, const AttentionShape& shape,
                      const AttentionMask& mask, float dropout) {
  AttentionDropout attention_dropout;
  attention_dropout.p = dropout;
  return backend.attention_weights_floats(shape, mask, attention_dropout);
}

// What one attention call projects (project() below): its queries only (cross-attention in
// incremental decoding: the keys are cached already), or keys and values too, from the same
// rows (self-attention) or from another sequence (cross-attention).
enum class Projected { kQuery, kSelf, kCross };

// Whether a stacked view (Attention::qkv, kv) is one product for its parts: prepared for
// inference, or training in bfloat16 (with_product_precision); else each part is its own.
bool stacks(const LinearWeights& view) {
  return view.out > 0;
}

// Whether W_o's products (forward and backward) read the context's bfloat16 copy alone, as a
// bfloat16 training step's do: the float32 context is then the attention's scratch
// (AttentionShape::rounded_out_only), in the shared kAttentionContextSlot of a planned workspace.
bool context_only_rounded(const AttentionWeights& w) {
  return reads_bfloat16_input(w.o) && rounds_to_bfloat16(w.o);
}

// Q, K and V's buffers (float q, k, v, or their bfloat16 rounded_q, rounded_k, rounded_v) for
// `query_rows` queries and `memory_rows` keys: one product's rows where the projections are
// stacked.
template <typename Sizer, typename T>
void projection_buffers(const AttentionWeights& w, Projected projected, int64_t query_rows,
                        int64_t memory_rows, DeviceBuffer<T>& q, DeviceBuffer<T>& k,
                        DeviceBuffer<T>& v, Sizer& sizer) {
  const int64_t d = w.q.out;
  if (stacks(w.qkv) && projected == Projected::kSelf) {
    sizer.need(q, query_rows * 3 * d);  // [B, T, 3D] rows q | k | v
    return;
  }
  sizer.need(q, query_rows * d);  // [B, Tq, D]
  if (projected == Projected::kQuery) return;
  if (stacks(w.kv)) {
    sizer.need(k, memory_rows * 2 * d);  // [B, Tk, 2D] rows k | v
  } else {
    sizer.need(k, memory_rows * d);  // [B, Tk, D]
    sizer.need(v, memory_rows * d);  // [B, Tk, D]
  }
}

// The buffers multi_head_attention_forward uses: its one size table. memory_rows: the rows its
// keys and values are projected from; query_rounded / memory_rounded: whether those inputs come
// with bfloat16 copies (AttentionInputs), which spare rounding them here; in_bfloat16: Q, K and V
// are written in bfloat16 alone (projects_in_bfloat16).
template <typename Sizer>
void forward_buffers(const AttentionWeights& w, int64_t heads, int64_t batch, int64_t query_len,
                     int64_t key_len, float dropout, Projected projected, int64_t memory_rows,
                     bool query_rounded, bool memory_rounded, bool in_bfloat16,
                     int64_t weight_floats, AttentionCache& cache, Sizer& sizer) {
  const int64_t d = w.q.out, query_rows = batch * query_len;
  const int64_t prob_count = batch * heads * query_len * key_len;
  if (context_only_rounded(w))
    sizer.need(cache.context, query_rows * d, kAttentionContextSlot);  // [B, Tq, D] scratch
  else
    sizer.need(cache.context, query_rows * d);  // [B, Tq, D]
  if (reads_bfloat16_input(w.o) && query_rows > 0)
    sizer.need(cache.rounded_context, query_rows * d);  // [B, Tq, D]
  // [B, H, Tq, Tk], or less where the backend keeps less for its backward (weight_floats).
  if (cache.keep_weights || dropout > 0.f) sizer.need(cache.probs, weight_floats);
  if (dropout > 0.f) sizer.need(cache.dropout_mask, prob_count);
  const bool rounds = rounds_to_bfloat16(w.q);
  if (rounds && !query_rounded && query_rows > 0)
    sizer.need(cache.rounded_query_input, query_rows * d);  // [B, Tq, D]
  if (in_bfloat16)
    projection_buffers(w, projected, query_rows, memory_rows, cache.rounded_q, cache.rounded_k,
                       cache.rounded_v, sizer);
  else
    projection_buffers(w, projected, query_rows, memory_rows, cache.q, cache.k, cache.v, sizer);
  if (rounds && !memory_rounded && projected == Projected::kCross && memory_rows > 0)
    sizer.need(cache.rounded_memory_input, memory_rows * d);  // [B, Tk, D]
}

// The scratch multi_head_attention_backward uses (its products' own aside). The gradients of
// stacked projections lie side by side as the projections do: dq | dk | dv in dq's rows for
// self-attention, dk | dv in dk's for cross-attention; so do their rounded copies. in_bfloat16:
// the forward projected in bfloat16 alone (projects_in_bfloat16), and W_o's input gradient, which
// the attention's backward reads, is written so too.
template <typename Sizer>
void backward_buffers(const AttentionWeights& w, int64_t batch, int64_t query_len, int64_t key_len,
                      bool in_bfloat16, BackwardScratch& scratch, Sizer& sizer) {
  const int64_t d = w.q.out, query_rows = batch * query_len, key_rows = batch * key_len;
  const bool rounds = rounds_to_bfloat16(w.q) && query_rows > 0;
  if (in_bfloat16)
    sizer.need(scratch.rounded_d_context, query_rows * d);  // [B, Tq, D]
  else
    sizer.need(scratch.d_context, query_rows * d);  // [B, Tq, D]
  if (stacks(w.qkv)) {
    sizer.need(scratch.dq, query_rows * 3 * d);                      // [B, T, 3D]
    if (rounds) sizer.need(scratch.rounded_dq, query_rows * 3 * d);  // [B, T, 3D]
    return;
  }
  const int64_t key_width = stacks(w.kv) ? 2 * d : d;       // dk's columns (with dv's: stacked)
  sizer.need(scratch.dq, query_rows * d);                   // [B, Tq, D]
  sizer.need(scratch.dk, key_rows * key_width);             // [B, Tk, D] or [B, Tk, 2D]
  if (!stacks(w.kv)) sizer.need(scratch.dv, key_rows * d);  // [B, Tk, D]
  if (rounds) {
    sizer.need(scratch.rounded_dq, query_rows * d);  // [B, Tq, D]
    if (key_len > 0) {
      sizer.need(scratch.rounded_dk, key_rows * key_width);             // as dk
      if (!stacks(w.kv)) sizer.need(scratch.rounded_dv, key_rows * d);  // [B, Tk, D]
    }
  }
}

// Q, K, V of one attention call and their row strides: in float32, or in bfloat16 alone
// (AttentionCache::projected_in_bfloat16; the float pointers then null).
struct Projections {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  const uint16_t *rounded_q = nullptr, *rounded_k = nullptr, *rounded_v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
};

// Where project() leaves Q, K and V in the cache (sized by forward_buffers), which the backward
// reads: side by side in one product's rows where the projections are stacked.
Projections saved_projections(const AttentionWeights& w, Projected projected,
                              AttentionCache& cache) {
  const int64_t d = w.q.out;
  const bool self_stacked = stacks(w.qkv) && projected == Projected::kSelf;
  const bool kv_stacked = !self_stacked && stacks(w.kv);  // as project() writes them
  Projections p;
  // [B, T, 3D] rows q | k | v; [B, Tk, 2D] rows k | v; else a buffer each.
  p.q_stride = self_stacked ? 3 * d : d;
  p.k_stride = p.v_stride = projected == Projected::kQuery ? 0
                            : self_stacked                 ? 3 * d
                            : kv_stacked                   ? 2 * d
                                                           : d;
  const auto place = [&](const auto* q, const auto* k, const auto* v, auto& at_q, auto& at_k,
                         auto& at_v) {
    at_q = q;
    if (projected == Projected::kQuery) return;
    at_k = self_stacked ? q + d : k;
    at_v = self_stacked ? q + 2 * d : kv_stacked ? k + d : v;
  };
  if (cache.projected_in_bfloat16)
    place(cache.rounded_q.data(), cache.rounded_k.data(), cache.rounded_v.data(), p.rounded_q,
          p.rounded_k, p.rounded_v);
  else
    place(cache.q.data(), cache.k.data(), cache.v.data(), p.q, p.k, p.v);
  return p;
}

// Q, K and V of an attention call for its AttentionShape: their strides, and where they are in
// bfloat16 alone, the copies.
void read_projections(const Projections& p, AttentionShape& shape) {
  shape.q_row_stride = p.q_stride;
  shape.k_row_stride = p.k_stride;
  shape.v_row_stride = p.v_stride;
  shape.rounded_q = p.rounded_q;
  shape.rounded_k = p.rounded_k;
  shape.rounded_v = p.rounded_v;
}

// Q from query_input, and K, V from memory_input unless it is null, into the cache: one stacked
// product where the weights are stacked, else one product each; in float32, or in bfloat16 alone
// where cache.projected_in_bfloat16. In bfloat16 the inputs' rounded copies are the given ones
// (null: rounded here), kept in cache.rounded_query / rounded_memory for the backward.
Projections project(const Backend& backend, const AttentionWeights& w, Projected projected,
                    const float* query_input, const float* memory_input,
                    const uint16_t* given_rounded_query, const uint16_t* given_rounded_memory,
                    int64_t query_rows, int64_t key_rows, AttentionCache& cache) {
  const int64_t d = w.q.out;
  // y = x·Wᵀ + b of one view into its float buffer, or its bfloat16 one alone.
  const auto multiply = [&](const LinearWeights& l, const float* x, const uint16_t* rounded_x,
                            int64_t rows, DeviceBuffer<float>& y,
                            DeviceBuffer<uint16_t>& rounded_y) {
    if (cache.projected_in_bfloat16)
      linear_forward(backend, l, x, rows, nullptr, rounded_x, false, rounded_y.data());
    else
      linear_forward(backend, l, x, rows, y.data(), rounded_x);
  };
  const uint16_t* rounded_query =
      given_rounded_query
          ? given_rounded_query
          : rounded_copy(backend, w.q, query_input, query_rows, d, cache.rounded_query_input);
  cache.rounded_query = rounded_query;
  if (stacks(w.qkv) && projected == Projected::kSelf) {
    cache.rounded_memory = rounded_query;
    multiply(w.qkv, query_input, rounded_query, query_rows, cache.q, cache.rounded_q);
    return saved_projections(w, projected, cache);
  }
  multiply(w.q, query_input, rounded_query, query_rows, cache.q, cache.rounded_q);
  if (projected == Projected::kQuery) return saved_projections(w, projected, cache);
  const uint16_t* rounded_memory =
      projected == Projected::kSelf ? rounded_query
      : given_rounded_memory
          ? given_rounded_memory
          : rounded_copy(backend, w.q, memory_input, key_rows, d, cache.rounded_memory_input);
  cache.rounded_memory = rounded_memory;
  if (stacks(w.kv)) {
    multiply(w.kv, memory_input, rounded_memory, key_rows, cache.k, cache.rounded_k);
  } else {
    multiply(w.k, memory_input, rounded_memory, key_rows, cache.k, cache.rounded_k);
    multiply(w.v, memory_input, rounded_memory, key_rows, cache.v, cache.rounded_v);
  }
  return saved_projections(w, projected, cache);
}

}  // namespace

void multi_head_attention_forward(const Backend& backend, const AttentionWeights& w, int64_t heads,
                                  const AttentionInputs& in, AttentionCache& cache, float* out) {
  const int64_t d = w.q.out;
  const int64_t query_rows = in.batch * in.query_len, key_rows = in.batch * in.key_len;
  // Incremental decoding projects only this position: its q, k, v in self-attention (k and v
  // are appended to the cache), its q alone in cross-attention (the keys are cached already).
  const bool appends = in.cached && in.cached->append_rows;
  const float* memory_input = in.cached && !appends ? nullptr : in.memory_input;
  const int64_t memory_rows = in.cached ? query_rows : key_rows;
  const Projected projected = !memory_input                    ? Projected::kQuery
                              : memory_input == in.query_input ? Projected::kSelf
                                                               : Projected::kCross;
  // The given bfloat16 copies, where this call's projections read them.
  const bool reads =
      reads_bfloat16_input(projected == Projected::kSelf && stacks(w.qkv) ? w.qkv : w.q);
  const uint16_t* rounded_query = reads ? in.rounded_query_input : nullptr;
  const uint16_t* rounded_memory =
      reads && projected == Projected::kCross ? in.rounded_memory_input : nullptr;
  AttentionShape shape = attention_shape(w, in, heads, d);
  cache.projected_in_bfloat16 =
      !in.cached && projects_in_bfloat16(backend, w, shape, in.mask, in.dropout);
  Allocate sizer{backend};
  forward_buffers(w, heads, in.batch, in.query_len, in.key_len, in.dropout, projected, memory_rows,
                  rounded_query != nullptr, rounded_memory != nullptr, cache.projected_in_bfloat16,
                  in.cached ? in.batch * heads * in.query_len * in.key_len  // over cached rows
                            : weight_floats(backend, shape, in.mask, in.dropout),
                  cache, sizer);
  float* context = cache.context.data();                     // [B, Tq, D]
  const bool keep = cache.keep_weights || in.dropout > 0.f;  // dropout needs the weights
  float* probs = keep ? cache.probs.data() : nullptr;        // weight_floats
  Projections p = project(backend, w, projected, in.query_input, memory_input, rounded_query,
                          rounded_memory, query_rows, memory_rows, cache);
  const CachedKeysValues* kv = in.cached;
  const bool cache_16_bits = kv && kv->keys_16_bits;
  // Keys and values side by side both in the projection's rows (the stacked Q|K|V product) and
  // in the cache's (IncrementalDecoder's): one append writes both.
  const bool side_by_side =
      appends && p.v == p.k + d && p.v_stride == p.k_stride &&
      (cache_16_bits ? kv->values_16_bits == kv->keys_16_bits + d : kv->values == kv->keys + d);
  const int64_t appended = side_by_side ? 2 * d : d;  // columns of each append
  if (appends && cache_16_bits) {
    backend.scatter_rows_to_16_bits(p.k, p.k_stride, kv->append_rows, in.batch, appended,
                                    kv->format, kv->keys_16_bits, kv->row_stride);
    if (!side_by_side)
      backend.scatter_rows_to_16_bits(p.v, p.v_stride, kv->append_rows, in.batch, d, kv->format,
                                      kv->values_16_bits, kv->row_stride);
  } else if (appends) {
    backend.scatter_rows(p.k, p.k_stride, kv->append_rows, in.batch, appended, kv->keys,
                         kv->row_stride);
    if (!side_by_side)
      backend.scatter_rows(p.v, p.v_stride, kv->append_rows, in.batch, d, kv->values,
                           kv->row_stride);
  }
  if (kv) {
    p.k = kv->keys;
    p.v = kv->values;
    p.k_stride = p.v_stride = kv->row_stride;
    shape.key_rows = kv->key_rows;
    shape.key_rows_stride = kv->key_rows_stride;
  }
  // W_o's bfloat16 copy of the context, written by the attention itself where W_o reads one.
  uint16_t* rounded_context = reads_bfloat16_input(w.o) && query_rows > 0
                                  ? cache.rounded_context.data()  // [B, Tq, D]
                                  : nullptr;
  shape.rounded_out = rounded_context;
  shape.rounded_out_only = rounded_context && context_only_rounded(w);
  read_projections(p, shape);
  AttentionDropout dropout;
  if (in.dropout > 0.f) {
    dropout.p = in.dropout;
    dropout.mask = cache.dropout_mask.data();
    dropout.key = in.dropout_key;
  }
  cache.dropout_key = in.dropout_key;
  if (cache_16_bits)
    backend.attention_forward_16_bit_cache(shape, in.mask, p.q, kv->format, kv->keys_16_bits,
                                           kv->values_16_bits, probs, context);
  else
    backend.attention_forward(shape, in.mask, p.q, p.k, p.v, probs, context, dropout);
  linear_forward(backend, w.o, context, query_rows, out, rounded_context);
}

namespace {

// The shape a plan's forward call will have (its mask's key_batch null, as a plan's mask is).
AttentionShape planned_shape(const AttentionWeights& w, int64_t heads, int64_t batch,
                             int64_t query_len, int64_t key_len) {
  AttentionInputs whole;
  whole.batch = batch;
  whole.query_len = query_len;
  whole.key_len = key_len;
  return attention_shape(w, whole, heads, w.q.out);
}

// projects_in_bfloat16 for a plan.
bool planned_in_bfloat16(const Backend& backend, const AttentionWeights& w, int64_t heads,
                         int64_t batch, int64_t query_len, int64_t key_len, float dropout) {
  return projects_in_bfloat16(backend, w, planned_shape(w, heads, batch, query_len, key_len), {},
                              dropout);
}

}  // namespace

void plan_multi_head_attention_forward(const Backend& backend, const AttentionWeights& w,
                                       int64_t heads, int64_t batch, int64_t query_len,
                                       int64_t key_len, float dropout, bool self_attention,
                                       bool query_rounded, bool memory_rounded,
                                       AttentionCache& cache, WorkspacePlan& plan) {
  const bool rounds = rounds_to_bfloat16(w.q);
  const bool in_bfloat16 =
      planned_in_bfloat16(backend, w, heads, batch, query_len, key_len, dropout);
  forward_buffers(
      w, heads, batch, query_len, key_len, dropout,
      self_attention ? Projected::kSelf : Projected::kCross, batch * key_len,
      rounds && query_rounded, rounds && !self_attention && memory_rounded, in_bfloat16,
      weight_floats(backend, planned_shape(w, heads, batch, query_len, key_len), {}, dropout),
      cache, plan);
}

void plan_multi_head_attention_backward(const Backend& backend, const AttentionWeights& w,
                                        int64_t heads, int64_t batch, int64_t query_len,
                                        int64_t key_len, float dropout, BackwardScratch& scratch,
                                        WorkspacePlan& plan) {
  backward_buffers(w, batch, query_len, key_len,
                   planned_in_bfloat16(backend, w, heads, batch, query_len, key_len, dropout),
                   scratch, plan);
  for (const LinearWeights* l : {&w.o, &w.q})
    plan_linear_backward(*l, batch * query_len, scratch, plan);
  for (const LinearWeights* l : {&w.k, &w.v})
    plan_linear_backward(*l, batch * key_len, scratch, plan);
}

void multi_head_attention_backward(const Backend& backend, const AttentionWeights& w,
                                   const Attention<float>& g, int64_t heads,
                                   const AttentionInputs& in, AttentionCache& cache,
                                   const float* d_out, const uint16_t* rounded_d_out,
                                   BackwardScratch& scratch, float* d_query_input, bool accumulate,
                                   float* d_memory_input) {
  const int64_t d = w.q.out;
  const int64_t query_rows = in.batch * in.query_len, key_rows = in.batch * in.key_len;
  const Projected projected =
      in.memory_input == in.query_input ? Projected::kSelf : Projected::kCross;
  const bool self_stacked = stacks(w.qkv) && projected == Projected::kSelf;
  if (stacks(w.qkv) && (!self_stacked || d_memory_input != d_query_input))
    throw std::logic_error(
        "multi_head_attention_backward: stacked Q|K|V projections read one input and give one "
        "gradient");
  const bool in_bfloat16 = cache.projected_in_bfloat16;
  Allocate sizer{backend};
  backward_buffers(w, in.batch, in.query_len, in.key_len, in_bfloat16, scratch, sizer);
  const uint16_t* rounded_context =
      rounds_to_bfloat16(w.o) ? cache.rounded_context.data() : nullptr;
  // W_o's input gradient, the attention's d_out: in float32, or in bfloat16 alone where the
  // attention reads Q, K and V so (it reads d_out so too).
  float* d_context = nullptr;             // [B, Tq, D]
  uint16_t* rounded_d_context = nullptr;  // [B, Tq, D]
  if (in_bfloat16) {
    rounded_d_context = scratch.rounded_d_context.data();
    if (!rounded_d_out)
      rounded_d_out = rounded_copy(backend, w.o, d_out, query_rows, w.o.out, scratch.rounded_d_out);
    linear_input_backward(backend, w.o, d_out, rounded_d_out, query_rows, nullptr, false,
                          rounded_d_context);
    linear_parameter_backward(backend, w.o, g.o, cache.context.data(), rounded_context, d_out,
                              rounded_d_out, w.o.out, query_rows);
  } else {
    d_context = scratch.d_context.data();
    linear_backward(backend, w.o, g.o, cache.context.data(), d_out, query_rows, d_context, false,
                    scratch, rounded_context, rounded_d_out);
  }
  AttentionDropout dropout;
  if (in.dropout > 0.f) {
    dropout.p = in.dropout;
    dropout.mask = cache.dropout_mask.data();
    dropout.key = cache.dropout_key;  // the forward's
  }
  // Q, K, V where the forward left them, and their gradients in the same layout
  // (backward_buffers): dq | dk | dv side by side for stacked Q|K|V, dk | dv for stacked K|V.
  const Projections p = saved_projections(w, projected, cache);
  AttentionShape shape = attention_shape(w, in, heads, d);
  read_projections(p, shape);
  shape.rounded_d_out = rounded_d_context;
  const bool kv_stacked = !self_stacked && stacks(w.kv);
  float* dq = scratch.dq.data();
  float* dk = self_stacked ? dq + d : scratch.dk.data();
  float* dv = self_stacked ? dq + 2 * d : kv_stacked ? dk + d : scratch.dv.data();
  // Training in bfloat16: the gradients' bfloat16 copies, which the projections' backward
  // products read, written by the attention's backward.
  const bool rounded = rounds_to_bfloat16(w.q);
  if (rounded && query_rows > 0) {
    // The products read the copies, and so do the bias gradients (bias_backward's rounded_dy).
    shape.rounded_gradients_only = true;
    shape.rounded_dq = scratch.rounded_dq.data();
    if (key_rows > 0) {
      shape.rounded_dk = self_stacked ? shape.rounded_dq + d : scratch.rounded_dk.data();
      shape.rounded_dv = self_stacked ? shape.rounded_dq + 2 * d
                         : kv_stacked ? shape.rounded_dk + d
                                      : scratch.rounded_dv.data();
    }
  }
  backend.attention_backward(shape, in.mask, p.q, p.k, p.v, cache.probs.data(), dropout, d_context,
                             dq, dk, dv, g.additive_v);
  // The inputs' bfloat16 copies this cache's forward read (training in bfloat16: the same
  // weights' precision and batch as this backward's, which the caller guarantees), else null.
  // Its own, or its producers' (AttentionCache::rounded_query), which a training pass keeps.
  const uint16_t* rounded_query = rounded ? cache.rounded_query : nullptr;
  const uint16_t* rounded_memory = rounded ? cache.rounded_memory : nullptr;
  // With dot-product scores the key bias adds q·b_k to every logit of a query's row, which
  // softmax ignores: its gradient is exactly zero. Computing it would give float rounding noise,
  // which Adam's m/√v scales up to steps of ~lr (and which differs between data-parallel
  // replicas), so it stays zero. Inside additive scores' tanh(q + k) the bias does matter.
  Linear<float> key_grads = g.k;
  if (w.scoring != AttentionScoring::kAdditive) key_grads.bias = nullptr;
  if (self_stacked) {
    // dx = [dQ dK dV] · [W_q; W_k; W_v]: one product over the stacked gradients.
    if (d_query_input)
      linear_input_backward(backend, w.qkv, dq, shape.rounded_dq, query_rows, d_query_input,
                            accumulate);
    linear_parameter_backward(backend, w.q, g.q, in.query_input, rounded_query, dq,
                              shape.rounded_dq, 3 * d, query_rows);
    linear_parameter_backward(backend, w.k, key_grads, in.memory_input, rounded_memory, dk,
                              shape.rounded_dk, 3 * d, key_rows);
    linear_parameter_backward(backend, w.v, g.v, in.memory_input, rounded_memory, dv,
                              shape.rounded_dv, 3 * d, key_rows);
    return;
  }
  linear_backward(backend, w.q, g.q, in.query_input, dq, query_rows, d_query_input, accumulate,
                  scratch, rounded_query, shape.rounded_dq);
  if (kv_stacked) {
    // d_memory += [dK dV] · [W_k; W_v]: one product over the stacked gradients.
    if (d_memory_input)
      linear_input_backward(backend, w.kv, dk, shape.rounded_dk, key_rows, d_memory_input, true);
    linear_parameter_backward(backend, w.k, key_grads, in.memory_input, rounded_memory, dk,
                              shape.rounded_dk, 2 * d, key_rows);
    linear_parameter_backward(backend, w.v, g.v, in.memory_input, rounded_memory, dv,
                              shape.rounded_dv, 2 * d, key_rows);
    return;
  }
  linear_backward(backend, w.k, key_grads, in.memory_input, dk, key_rows, d_memory_input, true,
                  scratch, rounded_memory, shape.rounded_dk);
  linear_backward(backend, w.v, g.v, in.memory_input, dv, key_rows, d_memory_input, true, scratch,
                  rounded_memory, shape.rounded_dv);
}

}  // namespace tfm
