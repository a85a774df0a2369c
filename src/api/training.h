// The library's training entry point: train() (train/trainer.h) with the model configuration
// named as a user names it (a preset or config file, vocabulary sizes read from the vocabulary
// files when not given). `transformer train` and the Python module's train() call it.
//
//   tfm::TrainOptions options;
//   options.model_dir = "run";
//   options.train_src = "train.en"; options.train_tgt = "train.de";
//   options.vocabularies = {"spm.model"};
//   options.max_steps = 1000;
//   tfm::train_model(options, {.preset = "small"});
#pragma once

#include "api/model_config.h"
#include "train/trainer.h"

namespace tfm {

// Without a choice (choice.given() false) the model comes from --init, --resume or an existing
// run, as train() decides. Throws as train() does.
TrainResult train_model(TrainOptions options, const ConfigChoice& choice = {});

// A training compute type by name: float32 or bfloat16 (the number format of every linear
// product; weights, gradients and Adam's moments stay float32). Throws UsageError otherwise.
Precision training_precision(const std::string& compute_type);

}  // namespace tfm
