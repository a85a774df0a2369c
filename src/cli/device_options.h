// --device and --compute-type, registered once for every command that runs the model: where it
// runs (a backend, backend/backend.h) and the number format of its weight products.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "api/compute_type.h"
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
  // What it names for the model at `model_path` on `backend` (resolve_compute_type).
  ComputeType resolve(const Backend& backend, const std::string& model_path) const;
};

}  // namespace tfm
