// Hypothesis → text and mean attention (see hypothesis_text.h).
#include "decode/hypothesis_text.h"

#include <algorithm>

namespace tfm {

std::vector<float> mean_attention(const Hypothesis& h, size_t t, int64_t heads) {
  const std::vector<float>& row = h.attention[t];
  const size_t width = row.size() / size_t(heads);
  std::vector<float> mean(width, 0.f);  // [source positions]
  for (int64_t head = 0; head < heads; ++head)
    for (size_t j = 0; j < width; ++j) mean[j] += row[size_t(head) * width + j] / float(heads);
  return mean;
}

std::string hypothesis_text(const Hypothesis& h, const Vocabulary& target, int64_t heads,
                            const std::vector<std::string>* source_pieces) {
  std::vector<std::string> pieces;
  for (size_t t = 0; t < h.tokens.size(); ++t) {
    std::string piece = target.piece(h.tokens[t]);
    if (source_pieces && h.tokens[t] == target.unk_id() && t < h.attention.size()) {
      const std::vector<float> weights = mean_attention(h, t, heads);
      const size_t best =
          size_t(std::max_element(weights.begin(), weights.end()) - weights.begin());
      if (best < source_pieces->size()) piece = (*source_pieces)[best];
    }
    pieces.push_back(piece);
  }
  return target.decode_pieces(pieces);
}

}  // namespace tfm
