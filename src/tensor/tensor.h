// A small owning float tensor: a shape and contiguous row-major fp32 storage.
// Files, imports, initialisation and test data hold tensors in these on the host; a model
// computes with its parameters in the backend's memory (backend/device_tensors.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tfm {

using Shape = std::vector<int64_t>;

struct Tensor {
  Shape shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(Shape s) : shape(std::move(s)), data(size_t(numel_of(shape)), 0.f) {}

  int64_t numel() const { return numel_of(shape); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }

  static int64_t numel_of(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Named tensors, ordered by name (the order safetensors files are written in).
using TensorMap = std::map<std::string, Tensor>;

// "[2, 3, 4]"
std::string shape_to_string(const Shape& shape);

}  // namespace tfm
