// The registry of the backends built into this binary, and --device's lookup.
#include "backend/backend.h"

#include "tensor/error.h"

namespace tfm {

const std::vector<const Backend*>& available_backends() {
  // A new backend adds itself here (under its build option).
  static const std::vector<const Backend*> backends = {&cpu_backend()};
  return backends;
}

std::string available_backend_names() {
  std::string names;
  for (const Backend* backend : available_backends()) {
    if (!names.empty()) names += ", ";
    names += backend->name();
  }
  return names;
}

const Backend& find_backend(const std::string& device) {
  for (const Backend* backend : available_backends())
    if (backend->name() == device) return *backend;
  throw Error("unknown device \"" + device + "\" (this build has: " + available_backend_names() +
              ")");
}

}  // namespace tfm
