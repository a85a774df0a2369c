// DeviceTensors: the layout of a named set (one block, or one allocation per tensor), and its
// copies to and from the host.
#include "backend/device_tensors.h"

#include <cmath>
#include <stdexcept>

namespace tfm {

DeviceTensors::DeviceTensors(const Backend& backend, const std::map<std::string, Shape>& shapes,
                             Layout layout, bool zeroed)
    : backend_(&backend), layout_(layout) {
  lay_out(shapes);
  if (layout_ == Layout::kPerTensor) {
    for (auto& [name, entry] : entries_) allocate(name, zeroed);
    return;
  }
  float* block = zeroed ? ensure_size(backend, block_, numel_)
                        : block_.allocate_uninitialized(backend, numel_);
  for (auto& [name, entry] : entries_) entry.data = block + entry.offset;
}

DeviceTensors DeviceTensors::zeros_like(const DeviceTensors& tensors) {
  return DeviceTensors(tensors.backend(), tensors.shapes());
}

DeviceTensors DeviceTensors::unallocated(const Backend& backend,
                                         const std::map<std::string, Shape>& shapes) {
  DeviceTensors set;
  set.backend_ = &backend;
  set.layout_ = Layout::kPerTensor;
  set.lay_out(shapes);
  return set;
}

void DeviceTensors::lay_out(const std::map<std::string, Shape>& shapes) {
  for (const auto& [name, shape] : shapes) {
    Entry& entry = entries_[name];
    entry.shape = shape;
    entry.offset = numel_;
    numel_ += entry.numel();
  }
}

DeviceTensors DeviceTensors::upload(const Backend& backend, TensorMap&& host) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, tensor] : host) shapes.emplace(name, tensor.shape);
  DeviceTensors set = unallocated(backend, shapes);
  for (auto& [name, tensor] : host) {
    if (tensor.data.empty() && tensor.numel() > 0) continue;  // held otherwise
    if (tensor.data.size() != size_t(tensor.numel()))
      throw std::logic_error("DeviceTensors::upload: \"" + name + "\" does not match its shape");
    set.allocate(name, false);
    set.copy_from_host(name, tensor.ptr());
    tensor = Tensor();
  }
  return set;
}

float* DeviceTensors::flat() {
  if (layout_ != Layout::kOneBlock) throw std::logic_error("DeviceTensors: no block per tensor");
  return block_.data();
}

const float* DeviceTensors::flat() const {
  return const_cast<DeviceTensors*>(this)->flat();
}

std::map<std::string, Shape> DeviceTensors::shapes() const {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, entry] : entries_) shapes.emplace(name, entry.shape);
  return shapes;
}

float* DeviceTensors::allocate(const std::string& name, bool zeroed) {
  if (layout_ != Layout::kPerTensor)
    throw std::logic_error("DeviceTensors::allocate: a tensor of one block");
  Entry& entry = at(name);
  entry.data = zeroed ? ensure_size(backend(), entry.own, entry.numel())
                      : entry.own.allocate_uninitialized(backend(), entry.numel());
  return entry.data;
}

void DeviceTensors::release(const std::string& name) {
  if (layout_ != Layout::kPerTensor)
    throw std::logic_error("DeviceTensors::release: a tensor of one block");
  Entry& entry = at(name);
  entry.own.reset();
  entry.data = nullptr;
}

void DeviceTensors::set_zero() {
  if (layout_ == Layout::kOneBlock) {
    if (numel_ > 0) backend().fill(flat(), numel_, 0.f);
    return;
  }
  for (auto& [name, entry] : entries_)
    if (entry.data && entry.numel() > 0) backend().fill(entry.data, entry.numel(), 0.f);
}

TensorMap DeviceTensors::to_host(const std::string& prefix) const {
  TensorMap host;
  for (const auto& [name, entry] : entries_) {
    Tensor& t = host.emplace(prefix + name, Tensor()).first->second;
    t.shape = entry.shape;
    if (!entry.data) continue;
    t.data.resize(size_t(entry.numel()));
    backend().copy_to_host(entry.data, entry.numel() * int64_t(sizeof(float)), t.ptr());
  }
  return host;
}

void DeviceTensors::copy_from_host(const std::string& name, const float* host) {
  Entry& entry = at(name);
  if (!entry.data) throw std::logic_error("DeviceTensors: \"" + name + "\" was released");
  backend().copy_from_host(host, entry.numel() * int64_t(sizeof(float)), entry.data);
}

bool all_finite(const DeviceTensors& tensors) {
  if (tensors.empty()) return true;
  if (tensors.layout() == DeviceTensors::Layout::kOneBlock)
    return std::isfinite(tensors.backend().sum_of_squares(tensors.flat(), tensors.numel()));
  for (const auto& [name, entry] : tensors)
    if (entry.data && !std::isfinite(tensors.backend().sum_of_squares(entry.data, entry.numel())))
      return false;
  return true;
}

}  // namespace tfm
