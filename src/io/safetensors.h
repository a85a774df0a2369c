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
// Where read_safetensors puts the tensors instead of SafetensorsFile::tensors: one at a time, in
// file order, straight into the caller's memory, so that a reader which converts tensors (int8
// weights) or keeps them elsewhere (a backend's memory) never holds the file twice.
struct SafetensorsReceiver {
  // Host-writable memory for the tensor's values converted to float32, [numel(shape)] floats,
  // kept valid until filled() returns.
  std::function<float*(const std::string& name, const Shape& shape)> place;
  // Called once the memory place() gave holds the tensor's values.
  std::function<void(const std::string& name, const Shape& shape, float* values)> filled;
  // When set, I8 tensors are not converted: they are read as stored (row-major values) into the
  // memory place_int8() gives, [numel(shape)] bytes, and int8_filled() is called.
  std::function<int8_t*(const std::string& name, const Shape& shape)> place_int8;
  std::function<void(const std::string& name, const Shape& shape, int8_t* values)> int8_filled;
};

// The same from a regular file (anything else is refused before it is opened); with a
// receiver, the tensors go there and SafetensorsFile::tensors stays empty.
SafetensorsFile read_safetensors(const std::string& path, const SafetensorsHeaderCheck& check = {},
                                 const SafetensorsReceiver* receiver = nullptr);

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
