// How text becomes token ids and back: a SentencePiece model (vocab.spm, source.spm,
// target.spm) or a token list (one token per line, id = line number; input is split on
// spaces and unknown tokens map to <unk>). Also the --ids line parser.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/utf8.h"  // is_valid_utf8, for the callers that read text

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tfm {

class Vocabulary {
 public:
  static Vocabulary from_token_list(const std::string& path);
  static Vocabulary from_tokens(std::vector<std::string> tokens, const std::string& where);
  static Vocabulary from_sentencepiece(const std::string& path);
  // A token list when the name ends in .txt (is_token_list_file), else a SentencePiece model.
  static Vocabulary from_file(const std::string& path);
  static bool is_token_list_file(const std::string& path);
  Vocabulary(Vocabulary&&) noexcept;
  Vocabulary& operator=(Vocabulary&&) noexcept;
  ~Vocabulary();

  int64_t size() const;
  // Throws Error if a token is unknown and the vocabulary has no <unk>.
  std::vector<int32_t> encode(const std::string& line) const;
  // Subword regularisation: one segmentation drawn at random (SentencePiece's SampleEncode
  // over the whole lattice): for a BPE model, BPE-dropout with merge-dropout probability
  // `alpha`; for a unigram model, sampling with smoothing `alpha`. Draws from the calling
  // thread's SentencePiece generator (see sample_encode_lines, which seeds it). Throws Error
  // for a token list.
  std::vector<int32_t> sample_encode(const std::string& line, float alpha) const;
  // A SentencePiece model that can sample (BPE or unigram; not char or word models).
  bool can_sample() const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // Token strings: the pieces a line is split into (unknown words kept as they are), one id's
  // piece, and the text a sequence of pieces stands for.
  std::vector<std::string> to_pieces(const std::string& line) const;
  std::string piece(int32_t id) const;
  // The ids of pieces (pre-tokenized input): an unknown piece is <unk>, or an Error naming it
  // when the vocabulary has no <unk>.
  std::vector<int32_t> piece_ids(const std::vector<std::string>& pieces) const;
  std::string decode_pieces(const std::vector<std::string>& pieces) const;
  int32_t unk_id() const;
  const std::string& where() const { return where_; }

 private:
  Vocabulary() = default;
  std::string where_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_ids_;
  int32_t unk_id_ = -1;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sentencepiece_;
};

// Parses a line of space-separated non-negative token ids, each < vocab_size.
// Throws Error("<where>:<line>: ...") on anything else.
std::vector<int32_t> parse_id_line(const std::string& line, int64_t vocab_size,
                                   const std::string& where, int64_t line_number);

}  // namespace tfm
