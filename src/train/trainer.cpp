// train(): the loop, its logging and its stopping rules.
#include "train/trainer.h"

#include <omp.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "io/directory_lock.h"
#include "io/file_util.h"
#include "io/model_directory.h"
#include "io/model_file.h"
#include "model/init.h"
#include "tensor/error.h"
#include "tensor/memory_budget.h"
#include "text/batching.h"
#include "train/checkpoint.h"
#include "train/loss.h"
#include "train/replicas.h"

namespace tfm {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

// For the lifetime of a training run, SIGINT / SIGTERM only set g_stop_signal, and never
// interrupt the computation: they are blocked in this thread and in every OpenMP worker (threads
// created later inherit the mask) and taken by one waiting thread. A signal handler running
// inside a GEMM or an allocation on a compute thread is what this avoids. The handler stays
// installed for threads that do not block them (e.g. an MPI library's own threads).
class SignalGuard {
 public:
  SignalGuard() {
    g_stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &old_mask_);
#pragma omp parallel
    if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    waiter_ = std::thread([this] {
      while (!quit_) {
        const timespec tick{0, 100 * 1000 * 1000};  // 0.1 s: how soon the destructor returns
        const int signal = sigtimedwait(&signals_, nullptr, &tick);
        if (signal > 0) g_stop_signal = signal;
      }
    });
  }
  ~SignalGuard() {
    quit_ = true;
    waiter_.join();
    // Handlers first, then masks: a signal still pending acts as it would have without us.
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    const bool int_was_blocked = sigismember(&old_mask_, SIGINT) == 1;
    const bool term_was_blocked = sigismember(&old_mask_, SIGTERM) == 1;
    sigset_t unblock;
    sigemptyset(&unblock);
    if (!int_was_blocked) sigaddset(&unblock, SIGINT);
    if (!term_was_blocked) sigaddset(&unblock, SIGTERM);
#pragma omp parallel
    if (omp_get_thread_num() != 0) pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
  sigset_t signals_{}, old_mask_{};
  std::atomic<bool> quit_{false};
  std::thread waiter_;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Vocabulary load_vocabulary(const std::string& path) {
  return ends_with(path, ".txt") ? Vocabulary::from_token_list(path)
                                 : Vocabulary::from_sentencepiece(path);
}

void copy_file_atomically(const std::string& from, const std::string& to) {
  write_bytes_atomically(to, read_file_bytes(from));
}

// Puts the vocabularies into the model directory under the names translate / score look for.
void install_vocabularies(const std::vector<std::string>& files, const std::string& dir) {
  if (files.size() == 1) {
    if (ends_with(files[0], ".txt")) {
      copy_file_atomically(files[0], dir + "/source_vocabulary.txt");
      copy_file_atomically(files[0], dir + "/target_vocabulary.txt");
    } else {
      copy_file_atomically(files[0], dir + "/vocab.spm");
    }
  } else if (files.size() == 2) {
    const bool lists = ends_with(files[0], ".txt");
    copy_file_atomically(files[0], dir + (lists ? "/source_vocabulary.txt" : "/source.spm"));
    copy_file_atomically(files[1], dir + (lists ? "/target_vocabulary.txt" : "/target.spm"));
  }
}

std::vector<TokenBatch> make_batches(const ModelConfig& config, const ParallelCorpus& corpus,
                                     const BatchPlan& plan) {
  std::vector<TokenBatch> batches;
  for (const auto& members : plan) {
    std::vector<std::vector<int32_t>> src, tgt;
    for (int64_t i : members) {
      src.push_back(corpus.sources[size_t(i)]);
      tgt.push_back(corpus.targets[size_t(i)]);
    }
    batches.push_back(make_batch(config, src, tgt));
  }
  return batches;
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

}  // namespace

TrainResult train(const TrainOptions& o) {
  using Clock = std::chrono::steady_clock;
  if (o.model_dir.empty()) throw Error("--model-dir is required");
  if (o.accumulate < 1) throw Error("--accumulate must be at least 1");
  if (!(o.label_smoothing >= 0.f && o.label_smoothing < 1.f))
    throw Error("--label-smoothing must be in [0, 1)");
  for (float p : {o.dropout, o.attention_dropout, o.relu_dropout})
    if (!(p >= 0.f && p < 1.f)) throw Error("dropout probabilities must be in [0, 1)");
  if (o.ids == !o.vocabularies.empty())
    throw Error(o.ids ? "--ids and --vocabs exclude each other"
                      : "give --vocabs (SentencePiece or token list) or --ids");
  if (o.vocabularies.size() > 2)
    throw Error("--vocabs takes one joint or two (source, target) files");

  // From here on SIGINT / SIGTERM stop the run cleanly, also while it is still loading.
  SignalGuard signals;
  Replicas& replicas = Replicas::world();
  replicas.set_timeout(o.replica_timeout);
  replicas.watch_stop_signal(&g_stop_signal);
  const bool primary = replicas.primary();
  if (o.replica_timeout <= 0) throw Error("--replica-timeout must be positive");
  const Backend& backend = find_backend(o.device);
  // A compute type this backend cannot train in fails before anything is loaded.
  auto check_compute_type = [&](Precision precision) {
    if (precision == Precision::kInt8)
      throw Error("--compute-type int8 is for inference; train in float32 or bfloat16");
    if (!backend.supports(precision))
      throw Error(std::string("--compute-type ") + precision_name(precision) +
                  (backend.name() == "cpu" ? " needs a CPU with AVX512-BF16 instructions"
                                           : " is not supported by device " + backend.name()));
  };
  if (o.precision) check_compute_type(*o.precision);
  TrainResult result;
  result.primary = primary;
  // A signal before the first step: nothing to save, and no point loading the rest.
  auto stopped_before_start = [&] {
    if (replicas.distributed() || !g_stop_signal) return false;
    if (primary)
      std::fprintf(stderr, "train: stopped by %s before the first step; nothing was written\n",
                   g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    result.interrupted = result.stopped_before_start = true;
    return true;
  };

  // The model: resumed, given, or new. One run per directory: rank 0 locks it.
  std::optional<DirectoryLock> lock;
  if (primary) {
    make_directories(o.model_dir);
    lock.emplace(o.model_dir, "training run");
    remove_stale_temp_files(o.model_dir);
    remove_stale_temp_files(o.model_dir + "/checkpoints");
  }
  std::optional<Model> model;
  std::optional<LoadedCheckpoint> resumed;
  TrainingState state;
  state.seed = o.seed;
  if (has_checkpoint(o.model_dir)) {
    if (!o.resume)
      throw Error(o.model_dir +
                  " already holds a training run; pass --resume to continue it, or choose another "
                  "--model-dir");
    resumed.emplace(load_checkpoint(o.model_dir, backend));
    state = resumed->state;
    if (o.precision && *o.precision != state.compute_type && primary)
      std::fprintf(stderr,
                   "train: --resume: the run trained in %s and continues in %s (--compute-type), "
                   "so it is no longer bit-exact with an uninterrupted run\n",
                   precision_name(state.compute_type), precision_name(*o.precision));
  } else if (o.resume) {
    if (o.init_path.empty() && !o.has_config)
      throw Error("--resume: " + o.model_dir +
                  " holds no checkpoint to continue; give --preset, --config or --init to start a "
                  "new run there");
    if (primary)
      std::fprintf(stderr, "train: --resume: %s holds no checkpoint yet; starting a new run\n",
                   o.model_dir.c_str());
  }
  if (resumed) {
    model.emplace(std::move(resumed->model));
  } else if (!o.init_path.empty()) {
    model.emplace(load_model(o.init_path, backend));
  } else if (o.has_config) {
    model.emplace(init_model(o.config, o.seed, backend));
  } else {
    throw Error("choose a model: --preset, --config or --init (or --resume an existing run)");
  }
  if (stopped_before_start()) return result;
  // As given, else the resumed run's own (so --resume alone continues bit for bit), else float32.
  const Precision precision = o.precision.value_or(state.compute_type);
  if (!o.precision) check_compute_type(precision);  // a given one was checked before loading
  state.compute_type = precision;
  const ModelConfig& config = model->config();
  // Weights + gradients (+ Adam's two moments, + the all-reduce buffer), for every rank on this
  // machine, before any of them is allocated.
  const int64_t copies =
      (o.optimizer.algorithm == "adam" ? 4 : 2) + (replicas.distributed() ? 1 : 0);
  check_memory(parameter_count(config) * int64_t(sizeof(float)) * copies * replicas.local_size(),
               "training this model (weights, gradients, optimizer state)");
  replicas.broadcast_tensors(model->mutable_parameters());  // every rank starts from rank 0's

  // Data.
  std::vector<Vocabulary> vocabularies;
  for (const auto& path : o.vocabularies) vocabularies.push_back(load_vocabulary(path));
  CorpusEncoding encoding;
  encoding.ids = o.ids;
  if (!o.ids) {
    encoding.source_vocabulary = &vocabularies.front();
    encoding.target_vocabulary = &vocabularies.back();
    if (vocabularies.front().size() != config.src_vocab_size ||
        vocabularies.back().size() != config.tgt_vocab_size)
      throw Error("the vocabularies have " + std::to_string(vocabularies.front().size()) + "/" +
                  std::to_string(vocabularies.back().size()) + " tokens but the model expects " +
                  std::to_string(config.src_vocab_size) + "/" +
                  std::to_string(config.tgt_vocab_size));
  }
  encoding.src_vocab_size = config.src_vocab_size;
  encoding.tgt_vocab_size = config.tgt_vocab_size;
  // One limit for both sides: the target's (the source's is the same or one more).
  const int64_t max_tokens = max_target_tokens(config);
  encoding.max_length = o.max_length > 0 ? std::min(o.max_length, max_tokens) : max_tokens;
  if (o.train_src.empty() || o.train_tgt.empty())
    throw Error("--train-src and --train-tgt are required");
  const ParallelCorpus corpus = load_parallel_corpus(o.train_src, o.train_tgt, encoding);
  if (corpus.sources.empty()) throw Error(o.train_src + ": no usable training pairs");
  if (stopped_before_start()) return result;
  if (primary)
    std::fprintf(
        stderr,
        "train: %lld pairs read, %lld used, %lld skipped (empty side), %lld skipped (longer "
        "than %lld tokens)\n",
        (long long)corpus.lines, (long long)corpus.sources.size(), (long long)corpus.skipped_empty,
        (long long)corpus.skipped_too_long, (long long)encoding.max_length);
  std::optional<ParallelCorpus> valid;
  std::vector<TokenBatch> valid_batches;
  if (!o.valid_src.empty() || !o.valid_tgt.empty()) {
    if (o.valid_src.empty() || o.valid_tgt.empty())
      throw Error("give both --valid-src and --valid-tgt");
    valid.emplace(load_parallel_corpus(o.valid_src, o.valid_tgt, encoding));
    valid_batches = make_batches(
        config, *valid, plan_batches(*valid, o.batch_tokens, config.src_append_eos, 0, 0, false));
    if (primary) std::fprintf(stderr, "valid: %lld pairs used\n", (long long)valid->sources.size());
  }
  if (primary) install_vocabularies(o.vocabularies, o.model_dir);
  if (replicas.distributed() && primary)
    std::fprintf(stderr,
                 "data parallel: %d ranks, each takes every %d-th sentence of a global batch of "
                 "%lld tokens\n",
                 replicas.size(), replicas.size(), (long long)o.batch_tokens);

  Optimizer optimizer(o.optimizer, model->parameters(), model->backend());
  if (resumed) {
    optimizer.load_state(std::move(resumed->optimizer_state),
                         o.model_dir + "/checkpoint.safetensors");
    optimizer.set_step(state.step);
    if (primary)
      std::fprintf(stderr, "resuming at step %lld (epoch %lld, batch %lld)\n",
                   (long long)state.step, (long long)state.epoch, (long long)state.batch_index);
  }
  TensorMap gradients;
  for (const auto& [name, t] : model->parameters()) gradients.emplace(name, Tensor(t.shape));
  const TransformerGradients grad_views = bind_gradients(config, gradients);
  TrainingWorkspace ws;
  DropoutOptions dropout;
  dropout.dropout = o.dropout;
  dropout.attention_dropout = o.attention_dropout;
  dropout.relu_dropout = o.relu_dropout;

  const int64_t extra_source = config.src_append_eos ? 1 : 0;
  BatchPlan plan =
      plan_batches(corpus, o.batch_tokens, extra_source, state.seed, state.epoch, true);
  if (state.batch_index > int64_t(plan.size()))
    throw Error(o.model_dir + "/checkpoint.safetensors: its data position (batch_index " +
                std::to_string(state.batch_index) + " in epoch " + std::to_string(state.epoch + 1) +
                ") is past the " + std::to_string(plan.size()) +
                " batches of this data; resume with the run's own --train-src/--train-tgt and "
                "--batch-tokens");
  std::FILE* log = nullptr;  // rank 0's
  if (primary) {
    log = std::fopen((o.model_dir + "/train.log.jsonl").c_str(), "a");
    if (!log) throw Error(o.model_dir + "/train.log.jsonl: cannot open for writing");
  }
  const bool terminal = primary && ::isatty(2);
  if (replicas.distributed()) {
    // Every rank read the checkpoint, corpus and options itself: they must agree before any
    // gradient is summed, or the ranks would train on different batches without noticing.
    const std::string start_state =
        state.to_json().dump() + " " + std::to_string(optimizer.step()) + " " +
        std::to_string(corpus.sources.size()) + " " + std::to_string(plan.size()) + " " +
        std::to_string(valid_batches.size());
    // The parameters need no check: they were just broadcast from rank 0.
    if (!replicas.all_equal(checksum_tensors(optimizer.state(), start_state)))
      throw Error(replicas.prefix() +
                  "the ranks start from different states (checkpoint, data or options differ "
                  "between them; every rank needs the same --model-dir and data files, e.g. on a "
                  "shared file system)");
  }
#ifdef NDEBUG
  const int64_t check_every = o.replica_check_every;
#else
  const int64_t check_every = o.replica_check_every > 0 ? o.replica_check_every : 100;
#endif
  const auto start = Clock::now();
  const double seconds_before = state.train_seconds;
  auto elapsed_minutes = [&] {
    return (seconds_before + std::chrono::duration<double>(Clock::now() - start).count()) / 60.0;
  };
  LossTotals interval;
  double interval_reduce_seconds = 0;
  auto interval_start = Clock::now();
  const int64_t first_step = state.step;
  int64_t last_saved = state.step, last_validated = -1;

  auto validate = [&] {
    if (!valid) return;
    LossTotals totals;  // each rank scores every size()-th batch; the totals are summed
    for (size_t i = size_t(replicas.rank()); i < valid_batches.size(); i += size_t(replicas.size()))
      totals += loss_and_gradients(*model, grad_views, valid_batches[i], {}, o.label_smoothing, 0.f,
                                   ws, precision);
    sum_totals(replicas, totals);
    const double nll = totals.nll / double(std::max<int64_t>(totals.tokens, 1));
    const bool best = state.best_valid_nll < 0 || nll < state.best_valid_nll;
    if (best) {
      state.best_valid_nll = nll;
      state.validations_without_improvement = 0;
      if (primary) save_model(*model, o.model_dir + "/model.best.safetensors");
    } else {
      ++state.validations_without_improvement;
    }
    last_validated = state.step;
    if (!primary) return;
    const double accuracy = double(totals.correct) / double(std::max<int64_t>(totals.tokens, 1));
    std::fprintf(stderr, "%svalid step %lld: loss %.4f ppl %.2f accuracy %.2f%%%s\n",
                 terminal ? "\r\033[K" : "", (long long)state.step,
                 totals.loss / double(std::max<int64_t>(totals.tokens, 1)), std::exp(nll),
                 100.0 * accuracy, best ? " (best)" : "");
    std::fprintf(
        log, "%s\n",
        nlohmann::json({{"event", "valid"},
                        {"step", state.step},
                        {"epoch", state.epoch},
                        {"loss", totals.loss / double(std::max<int64_t>(totals.tokens, 1))},
                        {"ppl", std::exp(nll)},
                        {"accuracy", accuracy},
                        {"best", best},
                        {"minutes", elapsed_minutes()}})
            .dump()
            .c_str());
    std::fflush(log);
  };
  // A run that starts from finite values never saves NaN / Inf over them; one that starts from
  // non-finite weights (--allow-nonfinite) may.
  const bool started_nonfinite =
      primary && (!all_finite(model->parameters()) || !all_finite(optimizer.state()));
  auto save = [&] {
    state.train_seconds = elapsed_minutes() * 60.0;
    if (primary) save_checkpoint(o.model_dir, *model, optimizer, state, o.keep, started_nonfinite);
    last_saved = state.step;
  };
  bool stop_agreed = false;          // distributed: all ranks agreed (end of the last step) to stop
  bool signalled_somewhere = false;  // distributed: some rank got SIGINT / SIGTERM
  if (replicas.distributed()) {      // a resumed run may have no time left (rank 0's clock decides)
    double vote = primary && o.max_minutes > 0 && elapsed_minutes() >= o.max_minutes;
    replicas.sum(&vote, 1);
    stop_agreed = vote > 0;
  }
  int64_t gradient_bytes = 0;  // all-reduced per step
  for (const auto& [name, g] : gradients) gradient_bytes += g.numel() * int64_t(sizeof(float));

  while (true) {
    if (o.max_steps > 0 && state.step >= o.max_steps) break;
    if (!replicas.distributed() && o.max_minutes > 0 && elapsed_minutes() >= o.max_minutes) break;
    if (stop_agreed) break;
    if (o.early_stopping > 0 && state.validations_without_improvement >= o.early_stopping) {
      std::fprintf(stderr, "early stopping: no improvement in %lld validations\n",
                   (long long)o.early_stopping);
      break;
    }
    if (!replicas.distributed() && g_stop_signal) break;
    // Gather the micro-batches of this step, moving to the next epoch when one is used up.
    std::vector<TokenBatch> micro;
    bool epochs_done = false;
    while (int64_t(micro.size()) < o.accumulate) {
      if (state.batch_index >= int64_t(plan.size())) {
        ++state.epoch;
        state.batch_index = 0;
        if (o.max_epochs > 0 && state.epoch >= o.max_epochs) {
          epochs_done = true;
          break;
        }
        plan = plan_batches(corpus, o.batch_tokens, extra_source, state.seed, state.epoch, true);
      }
      // This rank's share of the global batch: every size()-th sentence of a length-sorted
      // batch, so the shares have similar lengths and together hold each sentence once.
      const auto& members = plan[size_t(state.batch_index++)];
      std::vector<std::vector<int32_t>> src, tgt;
      for (size_t i = size_t(replicas.rank()); i < members.size(); i += size_t(replicas.size())) {
        src.push_back(corpus.sources[size_t(members[i])]);
        tgt.push_back(corpus.targets[size_t(members[i])]);
      }
      micro.push_back(make_batch(config, src, tgt));
    }
    if (epochs_done && micro.empty()) break;  // the same on every rank: the plan is global
    double step_tokens[1] = {0};
    for (const auto& b : micro)
      for (int32_t n : b.tgt_lengths) step_tokens[0] += n;
    replicas.sum(step_tokens, 1);  // the loss is normalised by the global target-token count
    const int64_t tokens = int64_t(step_tokens[0]);
    for (auto& [name, g] : gradients) std::fill(g.data.begin(), g.data.end(), 0.f);
    LossTotals step_totals;
    for (size_t m = 0; m < micro.size(); ++m) {
      if (micro[m].tgt_lengths.empty()) continue;  // a share can be empty in a tiny batch
      dropout.seed = dropout_key(state.seed, uint64_t(state.step + 1) * 1024 + m);
      if (replicas.rank() > 0) dropout.seed = dropout_key(dropout.seed, uint64_t(replicas.rank()));
      step_totals += loss_and_gradients(*model, grad_views, micro[m], dropout, o.label_smoothing,
                                        1.f / float(tokens), ws, precision);
    }
    interval_reduce_seconds += replicas.sum_tensors(gradients);
    if (replicas.distributed()) {
      // One small all-reduce per step: the step's loss totals, and the votes to stop (a signal
      // on any rank; the time limit on rank 0's clock), so that every rank stops at the same step.
      const bool time_up = primary && o.max_minutes > 0 && elapsed_minutes() >= o.max_minutes;
      double shared[6] = {step_totals.loss,           step_totals.nll,
                          double(step_totals.tokens), double(step_totals.correct),
                          double(g_stop_signal != 0), double(time_up)};
      replicas.sum(shared, 6);
      step_totals = {shared[0], shared[1], int64_t(shared[2]), int64_t(shared[3])};
      signalled_somewhere = shared[4] > 0;
      stop_agreed = shared[4] > 0 || shared[5] > 0;
    }
    // A non-finite loss or gradient skips the update (same decision on every rank: both are
    // global sums); too many in a row end the run without overwriting the last checkpoint.
    const bool finite_loss = std::isfinite(step_totals.loss) && std::isfinite(step_totals.nll);
    if (!finite_loss ||
        !std::isfinite(optimizer.apply(model->mutable_parameters(), gradients, config.d_model))) {
      ++state.skipped_steps;
      ++state.bad_steps_in_a_row;
      if (primary)
        std::fprintf(stderr,
                     "%swarning: step %lld: %s is not finite; update skipped (%lld in a row, %lld "
                     "in all)\n",
                     terminal ? "\r\033[K" : "", (long long)state.step + 1,
                     finite_loss ? "the gradient norm" : "the loss",
                     (long long)state.bad_steps_in_a_row, (long long)state.skipped_steps);
      if (log)
        std::fprintf(log, "%s\n",
                     nlohmann::json({{"event", "skipped"},
                                     {"step", state.step + 1},
                                     {"reason", finite_loss ? "gradient" : "loss"},
                                     {"skipped_steps", state.skipped_steps}})
                         .dump()
                         .c_str());
      if (state.bad_steps_in_a_row >= o.max_bad_steps)
        throw Error(replicas.prefix() +
                    "training stopped: " + std::to_string(state.bad_steps_in_a_row) +
                    " steps in a row had a non-finite loss or gradient (--max-bad-steps); the last "
                    "checkpoint (" +
                    (has_checkpoint(o.model_dir) ? "step " + std::to_string(last_saved) : "none") +
                    ") is left as it was. Try a lower learning rate or --clip-norm");
      if (epochs_done) break;
      continue;
    }
    state.bad_steps_in_a_row = 0;
    ++state.step;
    state.target_tokens_seen += tokens;
    if (replicas.distributed() && check_every > 0 && state.step % check_every == 0 &&
        !replicas.all_equal(checksum_tensors(model->parameters())))
      throw Error(replicas.prefix() + "the ranks' parameters differ after step " +
                  std::to_string(state.step) + " (replicas diverged)");
    interval += step_totals;

    const double interval_seconds =
        std::chrono::duration<double>(Clock::now() - interval_start).count();
    const bool log_now = o.log_every > 0 && state.step % o.log_every == 0;
    if (terminal || log_now) {
      const double loss = interval.loss / double(std::max<int64_t>(interval.tokens, 1));
      const double ppl = std::exp(interval.nll / double(std::max<int64_t>(interval.tokens, 1)));
      const double speed = double(interval.tokens) / std::max(interval_seconds, 1e-9);
      std::string eta;
      const double run_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (o.max_steps > 0 && state.step > first_step)
        eta = " | ETA " + format_duration(double(o.max_steps - state.step) * run_seconds /
                                          double(state.step - first_step));
      if (o.max_minutes > 0)
        eta = " | " + format_duration(std::max(0.0, o.max_minutes - elapsed_minutes()) * 60) +
              " left";
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %lld | epoch %lld | loss %.4f | ppl %.2f | lr %.3g | %.0f tok/s%s",
                    (long long)state.step, (long long)state.epoch + 1, loss, ppl,
                    learning_rate(o.optimizer, config.d_model, state.step), speed, eta.c_str());
      if (log_now) {
        if (primary) {
          std::fprintf(stderr, "%s%s\n", terminal ? "\r\033[K" : "", line);
          nlohmann::json entry = {{"event", "train"},
                                  {"step", state.step},
                                  {"epoch", state.epoch},
                                  {"loss", loss},
                                  {"ppl", ppl},
                                  {"lr", learning_rate(o.optimizer, config.d_model, state.step)},
                                  {"target_tokens_per_s", speed},
                                  {"minutes", elapsed_minutes()},
                                  {"rss_mb", double(resident_memory_bytes()) / (1 << 20)}};
          if (replicas.distributed()) {
            entry["ranks"] = replicas.size();
            entry["allreduce_seconds_per_step"] = interval_reduce_seconds / double(o.log_every);
            entry["allreduce_bytes_per_step"] = gradient_bytes;
          }
          std::fprintf(log, "%s\n", entry.dump().c_str());
          std::fflush(log);
        }
        result.last_loss = loss;
        interval = {};
        interval_reduce_seconds = 0;
        interval_start = Clock::now();
      } else {
        std::fprintf(stderr, "\r\033[K%s", line);
      }
    }
    if (o.valid_every > 0 && state.step % o.valid_every == 0) validate();
    if (o.save_every > 0 && state.step % o.save_every == 0) save();
    if (epochs_done) break;
  }
  if (terminal) std::fprintf(stderr, "\n");
  const bool interrupted = g_stop_signal != 0 || signalled_somewhere;
  // Interrupted: save first (a scheduler's SIGKILL may follow); the validation can wait.
  if (!interrupted && state.step != last_validated) validate();
  if (state.step != last_saved || (primary && !has_checkpoint(o.model_dir))) save();
  if (log) std::fclose(log);
  result.steps = state.step;
  result.best_valid_nll = state.best_valid_nll;
  result.interrupted = interrupted;
  if (result.interrupted && primary)
    std::fprintf(stderr, "interrupted: checkpoint saved at step %lld; continue with --resume\n",
                 (long long)state.step);
  return result;
}

}  // namespace tfm
