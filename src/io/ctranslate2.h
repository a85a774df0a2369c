// Interchange with CTranslate2 model directories (model.bin + config.json + vocabularies):
// import of TransformerSpec models as CTranslate2's converters write them (binary versions 1–6,
// spec revisions 1–7) and export of ours as revision 7. The mapping between the two layouts
// (fused projections, flags, position tables, special tokens) is README's "CTranslate2
// interchange"; the bytes of model.bin are io/ctranslate2_format.h.
#pragma once

#include <string>
#include <vector>

#include "io/ctranslate2_format.h"
#include "model/config.h"
#include "tensor/tensor.h"

namespace tfm {

class Model;

struct ImportedModel {
  ModelConfig config;
  TensorMap parameters;
  // The linear weights and embeddings that model.bin stores in int8, as stored (rows split
  // where CTranslate2 fuses projections); their float32 forms are in `parameters` too.
  Int8WeightMap int8_parameters;
  std::vector<std::string> source_tokens;  // one per source id
  std::vector<std::string> target_tokens;  // one per target id
};

// Throws Error naming the file on anything malformed, and naming the feature for every
// CTranslate2 feature that is switched on but not part of this engine's model.
ImportedModel import_ctranslate2(const std::string& directory);

struct CTranslate2Tokens {
  std::vector<std::string> source;  // one per source id
  std::vector<std::string> target;  // one per target id
  std::string unk_token;            // present in both lists
};

// Writes `directory`/{model.bin, config.json, shared_vocabulary.json or source_ and
// target_vocabulary.json} as a whole (write_directory_atomically: a previous export there is
// replaced only once the new one is complete). Throws Error for a model the spec cannot hold.
void export_ctranslate2(const Model& model, const CTranslate2Tokens& tokens,
                        CtQuantization quantization, const std::string& directory);

// If `table` [rows, d_model] is a sinusoid table of one of our layouts for positions
// offset, offset+1, ... (within `tolerance`), sets layout and offset and returns true.
bool match_sinusoid_table(const Tensor& table, double tolerance, SinusoidLayout& layout,
                          int64_t& offset);

}  // namespace tfm
