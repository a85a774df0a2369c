// Memory that layers, the loss and the decoder compute in — activations, their gradients, caches
// — lives in the memory of the backend that computes on it, not in std::vector: a DeviceBuffer
// is an array of T allocated by a Backend, so a second backend gets its buffers where its
// kernels can reach them without model/ changing. Buffers grow once to the largest batch shape
// they see and are reused (ensure_size); a pass whose batch shapes are known ahead (training,
// scoring) plans them instead, and its buffers then borrow their parts of one block
// (backend/workspace.h), as llm.c's activations are allocated once.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace tfm {

template <typename T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "a DeviceBuffer holds plain numbers");

 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : backend_(other.backend_),
        data_(other.data_),
        size_(other.size_),
        borrowed_(other.borrowed_) {
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.size_ = 0;
    other.borrowed_ = false;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(backend_, other.backend_);
      std::swap(data_, other.data_);
      std::swap(size_, other.size_);
      std::swap(borrowed_, other.borrowed_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }  // elements
  bool empty() const { return size_ == 0; }
  const Backend* backend() const { return backend_; }  // null until the first allocation

  // At least n elements on `backend`: ensure_size(backend, buffer, n) below.
  template <typename U>
  friend U* ensure_size(const Backend& backend, DeviceBuffer<U>& buffer, int64_t n);

  // Exactly n elements on `backend`, their values undefined until written (what was held is
  // freed first). For large caches whose parts are written before they are read: on the CPU
  // their untouched pages cost no memory.
  T* allocate_uninitialized(const Backend& backend, int64_t n) {
    reset();
    data_ = static_cast<T*>(backend.allocate(n * int64_t(sizeof(T)), false));
    backend_ = &backend;
    size_ = n;
    return data_;
  }

  // Points the buffer at n elements of memory that something else owns (a Workspace's block,
  // backend/workspace.h), after freeing what it held: reset() then lets go without freeing, and
  // growing past n allocates memory of its own (the borrowed part is left to its owner).
  void borrow(const Backend& backend, T* memory, int64_t n) {
    reset();
    backend_ = &backend;
    data_ = memory;
    size_ = n;
    borrowed_ = true;
  }

  // Frees the memory (size 0); the next allocation may use any backend.
  void reset() {
    if (data_ && !borrowed_) backend_->deallocate(data_);
    backend_ = nullptr;
    data_ = nullptr;
    size_ = 0;
    borrowed_ = false;
  }

 private:
  T* grow(const Backend& backend, int64_t n) {
    if (backend_ && backend_ != &backend)
      throw std::logic_error("DeviceBuffer: grown on " + backend.name() + ", allocated on " +
                             backend_->name());
    T* grown = static_cast<T*>(backend.allocate(n * int64_t(sizeof(T)), true));
    if (data_) {
      backend.copy_bytes(data_, size_ * int64_t(sizeof(T)), grown);
      if (!borrowed_) backend.deallocate(data_);
    }
    backend_ = &backend;
    data_ = grown;
    size_ = n;
    borrowed_ = false;
    return data_;
  }

  const Backend* backend_ = nullptr;
  T* data_ = nullptr;
  int64_t size_ = 0;
  bool borrowed_ = false;  // data_ is part of memory that something else frees
};

// The one way layers get their buffers: at least n elements of `buffer` on `backend`. A smaller
// buffer grows to n: its first size() elements are kept and the rest are zero (as
// std::vector::resize would leave them); a large enough one is returned as it is (steady-state
// calls allocate nothing). A buffer belongs to the backend that first allocated it.
template <typename T>
T* ensure_size(const Backend& backend, DeviceBuffer<T>& buffer, int64_t n) {
  return n <= buffer.size_ ? buffer.data_ : buffer.grow(backend, n);
}

// buffer[0, n) = host[0, n), the buffer grown as ensure_size grows it: the one way index arrays
// that the host computes (token ids, lengths, row lists) reach the operations, which read every
// pointer they are given in their backend's memory. Returns the buffer's data.
template <typename T>
T* upload(const Backend& backend, const T* host, int64_t n, DeviceBuffer<T>& buffer) {
  T* device = ensure_size(backend, buffer, n);
  if (n > 0) backend.copy_from_host(host, n * int64_t(sizeof(T)), device);
  return device;
}

// The n elements at `device` (the backend's memory) as the host can read them: the pointer itself
// where the backend's memory is the host's (Backend::memory_is_host: no copy), else a copy in
// `staging`. The one way host code (files, checksums, quantising) reads the backend's memory.
template <typename T>
const T* host_readable(const Backend& backend, const T* device, int64_t n,
                       std::vector<T>& staging) {
  if (backend.memory_is_host() || n == 0) return device;
  staging.resize(size_t(n));
  backend.copy_to_host(device, n * int64_t(sizeof(T)), staging.data());
  return staging.data();
}

}  // namespace tfm
