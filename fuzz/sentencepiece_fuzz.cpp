// Fuzz target: the text path of translate / score / train into SentencePiece: a line is
// checked for valid UTF-8, encoded to ids, the ids decoded back and split into pieces. The
// vocabulary is trained once, at start-up, on a few English and Spanish sentences.
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "fuzz_common.h"
#include "text/vocabulary.h"

namespace {
std::unique_ptr<tfm::Vocabulary> vocabulary;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = "/tmp/tfm_sentencepiece_fuzz_" + std::to_string(::getpid());
  std::string text;
  for (int i = 0; i < 50; ++i)
    text += "In the beginning God created the heavens and the earth " + std::to_string(i) +
            ".\nEn el principio crió Dios los cielos y la tierra, año " + std::to_string(i) +
            ". ¿Qué? ¡Sí! naïve café 東京\n";
  std::ofstream(dir + ".txt") << text;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + dir + ".txt --model_prefix=" + dir +
      " --vocab_size=120 --model_type=bpe --character_coverage=1.0 --pad_id=0 --bos_id=1 "
      "--eos_id=2 --unk_id=3 --minloglevel=2");
  if (!status.ok()) {
    std::fprintf(stderr, "sentencepiece training failed: %s\n", status.ToString().c_str());
    std::abort();
  }
  vocabulary =
      std::make_unique<tfm::Vocabulary>(tfm::Vocabulary::from_sentencepiece(dir + ".model"));
  std::remove((dir + ".txt").c_str());
  std::remove((dir + ".model").c_str());
  std::remove((dir + ".vocab").c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line = tfm::fuzzing::as_string(data, size);
  if (!tfm::is_valid_utf8(line)) return 0;  // the commands refuse it with file:line first
  tfm::fuzzing::expect_clean_rejection([&] {
    const std::vector<int32_t> ids = vocabulary->encode(line);
    for (int32_t id : ids)
      if (id < 0 || id >= vocabulary->size()) __builtin_trap();
    const std::string text = vocabulary->decode(ids);
    if (!tfm::is_valid_utf8(text)) __builtin_trap();
    (void)vocabulary->decode_pieces(vocabulary->to_pieces(line));
  });
  return 0;
}
