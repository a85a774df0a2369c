// What `transformer --version` prints: the version, the model file format it reads and writes,
// what the binary was built with (MPI, the CUDA backend, the instruction sets it was compiled
// for) and what the CPU it runs on offers to the kernels that choose at run time (oneDNN's
// products: AVX512-BF16 for bfloat16, VNNI for int8, AMX). Bug reports start from this.
#pragma once

#include <string>

namespace tfm {

std::string build_description();

}  // namespace tfm
