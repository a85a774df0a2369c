// The one rule for commands that write a model or a vocabulary (init, average, vocab, quantize,
// import-ctranslate2): an output that exists is replaced only with --force, so that a mistyped
// -o cannot destroy a trained model or the vocabulary it was trained with (CTranslate2's
// converters refuse an existing output directory the same way). An empty directory counts as
// absent. Checked before any work, so the refusal costs nothing.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

#include "tensor/error.h"

namespace tfm {

// Adds --force to `app`: "Overwrite an existing output <what>".
inline void add_force_flag(CLI::App& app, bool& force, const std::string& what) {
  app.add_flag("--force", force, "Overwrite an existing output " + what);
}

// Throws Error naming `output` when it exists (other than as an empty directory) and `force`
// is false.
inline void refuse_existing_output(const std::string& output, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!force && fs::exists(output, ec) &&
      !(fs::is_directory(output, ec) && fs::is_empty(output, ec)))
    throw Error(output + ": already exists (use --force to overwrite it)");
}

}  // namespace tfm
