// The PyTorch fixtures (tests/fixtures): their names, and the token batch of one
// (<name>.io.safetensors), whose src_tokens / tgt_tokens rows are padded with -1, which this
// turns back into ragged sentences; and a fixture's model loaded on a backend with its batch.
// Shared by the parity, gradient, optimizer, decoding, backend-memory and CTranslate2
// interchange tests, which run the same models on the same inputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/transformer.h"

namespace tfm::testing_support {

// The fixtures that have a file <name><suffix> in tests/fixtures, sorted: every fixture with
// ".io.safetensors", those with PyTorch's gradients with ".grads.safetensors".
inline std::vector<std::string> fixture_names(const std::string& suffix = ".io.safetensors") {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(TFM_FIXTURE_DIR)) {
    const std::string file = entry.path().filename().string();
    if (file.size() > suffix.size() &&
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(file.substr(0, file.size() - suffix.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A fixture on one backend: each test over the PyTorch and CTranslate2 fixtures runs on the CPU
// and on every GPU present (available_backends()), so that the GPU answers to the same outside
// values wherever one is.
struct FixtureOnDevice {
  std::string fixture;
  std::string device;  // Backend::name(): "cpu", "cuda", "cuda:1"
  // A test's own backend, which find_backend does not know (tests/emulated_cuda_backend.h), or
  // null: the registered backend named `device`.
  const Backend* backend = nullptr;
};
// The backend a case runs on.
inline const Backend& backend_of(const FixtureOnDevice& c) {
  return c.backend ? *c.backend : find_backend(c.device);
}
// Every fixture on one backend of a test's own.
inline std::vector<FixtureOnDevice> on_backend(const std::vector<std::string>& fixtures,
                                               const Backend& backend) {
  std::vector<FixtureOnDevice> cases;
  for (const std::string& fixture : fixtures) cases.push_back({fixture, backend.name(), &backend});
  return cases;
}
inline std::vector<FixtureOnDevice> on_every_device(const std::vector<std::string>& fixtures) {
  std::vector<FixtureOnDevice> cases;
  for (const Backend* backend : available_backends())
    for (const std::string& fixture : fixtures) cases.push_back({fixture, backend->name()});
  return cases;
}
// "<fixture>" on the CPU (the names the tests always had), "<fixture>_cuda_1" elsewhere.
inline std::string fixture_on_device_name(const FixtureOnDevice& c) {
  if (c.device == "cpu") return c.fixture;
  std::string name = c.fixture + "_" + c.device;
  std::replace(name.begin(), name.end(), ':', '_');
  return name;
}

inline std::vector<std::vector<int32_t>> fixture_rows(const Tensor& padded) {
  std::vector<std::vector<int32_t>> rows(size_t(padded.shape[0]));
  for (int64_t b = 0; b < padded.shape[0]; ++b)
    for (int64_t j = 0; j < padded.shape[1]; ++j) {
      const float v = padded.data[size_t(b * padded.shape[1] + j)];
      if (v >= 0) rows[size_t(b)].push_back(int32_t(v));
    }
  return rows;
}

inline TokenBatch fixture_batch(const ModelConfig& config, const TensorMap& io) {
  return make_batch(config, fixture_rows(io.at("src_tokens")), fixture_rows(io.at("tgt_tokens")));
}

// tests/fixtures/<fixture><suffix>.
inline std::string fixture_path(const std::string& fixture, const std::string& suffix) {
  return std::string(TFM_FIXTURE_DIR) + "/" + fixture + suffix;
}

// A fixture's model (<fixture>.safetensors) on its case's backend, and its batch.
struct FixtureModel {
  explicit FixtureModel(const FixtureOnDevice& c)
      : model(load_model(fixture_path(c.fixture, ".safetensors"), backend_of(c))),
        batch(fixture_batch(model.config(),
                            read_safetensors(fixture_path(c.fixture, ".io.safetensors")).tensors)) {
  }
  Model model;
  TokenBatch batch;
};

}  // namespace tfm::testing_support
