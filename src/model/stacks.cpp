// Encoder / decoder layers and stacks, forward and backward.
#include "model/stacks.h"

#include <algorithm>

#include "model/embeddings.h"
#include "model/sublayer.h"
#include "model/transformer.h"

namespace tfm {

namespace {

// Dropout site numbers: every dropout location of a step gets its own mask key.
constexpr uint64_t kEncoderInputSite = 1, kDecoderInputSite = 2;
uint64_t encoder_site(int64_t layer, int offset) {
  return 1000 + uint64_t(layer) * 16 + uint64_t(offset);
}
uint64_t decoder_site(int64_t layer, int offset) {
  return 100000 + uint64_t(layer) * 16 + uint64_t(offset);
}

// x (and memory below) with the bfloat16 copies their producers wrote, if any (MatmulOperand).
AttentionInputs self_attention_inputs(const ModelConfig& config, MatmulOperand x, int64_t batch,
                                      int64_t len, const int32_t* lengths, bool causal,
                                      float dropout, uint64_t key) {
  AttentionInputs in;
  in.query_input = in.memory_input = x.values;
  in.rounded_query_input = x.rounded;
  in.batch = batch;
  in.query_len = in.key_len = len;
  in.mask.key_lengths = lengths;
  in.mask.causal = causal;
  in.mask.window = config.self_attention_window;
  in.dropout = dropout;
  in.dropout_key = key;
  return in;
}

AttentionInputs cross_attention_inputs(MatmulOperand x, MatmulOperand memory, int64_t batch,
                                       int64_t tgt_len, int64_t src_len, const int32_t* src_lengths,
                                       float dropout, uint64_t key) {
  AttentionInputs in;
  in.query_input = x.values;
  in.memory_input = memory.values;
  in.rounded_query_input = x.rounded;
  in.rounded_memory_input = memory.rounded;
  in.batch = batch;
  in.query_len = tgt_len;
  in.key_len = src_len;
  in.mask.key_lengths = src_lengths;
  in.dropout = dropout;
  in.dropout_key = key;
  return in;
}

// Whether a layer's cache keeps what only backward reads (attention weights, the feed-forward
// pre-activation).
void set_keep_for_backward(EncoderLayerCache& cache, bool keep) {
  cache.self_attn.keep_weights = cache.ffn.keep_pre_activation = keep;
}
void set_keep_for_backward(DecoderLayerCache& cache, bool keep) {
  cache.self_attn.keep_weights = cache.cross_attn.keep_weights = keep;
  cache.ffn.keep_pre_activation = keep;
}

// Training keeps every layer's cache (and attention weights) for backward; inference reuses one
// cache for every layer and streams attention. That is safe because a layer reads its input (the
// previous layer's output, in this same cache) only in its first sublayer, and rewrites that
// output only in its last.
template <typename LayerCache>
LayerCache& layer_cache(std::vector<LayerCache>& caches, bool training, int64_t layers, int64_t i) {
  const size_t needed = training ? size_t(layers) : size_t(std::min<int64_t>(layers, 1));
  if (caches.size() < needed) caches.resize(needed);
  LayerCache& cache = caches[training ? size_t(i) : 0];
  set_keep_for_backward(cache, training);
  return cache;
}

// The buffers of embed_with_dropout: its one size table.
// shared: the stack's sublayer outputs lie in shared slots (outputs_shared), and so does this
// sum, which the first sublayer alone reads, as it would a feed-forward sublayer's output.
template <typename Sizer>
void embed_buffers(const Backend& backend, const ModelConfig& config, int64_t batch, int64_t len,
                   float dropout, bool shared, DeviceBuffer<float>& out,
                   DeviceBuffer<uint8_t>& mask, Sizer& sizer) {
  const int64_t n = batch * len * config.d_model;
  if (shared)
    sizer.need(out, n, kFeedForwardOutputSlot);  // [B, len, D]
  else
    sizer.need(out, n);  // [B, len, D]
  dropout_mask_buffer(backend, dropout, n, mask, sizer);
}

// Whether a layer's float32 sublayer outputs lie in shared slots (sublayer_forward_buffers'
// output_shared): where its products read bfloat16 copies (sublayer_rounds_for), so that only
// the next sublayer's residual sum, or the stack's final copy, reads a float32 output.
template <typename LayerWeights>
bool layer_outputs_shared(const ModelConfig& config, const LayerWeights& w) {
  return sublayer_rounds_for(config, w.ffn.fc1);
}
// The same for a stack's embeddings' sum, which its first layer alone reads: that layer's
// decision (every layer of a model takes the same).
template <typename Layers>
bool outputs_shared(const ModelConfig& config, const Layers& layers) {
  return !layers.empty() && layer_outputs_shared(config, layers.front());
}

// x [rows, D] = embeddings + positions, then dropout with its own mask.
void embed_with_dropout(const Backend& backend, const ModelConfig& config,
                        const EmbeddingTable& table, const float* positions, const int32_t* ids,
                        int64_t batch, int64_t len, float dropout, uint64_t key, bool shared,
                        DeviceBuffer<float>& out, DeviceBuffer<uint8_t>& mask) {
  Allocate sizer{backend};
  embed_buffers(backend, config, batch, len, dropout, shared, out, mask, sizer);
  const int64_t n = batch * len * config.d_model;
  float* x = out.data();  // [B, len, D]
  embed_forward(backend, config, table, positions, ids, batch, len, 0, x);
  dropout_forward(backend, x, n, dropout, key, mask);
}

// Whether a stack ends in a norm of its own, so that its output is that norm's value rather than
// its last layer's output: pre-norm's final norm; post-norm's is the identity. The encoder's memory
// is a value of its own either way (a decoding step keeps it after the layers' caches are reused).
bool has_final_norm(const ModelConfig& config) {
  return config.norm == NormPosition::kPre;
}

// The buffers of a stack's final norm: its output (where `out` holds it; post-norm's encoder
// copies the last layer's output there) and the statistics its backward reads.
template <typename Sizer>
void final_norm_buffers(const ModelConfig& config, int64_t rows, LayerNormCache& cache,
                        DeviceBuffer<float>* out, Sizer& sizer) {
  if (out) sizer.need(*out, rows * config.d_model);  // [rows, D]
  if (has_final_norm(config)) {
    sizer.need(cache.mean, rows);
    sizer.need(cache.rstd, rows);
  }
}
// The decoder's final norm output where it has one (has_final_norm), else null.
DeviceBuffer<float>* decoder_final_norm_output(const ModelConfig& config, StackCache& cache) {
  return has_final_norm(config) ? &cache.decoder_out : nullptr;
}

// The host-computed index arrays each stack uploads: its token ids and the batch's lengths.
template <typename Sizer>
void token_buffers(int64_t batch, int64_t len, DeviceBuffer<int32_t>& ids,
                   DeviceBuffer<int32_t>& lengths, Sizer& sizer) {
  sizer.need(ids, batch * len);  // [B, len]
  sizer.need(lengths, batch);    // [B]
}

// The scratch of stacks_backward itself (its layers' aside).
template <typename Sizer>
void stacks_backward_buffers(const ModelConfig& config, int64_t batch, int64_t src_len,
                             int64_t tgt_len, BackwardScratch& scratch, Sizer& sizer) {
  const int64_t d = config.d_model;
  if (has_final_norm(config))
    sizer.need(scratch.d_stream, batch * std::max(src_len, tgt_len) * d);  // [rows, D]
  sizer.need(scratch.d_memory, batch * src_len * d);                       // [B, S, D]
}

// Planning records where each layer cache is, so the vector gets all its layers before the
// first is planned (a later resize would move them).
template <typename LayerCache>
void make_layer_caches(std::vector<LayerCache>& caches, int64_t layers) {
  if (caches.size() < size_t(layers)) caches.resize(size_t(layers));
}

}  // namespace

void final_norm(const Backend& backend, const ModelConfig& config, const LayerNormWeights& norm,
                const float* in, int64_t rows, LayerNormCache* cache, float* out) {
  const int64_t d = config.d_model;
  if (has_final_norm(config)) {
    backend.layer_norm(in, norm.weight, norm.bias, out, rows, d, float(config.layer_norm_eps),
                       cache ? cache->mean.data() : nullptr, cache ? cache->rstd.data() : nullptr);
  } else if (in != out) {
    backend.copy(in, rows * d, out);
  }
}

void plan_encoder_forward(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                          const DropoutOptions& dropout, StackCache& cache, WorkspacePlan& plan) {
  const ModelConfig& config = model.config();
  const int64_t layers = config.encoder_layers, B = shape.batch, S = shape.src_len;
  make_layer_caches(cache.encoder_layers, layers);
  token_buffers(B, S, cache.src_ids, cache.src_lengths, plan);
  embed_buffers(model.backend(), config, B, S, dropout.dropout,
                outputs_shared(config, w.encoder_layers), cache.encoder_input,
                cache.encoder_input_mask, plan);
  for (int64_t i = 0; i < layers; ++i) {
    EncoderLayerCache& layer = layer_cache(cache.encoder_layers, cache.training, layers, i);
    const EncoderLayerWeights& lw = w.encoder_layers[size_t(i)];
    // As encoder_layer_forward and encoder_forward pass them: every sublayer's output rounded,
    // the first layer's input (the embeddings) not.
    const bool rounds = sublayer_rounds_for(config, lw.ffn.fc1);
    const bool shared = layer_outputs_shared(config, lw);
    const bool input_rounded =
        i > 0 && sublayer_rounds_for(config, w.encoder_layers[size_t(i - 1)].ffn.fc1);
    plan_sublayer_forward(model.backend(), config, B * S, dropout.dropout, rounds, shared,
                          layer.attention_sublayer, plan);
    plan_multi_head_attention_forward(model.backend(), lw.self_attn, config.heads, B, S, S,
                                      dropout.attention_dropout, true, input_rounded, false,
                                      layer.self_attn, plan);
    plan_sublayer_forward(model.backend(), config, B * S, dropout.dropout, rounds, shared,
                          layer.ffn_sublayer, plan);
    plan_feed_forward_forward(model.backend(), lw.ffn, config.activation, B * S,
                              dropout.relu_dropout, rounds, layer.ffn, plan);
  }
  final_norm_buffers(config, B * S, cache.encoder_norm, &cache.memory, plan);
}

void plan_decoder_forward(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                          const DropoutOptions& dropout, StackCache& cache, WorkspacePlan& plan) {
  const ModelConfig& config = model.config();
  const int64_t layers = config.decoder_layers, B = shape.batch, S = shape.src_len,
                T = shape.tgt_len;
  make_layer_caches(cache.decoder_layers, layers);
  token_buffers(B, T, cache.tgt_in, cache.tgt_lengths, plan);
  embed_buffers(model.backend(), config, B, T, dropout.dropout,
                outputs_shared(config, w.decoder_layers), cache.decoder_input,
                cache.decoder_input_mask, plan);
  for (int64_t i = 0; i < layers; ++i) {
    DecoderLayerCache& layer = layer_cache(cache.decoder_layers, cache.training, layers, i);
    const DecoderLayerWeights& lw = w.decoder_layers[size_t(i)];
    // As decoder_layer_forward and decoder_forward pass them: every sublayer's output rounded
    // but the last layer's (the output head's input), the first layer's input not, the memory
    // where the encoder's last layer rounded it.
    const bool rounds = sublayer_rounds_for(config, lw.ffn.fc1);
    const bool shared = layer_outputs_shared(config, lw);
    const bool input_rounded =
        i > 0 && sublayer_rounds_for(config, w.decoder_layers[size_t(i - 1)].ffn.fc1);
    const bool memory_rounded =
        !w.encoder_layers.empty() && sublayer_rounds_for(config, w.encoder_layers.back().ffn.fc1);
    plan_sublayer_forward(model.backend(), config, B * T, dropout.dropout, rounds, shared,
                          layer.self_sublayer, plan);
    plan_multi_head_attention_forward(model.backend(), lw.self_attn, config.heads, B, T, T,
                                      dropout.attention_dropout, true, input_rounded, false,
                                      layer.self_attn, plan);
    plan_sublayer_forward(model.backend(), config, B * T, dropout.dropout, rounds, shared,
                          layer.cross_sublayer, plan);
    plan_multi_head_attention_forward(model.backend(), lw.cross_attn, config.heads, B, T, S,
                                      dropout.attention_dropout, false, rounds, memory_rounded,
                                      layer.cross_attn, plan);
    plan_sublayer_forward(model.backend(), config, B * T, dropout.dropout, rounds && i + 1 < layers,
                          shared, layer.ffn_sublayer, plan);
    plan_feed_forward_forward(model.backend(), lw.ffn, config.activation, B * T,
                              dropout.relu_dropout, rounds, layer.ffn, plan);
  }
  final_norm_buffers(config, B * T, cache.decoder_norm, decoder_final_norm_output(config, cache),
                     plan);
}

void plan_stacks_backward(const Model& model, const TransformerWeights& w, const BatchShape& shape,
                          const DropoutOptions& dropout, BackwardScratch& scratch,
                          WorkspacePlan& plan) {
  const ModelConfig& config = model.config();
  const int64_t B = shape.batch, S = shape.src_len, T = shape.tgt_len;
  stacks_backward_buffers(config, B, S, T, scratch, plan);
  for (const DecoderLayerWeights& lw : w.decoder_layers) {
    plan_sublayer_backward(config, lw.ffn.fc2, B * T, scratch, plan);
    plan_sublayer_backward(config, lw.cross_attn.o, B * T, scratch, plan);
    plan_sublayer_backward(config, lw.self_attn.o, B * T, scratch, plan);
    plan_feed_forward_backward(lw.ffn, config.activation, B * T, dropout.relu_dropout, scratch,
                               plan);
    plan_multi_head_attention_backward(model.backend(), lw.cross_attn, config.heads, B, T, S,
                                       dropout.attention_dropout, scratch, plan);
    plan_multi_head_attention_backward(model.backend(), lw.self_attn, config.heads, B, T, T,
                                       dropout.attention_dropout, scratch, plan);
  }
  for (const EncoderLayerWeights& lw : w.encoder_layers) {
    plan_sublayer_backward(config, lw.ffn.fc2, B * S, scratch, plan);
    plan_sublayer_backward(config, lw.self_attn.o, B * S, scratch, plan);
    plan_feed_forward_backward(lw.ffn, config.activation, B * S, dropout.relu_dropout, scratch,
                               plan);
    plan_multi_head_attention_backward(model.backend(), lw.self_attn, config.heads, B, S, S,
                                       dropout.attention_dropout, scratch, plan);
  }
}

void encoder_layer_forward(const Backend& backend, const ModelConfig& config,
                           const EncoderLayerWeights& w, MatmulOperand input, int64_t batch,
                           int64_t src_len, const int32_t* src_lengths,
                           const DropoutOptions& dropout, int64_t layer_index,
                           EncoderLayerCache& cache) {
  const int64_t rows = batch * src_len;
  // The next layer's projections, or the decoder's of the encoder output, read the last output.
  const bool rounds = sublayer_rounds_for(config, w.ffn.fc1);
  const bool shared = layer_outputs_shared(config, w);
  sublayer_forward(backend, config, w.norm1, input, rows, dropout.dropout,
                   dropout_key(dropout.seed, encoder_site(layer_index, 0)), rounds, shared,
                   cache.attention_sublayer, [&](MatmulOperand x, float* out) {
                     AttentionInputs in = self_attention_inputs(
                         config, x, batch, src_len, src_lengths, false, dropout.attention_dropout,
                         dropout_key(dropout.seed, encoder_site(layer_index, 1)));
                     multi_head_attention_forward(backend, w.self_attn, config.heads, in,
                                                  cache.self_attn, out);
                   });
  sublayer_forward(backend, config, w.norm2, cache.attention_sublayer.output_operand(), rows,
                   dropout.dropout, dropout_key(dropout.seed, encoder_site(layer_index, 2)), rounds,
                   shared, cache.ffn_sublayer, [&](MatmulOperand x, float* out) {
                     feed_forward_forward(
                         backend, w.ffn, config.activation, x, rows, dropout.relu_dropout,
                         dropout_key(dropout.seed, encoder_site(layer_index, 3)), cache.ffn, out);
                   });
}

void decoder_layer_forward(const Backend& backend, const ModelConfig& config,
                           const DecoderLayerWeights& w, MatmulOperand input, int64_t batch,
                           int64_t tgt_len, const int32_t* tgt_lengths, MatmulOperand memory,
                           int64_t src_len, const int32_t* src_lengths,
                           const DropoutOptions& dropout, int64_t layer_index,
                           DecoderLayerCache& cache, const DecoderStep* step) {
  const int64_t rows = batch * tgt_len;
  const bool rounds = sublayer_rounds_for(config, w.ffn.fc1);
  const bool shared = layer_outputs_shared(config, w);
  sublayer_forward(backend, config, w.norm1, input, rows, dropout.dropout,
                   dropout_key(dropout.seed, decoder_site(layer_index, 0)), rounds, shared,
                   cache.self_sublayer, [&](MatmulOperand x, float* out) {
                     AttentionInputs in = self_attention_inputs(
                         config, x, batch, tgt_len, tgt_lengths, true, dropout.attention_dropout,
                         dropout_key(dropout.seed, decoder_site(layer_index, 1)));
                     if (step) {  // keys 0..t from the cache, this position's appended
                       in.cached = &step->self;
                       if (step->key_counts) {  // counted in memory, the capacity spanned
                         in.key_len = step->key_capacity;
                         in.mask.key_lengths = step->key_counts;
                         in.mask.causal = false;  // the counts end at the query's own key
                       } else {
                         in.key_len = step->position + 1;
                         in.mask.query_offset = step->position;
                       }
                     }
                     multi_head_attention_forward(backend, w.self_attn, config.heads, in,
                                                  cache.self_attn, out);
                   });
  sublayer_forward(backend, config, w.norm2, cache.self_sublayer.output_operand(), rows,
                   dropout.dropout, dropout_key(dropout.seed, decoder_site(layer_index, 2)), rounds,
                   shared, cache.cross_sublayer, [&](MatmulOperand x, float* out) {
                     AttentionInputs in = cross_attention_inputs(
                         x, memory, batch, tgt_len, src_len, src_lengths, dropout.attention_dropout,
                         dropout_key(dropout.seed, decoder_site(layer_index, 3)));
                     if (step) {  // the encoder keys of each hypothesis' sentence
                       in.mask.key_batch = step->sentence_of_query;
                       in.cached = &step->cross;
                     }
                     multi_head_attention_forward(backend, w.cross_attn, config.heads, in,
                                                  cache.cross_attn, out);
                   });
  // The last layer's output goes to the output head, which rounds its chunks itself in
  // training and scoring; a decoding step's reads the copy where the step asks for it.
  const bool last = layer_index + 1 == config.decoder_layers;
  const bool rounds_output = last ? step && step->round_last_output : rounds;
  sublayer_forward(backend, config, w.norm3, cache.cross_sublayer.output_operand(), rows,
                   dropout.dropout, dropout_key(dropout.seed, decoder_site(layer_index, 4)),
                   rounds_output, shared, cache.ffn_sublayer, [&](MatmulOperand x, float* out) {
                     feed_forward_forward(
                         backend, w.ffn, config.activation, x, rows, dropout.relu_dropout,
                         dropout_key(dropout.seed, decoder_site(layer_index, 5)), cache.ffn, out);
                   });
}

void encoder_forward(const Model& model, const TransformerWeights& w, const TokenBatch& batch,
                     const DropoutOptions& dropout, StackCache& cache) {
  const ModelConfig& config = model.config();
  const Backend& backend = model.backend();
  const int64_t layers = config.encoder_layers;
  Allocate sizer{backend};
  token_buffers(batch.batch, batch.src_len, cache.src_ids, cache.src_lengths, sizer);
  const int32_t* src_ids = upload(backend, batch.src_ids.data(), batch.batch * batch.src_len,
                                  cache.src_ids);  // [B, S]
  const int32_t* src_lengths =
      upload(backend, batch.src_lengths.data(), batch.batch, cache.src_lengths);  // [B]
  embed_with_dropout(
      backend, config, source_embedding(w), model.encoder_positions(), src_ids, batch.batch,
      batch.src_len, dropout.dropout, dropout_key(dropout.seed, kEncoderInputSite),
      outputs_shared(config, w.encoder_layers), cache.encoder_input, cache.encoder_input_mask);
  MatmulOperand x{cache.encoder_input.data()};  // [B, S, D]
  for (int64_t i = 0; i < layers; ++i) {
    EncoderLayerCache& layer = layer_cache(cache.encoder_layers, cache.training, layers, i);
    encoder_layer_forward(backend, config, w.encoder_layers[size_t(i)], x, batch.batch,
                          batch.src_len, src_lengths, dropout, i, layer);
    x = layer.output_operand();
  }
  const int64_t rows = batch.batch * batch.src_len;
  final_norm_buffers(config, rows, cache.encoder_norm, &cache.memory, sizer);
  final_norm(backend, config, w.encoder_norm, x.values, rows, &cache.encoder_norm,
             cache.memory.data());  // [B, S, D]
  // Post-norm's final norm is a copy: the last sublayer's bfloat16 copy is the memory's.
  cache.rounded_memory = config.norm == NormPosition::kPost ? x.rounded : nullptr;
}

void decoder_forward(const Model& model, const TransformerWeights& w, const TokenBatch& batch,
                     const DropoutOptions& dropout, StackCache& cache) {
  const ModelConfig& config = model.config();
  const Backend& backend = model.backend();
  const int64_t layers = config.decoder_layers;
  Allocate sizer{backend};
  token_buffers(batch.batch, batch.tgt_len, cache.tgt_in, cache.tgt_lengths, sizer);
  const int32_t* tgt_in = upload(backend, batch.tgt_in.data(), batch.batch * batch.tgt_len,
                                 cache.tgt_in);  // [B, T]
  const int32_t* tgt_lengths =
      upload(backend, batch.tgt_lengths.data(), batch.batch, cache.tgt_lengths);  // [B]
  embed_with_dropout(
      backend, config, target_embedding(w), model.decoder_positions(), tgt_in, batch.batch,
      batch.tgt_len, dropout.dropout, dropout_key(dropout.seed, kDecoderInputSite),
      outputs_shared(config, w.decoder_layers), cache.decoder_input, cache.decoder_input_mask);
  MatmulOperand x{cache.decoder_input.data()};  // [B, T, D]
  for (int64_t i = 0; i < layers; ++i) {
    DecoderLayerCache& layer = layer_cache(cache.decoder_layers, cache.training, layers, i);
    decoder_layer_forward(backend, config, w.decoder_layers[size_t(i)], x, batch.batch,
                          batch.tgt_len, tgt_lengths, {cache.memory.data(), cache.rounded_memory},
                          batch.src_len, cache.src_lengths.data(), dropout, i, layer);
    x = layer.output_operand();
  }
  const int64_t rows = batch.batch * batch.tgt_len;
  DeviceBuffer<float>* out = decoder_final_norm_output(config, cache);
  final_norm_buffers(config, rows, cache.decoder_norm, out, sizer);
  if (out)
    final_norm(backend, config, w.decoder_norm, x.values, rows, &cache.decoder_norm,
               out->data());                            // [B, T, D]
  cache.decoder_output = out ? out->data() : x.values;  // [B, T, D]
}

namespace {

// The backward of a feed-forward sublayer (its input: the previous sublayer's output).
void feed_forward_sublayer_backward(const Backend& backend, const ModelConfig& config,
                                    const LayerNormWeights& norm,
                                    const LayerNormParams<float>& norm_grad,
                                    const FeedForwardWeights& w, const FeedForward<float>& g,
                                    const float* input, int64_t rows, const DropoutOptions& dropout,
                                    SublayerCache& sublayer, FeedForwardCache& cache,
                                    float* d_stream, BackwardScratch& scratch) {
  sublayer_backward(backend, config, norm, norm_grad, w.fc2, g.fc2.bias, input, rows,
                    dropout.dropout, sublayer, d_stream, scratch,
                    [&](const float* d_out, const uint16_t* rounded_d_out, const float* x,
                        float* dx, bool accumulate, bool last_bias_summed) {
                      FeedForward<float> grads = g;
                      if (last_bias_summed) grads.fc2.bias = nullptr;
                      feed_forward_backward(backend, w, grads, config.activation, x, rows,
                                            dropout.relu_dropout, cache, d_out, rounded_d_out,
                                            scratch, dx, accumulate);
                    });
}

// The backward of a self-attention sublayer (causal in the decoder).
void self_attention_sublayer_backward(
    const Backend& backend, const ModelConfig& config, const LayerNormWeights& norm,
    const LayerNormParams<float>& norm_grad, const AttentionWeights& w, const Attention<float>& g,
    const float* input, int64_t batch, int64_t len, const int32_t* lengths, bool causal,
    const DropoutOptions& dropout, SublayerCache& sublayer, AttentionCache& cache, float* d_stream,
    BackwardScratch& scratch) {
  const int64_t rows = batch * len;
  sublayer_backward(backend, config, norm, norm_grad, w.o, g.o.bias, input, rows, dropout.dropout,
                    sublayer, d_stream, scratch,
                    [&](const float* d_out, const uint16_t* rounded_d_out, const float* x,
                        float* dx, bool accumulate, bool last_bias_summed) {
                      const AttentionInputs in = self_attention_inputs(
                          config, x, batch, len, lengths, causal, dropout.attention_dropout, 0);
                      Attention<float> grads = g;
                      if (last_bias_summed) grads.o.bias = nullptr;
                      // Self-attention: the query and memory inputs are the same tensor.
                      if (!accumulate) backend.fill(dx, rows * config.d_model, 0.f);
                      multi_head_attention_backward(backend, w, grads, config.heads, in, cache,
                                                    d_out, rounded_d_out, scratch, dx, true, dx);
                    });
}

}  // namespace

void encoder_layer_backward(const Backend& backend, const ModelConfig& config,
                            const EncoderLayerWeights& w, const EncoderLayer<float>& g,
                            const float* input, int64_t batch, int64_t src_len,
                            const int32_t* src_lengths, const DropoutOptions& dropout,
                            EncoderLayerCache& cache, float* d_stream, BackwardScratch& scratch) {
  feed_forward_sublayer_backward(backend, config, w.norm2, g.norm2, w.ffn, g.ffn,
                                 cache.attention_sublayer.output.data(), batch * src_len, dropout,
                                 cache.ffn_sublayer, cache.ffn, d_stream, scratch);
  self_attention_sublayer_backward(backend, config, w.norm1, g.norm1, w.self_attn, g.self_attn,
                                   input, batch, src_len, src_lengths, false, dropout,
                                   cache.attention_sublayer, cache.self_attn, d_stream, scratch);
}

void decoder_layer_backward(const Backend& backend, const ModelConfig& config,
                            const DecoderLayerWeights& w, const DecoderLayer<float>& g,
                            const float* input, int64_t batch, int64_t tgt_len,
                            const int32_t* tgt_lengths, const float* memory, int64_t src_len,
                            const int32_t* src_lengths, const DropoutOptions& dropout,
                            DecoderLayerCache& cache, float* d_stream, float* d_memory,
                            BackwardScratch& scratch) {
  const int64_t rows = batch * tgt_len;
  feed_forward_sublayer_backward(backend, config, w.norm3, g.norm3, w.ffn, g.ffn,
                                 cache.cross_sublayer.output.data(), rows, dropout,
                                 cache.ffn_sublayer, cache.ffn, d_stream, scratch);
  sublayer_backward(backend, config, w.norm2, g.norm2, w.cross_attn.o, g.cross_attn.o.bias,
                    cache.self_sublayer.output.data(), rows, dropout.dropout, cache.cross_sublayer,
                    d_stream, scratch,
                    [&](const float* d_out, const uint16_t* rounded_d_out, const float* x,
                        float* dx, bool accumulate, bool last_bias_summed) {
                      const AttentionInputs in =
                          cross_attention_inputs(x, memory, batch, tgt_len, src_len, src_lengths,
                                                 dropout.attention_dropout, 0);
                      Attention<float> grads = g.cross_attn;
                      if (last_bias_summed) grads.o.bias = nullptr;
                      multi_head_attention_backward(backend, w.cross_attn, grads, config.heads, in,
                                                    cache.cross_attn, d_out, rounded_d_out, scratch,
                                                    dx, accumulate, d_memory);
                    });
  self_attention_sublayer_backward(backend, config, w.norm1, g.norm1, w.self_attn, g.self_attn,
                                   input, batch, tgt_len, tgt_lengths, true, dropout,
                                   cache.self_sublayer, cache.self_attn, d_stream, scratch);
}

void stacks_backward(const Model& model, const TransformerWeights& w, const TransformerGradients& g,
                     const TokenBatch& batch, const DropoutOptions& dropout, StackCache& cache,
                     float* d_decoder_out, BackwardScratch& scratch) {
  const ModelConfig& config = model.config();
  const Backend& backend = model.backend();
  const int64_t d = config.d_model;
  const int64_t B = batch.batch, S = batch.src_len, T = batch.tgt_len;
  Allocate sizer{backend};
  stacks_backward_buffers(config, B, S, T, scratch, sizer);
  float* d_memory = scratch.d_memory.data();  // [B, S, D]
  backend.fill(d_memory, B * S * d, 0.f);

  // The gradient flowing down a stack's residual stream, each layer's backward in place: below a
  // final norm (pre-norm), in the scratch; else (identity) the stack output's gradient itself.
  float* stream = nullptr;  // [rows, D]
  auto final_norm_backward = [&](const LayerNormWeights& norm, const LayerNormParams<float>& ng,
                                 const float* last_output, LayerNormCache& norm_cache, float* d_out,
                                 int64_t rows) {
    if (!has_final_norm(config)) {
      stream = d_out;
      return;
    }
    stream = scratch.d_stream.data();
    backend.layer_norm_backward(d_out, last_output, norm_cache.mean.data(), norm_cache.rstd.data(),
                                norm.weight, stream, ng.weight, ng.bias, rows, d, false);
  };

  // Decoder, top to bottom.
  const int64_t tgt_rows = B * T;
  final_norm_backward(w.decoder_norm, g.decoder_norm, cache.decoder_layers.back().output(),
                      cache.decoder_norm, d_decoder_out, tgt_rows);
  for (int64_t i = config.decoder_layers - 1; i >= 0; --i) {
    const float* input =
        i == 0 ? cache.decoder_input.data() : cache.decoder_layers[size_t(i - 1)].output();
    decoder_layer_backward(backend, config, w.decoder_layers[size_t(i)],
                           g.decoder_layers[size_t(i)], input, B, T, cache.tgt_lengths.data(),
                           cache.memory.data(), S, cache.src_lengths.data(), dropout,
                           cache.decoder_layers[size_t(i)], stream, d_memory, scratch);
  }
  dropout_backward(backend, stream, tgt_rows * d, dropout.dropout,
                   dropout_key(dropout.seed, kDecoderInputSite), cache.decoder_input_mask);
  embed_backward(backend, config, stream, cache.tgt_in.data(), B, T, g.tgt_embed,
                 g.decoder_pos_embed);

  // Encoder, from the gradient its output received from every cross-attention.
  const int64_t src_rows = B * S;
  final_norm_backward(w.encoder_norm, g.encoder_norm, cache.encoder_layers.back().output(),
                      cache.encoder_norm, d_memory, src_rows);
  for (int64_t i = config.encoder_layers - 1; i >= 0; --i) {
    const float* input =
        i == 0 ? cache.encoder_input.data() : cache.encoder_layers[size_t(i - 1)].output();
    encoder_layer_backward(backend, config, w.encoder_layers[size_t(i)],
                           g.encoder_layers[size_t(i)], input, B, S, cache.src_lengths.data(),
                           dropout, cache.encoder_layers[size_t(i)], stream, scratch);
  }
  dropout_backward(backend, stream, src_rows * d, dropout.dropout,
                   dropout_key(dropout.seed, kEncoderInputSite), cache.encoder_input_mask);
  embed_backward(backend, config, stream, cache.src_ids.data(), B, S, g.src_embed,
                 g.encoder_pos_embed);
}

}  // namespace tfm
