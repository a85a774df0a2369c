// A model's weights prepared once for inference in one number format: matrices copied into
// the layout the backend's products read fastest (Backend::prepare_matrix, float32 or bfloat16),
// and the projections that read the same input stacked into one product (self-attention's Q|K|V,
// cross-attention's K|V). Two views share the copies:
// - `steps`, for incremental decoding (decoder layers and output projection), whose products
//   have one row per live hypothesis: there, reading packed weights instead of repacking them
//   per call is what makes a step fast, in either format;
// - `sequences`, for whole sequences (encoder, teacher-forced decoder, scoring). In float32
//   these are the model's own tensors: with hundreds of rows oneDNN reads them in place at full
//   speed, and a packed copy would double the memory. In bfloat16 every product needs its
//   bfloat16 copy, so `sequences` is `steps` plus the encoder. A model that runs inference only
//   (Model::set_inference_only) frees its tensors as they are packed, so there every
//   precision prepares every product, float32 too, and `sequences` is `steps` plus the encoder.
// Training reads the float32 tensors directly: they change every step.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "model/config.h"
#include "model/weights.h"

namespace tfm {

struct PreparedWeights {
  Precision precision = Precision::kFloat32;
  // The model's views with Linear::prepared set (and Attention::qkv / kv stacked) where
  // packed; norms, embeddings and biases still point at the model's tensors.
  TransformerWeights steps;
  TransformerWeights sequences;
  std::vector<std::unique_ptr<PreparedMatrix>> matrices;  // what the views' `prepared` point to
  std::deque<DeviceBuffer<float>> stacked_biases;         // [3D] or [2D] biases of qkv / kv
  // int8 only: float embeddings quantised by the rule of int8 weights, in the backend's memory,
  // which the views' int8 embedding tables point to (a model loaded for int8 holds them so from
  // the start).
  struct Int8Table {
    DeviceBuffer<int8_t> values;  // [vocab, D]
    DeviceBuffer<float> scales;   // [vocab]
  };
  std::deque<Int8Table> int8_embeddings;
};

// Called with the data a product was packed from (a float weight or int8 rows) as soon as it
// is packed, so the caller may free it before the next one is packed.
using ReleasePackedSource = std::function<void(const void* source)>;

// Prepares `weights` (which must outlive the result, unchanged) of a model with `config` on
// `backend`; int8 also holds the embeddings in int8 (int8_embeddings, unless they are). Throws
// std::invalid_argument for a precision the backend does not support. With `release`, every
// product is prepared (float32's `sequences` too) and each linear weight is handed to it once
// packed: after that only the embeddings, norms and biases of `weights` are read. In float32 an
// embedding table tied to the output projection is handed to it too (the lookups read the
// packed projection's rows instead).
std::unique_ptr<PreparedWeights> prepare_weights(const Backend& backend, const ModelConfig& config,
                                                 const TransformerWeights& weights,
                                                 Precision precision,
                                                 const ReleasePackedSource& release = nullptr);

}  // namespace tfm
