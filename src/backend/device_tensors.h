// Named float tensors in a backend's memory: a model's parameters, and what training keeps per
// parameter beside it — its gradient and Adam's two moments. Gradients and moments are one block
// per set (llm.c's grads_memory), laid out in name order, so that a whole-set operation —
// zeroing the gradients, their norm for clipping, their scaling, the all-reduce across ranks —
// is one call over one flat range instead of one per tensor. Parameters are one allocation per
// tensor, so that a model loaded for inference can free each weight once its packed copy exists.
// Either way a second backend holds the set in its own memory with nothing in model/ or train/
// changing. Files and checksums see the set through to_host() / copy_from_host().
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
  // One block for the whole set (flat() exists), or one allocation per tensor (release()).
  enum class Layout { kOneBlock, kPerTensor };

  // One tensor of the set: its shape and where its elements are.
  struct Entry {
    Shape shape;
    int64_t offset = 0;       // kOneBlock: elements from the start of the block
    float* data = nullptr;    // [numel()]: block + offset, or own's; null once released
    DeviceBuffer<float> own;  // kPerTensor: [numel()]
    int64_t numel() const { return Tensor::numel_of(shape); }
    float* ptr() { return data; }
    const float* ptr() const { return data; }
  };
  using Map = std::map<std::string, Entry>;

  DeviceTensors() = default;
  // One tensor per name of `shapes` in `backend`'s memory, all zero, or with values undefined
  // until written when !zeroed (a model file's tensors, read straight into them).
  DeviceTensors(const Backend& backend, const std::map<std::string, Shape>& shapes,
                Layout layout = Layout::kOneBlock, bool zeroed = true);
  // One zeroed block with the same names and shapes as `tensors` (their values are not read),
  // on their backend.
  static DeviceTensors zeros_like(const DeviceTensors& tensors);
  // Per tensor, on `backend`, with the values of `host`; each host tensor is freed as soon as
  // it is copied, so the host never holds two copies of the set. A host tensor without data
  // (a weight held otherwise, in int8) becomes a released entry.
  static DeviceTensors upload(const Backend& backend, TensorMap&& host);

  const Backend& backend() const { return *backend_; }  // not for a default-constructed set
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  int64_t numel() const { return numel_; }  // Σ of the tensors' elements
  Layout layout() const { return layout_; }
  // The whole block of a kOneBlock set: [numel()], the tensors one after another in name order
  // (std::logic_error for a kPerTensor set).
  float* flat();
  const float* flat() const;
  // The names and shapes.
  std::map<std::string, Shape> shapes() const;

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

  // kPerTensor, every tensor released: names and shapes without memory, which allocate() then
  // gives one tensor at a time (a file's tensors as they are read).
  static DeviceTensors unallocated(const Backend& backend,
                                   const std::map<std::string, Shape>& shapes);
  // kPerTensor: memory for the named released tensor, zeroed or with values undefined.
  float* allocate(const std::string& name, bool zeroed);
  // kPerTensor: frees the named tensor's memory; its name and shape stay, its data is null.
  void release(const std::string& name);
  // Every element 0 (one fill over the block: the gradients before each step).
  void set_zero();
  // A host copy of every tensor, named prefix + name (checkpoints, checksums); a released
  // tensor comes back with its shape and no data.
  TensorMap to_host(const std::string& prefix = "") const;
  // The named tensor's values from the host: host[numel] elements.
  void copy_from_host(const std::string& name, const float* host);

 private:
  const Backend* backend_ = nullptr;
  Layout layout_ = Layout::kOneBlock;
  Map entries_;
  int64_t numel_ = 0;
  DeviceBuffer<float> block_;  // kOneBlock: [numel_]

  // One entry per name, in name order, with its offset in a block; no memory yet.
  void lay_out(const std::map<std::string, Shape>& shapes);
};

// True when every element of every (unreleased) tensor is finite, read where the tensors are
// (the backend's Σ x² in double is finite exactly when every x is).
bool all_finite(const DeviceTensors& tensors);

}  // namespace tfm
