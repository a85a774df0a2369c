// The training loop of `transformer train`: token batches grouped by length and shuffled per
// epoch, gradient accumulation, Adam with the paper's schedule, dropout, label smoothing,
// validation with best-model keeping and early stopping, periodic atomic checkpoints, resume
// that continues bit for bit, and a clean save on SIGINT / SIGTERM.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/optimizer.h"

namespace tfm {

// The most batches one optimizer step accumulates: a step holds all of them at once, and a
// signal is answered between steps.
constexpr int64_t kMaxAccumulate = 1024;

struct TrainOptions {
  std::string model_dir;
  std::string train_src, train_tgt, valid_src, valid_tgt;
  bool ids = false;
  std::vector<std::string> vocabularies;  // one joint, or source + target (.spm or token .txt)
  int64_t max_length = 256;
  int64_t batch_tokens = 4096;
  int64_t accumulate = 1;  // batches per optimizer step, at most kMaxAccumulate

  bool has_config = false;  // config below is used for a new model (not --init / --resume)
  ModelConfig config;
  std::string init_path;
  bool resume = false;
  // The backend that trains (find_backend with the rank's local rank: under mpirun, "cuda" and
  // "auto" give each rank on a machine a GPU of its own).
  std::string device = "cpu";
  // The number format of every linear product, forward and backward: float32, or bfloat16
  // (float32 master weights, gradients, Adam moments and checkpoints). Unset: the resumed run's
  // (recorded in its checkpoint), else float32.
  std::optional<Precision> precision;

  // Subword regularisation, source and target: each epoch's training pairs encoded with a
  // segmentation sampled from the SentencePiece vocabularies at the side's alpha (BPE models:
  // BPE-dropout's merge-dropout probability; unigram models: the sampling smoothing), drawn
  // from (seed, epoch) so --resume sees the same; 0: the one best segmentation. Validation is
  // never sampled. Unset: the resumed run's (recorded in its checkpoint), else none.
  std::optional<std::array<double, 2>> sentencepiece_alphas;

  float label_smoothing = 0.1f;
  float dropout = 0.1f, attention_dropout = 0.f, relu_dropout = 0.f;
  OptimizerOptions optimizer;
  uint64_t seed = 1;

  int64_t max_steps = 0, max_epochs = 0;  // 0: unlimited
  double max_minutes = 0;
  int64_t valid_every = 500, save_every = 500, log_every = 100;
  int64_t keep = 5, early_stopping = 0;
  // A step whose loss or gradient norm is NaN / Inf is skipped (no update); this many in a row
  // end training with an error, the last checkpoint left as it was.
  int64_t max_bad_steps = 20;

  // Data parallelism (under mpirun): seconds a rank waits for the others before giving up, and
  // every how many steps the ranks compare parameter checksums (0: only in debug builds, every
  // 100 steps).
  double replica_timeout = 300;
  int64_t replica_check_every = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double last_loss = 0;  // per target token, last logged interval
  double best_valid_nll = -1;
  bool interrupted = false;
  bool stopped_before_start = false;  // a signal came before the first step: nothing written
  bool primary = true;                // rank 0 (or the only process): the one that reports
};

// Throws Error on bad data or options. Installs SIGINT / SIGTERM handlers while it runs.
// Under mpirun every rank runs this with the same options: each takes its share of every
// global batch, gradients are summed across ranks, rank 0 alone writes files and logs.
TrainResult train(const TrainOptions& options);

}  // namespace tfm
