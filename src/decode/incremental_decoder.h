// Incremental decoding: the decoder run one position at a time for a set of hypotheses, with
// each layer's self-attention keys/values kept in a cache (so a step costs O(length), not a
// recomputation of the prefix) and the cross-attention keys/values of the encoder output
// computed once per batch and shared by all hypotheses of a sentence. Each layer is the one
// decoder_layer_forward of training and scoring, given the cache as its key/value policy
// (DecoderStep), on the model's prepared weights (model/prepared_weights.h); beam reordering
// moves indices, not cache rows. Where the backend records operations (a GPU: CUDA graphs), a
// step's layers are recorded once per shape of step and replayed: every argument they take is
// then the same from step to step, and what changes (the position's key counts, the rows it
// appends, the token ids) lies in memory the host writes before each step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/prepared_weights.h"
#include "model/stacks.h"
#include "model/transformer.h"

namespace tfm {

class IncrementalDecoder {
 public:
  // memory: [sentences, src_len, D] encoder output in the backend's memory, which must stay
  // valid while decoding; src_lengths: [sentences] on the host (copied). max_steps bounds the
  // positions, max_hypotheses the live set; precision is that of the weight products, cache
  // the element type of the self- and cross-attention keys/values kept for the steps.
  IncrementalDecoder(const Model& model, const float* memory, int64_t sentences, int64_t src_len,
                     const int32_t* src_lengths, int64_t max_steps, int64_t max_hypotheses,
                     Precision precision = Precision::kFloat32,
                     CacheFormat cache = CacheFormat::kFloat32);

  // Starts `hypothesis_sentence.size()` hypotheses (sentence index of each) at position 0.
  void start(const std::vector<int32_t>& hypothesis_sentence);

  // Feeds tokens[N] (host) at the current position; logits[N, V] receive the output head's
  // logits for the next token (unnormalised: Backend::best_tokens gives the best ones their
  // log-probabilities in the same pass).
  // With cross_attention non-null, it receives the cross-attention weights of decoder layer
  // attention_layer (-1: the last): averaged over heads, [N, src_len], or with per_head
  // [N, heads, src_len]. Both outputs are in the model's backend memory and must have room for
  // step_rows() rows: the rows past N are written with values that mean nothing.
  void step(const int32_t* tokens, float* logits, float* cross_attention,
            int64_t attention_layer = -1, bool per_head = false);

  // The rows a step computes: N, or where steps are recorded, N rounded up to a multiple of an
  // eighth of max_hypotheses, so that a search whose hypotheses finish one by one records a
  // handful of step shapes rather than one per count (the extra rows repeat a real step's work
  // on slots no hypothesis reads).
  int64_t step_rows() const;

  // Keeps hypotheses parents[0..M) (indices into the current set, repeats allowed) as the new
  // set, in that order. Costs a gather of M × position indices and a copy of M × max_steps, made
  // by the backend at the next step: the cached rows stay where they are. Nothing where
  // parents[i] is i throughout.
  void reorder(const std::vector<int32_t>& parents);

  int64_t hypotheses() const { return int64_t(hypothesis_sentence_.size()); }  // N
  int64_t position() const { return position_; }

 private:
  // The operations of a step after its embedding (the layers and the output head) as the backend
  // recorded them, for steps of one shape: the same step_rows() and outputs. Recorded at the
  // second step of a shape (the first allocates what it lacks).
  struct StepRecording {
    int64_t rows;
    const float* logits;
    const float* cross_attention;
    int64_t attention_layer;
    bool per_head;
    int64_t runs = 0;
    std::shared_ptr<const RecordedOperations> operations;
  };
  StepRecording& recording_for(int64_t n, const float* logits, const float* cross_attention,
                               int64_t attention_layer, bool per_head);
  // The layers of one step and the output head: step()'s work after the embedding.
  void run_layers(float* x, int64_t n, float* logits, float* cross_attention,
                  int64_t attention_layer, bool per_head);
  // history_ and gathered_history_ = every slot's own rows (row i · max_steps + j at column j).
  void reset_history();

  const Model& model_;
  std::shared_ptr<const PreparedWeights> prepared_;
  int64_t src_len_, max_steps_, max_hypotheses_;
  CacheFormat cache_;
  int64_t position_ = 0;
  // Whether the self-attention counts each hypothesis' keys in memory (DecoderStep::key_counts)
  // and steps are recorded: where the backend records operations, and the model's
  // self-attention has no window.
  bool records_steps_ = false;
  std::vector<StepRecording> recordings_;
  int64_t discarded_recordings_ = 0;  // in a row, made useless by memory allocated since
  bool recording_failed_ = false;     // the backend kept nothing of a step: records no more
  // The host keeps the bookkeeping below and uploads what a step's operations read into the
  // device_ buffers.
  std::vector<int32_t> hypothesis_sentence_;  // [N]
  // Per decoder layer, what every step wrote: [max_hypotheses, max_steps, 2D] rows keys |
  // values, row i * max_steps + t from hypothesis slot i at position t (uninitialised until
  // written). A slot's rows before t may still serve other hypotheses (its old self's
  // descendants); rows at t are new, so writing them never disturbs a history. Slot-major keeps
  // a hypothesis' rows mostly contiguous (always, in greedy search), which the attention reads
  // far faster; a row's key and value side by side, as the stacked Q|K|V product writes them,
  // make the append one operation. One of the two is allocated, as the cache format says.
  std::vector<DeviceBuffer<float>> self_kv_;
  std::vector<DeviceBuffer<uint16_t>> self_kv_16_bits_;
  // In the backend's memory, the cache row holding position j of hypothesis i:
  // history_[i * max_steps + j], j <= position (columns past the position are the slot's own
  // rows, i * max_steps + j, which is what a step appends). A reorder gathers the kept
  // hypotheses' first `position` columns into gathered_history_ at the next step, and copies
  // them back: the steps' operations always read the history at one address.
  DeviceBuffer<int32_t> history_, gathered_history_;  // [max_hypotheses, max_steps] each
  bool history_moved_ = false;                        // reordered since reset_history()
  std::vector<int64_t> pending_parents_;  // [N] the reorder the next step applies, or empty
  // What a step's operations read, packed for one upload (a GPU's driver call and staging copy
  // each), at offsets that depend on R = step_rows() only: [R] the cache rows this position
  // appends and [R] pending_parents_ (int64), then as int32 [R] the input tokens, [R]
  // hypothesis_sentence_ and [R] each row's key count, position + 1 (rows past N: slot i's own
  // rows, sentence 0, token 0, no keys: they read no cached row).
  std::vector<int64_t> step_inputs_;
  DeviceBuffer<int64_t> device_step_inputs_;   // step_inputs_ in the backend's memory
  DeviceBuffer<int32_t> device_src_lengths_;   // [sentences]
  std::vector<DeviceBuffer<float>> cross_kv_;  // per layer [sentences, S, 2D]: keys | values
  std::vector<DeviceBuffer<uint16_t>> cross_kv_16_bits_;  // the same in a 16-bit cache
  DeviceBuffer<float> x_;                                 // [N, D] residual stream
  DecoderLayerCache layer_cache_;  // the layer's buffers (one layer at a time)
};

}  // namespace tfm
