// train_model: the configuration resolved, then the training loop (see training.h).
#include "api/training.h"

#include "tensor/error.h"
#include "text/vocabulary.h"
#include "train/checkpoint.h"

namespace tfm {

TrainResult train_model(TrainOptions options, const ConfigChoice& choice) {
  if (choice.given()) {
    ConfigChoice sized = choice;
    // Vocabulary sizes default to those of the vocabulary files the run is given.
    if (!options.vocabularies.empty() && sized.vocab == 0 && sized.src_vocab == 0 &&
        sized.tgt_vocab == 0) {
      sized.src_vocab = Vocabulary::from_file(options.vocabularies.front()).size();
      sized.tgt_vocab = Vocabulary::from_file(options.vocabularies.back()).size();
    }
    options.config = resolve_config(sized);
    options.has_config = true;
  }
  return train(options);
}

Precision training_precision(const std::string& compute_type) {
  Precision precision;
  if (!parse_precision(compute_type, precision) || !trains_in(precision))
    throw UsageError("the training compute type must be float32 or bfloat16, not \"" +
                     compute_type + "\"");
  return precision;
}

}  // namespace tfm
