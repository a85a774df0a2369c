// Import of CTranslate2 Transformer model directories (model.bin versions 1–6 plus vocabulary
// files) into this engine's model format: fused QKV split, int8/int16/fp16/bf16 weights
// dequantised to fp32, and CTranslate2's conventions (pre-norm, concat sinusoids from
// position 1, no source eos, <unk> appended to the vocabularies) written into the config.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace tfm {

struct ImportedModel {
  ModelConfig config;
  TensorMap parameters;
  std::vector<std::string> source_tokens;  // one per source id
  std::vector<std::string> target_tokens;  // one per target id
};

// Throws Error naming the file on anything malformed or unsupported.
ImportedModel import_ctranslate2(const std::string& directory);

// The raw variables of a model.bin (dequantised to fp32; quantisation scales applied and
// dropped; aliases resolved). Exposed for tests.
struct CTranslate2Variables {
  uint32_t version = 0;
  std::string spec_name;
  TensorMap variables;
};
CTranslate2Variables parse_ctranslate2_model(const std::string& bytes, const std::string& where);

}  // namespace tfm
