// Views of a model's parameter tensors, grouped the way the layers use them. Binding checks
// every tensor's presence and shape against the config, so layers never see a bad weight.
#pragma once

#include <vector>

#include "backend/device_int8_weights.h"
#include "backend/device_tensors.h"
#include "model/config.h"
#include "tensor/int8_weights.h"
#include "tensor/tensor.h"

namespace tfm {

// Each view is a template over the element type: `const float` for weights, `float` for the
// gradients, which are bound from a DeviceTensors of the same names and shapes. A shared embedding
// binds one gradient buffer to all of its uses, so their gradients add up.
template <typename F>
struct Linear {
  F* weight = nullptr;  // [out, in]
  F* bias = nullptr;    // [out] or null
  int64_t in = 0, out = 0;
  // The weight prepared for inference in a backend's layout and number format
  // (model/prepared_weights.h); products read it instead of `weight`. Null: they read `weight`
  // (training, whose weights change every step).
  const PreparedMatrix* prepared = nullptr;
  // A model loaded for int8 inference holds the weight only in int8 (weight null): what its
  // int8 product is prepared from, once (Model::prepared frees the rows afterwards).
  Int8Rows int8;
  // The number format of the products that read `weight` itself (training's forward and every
  // backward product): float32, or bfloat16 for `train --compute-type bfloat16` (weights,
  // activations and gradients rounded to bfloat16 at the product's inputs, float32
  // accumulation; the weights themselves stay float32).
  Precision precision = Precision::kFloat32;
  // Training in bfloat16: the weight rounded to bfloat16 once per pass (with_rounded_weights),
  // which the products read instead of rounding `weight` at each one. Null: not rounded yet.
  const uint16_t* rounded = nullptr;  // [out, in]
  // The bias rounded so too (with_rounded_weights), which a product writing its output in
  // bfloat16 alone adds instead (MatmulEpilogue::rounded_bias: a GPU library rounds a bias it
  // adds to a bfloat16 output, as PyTorch's autocast does). Null: none.
  const uint16_t* rounded_bias = nullptr;  // [out]
  // Training's views (with_product_precision): their products may run on the algorithm a
  // backend timed fastest for their shape (MatmulEpilogue::may_tune).
  bool tuned_products = false;
};

template <typename F>
struct LayerNormParams {
  F* weight = nullptr;  // [d_model]
  F* bias = nullptr;    // [d_model]
};

template <typename F>
struct Attention {
  Linear<F> q, k, v, o;
  AttentionScoring scoring = AttentionScoring::kScaledDot;  // config "attention"
  F* additive_v = nullptr;  // [heads, d_k] when scoring is additive, else null
  // The projections that read one input stacked into one product, W_q|W_k|W_v [3D, D] for
  // self-attention and W_k|W_v [2D, D] for cross-attention (weight null, bias stacked or null):
  // prepared weights (prepared set), or training in bfloat16 (with_product_precision describes
  // them, with_rounded_weights points `rounded` at the parts' adjacent rounded copies and `bias`
  // at a copy of theirs). out 0: three / two products.
  Linear<F> qkv, kv;

  // What the attention kernels need to score queries against keys.
  AttentionScore score() const { return {scoring, additive_v}; }
};

template <typename F>
struct FeedForward {
  Linear<F> fc1, fc2;  // fc1: [d_ff, d_model], fc2: [d_model, d_ff]
};

template <typename F>
struct EncoderLayer {
  Attention<F> self_attn;
  LayerNormParams<F> norm1;
  FeedForward<F> ffn;
  LayerNormParams<F> norm2;
};

template <typename F>
struct DecoderLayer {
  Attention<F> self_attn;
  LayerNormParams<F> norm1;
  Attention<F> cross_attn;
  LayerNormParams<F> norm2;
  FeedForward<F> ffn;
  LayerNormParams<F> norm3;
};

template <typename F>
struct TransformerParams {
  F* src_embed = nullptr;  // [src_vocab, d_model]
  F* tgt_embed = nullptr;  // [tgt_vocab, d_model]
  // A model loaded for int8 inference holds its embeddings in int8 too: then src_embed /
  // tgt_embed are null and these views set (row i = values[i] · scales[i]).
  Int8Rows src_embed_int8, tgt_embed_int8;
  // A float32 model prepared for inference only whose output projection is tied to the target
  // embedding reads the embedding rows from that projection's prepared matrix (and frees the
  // table): then these are set and the float views null.
  const PreparedMatrix* src_embed_prepared = nullptr;
  const PreparedMatrix* tgt_embed_prepared = nullptr;
  Linear<F>
      output;  // weight [tgt_vocab, d_model] (may alias an embedding), bias [tgt_vocab] or null
  F* encoder_pos_embed = nullptr;  // [max_positions, d_model] when learned
  F* decoder_pos_embed = nullptr;
  std::vector<EncoderLayer<F>> encoder_layers;
  LayerNormParams<F> encoder_norm;  // pre-norm only
  std::vector<DecoderLayer<F>> decoder_layers;
  LayerNormParams<F> decoder_norm;  // pre-norm only
};

// An embedding table as the layers read it: float32 rows, int8 rows with a scale each, or the
// rows of a prepared float32 matrix.
struct EmbeddingTable {
  const float* values = nullptr;             // [vocab, d_model]; null when held otherwise
  Int8Rows int8;                             // values [vocab, d_model], scales [vocab]
  const PreparedMatrix* prepared = nullptr;  // [vocab, d_model] (a tied output projection)
};

using LinearWeights = Linear<const float>;
using LayerNormWeights = LayerNormParams<const float>;
using AttentionWeights = Attention<const float>;
using FeedForwardWeights = FeedForward<const float>;
using EncoderLayerWeights = EncoderLayer<const float>;
using DecoderLayerWeights = DecoderLayer<const float>;
using TransformerWeights = TransformerParams<const float>;
using TransformerGradients = TransformerParams<float>;

// Throws Error("<where>: missing tensor ..." / "... has shape ..., expected ...") on mismatch,
// and on tensors the config does not use (of a model's tensors, or a file's declared shapes
// before its data is read).
void check_parameter_shapes(const ModelConfig& config, const std::map<std::string, Shape>& shapes,
                            const std::string& where);

inline EmbeddingTable source_embedding(const TransformerWeights& w) {
  return {w.src_embed, w.src_embed_int8, w.src_embed_prepared};
}
inline EmbeddingTable target_embedding(const TransformerWeights& w) {
  return {w.tgt_embed, w.tgt_embed_int8, w.tgt_embed_prepared};
}

// Views into `tensors` (which must outlive the result); checks as above. The linear weights
// found in `int8` (which must outlive the result too) are bound to it instead.
TransformerWeights bind_weights(const ModelConfig& config, const DeviceTensors& tensors,
                                const std::string& where, const DeviceInt8Weights* int8 = nullptr);
// The same over gradient buffers (the parameters' names and shapes, in a backend's memory).
TransformerGradients bind_gradients(const ModelConfig& config, DeviceTensors& gradients);

// `weights` with every Linear's product precision set to `precision` (training in bfloat16),
// and in bfloat16 the stacked views of the attentions' projections described (Attention::qkv
// for self-attention, kv for cross-attention: shapes and precision, with_rounded_weights fills
// their pointers), where every part is multiplied in bfloat16 from its float weight (unless
// TFM_STACKED_PROJECTIONS=0).
TransformerWeights with_product_precision(TransformerWeights weights, Precision precision);

// Elements of bfloat16 storage that with_rounded_weights needs for `weights`: Σ out · in of
// every linear multiplied in bfloat16 from its float weight (0 where none is), and its bias's
// out (in whole words of eight).
int64_t rounded_weights_elements(const TransformerWeights& weights);
// Elements of float storage for the stacked views' biases: Σ out of those with biases.
int64_t stacked_bias_elements(const TransformerWeights& weights);
// `weights` with each such linear's weight (and bias: rounded_bias) rounded to bfloat16 into
// `storage` (grown to rounded_weights_elements) and its `rounded` pointing there: training in
// bfloat16 rounds each
// weight once per pass instead of at each of its forward and backward products. The parts of a
// stacked view are rounded one after another, so the view's [out, in] weight is theirs in
// place; its bias is copied into `stacked_biases` (grown to stacked_bias_elements), and its
// rounded bias is its parts' in place where they lie one after another.
TransformerWeights with_rounded_weights(const Backend& backend, TransformerWeights weights,
                                        DeviceBuffer<uint16_t>& storage,
                                        DeviceBuffer<float>& stacked_biases);

// Single-layer binders used by tests and tools: prefix like "encoder.layers.0".
// The layer's attentions score with `scoring` (additive: their .additive_v tensors are bound).
EncoderLayerWeights bind_encoder_layer(const TensorMap& tensors, const std::string& prefix,
                                       AttentionScoring scoring = AttentionScoring::kScaledDot);
DecoderLayerWeights bind_decoder_layer(const TensorMap& tensors, const std::string& prefix,
                                       AttentionScoring scoring = AttentionScoring::kScaledDot);

}  // namespace tfm
