// The safetensors container: 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw data. The reader validates everything a
// stranger's file could get wrong before allocating; the writer writes atomically.
#pragma once

#include <map>
#include <string>

#include "tensor/tensor.h"

namespace tfm {

struct SafetensorsFile {
  TensorMap tensors;                            // all converted to fp32
  std::map<std::string, std::string> metadata;  // "__metadata__" string pairs
};

// Parses bytes read from `where` (a path, used in messages). Accepts F32, F16, BF16, F64,
// I64, I32 tensors (converted to fp32). Throws Error on any malformed or inconsistent header.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& where);
SafetensorsFile read_safetensors(const std::string& path);

// Writes all tensors as F32, names sorted, with the metadata; atomically.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace tfm
