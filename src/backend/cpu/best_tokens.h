// The CPU kernel of beam search's ranking step: each hypothesis' best next tokens (a top-k per
// row of the log-probabilities), so that only rows × k candidates, not rows × vocabulary
// log-probabilities, leave the backend.
#pragma once

#include <cstdint>

namespace tfm {

// Per row r of scores[rows, vocab]: its keep largest entries, largest first, into
// values[r, keep] and tokens[r, keep]; ties go to the lower token id; token `banned` (-1:
// none) and NaN count as −∞. 1 ≤ keep ≤ vocab. log_sums [rows] (null: none): the scores are
// logits, each row's log Σ exp goes there and the values are the entries less it (log_softmax's
// values), the row read again while it is in cache rather than written in log-probabilities.
void best_tokens(const float* scores, int64_t rows, int64_t vocab, int64_t keep, int32_t banned,
                 float* values, int32_t* tokens, float* log_sums);

}  // namespace tfm
