// The safetensors container: 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw data. The reader validates everything a
// stranger's file could get wrong before allocating; the writer writes atomically.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "tensor/tensor.h"

namespace tfm {

struct SafetensorsFile {
  TensorMap tensors;                            // all converted to fp32
  std::map<std::string, std::string> metadata;  // "__metadata__" string pairs
};

// Called with the metadata and every tensor's declared shape once the header is validated and
// before any tensor is allocated or read, so that a file whose shapes do not fit its config is
// refused at once instead of after reading gigabytes. Throws Error to refuse.
using SafetensorsHeaderCheck =
    std::function<void(const std::map<std::string, std::string>& metadata,
                       const std::map<std::string, Shape>& shapes)>;

// Parses bytes read from `where` (a path, used in messages). Accepts F32, F16, BF16, F64,
// I64, I32 tensors (converted to fp32). Throws Error on any malformed or inconsistent header.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& where,
                                  const SafetensorsHeaderCheck& check = {});
// Receives each tensor as soon as it is read, instead of SafetensorsFile::tensors: a reader
// that converts tensors (int8 weights) never holds the whole file in float32.
using SafetensorsTensorSink = std::function<void(const std::string& name, Tensor&& tensor)>;

// The same from a regular file (anything else is refused before it is opened); with `sink`, the
// tensors go there one at a time, in file order, and SafetensorsFile::tensors stays empty.
SafetensorsFile read_safetensors(const std::string& path, const SafetensorsHeaderCheck& check = {},
                                 const SafetensorsTensorSink& sink = {});

// The validated header alone (metadata and declared shapes), without reading any tensor.
struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Shape> shapes;
};
SafetensorsHeader read_safetensors_header(const std::string& path);

// Writes all tensors as F32, names sorted, with the metadata; atomically.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace tfm
