// A program outside the project: loads a model file through the installed library, prints its
// exact parameter count and translates one line of token ids (greedy), which
// tests/install_test.sh compares with `transformer info` and `transformer translate --ids`.
#include <transformer/api/translator.h>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer MODEL.safetensors\n");
    return 2;
  }
  try {
    tfm::TranslatorOptions loading;
    loading.need_vocabulary = false;  // a bare model file: token ids in and out
    const tfm::Translator translator(argv[1], loading);
    std::printf("parameters: %lld\n", (long long)tfm::parameter_count(translator.config()));
    tfm::TranslationOptions greedy;
    greedy.beam_size = 1;
    const auto results = translator.translate_ids({{3, 4, 5, 6}}, greedy);
    std::string ids;
    for (int32_t id : results.at(0).hypotheses.at(0).ids)
      ids += (ids.empty() ? "" : " ") + std::to_string(id);
    std::printf("translation: %s\n", ids.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
