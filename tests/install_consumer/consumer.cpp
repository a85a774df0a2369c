// Loads a model file through the installed library and prints its exact parameter count, which
// tests/install_test.sh compares with `transformer info`'s.
#include <transformer/backend/backend.h>
#include <transformer/io/model_file.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer MODEL.safetensors\n");
    return 2;
  }
  try {
    const tfm::Model model = tfm::load_model(argv[1], tfm::cpu_backend());
    std::printf("parameters: %lld\n", (long long)tfm::parameter_count(model.config()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
