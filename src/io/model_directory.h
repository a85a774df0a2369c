// What `translate` and `score` load: a model directory (model.safetensors plus its
// vocabularies) or, for --ids work, a bare .safetensors file. Also writes directories.
#pragma once

#include <optional>
#include <string>

#include "io/model_file.h"
#include "model/transformer.h"
#include "tensor/error.h"
#include "text/vocabulary.h"

namespace tfm {

struct ModelBundle {
  Model model;
  std::optional<Vocabulary> source_vocabulary;  // absent for a bare model file
  std::optional<Vocabulary> target_vocabulary;
};

// What load_model_bundle throws when a vocabulary it needs is not there; a command that can
// work on token ids instead (translate and score's --ids) says so.
struct MissingVocabulary : Error {
  explicit MissingVocabulary(const std::string& message) : Error(message) {}
};

// `path`: a directory or a .safetensors file. Vocabularies are looked up as vocab.spm,
// source.spm + target.spm, or source_vocabulary.txt + target_vocabulary.txt; their sizes must
// match the model's. With need_vocabulary, a missing vocabulary is MissingVocabulary. The model
// runs on `backend`. With `inference_only` (translate, score, serve) it runs inference in that
// precision only: int8 reads its linear weights as int8 (model_weights_for), and every precision
// frees the float weights once packed (Model::set_inference_only); without, all weights are
// float32.
ModelBundle load_model_bundle(const std::string& path, bool need_vocabulary, const Backend& backend,
                              std::optional<Precision> inference_only = std::nullopt);

// The model file `path` names: itself, or a directory's model.safetensors. Throws Error when
// there is none, with the OS's reason ("<path>: cannot open (Too many levels of symbolic
// links)"). Every command that takes --model resolves it here first, so all say the same.
std::string model_file_path(const std::string& path);

// What a model stores its linear weights in, from its header: kInt8 for I8 weights, else
// kFloat32 (other float dtypes are read as float32). `path` as for load_model_bundle.
Precision stored_precision(const std::string& path);

// Copies the vocabulary files load_model_bundle looks for (those of them `from_dir` has) into
// `to_dir`, each atomically.
void copy_vocabulary_files(const std::string& from_dir, const std::string& to_dir);

// Copies the vocabularies a run trains with into `dir` under the names load_model_bundle looks
// for, each atomically: one joint file (SentencePiece or .txt token list), or source + target.
void install_vocabulary_files(const std::vector<std::string>& files, const std::string& dir);

// The names of the files a model directory is made of (the model and every vocabulary name
// load_model_bundle looks for): what a writer of a whole model directory may replace.
const std::vector<std::string>& model_directory_files();

// Writes the model directory `dir` as a whole (write_directory_atomically): model.safetensors
// and, when given, token-list vocabularies.
void write_model_directory(const std::string& dir, const Model& model,
                           const std::vector<std::string>* source_tokens,
                           const std::vector<std::string>* target_tokens);

}  // namespace tfm
