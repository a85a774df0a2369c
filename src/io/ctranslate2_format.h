// CTranslate2's model.bin container, both ways: reading binary versions 1–6 (variables
// dequantised to fp32, aliases resolved) and writing version 6 with CTranslate2's own
// quantisation rules. What the variables mean (the Transformer spec) lives in
// ctranslate2_import.cpp / ctranslate2_export.cpp; this file knows only the bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/int8_weights.h"
#include "tensor/tensor.h"

namespace tfm {

// CTranslate2's DataType ids (include/ctranslate2/types.h), as stored from binary version 4.
enum class CtDtype : uint8_t { kF32 = 0, kI8 = 1, kI16 = 2, kI32 = 3, kF16 = 4, kBF16 = 5 };

struct CTranslate2Variables {
  uint32_t version = 0;        // binary version
  std::string spec_name;       // empty before version 2
  uint32_t spec_revision = 1;  // 1 before version 2
  TensorMap variables;         // fp32; quantised weights divided by their *_scale (dropped)
  std::map<std::string, CtDtype> stored_dtypes;  // the dtype each variable had in the file
  // Every int8 matrix as stored (values and per-row scales), besides its fp32 form in
  // `variables`, so that int8 weights can be used without dequantising: our scales multiply,
  // CTranslate2's divide, so scales[r] = 1 / (its scale of row r).
  Int8WeightMap int8_matrices;
};

// Throws Error naming `where` on anything malformed.
CTranslate2Variables parse_ctranslate2_model(const std::string& bytes, const std::string& where);

// How weights are stored on export: CTranslate2's converter `--quantization` values (its
// "int8_float32" is kInt8: our weights are float32, so its plain int8 stores the same).
enum class CtQuantization {
  kFloat32,
  kInt8,
  kInt8Float16,
  kInt8BFloat16,
  kInt16,
  kFloat16,
  kBFloat16
};
CtQuantization parse_ct_quantization(const std::string& name);  // throws Error on others
const char* ct_quantization_name(CtQuantization q);

struct CtVariable {
  std::string name;
  CtDtype dtype;
  Shape shape;
  std::string bytes;  // little-endian payload
};

// A scalar flag as the spec stores it (booleans and enums int8, counts int16).
CtVariable ct_int8_scalar(const std::string& name, int8_t value);
CtVariable ct_int16_scalar(const std::string& name, int16_t value);
CtVariable ct_float32_scalar(const std::string& name, float value);  // e.g. queries_scale

// Appends `tensor` as CTranslate2's ModelSpec._quantize would store it: a quantizable weight
// (a Linear's or an Embeddings' `weight`) becomes int8 with a per-row `<name>_scale`
// (127 / max|row|; a row of zeros takes max|row| as 127, and the scale stops at FLT_MAX as in
// CTranslate2 4.8) or int16 with one scale (2^10 / max|w|), rounded half to even; float16 /
// bfloat16 convert every float tensor; int8 / int16 leave the other tensors in float32,
// int8_float16 / int8_bfloat16 convert them to float16 / bfloat16.
void append_ct_variable(std::vector<CtVariable>& out, const std::string& name, const Tensor& tensor,
                        bool quantizable, CtQuantization quantization);

// Binary version 6: variables sorted by name, then `aliases` (alias name -> variable name).
std::string serialize_ctranslate2_model(
    const std::string& spec_name, uint32_t spec_revision, std::vector<CtVariable> variables,
    const std::vector<std::pair<std::string, std::string>>& aliases);

}  // namespace tfm
