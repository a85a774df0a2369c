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

#include <optional>
#include <string>
#include <variant>
#include <vector>

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

tfm::TranslationOptions translation_options(int64_t beam_size, double length_penalty,
                                            int64_t num_hypotheses, double max_decoding_length_a,
                                            int64_t max_decoding_length_b,
                                            int64_t max_decoding_length,
                                            int64_t min_decoding_length, int64_t max_batch_tokens,
                                            bool return_attention, bool replace_unknowns) {
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
  return o;
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
           "or auto; compute_type: default, auto, float32, bfloat16, int8 or int8_bfloat16")
      .def(
          "translate_batch",
          [](const tfm::Translator& translator, const std::variant<Texts, TokenLists>& source,
             int64_t beam_size, double length_penalty, int64_t num_hypotheses,
             double max_decoding_length_a, int64_t max_decoding_length_b,
             int64_t max_decoding_length, int64_t min_decoding_length, int64_t max_batch_tokens,
             bool return_attention, bool replace_unknowns,
             const std::optional<std::variant<Texts, TokenLists>>& target_prefix) {
            const tfm::TranslationOptions options = translation_options(
                beam_size, length_penalty, num_hypotheses, max_decoding_length_a,
                max_decoding_length_b, max_decoding_length, min_decoding_length, max_batch_tokens,
                return_attention, replace_unknowns);
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
          py::arg("source"), py::kw_only(), py::arg("beam_size") = 4,
          py::arg("length_penalty") = 0.6, py::arg("num_hypotheses") = 1,
          py::arg("max_decoding_length_a") = 1.0, py::arg("max_decoding_length_b") = 50,
          py::arg("max_decoding_length") = 0, py::arg("min_decoding_length") = 0,
          py::arg("max_batch_tokens") = 4096, py::arg("return_attention") = false,
          py::arg("replace_unknowns") = false, py::arg("target_prefix") = py::none(),
          "Translates a list of texts (or of token lists); returns one TranslationResult per "
          "input, in order. An empty input, or one longer than the model's positions, gets no "
          "hypotheses.")
      .def(
          "score_batch",
          [](const tfm::Translator& translator, const Texts& source, const Texts& target,
             int64_t max_batch_tokens) {
            py::gil_scoped_release release;
            return translator.score_batch(source, target, max_batch_tokens);
          },
          py::arg("source"), py::arg("target"), py::kw_only(), py::arg("max_batch_tokens") = 4096,
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
