// `transformer train`: flags -> TrainOptions -> train_model() (api/training.h).
#include <cstdio>
#include <memory>

#include "api/training.h"
#include "cli/commands.h"
#include "cli/config_options.h"
#include "cli/device_options.h"
#include "cli/option_ranges.h"
#include "tensor/error.h"

namespace tfm {

CommandRunner add_train_command(CLI::App& app) {
  struct Options {
    TrainOptions train;
    ConfigOptions config;
    DeviceOption device;
    std::string compute_type;                  // empty: the resumed run's, else float32
    std::vector<double> sentencepiece_alphas;  // empty: not given (the resumed run's, else 0)
  };
  auto o = std::make_shared<Options>();
  TrainOptions& t = o->train;
  app.add_option("--model-dir", t.model_dir,
                 "Where checkpoints and the model go; DIR/model.safetensors is always the latest")
      ->required();
  app.add_option("--train-src", t.train_src, "Training source sentences, one per line")->required();
  app.add_option("--train-tgt", t.train_tgt, "Training target sentences, same line count")
      ->required();
  app.add_option("--valid-src", t.valid_src, "Validation source sentences");
  app.add_option("--valid-tgt", t.valid_tgt, "Validation target sentences");
  app.add_option(
         "--vocabs", t.vocabularies,
         "Vocabulary: one joint SentencePiece model (from `transformer vocab`), or source and "
         "target models; token lists (.txt) also work. Copied into the model directory")
      ->expected(1, 2);
  app.add_flag("--ids", t.ids, "Data files hold space-separated token ids (no vocabulary)");
  o->config.add_to(app);
  o->device.add_to(app);
  app.add_option("--compute-type", o->compute_type,
                 "Number format of every linear product, forward and backward: float32 "
                 "(default), or bfloat16 (CPUs with AVX512-BF16: about twice the multiply rate; "
                 "weights, gradients, Adam's moments and checkpoints stay float32). The "
                 "checkpoint records it: --resume continues in the run's own type, bit for bit, "
                 "unless this flag says otherwise")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--init", t.init_path, "Start from this model file instead of a random one");
  app.add_flag("--resume", t.resume,
               "Continue the run saved in --model-dir exactly where it stopped (bit for bit)");
  app.add_option("--max-length", t.max_length,
                 with_default("Skip pairs with a side longer than this many tokens", t.max_length))
      ->check(at_least(1));
  app.add_option("--batch-tokens", t.batch_tokens,
                 with_default("Padded source + target tokens per batch", t.batch_tokens))
      ->check(at_least(1));
  app.add_option("--accumulate", t.accumulate,
                 "Batches per optimizer step (gradient accumulation; default 1)")
      ->check(in_range(1, double(kMaxAccumulate)));
  app.add_option("--sentencepiece-alphas", o->sentencepiece_alphas,
                 "Subword regularisation (Marian's option of the same name): every epoch the "
                 "training pairs are encoded with a segmentation sampled from the SentencePiece "
                 "vocabularies — BPE models (`transformer vocab`): BPE-dropout, each merge "
                 "dropped with this probability; unigram models: sampling with this smoothing. "
                 "One value for both sides, or source and target (0: that side's one best). "
                 "Validation and translation use the one best. Default 0 (off), or the resumed "
                 "run's")
      ->expected(1, 2)
      ->check(in_range(0, 1));
  app.add_option("--label-smoothing", t.label_smoothing,
                 with_default("Label smoothing ε", t.label_smoothing))
      ->check(in_range(0, 1, true, false));
  app.add_option("--dropout", t.dropout,
                 with_default("Dropout on sublayer outputs and embedding sums", t.dropout))
      ->check(in_range(0, 1, true, false));
  app.add_option("--attention-dropout", t.attention_dropout,
                 with_default("Dropout on attention weights", t.attention_dropout))
      ->check(in_range(0, 1, true, false));
  app.add_option("--relu-dropout", t.relu_dropout,
                 with_default("Dropout inside the feed-forward layer", t.relu_dropout))
      ->check(in_range(0, 1, true, false));
  app.add_option("--optimizer", t.optimizer.algorithm, "adam (default) or sgd")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--lr-schedule", t.optimizer.schedule,
                 "noam: the paper's d_model^-0.5·min(step^-0.5, step·warmup^-1.5) (default); "
                 "constant: --lr")
      ->check(CLI::IsMember({"noam", "constant"}));
  app.add_option("--lr", t.optimizer.lr,
                 with_default("Learning rate of the constant schedule", t.optimizer.lr))
      ->check(at_least(0, false));
  app.add_option("--lr-factor", t.optimizer.lr_factor,
                 with_default("Multiplier of the noam schedule", t.optimizer.lr_factor))
      ->check(at_least(0, false));
  app.add_option("--warmup", t.optimizer.warmup,
                 with_default("Warm-up steps of the noam schedule", t.optimizer.warmup))
      ->check(at_least(1));
  app.add_option("--lr-cooldown", t.optimizer.cooldown,
                 "Over this last fraction of the run (of --max-steps, or of --max-minutes by the "
                 "clock, whichever is nearer) the learning rate falls linearly, to 0 at the limit; "
                 "a run that --max-epochs or --early-stopping ends first stops part-way "
                 "(default 0: none)")
      ->check(in_range(0, 1, true, true));
  app.add_option("--adam-beta1", t.optimizer.beta1, with_default("Adam β1", t.optimizer.beta1))
      ->check(in_range(0, 1, true, false));
  app.add_option("--adam-beta2", t.optimizer.beta2, with_default("Adam β2", t.optimizer.beta2))
      ->check(in_range(0, 1, true, false));
  app.add_option("--adam-eps", t.optimizer.eps, with_default("Adam ε", t.optimizer.eps))
      ->check(at_least(0, false));
  app.add_option("--clip-norm", t.optimizer.clip_norm,
                 "Clip the global gradient norm to this value (default 0: off)")
      ->check(at_least(0));
  app.add_option("--seed", t.seed,
                 with_default("Seed of initialisation, shuffling and dropout", t.seed));
  app.add_option("--max-steps", t.max_steps,
                 "Stop after this many optimizer steps (default 0: no limit)")
      ->check(at_least(0));
  app.add_option("--max-epochs", t.max_epochs,
                 "Stop after this many passes over the data (default 0: no limit)")
      ->check(at_least(0));
  app.add_option("--max-minutes", t.max_minutes,
                 "Stop after this many minutes of training (default 0: no limit)")
      ->check(at_least(0));
  app.add_option("--valid-every", t.valid_every,
                 with_default("Validate every N steps", t.valid_every, "0: at the end"))
      ->check(at_least(0));
  app.add_option("--save-every", t.save_every,
                 with_default("Checkpoint every N steps", t.save_every, "0: at the end"))
      ->check(at_least(0));
  app.add_option("--log-every", t.log_every,
                 with_default("Log a line every N steps", t.log_every, "0: none"))
      ->check(at_least(0));
  app.add_option("--keep", t.keep,
                 with_default("Keep the last K step snapshots for `average`", t.keep, "0: none"))
      ->check(at_least(0));
  app.add_option("--early-stopping", t.early_stopping,
                 "Stop after N validations without a better perplexity (default 0: off)")
      ->check(at_least(0));
  app.add_option(
         "--max-bad-steps", t.max_bad_steps,
         with_default("A step with a NaN/Inf loss or gradient is skipped; stop with an error after "
                      "this many in a row, leaving the last checkpoint as it was",
                      t.max_bad_steps))
      ->check(at_least(1));
  app.add_option("--replica-timeout", t.replica_timeout,
                 with_default("Under mpirun: seconds a rank waits for the others before ending the "
                              "job with an error",
                              t.replica_timeout))
      ->check(at_least(0, false));
  app.add_option("--replica-check-every", t.replica_check_every,
                 "Under mpirun: compare the ranks' parameter checksums every N steps (default 0: "
                 "off; 100 in debug builds)")
      ->check(at_least(0));
  app.footer(
      "Example (reversal task on token ids, tiny model):\n"
      "  transformer train --preset tiny --vocab 32 --ids --train-src train.src --train-tgt "
      "train.tgt \\\n"
      "    --valid-src dev.src --valid-tgt dev.tgt --model-dir rev --max-steps 2000 --warmup 400 "
      "--lr-factor 2\n"
      "Data parallel (P processes, each --batch-tokens / P of every global batch; rank 0 writes):\n"
      "  mpirun -np 2 -x OMP_NUM_THREADS=1 --bind-to none transformer train ...\n"
      "  (with --device cuda the r-th rank on a machine takes its GPU r, mod the GPUs there)");
  return [o] {
    TrainOptions train = o->train;
    o->device.resolve();  // an unknown or absent device fails here, before anything is read
    // The name as given: under mpirun "cuda" and "auto" give each rank a GPU of its own, where
    // "cuda:0" keeps every rank on that one (find_backend with the local rank).
    train.device = o->device.name;
    if (!o->compute_type.empty()) train.precision = training_precision(o->compute_type);
    if (!o->sentencepiece_alphas.empty())
      train.sentencepiece_alphas = {o->sentencepiece_alphas.front(),
                                    o->sentencepiece_alphas.back()};
    const TrainResult result = train_model(train, o->config);
    if (result.primary && !result.stopped_before_start)
      std::printf("trained %lld steps; model: %s/model.safetensors\n", (long long)result.steps,
                  train.model_dir.c_str());
  };
}

}  // namespace tfm
