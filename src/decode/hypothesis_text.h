// What a hypothesis looks like to a user: its text (with <unk> replaced by the source piece it
// attends to most, when asked) and its cross-attention averaged over heads. One definition for
// `translate` and `serve`, so both print the same words for the same hypothesis.
#pragma once

#include <string>
#include <vector>

#include "decode/beam_search.h"
#include "text/vocabulary.h"

namespace tfm {

// Step t's attention averaged over heads; h.attention rows hold `heads` blocks of source
// positions (heads = 1 when the search kept the mean already).
std::vector<float> mean_attention(const Hypothesis& h, size_t t, int64_t heads);

// The target pieces of h joined into text. With source_pieces (the source line's pieces), each
// <unk> becomes the source piece with the highest mean attention at that step.
std::string hypothesis_text(const Hypothesis& h, const Vocabulary& target, int64_t heads,
                            const std::vector<std::string>* source_pieces = nullptr);

}  // namespace tfm
