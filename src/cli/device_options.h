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

  void add_to(CLI::App& app);  // the name is resolved by the Translator (resolve_compute_type)
};

}  // namespace tfm
