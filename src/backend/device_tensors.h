// Named float tensors in one block of a backend's memory: what training keeps per parameter
// beside the parameter itself — its gradient and Adam's two moments. One block per set (llm.c's
// grads_memory), laid out in name order, so that a whole-set operation — zeroing the gradients,
// their norm for clipping, their scaling, the all-reduce across ranks — is one call over one
// flat range instead of one per tensor, and a second backend holds the set in its own memory
// with nothing in train/ changing. Files and checksums see the set through to_host() /
// copy_from_host().
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "backend/backend.h"
#include "backend/device_buffer.h"
#include "tensor/tensor.h"

namespace tfm {

class DeviceTensors {
 public:
  // One tensor of the set: its shape and where its elements are in the block.
  struct Entry {
    Shape shape;
    int64_t offset = 0;     // elements from the start of the block
    float* data = nullptr;  // block + offset
    int64_t numel() const { return Tensor::numel_of(shape); }
    float* ptr() { return data; }
    const float* ptr() const { return data; }
  };
  using Map = std::map<std::string, Entry>;

  DeviceTensors() = default;
  // One tensor per name of `shapes`, all zero, in one block of `backend`'s memory.
  DeviceTensors(const Backend& backend, const std::map<std::string, Shape>& shapes);
  // The same names and shapes as `tensors` (their values are not read).
  static DeviceTensors zeros_like(const Backend& backend, const TensorMap& tensors);

  const Backend& backend() const { return *backend_; }  // not for a default-constructed set
  bool empty() const { return entries_.empty(); }
  int64_t numel() const { return numel_; }  // Σ of the tensors' elements
  // The whole block: [numel()], the tensors one after another in name order.
  float* flat() { return block_.data(); }
  const float* flat() const { return block_.data(); }

  // By name, as std::map does (model/weights.h binds views through these).
  Map::iterator find(const std::string& name) { return entries_.find(name); }
  Map::const_iterator find(const std::string& name) const { return entries_.find(name); }
  Map::iterator begin() { return entries_.begin(); }
  Map::iterator end() { return entries_.end(); }
  Map::const_iterator begin() const { return entries_.begin(); }
  Map::const_iterator end() const { return entries_.end(); }
  // The named tensor; throws std::out_of_range when there is none.
  Entry& at(const std::string& name) { return entries_.at(name); }
  const Entry& at(const std::string& name) const { return entries_.at(name); }

  // Every element 0 (one fill over the block: the gradients before each step).
  void set_zero();
  // A host copy of every tensor, named prefix + name (checkpoints, checksums).
  TensorMap to_host(const std::string& prefix = "") const;
  // The named tensor's values from the host: host[numel] elements.
  void copy_from_host(const std::string& name, const float* host);

 private:
  const Backend* backend_ = nullptr;
  Map entries_;
  int64_t numel_ = 0;
  DeviceBuffer<float> block_;  // [numel_]
};

}  // namespace tfm
