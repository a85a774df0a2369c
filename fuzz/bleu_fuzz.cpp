// Fuzz target: the BLEU / chrF tokenizers (13a, intl, char, none) and scorers on any valid
// UTF-8 text: the first line is the hypothesis, the rest its reference.
#include "fuzz_common.h"
#include "metrics/bleu.h"
#include "text/vocabulary.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = tfm::fuzzing::as_string(data, size);
  if (!tfm::is_valid_utf8(input)) return 0;  // `bleu` refuses it with file:line first
  const size_t newline = input.find('\n');
  const std::string hypothesis = input.substr(0, newline);
  const std::string reference = newline == std::string::npos ? "" : input.substr(newline + 1);
  tfm::fuzzing::expect_clean_rejection([&] {
    for (const char* name : {"13a", "intl", "char", "none"}) {
      tfm::BleuOptions options;
      options.tokenizer = tfm::parse_bleu_tokenizer(name);
      options.lowercase = size % 2 == 1;
      const double score = tfm::corpus_bleu({hypothesis}, {{reference}}, options).score;
      if (!(score >= 0 && score <= 100.0000001)) __builtin_trap();
    }
    const double chrf = tfm::corpus_chrf({hypothesis}, {{reference}}).score;
    if (!(chrf >= 0 && chrf <= 100.0000001)) __builtin_trap();
  });
  return 0;
}
