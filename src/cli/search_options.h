// The decoding flags that `translate` and `serve` share (beam, length penalty, length limits,
// device, compute type), registered once so both commands spell, bound and explain them the same
// way.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/device_options.h"
#include "decode/beam_search.h"

namespace tfm {

struct SearchFlags {
  SearchOptions search;
  DeviceOption device;
  ComputeTypeOption compute_type;

  void add_to(CLI::App& app);
  // search with the precision of --compute-type on `backend` (device.resolve()) for the model at
  // `model_path`; throws Error for bfloat16 on a CPU without it.
  SearchOptions resolve(const Backend& backend, const std::string& model_path) const;
};

}  // namespace tfm
