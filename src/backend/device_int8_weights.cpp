// Int8 weights between the host and a backend's memory.
#include "backend/device_int8_weights.h"

namespace tfm {

Int8Matrix DeviceInt8Matrix::to_host() const {
  Int8Matrix host;
  host.shape = shape;
  if (const Backend* backend = values.backend()) {
    host.values.resize(size_t(values.size()));
    backend->copy_to_host(values.data(), values.size(), host.values.data());
  }
  if (const Backend* backend = scales.backend()) {
    host.scales.resize(size_t(scales.size()));
    backend->copy_to_host(scales.data(), scales.size() * int64_t(sizeof(float)),
                          host.scales.data());
  }
  return host;
}

DeviceInt8Weights upload_int8_weights(const Backend& backend, Int8WeightMap&& host) {
  DeviceInt8Weights device;
  for (auto& [name, q] : host) {
    DeviceInt8Matrix& d = device[name];
    d.shape = q.shape;
    upload(backend, q.values.data(), int64_t(q.values.size()), d.values);
    upload(backend, q.scales.data(), int64_t(q.scales.size()), d.scales);
    q = Int8Matrix();
  }
  return device;
}

}  // namespace tfm
