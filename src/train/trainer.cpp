// train(): a TrainingRun in named steps — check the options, open the model (resumed, given or
// new), read the data, then the loop of steps (take the micro-batches, compute the gradients,
// update or skip, report, validate, save) and the final save.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "io/directory_lock.h"
#include "io/model_directory.h"
#include "io/model_file.h"
#include "model/init.h"
#include "model/linear.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "tensor/memory_budget.h"
#include "text/batching.h"
#include "train/checkpoint.h"
#include "train/loss.h"
#include "train/replicas.h"
#include "train/stop_signal.h"

namespace tfm {

namespace {

using Clock = std::chrono::steady_clock;

// Every option that changes what a step computes, which batches it takes, or when the run
// validates, saves, logs, compares replicas or stops: ranks given different ones would sum the
// gradients of different computations, or meet at different collectives. Paths, the device and
// --replica-timeout may differ between ranks (each node its own disk and GPU); the data they
// name is compared by its ids, the model by its configuration, the number format and subword
// sampling as the training state resolved them.
std::string options_every_rank_shares(const TrainOptions& o, const ModelConfig& config) {
  const OptimizerOptions& opt = o.optimizer;
  nlohmann::json j = {
      {"config", config_to_json(config)},
      {"ids", o.ids},
      {"max_length", o.max_length},
      {"batch_tokens", o.batch_tokens},
      {"accumulate", o.accumulate},
      {"label_smoothing", o.label_smoothing},
      {"dropout", {o.dropout, o.attention_dropout, o.relu_dropout}},
      {"optimizer",
       {opt.algorithm, opt.schedule, opt.lr, opt.lr_factor, opt.warmup, opt.beta1, opt.beta2,
        opt.eps, opt.clip_norm, opt.cooldown}},
      {"seed", o.seed},
      {"limits", {o.max_steps, o.max_epochs, o.max_minutes, o.max_bad_steps, o.early_stopping}},
      {"every", {o.valid_every, o.save_every, o.log_every, o.keep, o.replica_check_every}},
  };
  return j.dump();
}

// Options no run could use, refused before anything is read.
void check_options(const TrainOptions& o) {
  if (o.model_dir.empty()) throw Error("--model-dir is required");
  if (o.accumulate < 1 || o.accumulate > kMaxAccumulate)
    throw Error("--accumulate must be in [1, " + std::to_string(kMaxAccumulate) + "]");
  if (o.batch_tokens < 1) throw Error("--batch-tokens must be at least 1");
  if (o.max_length < 1) throw Error("--max-length must be at least 1");
  const OptimizerOptions& opt = o.optimizer;
  if (opt.algorithm != "adam" && opt.algorithm != "sgd")
    throw Error("--optimizer must be adam or sgd, not " + quoted_for_message(opt.algorithm));
  if (opt.schedule != "noam" && opt.schedule != "constant")
    throw Error("--lr-schedule must be noam or constant, not " + quoted_for_message(opt.schedule));
  if (!(opt.lr > 0) || !(opt.lr_factor > 0)) throw Error("--lr and --lr-factor must be positive");
  if (opt.warmup < 1) throw Error("--warmup must be at least 1");
  if (!(opt.cooldown >= 0 && opt.cooldown <= 1)) throw Error("--lr-cooldown must be in [0, 1]");
  if (!(opt.beta1 >= 0 && opt.beta1 < 1) || !(opt.beta2 >= 0 && opt.beta2 < 1))
    throw Error("--adam-beta1 and --adam-beta2 must be in [0, 1)");
  if (!(opt.eps > 0)) throw Error("--adam-eps must be positive");
  if (!(opt.clip_norm >= 0)) throw Error("--clip-norm cannot be negative");
  if (o.max_steps < 0 || o.max_epochs < 0 || !(o.max_minutes >= 0))
    throw Error("--max-steps, --max-epochs and --max-minutes cannot be negative");
  if (o.valid_every < 0 || o.save_every < 0 || o.log_every < 0 || o.keep < 0 ||
      o.early_stopping < 0 || o.replica_check_every < 0)
    throw Error(
        "--valid-every, --save-every, --log-every, --keep, --early-stopping and "
        "--replica-check-every cannot be negative");
  if (o.max_bad_steps < 1) throw Error("--max-bad-steps must be at least 1");
  if (!(o.label_smoothing >= 0.f && o.label_smoothing < 1.f))
    throw Error("--label-smoothing must be in [0, 1)");
  for (float p : {o.dropout, o.attention_dropout, o.relu_dropout})
    if (!(p >= 0.f && p < 1.f)) throw Error("dropout probabilities must be in [0, 1)");
  if (o.ids == !o.vocabularies.empty())
    throw Error(o.ids ? "--ids and --vocabs exclude each other"
                      : "give --vocabs (SentencePiece or token list) or --ids");
  if (o.vocabularies.size() > 2)
    throw Error("--vocabs takes one joint or two (source, target) files");
  if (!(o.replica_timeout > 0)) throw Error("--replica-timeout must be positive");
  if (o.optimizer.cooldown > 0 && o.max_steps <= 0 && o.max_minutes <= 0)
    throw Error("--lr-cooldown needs the run's length: --max-steps or --max-minutes");
  if (o.valid_src.empty() != o.valid_tgt.empty())
    throw Error("give both --valid-src and --valid-tgt");
  if (o.early_stopping > 0 && o.valid_src.empty())
    throw Error("--early-stopping needs a validation set: --valid-src and --valid-tgt");
  if (o.sentencepiece_alphas)
    for (double alpha : *o.sentencepiece_alphas)
      if (!(alpha >= 0 && alpha <= 1)) throw Error("--sentencepiece-alphas must be in [0, 1]");
}

// A compute type this backend cannot train in.
void check_compute_type(const Backend& backend, Precision precision) {
  if (!trains_in(precision))
    throw Error(std::string("--compute-type ") + precision_name(precision) +
                " is for inference; train in float32 or bfloat16");
  if (!backend.supports(precision))
    throw Error(std::string("--compute-type ") + precision_name(precision) + " " +
                backend.unsupported_reason(precision));
}

// Sums loss totals over the ranks (nothing to do in one process).
void sum_totals(Replicas& replicas, LossTotals& totals) {
  double values[4] = {totals.loss, totals.nll, double(totals.tokens), double(totals.correct)};
  replicas.sum(values, 4);
  totals = {values[0], values[1], int64_t(values[2]), int64_t(values[3])};
}

std::string format_duration(double seconds) {
  char buffer[32];
  const long s = long(seconds);
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buffer, sizeof buffer, "%ldm%02lds", s / 60, s % 60);
  return buffer;
}

double per_token(double total, int64_t tokens) {
  return total / double(std::max<int64_t>(tokens, 1));
}

// One run of `transformer train` in one process (one rank under mpirun). Rank 0 alone writes
// files and logs; every rank computes its share of each step.
class TrainingRun {
 public:
  TrainingRun(const TrainOptions& o, Replicas& replicas, const Backend& backend)
      : o_(o), replicas_(replicas), backend_(backend), primary_(replicas.primary()) {
    result_.primary = primary_;
  }

  // Opens the model and reads the data; false when a signal came before the first step. A run
  // that ends here leaves no directory it created behind (bad data on a first run left one
  // holding only .lock).
  bool start() {
    try {
      open_model();
      bool starting = !stopped_before_start();
      if (starting) {
        read_data();
        starting = !stopped_before_start();
      }
      if (!starting) {
        remove_unused_model_directory();
        return false;
      }
      prepare_training();
      return true;
    } catch (...) {
      remove_unused_model_directory();
      throw;
    }
  }

  // Steps until a limit, the data, early stopping or a signal ends the run.
  void run_steps() {
    while (!time_to_stop()) {
      std::vector<TokenBatch> micro;
      const bool epochs_done = take_micro_batches(micro);
      if (epochs_done && micro.empty()) break;  // the same on every rank: the plan is global
      take_step(micro);
      if (epochs_done) break;
    }
    if (terminal_) std::fprintf(stderr, "\n");
  }

  // The last validation and save; what the run reports.
  TrainResult finish() {
    const bool interrupted = stop_signal() != 0 || signalled_somewhere_;
    // Interrupted: save first (a scheduler's SIGKILL may follow); the validation can wait.
    if (!interrupted && state_.step != last_validated_) validate();
    if (state_.step != last_saved_ || (primary_ && !has_checkpoint(o_.model_dir))) save();
    if (log_) std::fclose(log_);
    log_ = nullptr;
    result_.steps = state_.step;
    result_.best_valid_nll = state_.best_valid_nll;
    result_.interrupted = interrupted;
    if (interrupted && primary_)
      std::fprintf(stderr, "interrupted: checkpoint saved at step %lld; continue with --resume\n",
                   (long long)state_.step);
    return result_;
  }

  // What the run reports when a signal ended it before its first step.
  const TrainResult& result() const { return result_; }

  ~TrainingRun() {
    if (log_) std::fclose(log_);
  }
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

 private:
  // A signal before the first step: nothing to save, and no point loading the rest.
  bool stopped_before_start() {
    if (replicas_.distributed() || !stop_signal()) return false;
    if (primary_)
      std::fprintf(stderr, "train: stopped by %s before the first step; nothing was written\n",
                   stop_signal() == SIGINT ? "SIGINT" : "SIGTERM");
    result_.interrupted = result_.stopped_before_start = true;
    return true;
  }

  // `--resume --preset/--config` starts a run where there is none and continues the one there
  // otherwise, so one command line serves both; a run of another shape than the options describe
  // is refused instead of being continued as if they had not been given. So is an --init model
  // of another shape. Names the first key that differs; `whose`: "--resume: the run in DIR".
  void check_given_config(const ModelConfig& model, const std::string& whose,
                          const std::string& remedy) const {
    const nlohmann::json has = config_to_json(model), given = config_to_json(o_.config);
    for (const auto& [key, value] : given.items())
      if (!has.contains(key) || has[key] != value)
        throw Error(whose + " has " + key + " " + (has.contains(key) ? has[key].dump() : "unset") +
                    ", not the " + value.dump() + " of --preset/--config; " + remedy);
  }

  // The model: resumed, given, or new, and the compute type it trains in. One run per
  // directory: rank 0 locks it.
  void open_model() {
    if (primary_) {
      created_directories_ = make_directories(o_.model_dir);
      lock_.emplace(o_.model_dir, "training run");
      remove_stale_temp_files(o_.model_dir);
      remove_stale_temp_files(o_.model_dir + "/checkpoints");
    }
    state_.seed = o_.seed;
    if (has_checkpoint(o_.model_dir)) {
      if (!o_.resume)
        throw Error(o_.model_dir +
                    " already holds a training run; pass --resume to continue it, or choose "
                    "another --model-dir");
      resumed_.emplace(load_checkpoint(o_.model_dir, backend_));
      state_ = resumed_->state;
      if (o_.precision && *o_.precision != state_.compute_type && primary_)
        std::fprintf(stderr,
                     "train: --resume: the run trained in %s and continues in %s "
                     "(--compute-type), so it is no longer bit-exact with an uninterrupted run\n",
                     precision_name(state_.compute_type), precision_name(*o_.precision));
    } else if (o_.resume) {
      if (o_.init_path.empty() && !o_.has_config)
        throw Error("--resume: " + o_.model_dir +
                    " holds no checkpoint to continue; give --preset, --config or --init to start "
                    "a new run there");
      if (primary_)
        std::fprintf(stderr, "train: --resume: %s holds no checkpoint yet; starting a new run\n",
                     o_.model_dir.c_str());
    }
    if (resumed_) {
      if (o_.has_config)
        check_given_config(resumed_->model.config(), "--resume: the run in " + o_.model_dir,
                           "leave them out to continue it, or choose another --model-dir");
      model_.emplace(std::move(resumed_->model));
    } else if (!o_.init_path.empty()) {
      model_.emplace(load_model(o_.init_path, backend_));
      if (o_.has_config)
        check_given_config(model_->config(), "--init " + o_.init_path,
                           "leave them out to train it as it is");
    } else if (o_.has_config) {
      model_.emplace(init_model(o_.config, o_.seed, backend_));
    } else {
      throw Error("choose a model: --preset, --config or --init (or --resume an existing run)");
    }
    // As given, else the resumed run's own (so --resume alone continues bit for bit), else
    // float32. A given one was checked before loading.
    precision_ = o_.precision.value_or(state_.compute_type);
    if (!o_.precision) check_compute_type(backend_, precision_);
    state_.compute_type = precision_;
    // The same rule for the subword sampling: given, else the resumed run's.
    const auto& alphas = state_.sentencepiece_alphas;
    if (resumed_ && o_.sentencepiece_alphas && *o_.sentencepiece_alphas != alphas && primary_)
      std::fprintf(stderr,
                   "train: --resume: the run sampled segmentations at alphas %g %g and continues "
                   "at %g %g (--sentencepiece-alphas), so it is no longer bit-exact with an "
                   "uninterrupted run\n",
                   alphas[0], alphas[1], (*o_.sentencepiece_alphas)[0],
                   (*o_.sentencepiece_alphas)[1]);
    state_.sentencepiece_alphas = o_.sentencepiece_alphas.value_or(alphas);
  }

  // The directories open_model created, when nothing but the lock was written into them: a run
  // that failed before its first file leaves the file system as it found it. A directory that
  // existed before, or holds anything else, stays.
  void remove_unused_model_directory() {
    if (created_directories_.empty()) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    for (fs::directory_iterator it(o_.model_dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename() != ".lock") return;
    if (ec) return;
    fs::remove(o_.model_dir + "/.lock", ec);
    lock_.reset();
    for (auto dir = created_directories_.rbegin(); dir != created_directories_.rend(); ++dir)
      if (::rmdir(dir->c_str()) != 0) break;  // only empty ones: never anything of anyone's
    created_directories_.clear();
  }

  // Weights + gradients (+ Adam's two moments) of one rank.
  int64_t state_bytes() const {
    const int64_t copies = o_.optimizer.algorithm == "adam" ? 4 : 2;
    return parameter_count(model_->config()) * int64_t(sizeof(float)) * copies;
  }

  // The host memory all ranks on this machine take for `device_bytes` of training state in
  // the backend's memory: all of it, for every rank, where that memory is the host's; else
  // (a GPU each) the host copy of the gradients that a distributed run sums (Replicas).
  int64_t host_bytes_on_this_machine(int64_t device_bytes) const {
    if (backend_.memory_is_host()) return device_bytes * replicas_.local_size();
    if (!replicas_.distributed()) return 0;
    return parameter_count(model_->config()) * int64_t(sizeof(float)) * replicas_.local_size();
  }

  // The training and validation data, encoded with the run's vocabularies; the vocabularies
  // go into the model directory.
  void read_data() {
    const ModelConfig& config = model_->config();
    // Weights + gradients (+ Adam's two moments), for every rank on this machine, before any
    // of them is allocated.
    check_memory(host_bytes_on_this_machine(state_bytes()),
                 "training this model (weights, gradients, optimizer state)");
    replicas_.broadcast_tensors(model_->mutable_parameters());  // every rank starts from rank 0's

    for (const auto& path : o_.vocabularies) vocabularies_.push_back(Vocabulary::from_file(path));
    CorpusEncoding& encoding = encoding_;
    encoding.ids = o_.ids;
    if (!o_.ids) {
      encoding.source_vocabulary = &vocabularies_.front();
      encoding.target_vocabulary = &vocabularies_.back();
      if (vocabularies_.front().size() != config.src_vocab_size ||
          vocabularies_.back().size() != config.tgt_vocab_size)
        throw Error("the vocabularies have " + std::to_string(vocabularies_.front().size()) + "/" +
                    std::to_string(vocabularies_.back().size()) + " tokens but the model expects " +
                    std::to_string(config.src_vocab_size) + "/" +
                    std::to_string(config.tgt_vocab_size));
    }
    if (samples_segmentations() &&
        (o_.ids || !vocabularies_.front().can_sample() || !vocabularies_.back().can_sample()))
      throw Error(
          "--sentencepiece-alphas samples segmentations: give SentencePiece BPE or unigram "
          "--vocabs (not --ids, token lists, or char / word models)");
    encoding.src_vocab_size = config.src_vocab_size;
    encoding.tgt_vocab_size = config.tgt_vocab_size;
    // One limit for both sides: the target's (the source's is the same or one more).
    const int64_t max_tokens = max_target_tokens(config);
    encoding.max_length = o_.max_length > 0 ? std::min(o_.max_length, max_tokens) : max_tokens;
    if (o_.train_src.empty() || o_.train_tgt.empty())
      throw Error("--train-src and --train-tgt are required");
    train_text_ = read_parallel_text(o_.train_src, o_.train_tgt);
    if (train_text_.sources.empty()) throw Error(o_.train_src + ": no training pairs (empty file)");
    encode_epoch();
    if (!o_.valid_src.empty()) {           // and --valid-tgt (check_options)
      CorpusEncoding one_best = encoding;  // validation: never sampled
      one_best.source_sampling_alpha = one_best.target_sampling_alpha = 0;
      valid_.emplace(load_parallel_corpus(o_.valid_src, o_.valid_tgt, one_best));
      if (valid_->sources.empty())
        throw Error(o_.valid_src + ": no usable validation pairs (" +
                    std::to_string(valid_->lines) + " lines read)");
      for (const auto& members :
           plan_batches(*valid_, o_.batch_tokens, config.src_append_eos, 0, 0, false))
        valid_batches_.push_back(make_batch(config, valid_->sources, valid_->targets, members));
      if (primary_)
        std::fprintf(stderr, "valid: %lld pairs used\n", (long long)valid_->sources.size());
    }
  }

  // The optimizer (with a resumed run's moments), the gradients, the data position's batch
  // plan and the log; then, under mpirun, the check that every rank starts from the same state.
  void prepare_training() {
    const ModelConfig& config = model_->config();
    if (primary_) install_vocabulary_files(o_.vocabularies, o_.model_dir);
    if (replicas_.distributed() && primary_)
      std::fprintf(stderr,
                   "data parallel: %d ranks, each takes every %d-th sentence of a global batch of "
                   "%lld tokens; rank 0 on %s\n",
                   replicas_.size(), replicas_.size(), (long long)o_.batch_tokens,
                   backend_.name().c_str());
    optimizer_.emplace(o_.optimizer, model_->parameters());
    if (resumed_) {
      optimizer_->load_state(std::move(resumed_->optimizer_state), checkpoint_path(o_.model_dir));
      optimizer_->set_step(state_.step);
      if (primary_)
        std::fprintf(stderr, "resuming at step %lld (epoch %lld, batch %lld)\n",
                     (long long)state_.step, (long long)state_.epoch,
                     (long long)state_.batch_index);
      resumed_.reset();
    }
    gradients_ = DeviceTensors::zeros_like(model_->parameters());
    grad_views_ = bind_gradients(config, gradients_);
    dropout_.dropout = o_.dropout;
    dropout_.attention_dropout = o_.attention_dropout;
    dropout_.relu_dropout = o_.relu_dropout;

    extra_source_ = config.src_append_eos ? 1 : 0;
    plan_ = plan_batches(corpus_, o_.batch_tokens, extra_source_, state_.seed, state_.epoch, true);
    plan_activations();
    if (state_.batch_index > int64_t(plan_.size()))
      throw Error(checkpoint_path(o_.model_dir) + ": its data position (batch_index " +
                  std::to_string(state_.batch_index) + " in epoch " +
                  std::to_string(state_.epoch + 1) + ") is past the " +
                  std::to_string(plan_.size()) +
                  " batches of this data; resume with the run's own --train-src/--train-tgt and "
                  "--batch-tokens");
    terminal_ = primary_ && ::isatty(2);
    if (replicas_.distributed()) {
      // Every rank read the checkpoint, corpus and options itself: they must agree before any
      // gradient is summed, or the ranks would train on different batches without noticing.
      const std::string start_state =
          state_.to_json().dump() + " " + std::to_string(optimizer_->step()) + " " +
          std::to_string(plan_.size()) + " " + std::to_string(valid_batches_.size()) + " " +
          options_every_rank_shares(o_, config);
      // The parameters need no check: they were just broadcast from rank 0.
      uint64_t checksum = checksum_text(start_state);
      checksum = checksum_sequences(corpus_.sources, checksum);
      checksum = checksum_sequences(corpus_.targets, checksum);
      for (const auto& [prefix, moments] : optimizer_->moments())
        checksum = checksum_tensors(*moments, checksum_text(prefix, checksum));
      if (!replicas_.all_equal(checksum))
        throw Error(replicas_.prefix() +
                    "the ranks start from different states (checkpoint, data or options differ "
                    "between them; every rank needs the same options, --model-dir and data, e.g. "
                    "on a shared file system)");
    }
    // The log is opened once the run is known to start: a run refused before (here, ranks that
    // disagree) leaves no empty log, and so no directory, behind.
    if (primary_) {
      log_ = std::fopen((o_.model_dir + "/train.log.jsonl").c_str(), "a");
      if (!log_) throw Error(o_.model_dir + "/train.log.jsonl: cannot open for writing");
    }
#ifdef NDEBUG
    check_every_ = o_.replica_check_every;
#else
    check_every_ = o_.replica_check_every > 0 ? o_.replica_check_every : 100;
#endif
    start_ = interval_start_ = Clock::now();
    seconds_before_ = state_.train_seconds;
    first_step_ = last_saved_ = state_.step;
    // A run that starts from finite values never saves NaN / Inf over them; one that starts from
    // non-finite weights (--allow-nonfinite) may.
    started_nonfinite_ =
        primary_ && (!all_finite(model_->parameters()) || !optimizer_->state_is_finite());
    if (replicas_.distributed()) {  // a resumed run may have no time left (rank 0's clock decides)
      double vote = primary_ && time_is_up();
      replicas_.sum(&vote, 1);
      stop_agreed_ = vote > 0;
    }
  }

  double elapsed_minutes() const {
    return (seconds_before_ + std::chrono::duration<double>(Clock::now() - start_).count()) / 60.0;
  }
  bool time_is_up(double minutes) const {
    return o_.max_minutes > 0 && minutes >= o_.max_minutes;
  }
  bool time_is_up() const {
    return time_is_up(elapsed_minutes());
  }

  // The stopping rules checked before each step. Distributed runs stop only where all ranks
  // agreed to (stop_agreed_: the time limit on rank 0's clock, a signal on any rank).
  bool time_to_stop() const {
    if (o_.max_steps > 0 && state_.step >= o_.max_steps) return true;
    if (!replicas_.distributed() && time_is_up()) return true;
    if (stop_agreed_) return true;
    if (o_.early_stopping > 0 && state_.validations_without_improvement >= o_.early_stopping) {
      std::fprintf(stderr, "early stopping: no improvement in %lld validations\n",
                   (long long)o_.early_stopping);
      return true;
    }
    return !replicas_.distributed() && stop_signal() != 0;
  }

  bool samples_segmentations() const {
    return state_.sentencepiece_alphas[0] > 0 || state_.sentencepiece_alphas[1] > 0;
  }

  // This epoch's training pairs: the text encoded once, or with --sentencepiece-alphas a
  // segmentation sampled for each epoch from (seed, epoch), so a resumed run sees the same.
  // The text is kept only for sampling.
  // What pairs the encoding kept is printed for the first epoch, and for each later one that
  // samples (a sampled segmentation can make a pair longer than --max-length, or fit).
  void encode_epoch() {
    const bool first = corpus_.lines == 0;
    if (samples_segmentations()) {
      encoding_.source_sampling_alpha = float(state_.sentencepiece_alphas[0]);
      encoding_.target_sampling_alpha = float(state_.sentencepiece_alphas[1]);
      encoding_.sampling_seed = state_.seed * 0xD1B54A32D192ED03ull + uint64_t(state_.epoch);
      corpus_ = {};  // the last epoch's ids go before this epoch's are made
      corpus_ = encode_parallel_text(train_text_, encoding_);
    } else if (!train_text_.sources.empty()) {
      corpus_ = encode_parallel_text(train_text_, encoding_);
      train_text_ = {};
    } else {
      return;  // encoded once, for every epoch
    }
    if (corpus_.sources.empty()) throw Error(o_.train_src + ": no usable training pairs");
    if (!primary_) return;
    if (first)
      std::fprintf(stderr, "train: %lld pairs read, ", (long long)corpus_.lines);
    else
      std::fprintf(stderr,
                   "train: epoch %lld, segmentations sampled anew: ", (long long)state_.epoch + 1);
    std::fprintf(stderr,
                 "%lld used, %lld skipped (empty side), %lld skipped (longer than %lld tokens)\n",
                 (long long)corpus_.sources.size(), (long long)corpus_.skipped_empty,
                 (long long)corpus_.skipped_too_long, (long long)encoding_.max_length);
  }

  // The activation memory of this epoch's training passes (this rank's share of each batch)
  // and of validation, planned from their batch shapes and allocated as one block before the
  // first of them runs: checked against the memory limit here, not found missing at the
  // longest batch hours later. A later epoch groups the pairs differently; the block is
  // reallocated (between steps) only if one of its batches needs more.
  void plan_activations() {
    const ModelConfig& config = model_->config();
    for (const auto& members : plan_) {
      const BatchShape shape = batch_shape(config, corpus_.sources, corpus_.targets, members,
                                           size_t(replicas_.rank()), size_t(replicas_.size()));
      if (shape.batch > 0) plan_loss_and_gradients(*model_, shape, dropout_, true, ws_, precision_);
    }
    for (size_t i = size_t(replicas_.rank()); i < valid_batches_.size();
         i += size_t(replicas_.size()))
      plan_loss_and_gradients(*model_, shape_of(valid_batches_[i]), {}, false, ws_, precision_);
    const int64_t bytes = ws_.plan.block_bytes();
    if (bytes <= ws_.memory.bytes()) return;
    check_memory(host_bytes_on_this_machine(state_bytes() + bytes),
                 "training this model on these batches (weights, gradients, optimizer state and " +
                     std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB of activations)");
    ws_.memory.allocate(model_->backend(), ws_.plan);
    if (primary_)
      std::fprintf(stderr, "train: activations: %.1f MiB in one block (%lld buffers)\n",
                   double(bytes) / (1 << 20), (long long)ws_.plan.buffers());
  }

  // The micro-batches of one step (--accumulate of them), moving to the next epoch when the
  // plan is used up. True when the last epoch (--max-epochs) ended on the way.
  bool take_micro_batches(std::vector<TokenBatch>& micro) {
    const ModelConfig& config = model_->config();
    while (int64_t(micro.size()) < o_.accumulate) {
      if (state_.batch_index >= int64_t(plan_.size())) {
        ++state_.epoch;
        state_.batch_index = 0;
        if (o_.max_epochs > 0 && state_.epoch >= o_.max_epochs) return true;
        encode_epoch();
        plan_ =
            plan_batches(corpus_, o_.batch_tokens, extra_source_, state_.seed, state_.epoch, true);
        plan_activations();
      }
      // This rank's share of the global batch.
      micro.push_back(make_batch(config, corpus_.sources, corpus_.targets,
                                 plan_[size_t(state_.batch_index++)], size_t(replicas_.rank()),
                                 size_t(replicas_.size())));
    }
    return false;
  }

  // One optimizer step on the micro-batches: gradients summed over them and the ranks, then the
  // update (or, with a non-finite loss or gradient, none), the report, validation and save.
  void take_step(const std::vector<TokenBatch>& micro) {
    double step_tokens[1] = {0};
    for (const auto& b : micro)
      for (int32_t n : b.tgt_lengths) step_tokens[0] += n;
    replicas_.sum(step_tokens, 1);  // the loss is normalised by the global target-token count
    const int64_t tokens = int64_t(step_tokens[0]);
    LossTotals totals = compute_gradients(micro, tokens);
    interval_reduce_seconds_ += replicas_.sum_tensors(gradients_);
    double minutes = elapsed_minutes();  // distributed: rank 0's, so every rank has one rate
    if (replicas_.distributed()) share_totals_and_stop_votes(totals, &minutes);
    // A non-finite loss or gradient skips the update (same decision on every rank: both are
    // global sums).
    const bool finite_loss = std::isfinite(totals.loss) && std::isfinite(totals.nll);
    if (!finite_loss ||
        !std::isfinite(optimizer_->apply(model_->mutable_parameters(), gradients_,
                                         model_->config().d_model, progress(minutes)))) {
      skip_step(finite_loss);
      return;
    }
    state_.bad_steps_in_a_row = 0;
    ++state_.step;
    state_.target_tokens_seen += tokens;
    if (replicas_.distributed() && check_every_ > 0 && state_.step % check_every_ == 0 &&
        !replicas_.all_equal(checksum_tensors(model_->parameters())))
      throw Error(replicas_.prefix() + "the ranks' parameters differ after step " +
                  std::to_string(state_.step) + " (replicas diverged)");
    interval_ += totals;
    report_progress();
    if (o_.valid_every > 0 && state_.step % o_.valid_every == 0) validate();
    if (o_.save_every > 0 && state_.step % o_.save_every == 0) save();
  }

  // This rank's loss totals of the step, its gradients (scaled by 1 / the global target
  // tokens) in gradients_.
  LossTotals compute_gradients(const std::vector<TokenBatch>& micro, int64_t tokens) {
    gradients_.set_zero();
    LossTotals totals;
    for (size_t m = 0; m < micro.size(); ++m) {
      if (micro[m].tgt_lengths.empty()) continue;  // a share can be empty in a tiny batch
      dropout_.seed = dropout_key(state_.seed, uint64_t(state_.step + 1) * 1024 + m);
      if (replicas_.rank() > 0)
        dropout_.seed = dropout_key(dropout_.seed, uint64_t(replicas_.rank()));
      totals += loss_and_gradients(*model_, grad_views_, micro[m], dropout_, o_.label_smoothing,
                                   1.f / float(tokens), ws_, precision_);
    }
    return totals;
  }

  // How far through its limits the run is before this step, in [0, 1]: the larger of steps /
  // --max-steps and minutes / --max-minutes (0 without either); drives the cool-down.
  double progress(double minutes) const {
    double done = 0;
    if (o_.max_steps > 0) done = double(state_.step) / double(o_.max_steps);
    if (o_.max_minutes > 0) done = std::max(done, minutes / o_.max_minutes);
    return std::min(done, 1.0);
  }

  // One small all-reduce per step: the step's loss totals, the votes to stop (a signal on any
  // rank; the time limit on rank 0's clock), so that every rank stops at the same step, and
  // rank 0's elapsed minutes (into *minutes), so that every rank cools down alike.
  void share_totals_and_stop_votes(LossTotals& totals, double* minutes) {
    const bool time_up = primary_ && time_is_up(*minutes);  // the reading the rate uses
    double shared[7] = {totals.loss,
                        totals.nll,
                        double(totals.tokens),
                        double(totals.correct),
                        double(stop_signal() != 0),
                        double(time_up),
                        primary_ ? *minutes : 0.0};
    replicas_.sum(shared, 7);
    *minutes = shared[6];
    totals = {shared[0], shared[1], int64_t(shared[2]), int64_t(shared[3])};
    signalled_somewhere_ = shared[4] > 0;
    stop_agreed_ = shared[4] > 0 || shared[5] > 0;
  }

  // A step without an update; too many in a row end the run without overwriting the last
  // checkpoint.
  void skip_step(bool finite_loss) {
    ++state_.skipped_steps;
    ++state_.bad_steps_in_a_row;
    if (primary_)
      std::fprintf(stderr,
                   "%swarning: step %lld: %s is not finite; update skipped (%lld in a row, %lld "
                   "in all)\n",
                   terminal_ ? "\r\033[K" : "", (long long)state_.step + 1,
                   finite_loss ? "the gradient norm" : "the loss",
                   (long long)state_.bad_steps_in_a_row, (long long)state_.skipped_steps);
    if (log_)
      write_log({{"event", "skipped"},
                 {"step", state_.step + 1},
                 {"reason", finite_loss ? "gradient" : "loss"},
                 {"skipped_steps", state_.skipped_steps}});
    if (state_.bad_steps_in_a_row >= o_.max_bad_steps)
      throw Error(replicas_.prefix() +
                  "training stopped: " + std::to_string(state_.bad_steps_in_a_row) +
                  " steps in a row had a non-finite loss or gradient (--max-bad-steps); the last "
                  "checkpoint (" +
                  (has_checkpoint(o_.model_dir) ? "step " + std::to_string(last_saved_) : "none") +
                  ") is left as it was. Try a lower learning rate or --clip-norm");
  }

  // The progress line (every step on a terminal) and, every --log-every steps, the log entry.
  void report_progress() {
    const bool log_now = o_.log_every > 0 && state_.step % o_.log_every == 0;
    if (!terminal_ && !log_now) return;
    const double interval_seconds =
        std::chrono::duration<double>(Clock::now() - interval_start_).count();
    const double loss = per_token(interval_.loss, interval_.tokens);
    const double ppl = std::exp(per_token(interval_.nll, interval_.tokens));
    const double speed = double(interval_.tokens) / std::max(interval_seconds, 1e-9);
    const double lr = optimizer_->last_rate();
    std::string eta;
    const double run_seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (o_.max_steps > 0 && state_.step > first_step_)
      eta = " | ETA " + format_duration(double(o_.max_steps - state_.step) * run_seconds /
                                        double(state_.step - first_step_));
    if (o_.max_minutes > 0)
      eta =
          " | " + format_duration(std::max(0.0, o_.max_minutes - elapsed_minutes()) * 60) + " left";
    char line[256];
    std::snprintf(
        line, sizeof line, "step %lld | epoch %lld | loss %.4f | ppl %.2f | lr %.3g | %.0f tok/s%s",
        (long long)state_.step, (long long)state_.epoch + 1, loss, ppl, lr, speed, eta.c_str());
    if (!log_now) {
      std::fprintf(stderr, "\r\033[K%s", line);
      return;
    }
    if (primary_) {
      std::fprintf(stderr, "%s%s\n", terminal_ ? "\r\033[K" : "", line);
      nlohmann::json entry = {{"event", "train"},
                              {"step", state_.step},
                              {"epoch", state_.epoch},
                              {"loss", loss},
                              {"ppl", ppl},
                              {"lr", lr},
                              {"target_tokens_per_s", speed},
                              {"minutes", elapsed_minutes()},
                              {"rss_mb", double(resident_memory_bytes()) / (1 << 20)}};
      if (replicas_.distributed()) {
        entry["ranks"] = replicas_.size();
        entry["allreduce_seconds_per_step"] = interval_reduce_seconds_ / double(o_.log_every);
        entry["allreduce_bytes_per_step"] = gradients_.numel() * int64_t(sizeof(float));
      }
      // A device with memory of its own: what the run holds there (flat after the first steps),
      // and the most it has held (what a larger --batch-tokens must fit beside).
      const DeviceMemory device = backend_.device_memory();
      if (device.in_use >= 0) {
        entry["device_memory_mb"] = double(device.in_use) / (1 << 20);
        entry["device_memory_peak_mb"] = double(device.peak_in_use) / (1 << 20);
      }
      write_log(entry);
    }
    result_.last_loss = loss;
    interval_ = {};
    interval_reduce_seconds_ = 0;
    interval_start_ = Clock::now();
  }

  // The dev set's loss, perplexity and accuracy; the best model so far is kept as
  // model.best.safetensors.
  void validate() {
    if (!valid_) return;
    LossTotals totals;  // each rank scores every size()-th batch; the totals are summed
    for (size_t i = size_t(replicas_.rank()); i < valid_batches_.size();
         i += size_t(replicas_.size()))
      totals += loss_and_gradients(*model_, grad_views_, valid_batches_[i], {}, o_.label_smoothing,
                                   0.f, ws_, precision_);
    sum_totals(replicas_, totals);
    const double nll = per_token(totals.nll, totals.tokens);
    const bool best = state_.best_valid_nll < 0 || nll < state_.best_valid_nll;
    if (best) {
      state_.best_valid_nll = nll;
      state_.validations_without_improvement = 0;
      if (primary_) save_model(*model_, o_.model_dir + "/model.best.safetensors");
    } else {
      ++state_.validations_without_improvement;
    }
    last_validated_ = state_.step;
    if (!primary_) return;
    const double accuracy = per_token(double(totals.correct), totals.tokens);
    const double loss = per_token(totals.loss, totals.tokens);
    std::fprintf(stderr, "%svalid step %lld: loss %.4f ppl %.2f accuracy %.2f%%%s\n",
                 terminal_ ? "\r\033[K" : "", (long long)state_.step, loss, std::exp(nll),
                 100.0 * accuracy, best ? " (best)" : "");
    write_log({{"event", "valid"},
               {"step", state_.step},
               {"epoch", state_.epoch},
               {"loss", loss},
               {"ppl", std::exp(nll)},
               {"accuracy", accuracy},
               {"best", best},
               {"minutes", elapsed_minutes()}});
  }

  void save() {
    state_.train_seconds = elapsed_minutes() * 60.0;
    if (primary_)
      save_checkpoint(o_.model_dir, *model_, *optimizer_, state_, o_.keep, started_nonfinite_);
    last_saved_ = state_.step;
  }

  void write_log(const nlohmann::json& entry) {
    std::fprintf(log_, "%s\n", entry.dump().c_str());
    std::fflush(log_);
  }

  const TrainOptions& o_;
  Replicas& replicas_;
  const Backend& backend_;
  const bool primary_;
  TrainResult result_;

  // The model and where the run stands.
  std::optional<DirectoryLock> lock_;             // rank 0's, on the model directory
  std::vector<std::string> created_directories_;  // by open_model, the deepest last
  std::optional<LoadedCheckpoint> resumed_;       // until its parts moved into model_ / optimizer_
  std::optional<Model> model_;
  TrainingState state_;
  Precision precision_ = Precision::kFloat32;

  // The data.
  std::vector<Vocabulary> vocabularies_;  // source and target (one when joint); none with --ids
  CorpusEncoding encoding_;               // of the training pairs (points into vocabularies_)
  ParallelText train_text_;               // kept while sampling segmentations, else emptied
  ParallelCorpus corpus_;                 // this epoch's training pairs
  std::optional<ParallelCorpus> valid_;
  std::vector<TokenBatch> valid_batches_;
  int64_t extra_source_ = 0;  // 1 when sources get an eos
  BatchPlan plan_;            // this epoch's batches (indices into corpus_)

  // Training.
  std::optional<Optimizer> optimizer_;
  DeviceTensors gradients_;  // the parameters' names and shapes, one block
  TransformerGradients grad_views_{};
  TrainingWorkspace ws_;
  DropoutOptions dropout_;

  // Reporting, stopping and saving.
  std::FILE* log_ = nullptr;  // rank 0's train.log.jsonl
  bool terminal_ = false;     // rank 0 writes to a terminal: a progress line every step
  int64_t check_every_ = 0;   // distributed: parameter checksums compared every this many steps
  Clock::time_point start_, interval_start_;
  double seconds_before_ = 0;  // training time of the run before this process
  LossTotals interval_;        // since the last log entry
  double interval_reduce_seconds_ = 0;
  int64_t first_step_ = 0, last_saved_ = 0, last_validated_ = -1;
  bool started_nonfinite_ = false;
  bool stop_agreed_ = false;          // distributed: all ranks agreed (last step) to stop
  bool signalled_somewhere_ = false;  // distributed: some rank got SIGINT / SIGTERM
};

}  // namespace

TrainResult train(const TrainOptions& o) {
  check_options(o);
  // From here on SIGINT / SIGTERM stop the run cleanly, also while it is still loading.
  StopSignalGuard signals;
  Replicas& replicas = Replicas::world();
  replicas.set_timeout(o.replica_timeout);
  replicas.watch_stop_signal(&stop_signal());
  const Backend& backend = find_backend(o.device, replicas.local_rank());
  // A compute type this backend cannot train in fails before anything is loaded.
  if (o.precision) check_compute_type(backend, *o.precision);
  TrainingRun run(o, replicas, backend);
  if (!run.start()) return run.result();
  run.run_steps();
  return run.finish();
}

}  // namespace tfm
