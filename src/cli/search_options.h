// The decoding flags that `translate` and `serve` share (beam, length penalty, length limits,
// sampling, device, compute type), registered once so both commands spell, bound and explain them
// the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "api/translator.h"
#include "cli/device_options.h"

namespace tfm {

struct SearchFlags {
  TranslationOptions search;  // the library's options these flags set
  DeviceOption device;
  ComputeTypeOption compute_type;

  void add_to(CLI::App& app);
  // The flags' combinations (each flag's range is checked as it is parsed): UsageError.
  void check() const;
  // Where and in which number format a Translator loads the model (--device, --compute-type).
  TranslatorOptions translator_options() const;
};

}  // namespace tfm
