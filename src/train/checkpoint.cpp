// Checkpoint files.
#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "io/file_util.h"
#include "io/safetensors.h"
#include "tensor/error.h"

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
          {"bad_steps_in_a_row", bad_steps_in_a_row}};
}

TrainingState TrainingState::from_json(const nlohmann::json& j, const std::string& where) {
  try {
    TrainingState s;
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.batch_index = j.at("batch_index").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.best_valid_nll = j.at("best_valid_nll").get<double>();
    s.validations_without_improvement = j.at("validations_without_improvement").get<int64_t>();
    s.target_tokens_seen = j.at("target_tokens_seen").get<int64_t>();
    s.train_seconds = j.at("train_seconds").get<double>();
    s.skipped_steps = j.value("skipped_steps", int64_t(0));  // absent in older checkpoints
    s.bad_steps_in_a_row = j.value("bad_steps_in_a_row", int64_t(0));
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": bad training state (" + e.what() + ")");
  }
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir + "/checkpoint.safetensors", ec);
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
                     const TrainingState& state, int64_t keep) {
  make_directories(dir + "/checkpoints");
  char name[64];
  std::snprintf(name, sizeof name, "/checkpoints/step-%09lld.safetensors", (long long)state.step);
  if (keep > 0) save_model(model, dir + name);

  TensorMap everything = optimizer.state();
  for (const auto& [param, t] : model.parameters()) everything.emplace("model." + param, t);
  nlohmann::json training = state.to_json();
  training["optimizer_step"] = optimizer.step();
  write_safetensors(
      dir + "/checkpoint.safetensors", everything,
      {{"config", config_to_json_text(model.config())}, {"training_state", training.dump()}});
  save_model(model, dir + "/model.safetensors");

  const auto snapshots = list_snapshots(dir);
  for (size_t i = 0; keep >= 0 && i + size_t(keep) < snapshots.size(); ++i)
    std::remove(snapshots[i].c_str());
}

LoadedCheckpoint load_checkpoint(const std::string& dir) {
  const std::string path = dir + "/checkpoint.safetensors";
  SafetensorsFile file = read_safetensors(path);
  auto config_it = file.metadata.find("config");
  auto state_it = file.metadata.find("training_state");
  if (config_it == file.metadata.end() || state_it == file.metadata.end())
    throw Error(path + ": not a training checkpoint (no config / training_state metadata)");
  const ModelConfig config = config_from_json_text(config_it->second, path);
  const nlohmann::json state_json = nlohmann::json::parse(state_it->second, nullptr, false);
  if (state_json.is_discarded()) throw Error(path + ": training_state is not valid JSON");
  TensorMap parameters, optimizer_state;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) {
      parameters.emplace(name.substr(6), std::move(t));
    } else {
      optimizer_state.emplace(name, std::move(t));
    }
  }
  check_finite_parameters(parameters, path);
  return {Model(config, std::move(parameters), path), std::move(optimizer_state),
          TrainingState::from_json(state_json, path)};
}

}  // namespace tfm
