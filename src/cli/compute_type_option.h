// --compute-type, the number format of the weight products, registered once for every command
// that runs the model for inference (translate, serve, score).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "kernels/gemm.h"

namespace tfm {

struct ComputeTypeOption {
  std::string name = "float32";

  void add_to(CLI::App& app);
  // The precision it names; throws Error for bfloat16 on a CPU without native bfloat16 products.
  Precision resolve() const;
};

}  // namespace tfm
