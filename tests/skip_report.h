// What a test cannot run on this machine, said so that no skip is silent. A whole test skips with
// GTEST_SKIP() << reason (CTest lists it as Skipped); a part of a test (one precision of a loop)
// calls skip_part, which prints
//   [ PART SKIPPED ] Suite.Test: what: why
// in the test's output. scripts/check_skips.py lists both kinds with their reasons after every
// run of scripts/test.sh and scripts/sanitize.sh, and fails unless each is allowed on this
// machine by tests/allowed_skips.txt (no GPU, a CPU feature this CPU lacks, ...).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/backend.h"
#include "backend/operation_types.h"

namespace tfm::testing_support {

// "cpu cannot compute in bfloat16: needs a CPU with AVX512-BF16 instructions"
inline std::string cannot_compute(const Backend& backend, Precision precision) {
  return backend.name() + " cannot compute in " + precision_name(precision) + ": " +
         backend.unsupported_reason(precision);
}

inline void skip_part(const std::string& what, const std::string& why) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      test ? std::string(test->test_suite_name()) + "." + test->name() : std::string("?");
  std::printf("[ PART SKIPPED ] %s: %s: %s\n", name.c_str(), what.c_str(), why.c_str());
  std::fflush(stdout);
}

// The part of the current test in `precision` does not run on `backend`.
inline void skip_precision(const Backend& backend, Precision precision,
                           const std::string& what = "") {
  skip_part(what.empty() ? precision_name(precision) : what + " in " + precision_name(precision),
            cannot_compute(backend, precision));
}

}  // namespace tfm::testing_support
