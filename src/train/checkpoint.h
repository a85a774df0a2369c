// Training checkpoints in a model directory:
//   DIR/model.safetensors            the latest model (what translate / score load)
//   DIR/checkpoint.safetensors       model + Adam moments + training state, one atomic file,
//                                    everything --resume needs to continue bit for bit
//   DIR/checkpoints/step-N.safetensors  the last --keep models, for `transformer average`
//   DIR/model.best.safetensors       the model with the best validation perplexity
#pragma once

#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "train/optimizer.h"

namespace tfm {

// Whether a run trains in `precision`: float32 or bfloat16 products (int8 and float16 are for
// inference; float16 training would need loss scaling). The one rule that train's
// --compute-type, the library's training_precision and a checkpoint's state are checked by.
inline bool trains_in(Precision precision) {
  return precision == Precision::kFloat32 || precision == Precision::kBFloat16;
}

struct TrainingState {
  int64_t step = 0;
  int64_t epoch = 0;        // epochs completed
  int64_t batch_index = 0;  // next batch of this epoch's plan
  uint64_t seed = 1;
  double best_valid_nll = -1;  // per token; < 0: none yet
  int64_t validations_without_improvement = 0;
  int64_t target_tokens_seen = 0;
  double train_seconds = 0;
  int64_t skipped_steps = 0;       // updates skipped for a non-finite loss or gradient
  int64_t bad_steps_in_a_row = 0;  // consecutive skipped updates, up to now
  // The number format of the run's products (train --compute-type): what --resume continues in
  // unless told otherwise. Checkpoints written before it was recorded were float32 runs or
  // passed the flag: absent means float32.
  Precision compute_type = Precision::kFloat32;
  // The run's train --sentencepiece-alphas, source and target (0: none; absent in older
  // checkpoints).
  std::array<double, 2> sentencepiece_alphas{0, 0};

  nlohmann::json to_json() const;
  static TrainingState from_json(const nlohmann::json& j, const std::string& where);
};

// Writes the snapshot, the checkpoint and the latest model (each atomically, in that order),
// then deletes snapshots beyond the newest `keep`. Unless `allow_nonfinite` (a run that started
// from NaN / Inf values the user let in with --allow-nonfinite), a model or optimizer state
// holding NaN or Inf is refused with an Error and nothing is written: a checkpoint that can be
// resumed is never replaced by one that cannot.
void save_checkpoint(const std::string& dir, const Model& model, const Optimizer& optimizer,
                     const TrainingState& state, int64_t keep, bool allow_nonfinite = false);

// A checkpoint file's header (metadata and declared shapes, before any tensor is read), checked:
// the config, every training-state field, the model's shapes against the config and each
// optimizer tensor against its parameter. Throws Error naming `where`.
struct CheckpointHeader {
  ModelConfig config;
  TrainingState state;
};
CheckpointHeader checkpoint_of_header(const std::map<std::string, std::string>& metadata,
                                      const std::map<std::string, Shape>& shapes,
                                      const std::string& where);

struct LoadedCheckpoint {
  Model model;
  TensorMap optimizer_state;
  TrainingState state;
};
// The model runs on `backend`.
LoadedCheckpoint load_checkpoint(const std::string& dir, const Backend& backend);
// DIR/checkpoint.safetensors: where a run keeps what --resume continues from.
std::string checkpoint_path(const std::string& dir);
bool has_checkpoint(const std::string& dir);

// Snapshot files in DIR/checkpoints, oldest first.
std::vector<std::string> list_snapshots(const std::string& dir);

}  // namespace tfm
