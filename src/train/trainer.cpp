// train(): the loop, its logging and its stopping rules.
#include "train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "io/file_util.h"
#include "model/init.h"
#include "tensor/error.h"
#include "text/batching.h"
#include "text/model_directory.h"
#include "train/checkpoint.h"
#include "train/loss.h"

namespace tfm {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

// Installs the handlers for the lifetime of a training run.
struct SignalGuard {
  struct sigaction old_int {
  }, old_term{};
  SignalGuard() {
    g_stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int);
    sigaction(SIGTERM, &action, &old_term);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
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
  const std::string bytes = read_file_bytes(from);
  write_file_atomically(to, [&](std::FILE* f) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
      throw Error(to + ": write failed");
  });
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

  // The model: resumed, given, or new.
  make_directories(o.model_dir);
  std::optional<Model> model;
  std::optional<LoadedCheckpoint> resumed;
  TrainingState state;
  state.seed = o.seed;
  if (has_checkpoint(o.model_dir)) {
    if (!o.resume)
      throw Error(o.model_dir +
                  " already holds a training run; pass --resume to continue it, or choose another "
                  "--model-dir");
    resumed.emplace(load_checkpoint(o.model_dir));
    state = resumed->state;
  }
  if (resumed) {
    model.emplace(std::move(resumed->model));
  } else if (!o.init_path.empty()) {
    model.emplace(load_model(o.init_path));
  } else if (o.has_config) {
    model.emplace(init_model(o.config, o.seed));
  } else {
    throw Error("choose a model: --preset, --config or --init (or --resume an existing run)");
  }
  const ModelConfig& config = model->config();

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
  const int64_t position_limit = config.max_positions - config.position_offset - 1;
  encoding.max_length = o.max_length > 0 ? std::min(o.max_length, position_limit) : position_limit;
  if (o.train_src.empty() || o.train_tgt.empty())
    throw Error("--train-src and --train-tgt are required");
  const ParallelCorpus corpus = load_parallel_corpus(o.train_src, o.train_tgt, encoding);
  if (corpus.sources.empty()) throw Error(o.train_src + ": no usable training pairs");
  std::fprintf(stderr,
               "train: %lld pairs read, %lld used, %lld skipped (empty side), %lld skipped (longer "
               "than %lld tokens)\n",
               (long long)corpus.lines, (long long)corpus.sources.size(),
               (long long)corpus.skipped_empty, (long long)corpus.skipped_too_long,
               (long long)encoding.max_length);
  std::optional<ParallelCorpus> valid;
  std::vector<TokenBatch> valid_batches;
  if (!o.valid_src.empty() || !o.valid_tgt.empty()) {
    if (o.valid_src.empty() || o.valid_tgt.empty())
      throw Error("give both --valid-src and --valid-tgt");
    valid.emplace(load_parallel_corpus(o.valid_src, o.valid_tgt, encoding));
    valid_batches = make_batches(
        config, *valid, plan_batches(*valid, o.batch_tokens, config.src_append_eos, 0, 0, false));
    std::fprintf(stderr, "valid: %lld pairs used\n", (long long)valid->sources.size());
  }
  install_vocabularies(o.vocabularies, o.model_dir);

  Optimizer optimizer(o.optimizer, model->parameters());
  if (resumed) {
    optimizer.load_state(resumed->optimizer_state, o.model_dir + "/checkpoint.safetensors");
    optimizer.set_step(state.step);
    std::fprintf(stderr, "resuming at step %lld (epoch %lld, batch %lld)\n", (long long)state.step,
                 (long long)state.epoch, (long long)state.batch_index);
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
  std::FILE* log = std::fopen((o.model_dir + "/train.log.jsonl").c_str(), "a");
  if (!log) throw Error(o.model_dir + "/train.log.jsonl: cannot open for writing");
  const bool terminal = ::isatty(2);
  SignalGuard signals;
  TrainResult result;
  const auto start = Clock::now();
  const double seconds_before = state.train_seconds;
  auto elapsed_minutes = [&] {
    return (seconds_before + std::chrono::duration<double>(Clock::now() - start).count()) / 60.0;
  };
  LossTotals interval;
  auto interval_start = Clock::now();
  const int64_t first_step = state.step;
  int64_t last_saved = state.step, last_validated = -1;

  auto validate = [&] {
    if (!valid) return;
    LossTotals totals;
    for (const TokenBatch& batch : valid_batches)
      totals += loss_and_gradients(*model, grad_views, batch, {}, o.label_smoothing, 0.f, ws);
    const double nll = totals.nll / double(std::max<int64_t>(totals.tokens, 1));
    const bool best = state.best_valid_nll < 0 || nll < state.best_valid_nll;
    if (best) {
      state.best_valid_nll = nll;
      state.validations_without_improvement = 0;
      save_model(*model, o.model_dir + "/model.best.safetensors");
    } else {
      ++state.validations_without_improvement;
    }
    last_validated = state.step;
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
  auto save = [&] {
    state.train_seconds = elapsed_minutes() * 60.0;
    save_checkpoint(o.model_dir, *model, optimizer, state, o.keep);
    last_saved = state.step;
  };

  while (true) {
    if (o.max_steps > 0 && state.step >= o.max_steps) break;
    if (o.max_minutes > 0 && elapsed_minutes() >= o.max_minutes) break;
    if (o.early_stopping > 0 && state.validations_without_improvement >= o.early_stopping) {
      std::fprintf(stderr, "early stopping: no improvement in %lld validations\n",
                   (long long)o.early_stopping);
      break;
    }
    if (g_stop_signal) break;
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
      const auto& members = plan[size_t(state.batch_index++)];
      std::vector<std::vector<int32_t>> src, tgt;
      for (int64_t i : members) {
        src.push_back(corpus.sources[size_t(i)]);
        tgt.push_back(corpus.targets[size_t(i)]);
      }
      micro.push_back(make_batch(config, src, tgt));
    }
    if (epochs_done && micro.empty()) break;
    int64_t tokens = 0;
    for (const auto& b : micro)
      for (int32_t n : b.tgt_lengths) tokens += n;
    for (auto& [name, g] : gradients) std::fill(g.data.begin(), g.data.end(), 0.f);
    for (size_t m = 0; m < micro.size(); ++m) {
      dropout.seed = dropout_key(state.seed, uint64_t(state.step + 1) * 1024 + m);
      interval += loss_and_gradients(*model, grad_views, micro[m], dropout, o.label_smoothing,
                                     1.f / float(tokens), ws);
    }
    optimizer.apply(model->mutable_parameters(), gradients, config.d_model);
    ++state.step;
    state.target_tokens_seen += tokens;

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
        std::fprintf(stderr, "%s%s\n", terminal ? "\r\033[K" : "", line);
        std::fprintf(log, "%s\n",
                     nlohmann::json({{"event", "train"},
                                     {"step", state.step},
                                     {"epoch", state.epoch},
                                     {"loss", loss},
                                     {"ppl", ppl},
                                     {"lr", learning_rate(o.optimizer, config.d_model, state.step)},
                                     {"target_tokens_per_s", speed},
                                     {"minutes", elapsed_minutes()}})
                         .dump()
                         .c_str());
        std::fflush(log);
        result.last_loss = loss;
        interval = {};
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
  if (state.step != last_validated) validate();
  if (state.step != last_saved || !has_checkpoint(o.model_dir)) save();
  std::fclose(log);
  result.steps = state.step;
  result.best_valid_nll = state.best_valid_nll;
  result.interrupted = g_stop_signal != 0;
  if (result.interrupted)
    std::fprintf(stderr, "interrupted: checkpoint saved at step %lld; continue with --resume\n",
                 (long long)state.step);
  return result;
}

}  // namespace tfm
