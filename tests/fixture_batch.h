// The token batch of a PyTorch fixture (tests/fixtures/<name>.io.safetensors): its src_tokens /
// tgt_tokens rows are padded with -1, which this turns back into ragged sentences. Shared by
// the parity tests and the CTranslate2 interchange tests, which score the same inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace tfm::testing_support {

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

}  // namespace tfm::testing_support
