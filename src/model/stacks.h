// The encoder and decoder stacks of §3.1 (Figure 1) as forward / backward pairs. Each layer is
// a chain of residual sublayers — post-norm LayerNorm(x + Dropout(F(x))) as in the paper, or
// pre-norm x + Dropout(F(LayerNorm(x))) — and saves what its backward needs in its cache.
// Inference runs the same code with one layer cache reused by every layer, and dropout 0.
#pragma once

#include <cstdint>
#include <vector>

#include "model/feed_forward.h"
#include "model/linear.h"
#include "model/multi_head_attention.h"
#include "model/workspace_slots.h"

namespace tfm {

class Model;
struct TokenBatch;
struct BatchShape;

struct LayerNormCache {
  DeviceBuffer<float> mean;  // [rows]
  DeviceBuffer<float> rstd;  // [rows]
};

// One residual sublayer around a function F (attention or feed-forward).
struct SublayerCache {
  explicit SublayerCache(SharedSlot slot) : output_slot(slot) {}
  DeviceBuffer<float> normed;    // [rows, D] pre-norm: LayerNorm(input), F's input
  DeviceBuffer<float> residual;  // [rows, D] post-norm: input + Dropout(F), the norm's input
  LayerNormCache norm;
  DeviceBuffer<uint8_t> dropout_mask;  // [rows, D] when dropout > 0 (dropout_mask_buffer)
  uint64_t dropout_key = 0;    // the forward's, from which the backward draws its decisions again
  DeviceBuffer<float> output;  // [rows, D]
  SharedSlot output_slot;      // its place in the layer (model/workspace_slots.h)
  // [rows, D] output in bfloat16 where sublayer_rounds_for (model/sublayer.h): what the next
  // sublayer's first products read, and their weight gradients. output_rounded is its data where
  // the last pass wrote it, else null.
  DeviceBuffer<uint16_t> rounded_output;
  const uint16_t* output_rounded = nullptr;
  MatmulOperand output_operand() const { return {output.data(), output_rounded}; }
};

struct EncoderLayerCache {
  SublayerCache attention_sublayer{kSelfAttentionOutputSlot}, ffn_sublayer{kFeedForwardOutputSlot};
  AttentionCache self_attn;
  FeedForwardCache ffn;
  const float* output() const { return ffn_sublayer.output.data(); }  // [B, S, D]
  MatmulOperand output_operand() const { return ffn_sublayer.output_operand(); }
};

struct DecoderLayerCache {
  SublayerCache self_sublayer{kSelfAttentionOutputSlot}, cross_sublayer{kCrossAttentionOutputSlot},
      ffn_sublayer{kFeedForwardOutputSlot};
  AttentionCache self_attn, cross_attn;
  FeedForwardCache ffn;
  const float* output() const { return ffn_sublayer.output.data(); }  // [B, T, D]
  MatmulOperand output_operand() const { return ffn_sublayer.output_operand(); }
};

// Dropout probabilities and the key that makes every mask of one step reproducible.
struct DropoutOptions {
  float dropout = 0.f;            // sublayer outputs and embedding sums (the paper's P_drop)
  float attention_dropout = 0.f;  // attention weights
  float relu_dropout = 0.f;       // feed-forward hidden layer
  uint64_t seed = 0;              // mixed with a site number per dropout location
};

struct StackCache {
  bool training = false;  // keep every layer's cache for backward
  // The batch's index arrays in the backend's memory, where the operations read them:
  // encoder_forward uploads the source side, decoder_forward the target side (it needs the
  // source lengths encoder_forward uploaded into the same cache).
  DeviceBuffer<int32_t> src_ids;      // [B, S]
  DeviceBuffer<int32_t> src_lengths;  // [B]
  DeviceBuffer<int32_t> tgt_in;       // [B, T]
  DeviceBuffer<int32_t> tgt_lengths;  // [B]
  // The real target positions and their labels, for the output projection of scoring and the
  // loss (uploaded by target_states, model/transformer.h).
  DeviceBuffer<int64_t> target_rows;    // [tokens]
  DeviceBuffer<int32_t> target_labels;  // [tokens]
  DeviceBuffer<float> encoder_input;    // [B, S, D] embeddings + positions (after dropout)
  DeviceBuffer<uint8_t> encoder_input_mask;
  std::vector<EncoderLayerCache> encoder_layers;  // N when training, else 1 (reused)
  LayerNormCache encoder_norm;
  DeviceBuffer<float> memory;  // [B, S, D] encoder output
  // [B, S, D] memory in bfloat16 where the encoder's last sublayer wrote it so (post-norm, whose
  // final norm is a copy; a bfloat16 step), else null: the cross-attentions' keys and values
  // read it
  const uint16_t* rounded_memory = nullptr;
  DeviceBuffer<float> decoder_input;  // [B, T, D]
  DeviceBuffer<uint8_t> decoder_input_mask;
  std::vector<DecoderLayerCache> decoder_layers;
  LayerNormCache decoder_norm;
  DeviceBuffer<float> decoder_out;  // [B, T, D] pre-norm's final norm output (post-norm: unused)
  // [B, T, D] the decoder stack's output: decoder_out, or post-norm's last layer output read in
  // place (its final norm is the identity; nothing writes that layer's output before the
  // output head has read it)
  const float* decoder_output = nullptr;
};

// out [rows, D] = LayerNorm(in) where the stack is pre-norm (its final norm; cache, when given,
// already sized for `rows`, keeps the statistics its backward reads), else a copy of in. out may
// be in.
void final_norm(const Backend& backend, const ModelConfig& config, const LayerNormWeights& norm,
                const float* in, int64_t rows, LayerNormCache* cache, float* out);

// Single layers from `input`, output in the cache (used by the stacks and by layer-level tests).
// input: [B, S, D]; src_lengths: [B]; layer_index numbers the dropout sites.
void encoder_layer_forward(const Backend& backend, const ModelConfig& config,
                           const EncoderLayerWeights& w, MatmulOperand input, int64_t batch,
                           int64_t src_len, const int32_t* src_lengths,
                           const DropoutOptions& dropout, int64_t layer_index,
                           EncoderLayerCache& cache);
// Incremental decoding (one position of B hypotheses, tgt_len 1, no dropout): the KV-cache
// policy of decoder_layer_forward, i.e. where its attentions find their keys and values.
struct DecoderStep {
  int64_t position = 0;  // t: the query's position
  // Where each hypothesis' count of keys (its position + 1) lies in memory, [B], or null. With
  // it, the self-attention spans key_capacity keys, masked by those counts instead of by the
  // position, so no argument of the step's operations depends on t and a recording of them
  // (Backend::run_and_record) serves every step; without it, keys 0..position. Not with a
  // restricted self-attention window, whose mask needs the position.
  const int32_t* key_counts = nullptr;
  int64_t key_capacity = 0;
  const int32_t* sentence_of_query = nullptr;  // [B] encoder sequence each hypothesis reads
  CachedKeysValues self, cross;                // self: appended per step; cross: precomputed
  // Whether the last layer writes its output's bfloat16 copy too (sublayer_rounds_for the
  // output head's weights): a step projects all its rows at once and reads it.
  bool round_last_output = false;
};

// input: [B, T, D]; memory: [B, S, D]. With step (incremental decoding) memory is unused, T is 1
// and tgt_lengths null; src_lengths then has one entry per encoder sequence. input and memory
// carry their bfloat16 copies where their producers wrote them (MatmulOperand::rounded).
void decoder_layer_forward(const Backend& backend, const ModelConfig& config,
                           const DecoderLayerWeights& w, MatmulOperand input, int64_t batch,
                           int64_t tgt_len, const int32_t* tgt_lengths, MatmulOperand memory,
                           int64_t src_len, const int32_t* src_lengths,
                           const DropoutOptions& dropout, int64_t layer_index,
                           DecoderLayerCache& cache, const DecoderStep* step = nullptr);

// Backward of the layer forwards above (cache from a training forward, same arguments):
// d_stream [rows, D] holds the gradient of the layer's output and is replaced, in place, by that
// of its input; the layer's parameter gradients are accumulated into g, and the decoder layer
// adds its cross-attention's gradient of the encoder output to d_memory [B, S, D].
void encoder_layer_backward(const Backend& backend, const ModelConfig& config,
                            const EncoderLayerWeights& w, const EncoderLayer<float>& g,
                            const float* input, int64_t batch, int64_t src_len,
                            const int32_t* src_lengths, const DropoutOptions& dropout,
                            EncoderLayerCache& cache, float* d_stream, BackwardScratch& scratch);
void decoder_layer_backward(const Backend& backend, const ModelConfig& config,
                            const DecoderLayerWeights& w, const DecoderLayer<float>& g,
                            const float* input, int64_t batch, int64_t tgt_len,
                            const int32_t* tgt_lengths, const float* memory, int64_t src_len,
                            const int32_t* src_lengths, const DropoutOptions& dropout,
                            DecoderLayerCache& cache, float* d_stream, float* d_memory,
                            BackwardScratch& scratch);

// cache.memory = encoder stack output; cache.decoder_output = decoder stack output. w is
// model.weights() (training) or the model's prepared weights (inference, model.prepared()).
void encoder_forward(const Model& model, const TransformerWeights& w, const TokenBatch& batch,
                     const DropoutOptions& dropout, StackCache& cache);
void decoder_forward(const Model& model, const TransformerWeights& w, const TokenBatch& batch,
                     const DropoutOptions& dropout, StackCache& cache);

// What encoder_forward, decoder_forward and stacks_backward ask of the cache and the scratch
// for a batch of `shape` (with cache.training as the pass will set it): a workspace's plan.
void plan_encoder_forward(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                          const DropoutOptions& dropout, StackCache& cache, WorkspacePlan& plan);
void plan_decoder_forward(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                          const DropoutOptions& dropout, StackCache& cache, WorkspacePlan& plan);
void plan_stacks_backward(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                          const DropoutOptions& dropout, BackwardScratch& scratch,
                          WorkspacePlan& plan);

// Backward through both stacks (cache from a training forward with the weights `w`) given
// d_decoder_out [B, T, D], which it overwrites (post-norm: the decoder's residual-stream gradient
// in place); accumulates every parameter gradient, embeddings included.
void stacks_backward(const Model& model, const TransformerWeights& w, const TransformerGradients& g,
                     const TokenBatch& batch, const DropoutOptions& dropout, StackCache& cache,
                     float* d_decoder_out, BackwardScratch& scratch);

}  // namespace tfm
