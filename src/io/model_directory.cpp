// Model directory loading and writing.
#include "io/model_directory.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/model_file.h"
#include "tensor/error.h"
#include "tensor/file_util.h"

namespace tfm {

std::string model_file_path(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0)  // the OS's reason: missing, a symlink loop, no access
    throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  if (!S_ISDIR(info.st_mode)) {
    require_regular_file(path);
    return path;
  }
  const std::string model_path = path + "/model.safetensors";
  if (::stat(model_path.c_str(), &info) != 0) {
    if (errno == ENOENT) throw Error(path + ": no model.safetensors in this directory");
    throw Error(model_path + ": cannot open (" + std::strerror(errno) + ")");
  }
  require_regular_file(model_path);
  return model_path;
}

Precision stored_precision(const std::string& path) {
  return stores_int8_weights(read_safetensors_header(model_file_path(path))) ? Precision::kInt8
                                                                             : Precision::kFloat32;
}

ModelBundle load_model_bundle(const std::string& path, bool need_vocabulary, const Backend& backend,
                              std::optional<Precision> inference_only) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string model_path = model_file_path(path);
  const bool directory = fs::is_directory(path, ec);
  if (!directory && need_vocabulary)
    throw MissingVocabulary(path +
                            ": a bare model file has no vocabulary; pass its model directory");
  ModelBundle bundle{
      load_model(model_path, backend,
                 inference_only ? model_weights_for(*inference_only) : ModelWeights::kFloat32),
      std::nullopt, std::nullopt};
  if (inference_only) bundle.model.set_inference_only(*inference_only);
  if (!directory) return bundle;
  auto file = [&](const char* name) { return path + "/" + name; };
  if (fs::exists(file("vocab.spm"), ec)) {
    bundle.source_vocabulary = Vocabulary::from_sentencepiece(file("vocab.spm"));
    bundle.target_vocabulary = Vocabulary::from_sentencepiece(file("vocab.spm"));
  } else if (fs::exists(file("source.spm"), ec) && fs::exists(file("target.spm"), ec)) {
    bundle.source_vocabulary = Vocabulary::from_sentencepiece(file("source.spm"));
    bundle.target_vocabulary = Vocabulary::from_sentencepiece(file("target.spm"));
  } else if (fs::exists(file("source_vocabulary.txt"), ec) &&
             fs::exists(file("target_vocabulary.txt"), ec)) {
    bundle.source_vocabulary = Vocabulary::from_token_list(file("source_vocabulary.txt"));
    bundle.target_vocabulary = Vocabulary::from_token_list(file("target_vocabulary.txt"));
  } else if (need_vocabulary) {
    throw MissingVocabulary(path +
                            ": no vocabulary (vocab.spm, source.spm + target.spm, or "
                            "source_vocabulary.txt + target_vocabulary.txt)");
  }
  const ModelConfig& c = bundle.model.config();
  if (bundle.source_vocabulary && bundle.source_vocabulary->size() != c.src_vocab_size)
    throw Error(bundle.source_vocabulary->where() + ": " +
                std::to_string(bundle.source_vocabulary->size()) +
                " tokens, but the model's source vocabulary has " +
                std::to_string(c.src_vocab_size));
  if (bundle.target_vocabulary && bundle.target_vocabulary->size() != c.tgt_vocab_size)
    throw Error(bundle.target_vocabulary->where() + ": " +
                std::to_string(bundle.target_vocabulary->size()) +
                " tokens, but the model's target vocabulary has " +
                std::to_string(c.tgt_vocab_size));
  return bundle;
}

namespace {

const char* const kVocabularyFiles[] = {"vocab.spm", "source.spm", "target.spm",
                                        "source_vocabulary.txt", "target_vocabulary.txt"};

}  // namespace

const std::vector<std::string>& model_directory_files() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list{"model.safetensors"};
    list.insert(list.end(), std::begin(kVocabularyFiles), std::end(kVocabularyFiles));
    return list;
  }();
  return names;
}

void copy_vocabulary_files(const std::string& from_dir, const std::string& to_dir) {
  std::error_code ec;
  for (const char* name : kVocabularyFiles) {
    const std::string from = from_dir + "/" + name;
    if (std::filesystem::exists(from, ec))
      write_bytes_atomically(to_dir + "/" + name, read_file_bytes(from));
  }
}

void install_vocabulary_files(const std::vector<std::string>& files, const std::string& dir) {
  auto copy = [&](const std::string& from, const char* name) {
    write_bytes_atomically(dir + "/" + name, read_file_bytes(from));
  };
  if (files.size() == 1) {
    if (Vocabulary::is_token_list_file(files[0])) {
      copy(files[0], "source_vocabulary.txt");
      copy(files[0], "target_vocabulary.txt");
    } else {
      copy(files[0], "vocab.spm");
    }
  } else if (files.size() == 2) {
    const bool lists = Vocabulary::is_token_list_file(files[0]);
    copy(files[0], lists ? "source_vocabulary.txt" : "source.spm");
    copy(files[1], lists ? "target_vocabulary.txt" : "target.spm");
  }
}

void write_model_directory(const std::string& dir, const Model& model,
                           const std::vector<std::string>* source_tokens,
                           const std::vector<std::string>* target_tokens) {
  auto write_tokens = [&](const std::string& path, const std::vector<std::string>& tokens) {
    write_file_atomically(path, [&](std::FILE* f) {
      for (const auto& token : tokens) write_text(f, token + "\n");
    });
  };
  write_directory_atomically(dir, model_directory_files(), [&](const std::string& temp) {
    if (source_tokens) write_tokens(temp + "/source_vocabulary.txt", *source_tokens);
    if (target_tokens) write_tokens(temp + "/target_vocabulary.txt", *target_tokens);
    save_model(model, temp + "/model.safetensors");
  });
}

}  // namespace tfm
