// Checkpoint files.
#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "io/model_file.h"
#include "io/safetensors.h"
#include "tensor/error.h"
#include "tensor/file_util.h"

namespace tfm {

namespace fs = std::filesystem;

nlohmann::json TrainingState::to_json() const {
  return {{"step", step},
          {"epoch", epoch},
          {"batch_index", batch_index},
          {"seed", seed},
          {"best_valid_nll", best_valid_nll},
          {"validations_without_improvement", validations_without_improvement},
          {"target_tokens_seen", target_tokens_seen},
          {"train_seconds", train_seconds},
          {"skipped_steps", skipped_steps},
          {"bad_steps_in_a_row", bad_steps_in_a_row},
          {"compute_type", precision_name(compute_type)},
          {"sentencepiece_alphas", sentencepiece_alphas}};
}

TrainingState TrainingState::from_json(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& key, const std::string& why) {
    return Error(where + ": bad training state: \"" + key + "\" " + why);
  };
  // Counters are non-negative integers; an absent optional one (older checkpoints) is 0.
  auto count = [&](const char* key, bool required) -> int64_t {
    if (!j.is_object() || !j.contains(key)) {
      if (required) throw bad(key, "is missing");
      return 0;
    }
    const nlohmann::json& v = j.at(key);
    if (!v.is_number_integer()) throw bad(key, "is not an integer");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT64_MAX) : v.get<int64_t>() < 0)
      throw bad(key, "is out of range (" + v.dump() + ")");
    return v.get<int64_t>();
  };
  auto real = [&](const char* key) -> double {
    if (!j.is_object() || !j.contains(key)) throw bad(key, "is missing");
    const nlohmann::json& v = j.at(key);
    if (!v.is_number()) throw bad(key, "is not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) throw bad(key, "is not finite");
    return x;
  };
  TrainingState s;
  s.step = count("step", true);
  s.epoch = count("epoch", true);
  s.batch_index = count("batch_index", true);
  if (!j.contains("seed") || !j.at("seed").is_number_unsigned()) throw bad("seed", "is not a seed");
  s.seed = j.at("seed").get<uint64_t>();
  s.best_valid_nll = real("best_valid_nll");
  if (s.best_valid_nll < 0 && s.best_valid_nll != -1) throw bad("best_valid_nll", "is negative");
  s.validations_without_improvement = count("validations_without_improvement", true);
  s.target_tokens_seen = count("target_tokens_seen", true);
  s.train_seconds = real("train_seconds");
  if (s.train_seconds < 0) throw bad("train_seconds", "is negative");
  s.skipped_steps = count("skipped_steps", false);
  s.bad_steps_in_a_row = count("bad_steps_in_a_row", false);
  if (j.contains("compute_type")) {
    const nlohmann::json& v = j.at("compute_type");
    if (!v.is_string() || !parse_precision(v.get<std::string>(), s.compute_type) ||
        !trains_in(s.compute_type))
      throw bad("compute_type", "is not float32 or bfloat16 (" + v.dump() + ")");
  }
  if (j.contains("sentencepiece_alphas")) {
    const nlohmann::json& v = j.at("sentencepiece_alphas");
    if (!v.is_array() || v.size() != 2)
      throw bad("sentencepiece_alphas", "is not a [source, target] pair");
    for (size_t side = 0; side < 2; ++side) {
      if (!v[side].is_number() || !(v[side].get<double>() >= 0 && v[side].get<double>() <= 1))
        throw bad("sentencepiece_alphas", "holds a value not in [0, 1] (" + v.dump() + ")");
      s.sentencepiece_alphas[side] = v[side].get<double>();
    }
  }
  return s;
}

std::string checkpoint_path(const std::string& dir) {
  return dir + "/checkpoint.safetensors";
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(checkpoint_path(dir), ec);
}

std::vector<std::string> list_snapshots(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  const std::string folder = dir + "/checkpoints";
  if (!fs::is_directory(folder, ec)) return files;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() > 17 &&
        name.compare(name.size() - 12, 12, ".safetensors") == 0)
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());  // zero-padded step numbers sort in order
  return files;
}

void save_checkpoint(const std::string& dir, const Model& model, const Optimizer& optimizer,
                     const TrainingState& state, int64_t keep, bool allow_nonfinite) {
  const std::string step = "step " + std::to_string(state.step);
  if (!allow_nonfinite && (!all_finite(model.parameters()) || !optimizer.state_is_finite()))
    throw Error(
        step + ": the model or optimizer state holds NaN or Inf; not saved (" +
        (has_checkpoint(dir) ? "the last checkpoint in " + dir + " is kept" : "nothing saved") +
        ")");
  make_directories(dir + "/checkpoints");
  char name[64];
  std::snprintf(name, sizeof name, "/checkpoints/step-%09lld.safetensors", (long long)state.step);
  if (keep > 0) save_model(model, dir + name);

  // Written from where the tensors are when the host can read the backend's memory: a copy of
  // the parameters and both moments would add three model sizes to training's peak memory at
  // every save (store_tensors copies only where it must).
  std::map<std::string, StoredTensor> stored;
  TensorMap staged;
  for (const auto& [prefix, moments] : optimizer.moments())
    store_tensors(*moments, prefix, stored, staged);
  store_tensors(model.parameters(), "model.", stored, staged);
  nlohmann::json training = state.to_json();
  training["optimizer_step"] = optimizer.step();
  write_safetensors(
      checkpoint_path(dir), stored,
      {{"config", config_to_json_text(model.config())}, {"training_state", training.dump()}});
  save_model(model, dir + "/model.safetensors");

  const auto snapshots = list_snapshots(dir);
  for (size_t i = 0; keep >= 0 && i + size_t(keep) < snapshots.size(); ++i)
    std::remove(snapshots[i].c_str());
}

CheckpointHeader checkpoint_of_header(const std::map<std::string, std::string>& metadata,
                                      const std::map<std::string, Shape>& shapes,
                                      const std::string& where) {
  auto config_it = metadata.find("config");
  auto state_it = metadata.find("training_state");
  if (config_it == metadata.end() || state_it == metadata.end())
    throw Error(where + ": not a training checkpoint (no config / training_state metadata)");
  CheckpointHeader header{config_from_json_text(config_it->second, where), {}};
  validate_config(header.config, where);
  const nlohmann::json state_json = nlohmann::json::parse(state_it->second, nullptr, false);
  if (state_json.is_discarded() || !state_json.is_object())
    throw Error(where + ": training_state is not a JSON object");
  header.state = TrainingState::from_json(state_json, where);
  std::map<std::string, Shape> model_shapes;
  for (const auto& [name, shape] : shapes)
    if (name.rfind("model.", 0) == 0) model_shapes.emplace(name.substr(6), shape);
  check_parameter_shapes(header.config, model_shapes, where);
  for (const auto& [name, shape] : shapes) {
    if (name.rfind("model.", 0) == 0) continue;
    const size_t dot = name.find('.');
    const std::string kind = name.substr(0, dot == std::string::npos ? 0 : dot);
    auto param = model_shapes.find(dot == std::string::npos ? "" : name.substr(dot + 1));
    if ((kind != "adam_m" && kind != "adam_v") || param == model_shapes.end() ||
        param->second != shape)
      throw Error(where + ": unexpected optimizer state tensor \"" + name + "\"");
  }
  return header;
}

LoadedCheckpoint load_checkpoint(const std::string& dir, const Backend& backend) {
  const std::string path = checkpoint_path(dir);
  std::optional<CheckpointHeader> header;
  // Config, state fields and every declared shape are checked before any tensor is read.
  SafetensorsFile file = read_safetensors(path, [&](const SafetensorsHeader& declared) {
    header = checkpoint_of_header(declared.metadata, declared.shapes, path);
  });
  TensorMap parameters, optimizer_state;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) {
      parameters.emplace(name.substr(6), std::move(t));
    } else {
      optimizer_state.emplace(name, std::move(t));
    }
  }
  check_finite_parameters(parameters, path);
  check_finite_parameters(optimizer_state, path);
  return {Model(header->config, std::move(parameters), path, backend), std::move(optimizer_state),
          header->state};
}

}  // namespace tfm
