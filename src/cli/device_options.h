// --device and --compute-type, registered once for every command that runs the model: where it
// runs (a backend, backend/backend.h) and the number format of its weight products.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "backend/backend.h"

namespace tfm {

struct DeviceOption {
  std::string name = "cpu";

  void add_to(CLI::App& app);
  // The backend it names; throws Error for a device this build does not have.
  const Backend& resolve() const;
};

struct ComputeTypeOption {
  std::string name = "default";

  void add_to(CLI::App& app);
  // The precision it names ("default": the one the model at `model_path` stores its linear
  // weights in, int8 or float32; "auto": int8 where `backend` multiplies in it, else float32);
  // throws Error when `backend` cannot multiply in it (bfloat16 on a CPU without AVX512-BF16,
  // int8 on one without VNNI).
  Precision resolve(const Backend& backend, const std::string& model_path) const;
  // The key/value cache of incremental decoding: bfloat16 for bfloat16 and int8_bfloat16.
  CacheFormat cache_format() const;
};

}  // namespace tfm
