// The Python module `transformer_cpp`: the library's Translator (api/translator.h) as
// ctranslate2.Translator is used —
//
//   import transformer_cpp
//   translator = transformer_cpp.Translator("model_dir", device="cpu", compute_type="int8")
//   results = translator.translate_batch(["the house is small"], beam_size=4)
//   results[0].hypotheses[0], results[0].scores[0]
//
// Text in gives text out; lists of pieces (pre-tokenized input) give lists of pieces out.
// Every call releases the GIL while it works. Usage errors are ValueError, the rest
// RuntimeError, each with the message the command line would print.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "api/training.h"
#include "api/translator.h"
#include "tensor/error.h"

namespace py = pybind11;

namespace {

using Texts = std::vector<std::string>;
using TokenLists = std::vector<std::vector<std::string>>;

// One input's answer: its n best as text (or pieces), their log-probabilities, and their
// attention when asked.
struct PyTranslationResult {
  py::list hypotheses;
  std::vector<double> scores;
  std::vector<std::vector<std::vector<float>>> attention;  // [hypothesis][target][source]
};

std::vector<PyTranslationResult> to_python(std::vector<tfm::TranslationResult> results,
                                           bool as_tokens, bool return_attention) {
  std::vector<PyTranslationResult> out;
  out.reserve(results.size());
  for (tfm::TranslationResult& result : results) {
    PyTranslationResult r;
    for (tfm::TranslationHypothesis& h : result.hypotheses) {
      if (as_tokens)
        r.hypotheses.append(py::cast(h.tokens));
      else
        r.hypotheses.append(py::cast(h.text));
      r.scores.push_back(h.log_prob);
      if (return_attention) r.attention.push_back(std::move(h.attention));
    }
    out.push_back(std::move(r));
  }
  return out;
}

tfm::TranslationOptions translation_options(
    int64_t beam_size, double length_penalty, int64_t num_hypotheses, double max_decoding_length_a,
    int64_t max_decoding_length_b, int64_t max_decoding_length, int64_t min_decoding_length,
    int64_t max_batch_tokens, bool return_attention, bool replace_unknowns, int64_t sampling_topk,
    double sampling_topp, double sampling_temperature, uint64_t sampling_seed) {
  tfm::TranslationOptions o;
  o.beam_size = beam_size;
  o.length_penalty = length_penalty;
  o.num_hypotheses = num_hypotheses;
  o.max_decoding_length_a = max_decoding_length_a;
  o.max_decoding_length_b = max_decoding_length_b;
  o.max_decoding_length = max_decoding_length;
  o.min_decoding_length = min_decoding_length;
  o.max_batch_tokens = max_batch_tokens;
  o.return_attention = return_attention;
  o.replace_unknowns = replace_unknowns;
  o.sampling_topk = sampling_topk;
  o.sampling_topp = sampling_topp;
  o.sampling_temperature = sampling_temperature;
  o.sampling_seed = sampling_seed;
  return o;
}

// train()'s keyword options: each sets one field of TrainOptions or of the model's
// ConfigChoice, named as the command line's flag with '_' for '-'. Their defaults are the
// structs' own.
struct TrainingRun {
  tfm::TrainOptions options;
  tfm::ConfigChoice model;
};
using TrainingSetter = std::function<void(TrainingRun&, const py::handle&)>;

template <typename T>
TrainingSetter set(T tfm::TrainOptions::*field) {
  return
      [field](TrainingRun& run, const py::handle& value) { run.options.*field = value.cast<T>(); };
}
template <typename T>
TrainingSetter set(T tfm::OptimizerOptions::*field) {
  return [field](TrainingRun& run, const py::handle& value) {
    run.options.optimizer.*field = value.cast<T>();
  };
}
template <typename T>
TrainingSetter set(T tfm::ConfigChoice::*field) {
  return [field](TrainingRun& run, const py::handle& value) { run.model.*field = value.cast<T>(); };
}

const std::map<std::string, TrainingSetter>& training_setters() {
  using tfm::ConfigChoice, tfm::OptimizerOptions, tfm::TrainOptions;
  static const std::map<std::string, TrainingSetter> setters = {
      {"valid_src", set(&TrainOptions::valid_src)},
      {"valid_tgt", set(&TrainOptions::valid_tgt)},
      {"vocabs", set(&TrainOptions::vocabularies)},
      {"ids", set(&TrainOptions::ids)},
      {"preset", set(&ConfigChoice::preset)},
      {"config", set(&ConfigChoice::config_path)},
      {"vocab", set(&ConfigChoice::vocab)},
      {"src_vocab", set(&ConfigChoice::src_vocab)},
      {"tgt_vocab", set(&ConfigChoice::tgt_vocab)},
      {"share", set(&ConfigChoice::share)},
      {"device", set(&TrainOptions::device)},
      {"compute_type",
       [](TrainingRun& run, const py::handle& value) {
         run.options.precision = tfm::training_precision(value.cast<std::string>());
       }},
      {"init", set(&TrainOptions::init_path)},
      {"resume", set(&TrainOptions::resume)},
      {"max_length", set(&TrainOptions::max_length)},
      {"batch_tokens", set(&TrainOptions::batch_tokens)},
      {"accumulate", set(&TrainOptions::accumulate)},
      {"sentencepiece_alphas",
       [](TrainingRun& run, const py::handle& value) {
         std::vector<double> alphas;
         if (py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value))
           alphas = {value.cast<double>()};
         else
           alphas = value.cast<std::vector<double>>();
         if (alphas.empty() || alphas.size() > 2)
           throw tfm::UsageError("sentencepiece_alphas takes one value or two (source, target)");
         run.options.sentencepiece_alphas = {alphas.front(), alphas.back()};
       }},
      {"label_smoothing", set(&TrainOptions::label_smoothing)},
      {"dropout", set(&TrainOptions::dropout)},
      {"attention_dropout", set(&TrainOptions::attention_dropout)},
      {"relu_dropout", set(&TrainOptions::relu_dropout)},
      {"optimizer", set(&OptimizerOptions::algorithm)},
      {"lr_schedule", set(&OptimizerOptions::schedule)},
      {"lr", set(&OptimizerOptions::lr)},
      {"lr_factor", set(&OptimizerOptions::lr_factor)},
      {"warmup", set(&OptimizerOptions::warmup)},
      {"lr_cooldown", set(&OptimizerOptions::cooldown)},
      {"adam_beta1", set(&OptimizerOptions::beta1)},
      {"adam_beta2", set(&OptimizerOptions::beta2)},
      {"adam_eps", set(&OptimizerOptions::eps)},
      {"clip_norm", set(&OptimizerOptions::clip_norm)},
      {"seed", set(&TrainOptions::seed)},
      {"max_steps", set(&TrainOptions::max_steps)},
      {"max_epochs", set(&TrainOptions::max_epochs)},
      {"max_minutes", set(&TrainOptions::max_minutes)},
      {"valid_every", set(&TrainOptions::valid_every)},
      {"save_every", set(&TrainOptions::save_every)},
      {"log_every", set(&TrainOptions::log_every)},
      {"keep", set(&TrainOptions::keep)},
      {"early_stopping", set(&TrainOptions::early_stopping)},
      {"max_bad_steps", set(&TrainOptions::max_bad_steps)},
  };
  return setters;
}

TrainingRun training_run(const std::string& model_dir, const std::string& train_src,
                         const std::string& train_tgt, const py::kwargs& options) {
  TrainingRun run;
  run.options.model_dir = model_dir;
  run.options.train_src = train_src;
  run.options.train_tgt = train_tgt;
  const auto& setters = training_setters();
  for (const auto& [key, value] : options) {
    const std::string name = key.cast<std::string>();
    auto it = setters.find(name);
    if (it == setters.end()) {
      std::string known;
      for (const auto& [n, setter] : setters) known += (known.empty() ? "" : ", ") + n;
      throw tfm::UsageError("train() has no option \"" + name + "\" (known: " + known + ")");
    }
    try {
      it->second(run, value);
    } catch (const py::cast_error&) {
      throw tfm::UsageError(name + ": " + py::repr(value).cast<std::string>() +
                            " is not of the option's type");
    }
  }
  return run;
}

}  // namespace

PYBIND11_MODULE(transformer_cpp, m) {
  m.doc() =
      "transformer-cpp: the Transformer of \"Attention Is All You Need\" — translate and score "
      "with a model trained or converted by the `transformer` command.";
  m.attr("__version__") = TRANSFORMER_VERSION;
  py::register_exception<tfm::UsageError>(m, "UsageError", PyExc_ValueError);

  py::class_<PyTranslationResult>(m, "TranslationResult",
                                  "One input's n best hypotheses, best first")
      .def_readonly("hypotheses", &PyTranslationResult::hypotheses,
                    "Text per hypothesis (a list of pieces for pre-tokenized input)")
      .def_readonly("scores", &PyTranslationResult::scores,
                    "Natural-log probability of each hypothesis' tokens and eos")
      .def_readonly("attention", &PyTranslationResult::attention,
                    "With return_attention: per hypothesis, per target token (eos included), "
                    "the cross-attention over source tokens, averaged over heads")
      .def("__repr__", [](const PyTranslationResult& r) {
        return "TranslationResult(hypotheses=" + py::repr(r.hypotheses).cast<std::string>() +
               ", scores=" + py::repr(py::cast(r.scores)).cast<std::string>() + ")";
      });

  py::class_<tfm::ScoringResult>(m, "ScoringResult", "log p(target + eos | source)")
      .def_readonly("log_probs", &tfm::ScoringResult::log_probs,
                    "Per target token, then eos (natural log)")
      .def_readonly("log_prob", &tfm::ScoringResult::log_prob, "Their sum")
      .def("__repr__", [](const tfm::ScoringResult& r) {
        return "ScoringResult(log_prob=" + std::to_string(r.log_prob) + ")";
      });

  py::class_<tfm::TrainResult>(m, "TrainResult", "What a training run did")
      .def_readonly("steps", &tfm::TrainResult::steps, "Optimizer steps taken in all")
      .def_readonly("last_loss", &tfm::TrainResult::last_loss,
                    "Loss per target token over the last logged interval")
      .def_readonly("best_valid_nll", &tfm::TrainResult::best_valid_nll,
                    "Best validation negative log-likelihood per token (-1: no validation)")
      .def_readonly("interrupted", &tfm::TrainResult::interrupted,
                    "Stopped by SIGINT / SIGTERM (after saving)")
      .def("__repr__", [](const tfm::TrainResult& r) {
        return "TrainResult(steps=" + std::to_string(r.steps) +
               ", last_loss=" + std::to_string(r.last_loss) + ")";
      });

  m.def(
      "train",
      [](const std::string& model_dir, const std::string& train_src, const std::string& train_tgt,
         const py::kwargs& options) {
        const TrainingRun run = training_run(model_dir, train_src, train_tgt, options);
        py::gil_scoped_release release;
        return tfm::train_model(run.options, run.model);
      },
      py::arg("model_dir"), py::arg("train_src"), py::arg("train_tgt"),
      "Trains a model into model_dir, as `transformer train` does; every keyword is that "
      "command's flag with '_' for '-' (preset='small', vocabs=['spm.model'], max_steps=1000, "
      "compute_type='bfloat16', valid_src=..., resume=True, ...). Progress is logged to "
      "standard error; SIGINT / SIGTERM save and stop. Returns a TrainResult.");

  const tfm::TranslationOptions defaults;  // every keyword's default
  py::class_<tfm::Translator>(m, "Translator")
      .def(py::init([](const std::string& model_path, const std::string& device,
                       const std::string& compute_type) {
             tfm::TranslatorOptions options;
             options.device = device;
             options.compute_type = compute_type;
             py::gil_scoped_release release;
             return std::make_unique<tfm::Translator>(model_path, options);
           }),
           py::arg("model_path"), py::arg("device") = "cpu", py::arg("compute_type") = "default",
           "Loads a model directory (model.safetensors + vocabulary). device: cpu, cuda, cuda:N "
           "or auto; compute_type: default, auto, float32, bfloat16, float16, int8, "
           "int8_bfloat16 or int8_float16 (the float16 ones on GPUs)")
      .def(
          "translate_batch",
          [](const tfm::Translator& translator, const std::variant<Texts, TokenLists>& source,
             int64_t beam_size, double length_penalty, int64_t num_hypotheses,
             double max_decoding_length_a, int64_t max_decoding_length_b,
             int64_t max_decoding_length, int64_t min_decoding_length, int64_t max_batch_tokens,
             bool return_attention, bool replace_unknowns,
             const std::optional<std::variant<Texts, TokenLists>>& target_prefix,
             int64_t sampling_topk, double sampling_topp, double sampling_temperature,
             uint64_t sampling_seed) {
            const tfm::TranslationOptions options = translation_options(
                beam_size, length_penalty, num_hypotheses, max_decoding_length_a,
                max_decoding_length_b, max_decoding_length, min_decoding_length, max_batch_tokens,
                return_attention, replace_unknowns, sampling_topk, sampling_topp,
                sampling_temperature, sampling_seed);
            const bool as_tokens = std::holds_alternative<TokenLists>(source);
            if (target_prefix && std::holds_alternative<TokenLists>(*target_prefix) != as_tokens)
              throw tfm::UsageError(
                  "target_prefix must be of the same kind as source (texts, or token lists)");
            std::vector<tfm::TranslationResult> results;
            {
              py::gil_scoped_release release;
              if (as_tokens)
                results = translator.translate_tokens(
                    std::get<TokenLists>(source), options,
                    target_prefix ? std::get<TokenLists>(*target_prefix) : TokenLists());
              else
                results = translator.translate_batch(
                    std::get<Texts>(source), options,
                    target_prefix ? std::get<Texts>(*target_prefix) : Texts());
            }
            return to_python(std::move(results), as_tokens, return_attention);
          },
          py::arg("source"), py::kw_only(), py::arg("beam_size") = defaults.beam_size,
          py::arg("length_penalty") = defaults.length_penalty,
          py::arg("num_hypotheses") = defaults.num_hypotheses,
          py::arg("max_decoding_length_a") = defaults.max_decoding_length_a,
          py::arg("max_decoding_length_b") = defaults.max_decoding_length_b,
          py::arg("max_decoding_length") = defaults.max_decoding_length,
          py::arg("min_decoding_length") = defaults.min_decoding_length,
          py::arg("max_batch_tokens") = defaults.max_batch_tokens,
          py::arg("return_attention") = defaults.return_attention,
          py::arg("replace_unknowns") = defaults.replace_unknowns,
          py::arg("target_prefix") = py::none(), py::arg("sampling_topk") = defaults.sampling_topk,
          py::arg("sampling_topp") = defaults.sampling_topp,
          py::arg("sampling_temperature") = defaults.sampling_temperature,
          py::arg("sampling_seed") = defaults.sampling_seed,
          "Translates a list of texts (or of token lists); returns one TranslationResult per "
          "input, in order. An empty input, or one longer than the model's positions, gets no "
          "hypotheses. sampling_topk other than 1 (0: the whole vocabulary) draws each token at "
          "random instead (beam_size 1; num_hypotheses draws of each input; sampling_seed 0: a "
          "new seed each call).")
      .def(
          "score_batch",
          [](const tfm::Translator& translator, const Texts& source, const Texts& target,
             int64_t max_batch_tokens) {
            py::gil_scoped_release release;
            return translator.score_batch(source, target, max_batch_tokens);
          },
          py::arg("source"), py::arg("target"), py::kw_only(),
          py::arg("max_batch_tokens") = defaults.max_batch_tokens,
          "log p(target + eos | source) of each pair, teacher-forced")
      .def_property_readonly(
          "parameters",
          [](const tfm::Translator& translator) {
            return tfm::parameter_count(translator.config());
          },
          "The model's exact parameter count")
      .def_property_readonly(
          "device", [](const tfm::Translator& translator) { return translator.backend().name(); })
      .def_property_readonly("compute_type", [](const tfm::Translator& translator) {
        const tfm::SearchOptions& s = translator.search_defaults();
        return tfm::compute_type_name(s.precision, s.cache);
      });
}
