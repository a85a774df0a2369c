// The rules for what commands write. A model or a vocabulary (init, average, vocab, quantize,
// import-ctranslate2): an output that exists is replaced only with --force, so that a mistyped
// -o cannot destroy a trained model or the vocabulary it was trained with (CTranslate2's
// converters refuse an existing output directory the same way). An empty directory counts as
// absent where a directory is written. Every output: it is not one of the command's inputs.
// Checked before any work, so a refusal costs nothing.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "tensor/file_util.h"

namespace tfm {

// Adds --force to `app`: "Overwrite an existing output <what>".
inline void add_force_flag(CLI::App& app, bool& force, const std::string& what) {
  app.add_flag("--force", force, "Overwrite an existing output " + what);
}

// What a command writes at its -o: one file (init, average, vocab) or a directory of files
// (quantize, import-ctranslate2).
enum class OutputKind { kFile, kDirectory };

// Throws Error naming `output` when it exists (other than as an empty directory where a
// directory is written) and `force` is false, and whatever `force` when a file is to be written
// where a directory is (the rename at the end would fail after all the work).
inline void refuse_existing_output(const std::string& output, OutputKind kind, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool directory = fs::is_directory(output, ec);
  if (kind == OutputKind::kFile && directory)
    throw Error(output + ": is a directory; -o names the file to write");
  if (!force && fs::exists(output, ec) && !(directory && fs::is_empty(output, ec)))
    throw Error(output + ": already exists (use --force to overwrite it)");
}

// Throws UsageError when `output` (-o, or another option's file: `option`) is one of `inputs`:
// it would be replaced by what is made from it (translate -i X -o X lost X). Standard input and
// output ("-" or empty) are never the same file as a named one.
inline void refuse_output_over_input(const std::string& option, const std::string& output,
                                     const std::vector<std::string>& inputs) {
  if (output.empty() || output == "-") return;
  for (const std::string& input : inputs)
    if (!input.empty() && input != "-" && same_file(input, output))
      throw UsageError(option + " " + output + " is also an input (" + input +
                       "); it would be replaced");
}

}  // namespace tfm
