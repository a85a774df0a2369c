// The safetensors container: 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw data. The reader validates everything a
// stranger's file could get wrong before allocating; the writer writes atomically.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tfm {

struct SafetensorsFile {
  TensorMap tensors;                            // all converted to fp32
  std::map<std::string, std::string> metadata;  // "__metadata__" string pairs
};

// The validated header: metadata, and each tensor's declared shape and dtype ("F32", "I8", ...).
struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::string> dtypes;
};

// Called with the header once it is validated and before any tensor is allocated or read, so
// that a file whose shapes do not fit its config is refused at once instead of after reading
// gigabytes. Throws Error to refuse.
using SafetensorsHeaderCheck = std::function<void(const SafetensorsHeader& header)>;

// Parses bytes read from `where` (a path, used in messages). Accepts F32, F16, BF16, F64,
// I64, I32 and I8 tensors (converted to fp32). Throws Error on any malformed or inconsistent
// header.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& where,
                                  const SafetensorsHeaderCheck& check = {});
// Receives each tensor as soon as it is read, instead of SafetensorsFile::tensors: a reader
// that converts tensors (int8 weights) never holds the whole file in float32.
using SafetensorsTensorSink = std::function<void(const std::string& name, Tensor&& tensor)>;
// Receives I8 tensors as they are stored (row-major values), instead of converted to fp32.
using SafetensorsInt8Sink =
    std::function<void(const std::string& name, Shape&& shape, std::vector<int8_t>&& values)>;

// The same from a regular file (anything else is refused before it is opened); with `sink`, the
// tensors go there one at a time, in file order, and SafetensorsFile::tensors stays empty; with
// `int8_sink` too, I8 tensors go there unconverted.
SafetensorsFile read_safetensors(const std::string& path, const SafetensorsHeaderCheck& check = {},
                                 const SafetensorsTensorSink& sink = {},
                                 const SafetensorsInt8Sink& int8_sink = {});

// The validated header alone, without reading any tensor.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Writes all tensors as F32, names sorted, with the metadata; atomically.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata);

// One tensor as stored: its dtype name ("F32" or "I8"), shape and little-endian bytes, which
// the caller keeps alive until the write returns.
struct StoredTensor {
  std::string dtype;
  Shape shape;
  const void* data = nullptr;
};
// Writes tensors of any of those dtypes, names sorted, with the metadata; atomically.
void write_safetensors(const std::string& path, const std::map<std::string, StoredTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace tfm
