// DeviceTensors: the layout of a named set in one block, and its copies to and from the host.
#include "backend/device_tensors.h"

namespace tfm {

DeviceTensors::DeviceTensors(const Backend& backend, const std::map<std::string, Shape>& shapes)
    : backend_(&backend) {
  for (const auto& [name, shape] : shapes) {
    Entry& entry = entries_[name];
    entry.shape = shape;
    entry.offset = numel_;
    numel_ += entry.numel();
  }
  float* block = ensure_size(backend, block_, numel_);  // zeroed
  for (auto& [name, entry] : entries_) entry.data = block + entry.offset;
}

DeviceTensors DeviceTensors::zeros_like(const Backend& backend, const TensorMap& tensors) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, tensor] : tensors) shapes.emplace(name, tensor.shape);
  return DeviceTensors(backend, shapes);
}

void DeviceTensors::set_zero() {
  if (numel_ > 0) backend().fill(flat(), numel_, 0.f);
}

TensorMap DeviceTensors::to_host(const std::string& prefix) const {
  TensorMap host;
  for (const auto& [name, entry] : entries_) {
    Tensor& t = host.emplace(prefix + name, Tensor(entry.shape)).first->second;
    backend().copy_to_host(entry.data, entry.numel() * int64_t(sizeof(float)), t.ptr());
  }
  return host;
}

void DeviceTensors::copy_from_host(const std::string& name, const float* host) {
  Entry& entry = at(name);
  backend().copy_from_host(host, entry.numel() * int64_t(sizeof(float)), entry.data);
}

}  // namespace tfm
