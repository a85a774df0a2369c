// Incremental decoding: the decoder run one position at a time for a set of hypotheses, with
// each layer's self-attention keys/values kept in a cache (so a step costs O(length), not a
// recomputation of the prefix) and the cross-attention keys/values of the encoder output
// computed once per batch and shared by all hypotheses of a sentence.
#pragma once

#include <cstdint>
#include <vector>

#include "model/stacks.h"
#include "model/transformer.h"

namespace tfm {

class IncrementalDecoder {
 public:
  // memory: [sentences, src_len, D] encoder output; src_lengths: [sentences]. Both must stay
  // valid while decoding. max_steps bounds the cache.
  IncrementalDecoder(const Model& model, const float* memory, int64_t sentences, int64_t src_len,
                     const int32_t* src_lengths, int64_t max_steps);

  // Starts `hypothesis_sentence.size()` hypotheses (sentence index of each) at position 0.
  void start(const std::vector<int32_t>& hypothesis_sentence);

  // Feeds tokens[N] at the current position; logprobs[N, V] receive log p(next token).
  // With cross_attention non-null, it receives the cross-attention weights of decoder layer
  // attention_layer (-1: the last): averaged over heads, [N, src_len], or with per_head
  // [N, heads, src_len].
  void step(const int32_t* tokens, float* logprobs, float* cross_attention,
            int64_t attention_layer = -1, bool per_head = false);

  // Keeps hypotheses parents[0..M) (indices into the current set, repeats allowed) as the new
  // set, in that order.
  void reorder(const std::vector<int32_t>& parents);

  int64_t hypotheses() const { return int64_t(hypothesis_sentence_.size()); }
  int64_t position() const { return position_; }

 private:
  const Model& model_;
  const float* memory_;
  int64_t sentences_, src_len_, max_steps_;
  const int32_t* src_lengths_;
  int64_t position_ = 0;
  std::vector<int32_t> hypothesis_sentence_;  // [N]
  // Per decoder layer.
  std::vector<std::vector<float>> self_keys_, self_values_;    // [N, max_steps, D]
  std::vector<std::vector<float>> cross_keys_, cross_values_;  // [sentences, S, D]
  // Step buffers.
  std::vector<float> x_, q_, k_, v_, context_, probs_, logits_;
  std::vector<float> reorder_buffer_;
  DecoderLayerCache layer_cache_;  // sublayer buffers (one layer at a time)
};

}  // namespace tfm
