// Vocabulary implementation over SentencePiece and token lists.
#include "text/vocabulary.h"

#include <sentencepiece_processor.h>

#include <sstream>

#include "tensor/file_util.h"
#include "tensor/error.h"

namespace tfm {

Vocabulary::Vocabulary(Vocabulary&&) noexcept = default;
Vocabulary& Vocabulary::operator=(Vocabulary&&) noexcept = default;
Vocabulary::~Vocabulary() = default;

Vocabulary Vocabulary::from_tokens(std::vector<std::string> tokens, const std::string& where) {
  Vocabulary v;
  v.where_ = where;
  v.tokens_ = std::move(tokens);
  for (size_t i = 0; i < v.tokens_.size(); ++i) v.token_ids_.emplace(v.tokens_[i], int32_t(i));
  auto it = v.token_ids_.find("<unk>");
  if (it != v.token_ids_.end()) v.unk_id_ = it->second;
  return v;
}

bool Vocabulary::is_token_list_file(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".txt") == 0;
}

Vocabulary Vocabulary::from_file(const std::string& path) {
  return is_token_list_file(path) ? from_token_list(path) : from_sentencepiece(path);
}

Vocabulary Vocabulary::from_token_list(const std::string& path) {
  std::istringstream lines(read_file_bytes(path));
  std::vector<std::string> tokens;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(line);
  }
  if (tokens.empty()) throw Error(path + ": empty vocabulary");
  return from_tokens(std::move(tokens), path);
}

Vocabulary Vocabulary::from_sentencepiece(const std::string& path) {
  Vocabulary v;
  v.where_ = path;
  v.sentencepiece_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  // Read here (a FIFO or device is refused), parsed from memory.
  const auto status = v.sentencepiece_->LoadFromSerializedProto(read_file_bytes(path));
  if (!status.ok()) throw Error(path + ": not a SentencePiece model (" + status.ToString() + ")");
  return v;
}

int64_t Vocabulary::size() const {
  return sentencepiece_ ? sentencepiece_->GetPieceSize() : int64_t(tokens_.size());
}

std::vector<int32_t> Vocabulary::encode(const std::string& line) const {
  std::vector<int32_t> ids;
  if (sentencepiece_) {
    std::vector<int> pieces;
    const auto status = sentencepiece_->Encode(line, &pieces);
    if (!status.ok()) throw Error(where_ + ": cannot encode text (" + status.ToString() + ")");
    ids.assign(pieces.begin(), pieces.end());
    return ids;
  }
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    auto it = token_ids_.find(word);
    if (it != token_ids_.end()) {
      ids.push_back(it->second);
    } else if (unk_id_ >= 0) {
      ids.push_back(unk_id_);
    } else {
      throw Error(where_ + ": token \"" + word + "\" is not in the vocabulary, which has no <unk>");
    }
  }
  return ids;
}

std::vector<int32_t> Vocabulary::sample_encode(const std::string& line, float alpha) const {
  if (!sentencepiece_)
    throw Error(where_ + ": sampled segmentation needs a SentencePiece model, not a token list");
  std::vector<int> pieces;
  const auto status = sentencepiece_->SampleEncode(line, -1, alpha, &pieces);
  if (!status.ok()) throw Error(where_ + ": cannot encode text (" + status.ToString() + ")");
  return std::vector<int32_t>(pieces.begin(), pieces.end());
}

bool Vocabulary::can_sample() const {
  std::vector<int> pieces;  // (draws from this thread's generator: never one that samples data)
  return sentencepiece_ && sentencepiece_->SampleEncode("a", -1, 0.1f, &pieces).ok();
}

std::string Vocabulary::decode(const std::vector<int32_t>& ids) const {
  if (sentencepiece_) {
    std::string text;
    const std::vector<int> pieces(ids.begin(), ids.end());
    const auto status = sentencepiece_->Decode(pieces, &text);
    if (!status.ok()) throw Error(where_ + ": cannot decode ids (" + status.ToString() + ")");
    return text;
  }
  std::string text;
  for (int32_t id : ids) {
    if (!text.empty()) text += ' ';
    text += id >= 0 && id < int32_t(tokens_.size()) ? tokens_[size_t(id)] : "<unk>";
  }
  return text;
}

std::vector<std::string> Vocabulary::to_pieces(const std::string& line) const {
  std::vector<std::string> pieces;
  if (sentencepiece_) {
    const auto status = sentencepiece_->Encode(line, &pieces);
    if (!status.ok()) throw Error(where_ + ": cannot encode text (" + status.ToString() + ")");
    return pieces;
  }
  std::istringstream words(line);
  for (std::string word; words >> word;) pieces.push_back(word);
  return pieces;
}

std::string Vocabulary::piece(int32_t id) const {
  if (sentencepiece_)
    return id >= 0 && id < sentencepiece_->GetPieceSize() ? sentencepiece_->IdToPiece(id) : "<unk>";
  return id >= 0 && id < int32_t(tokens_.size()) ? tokens_[size_t(id)] : "<unk>";
}

std::vector<int32_t> Vocabulary::piece_ids(const std::vector<std::string>& pieces) const {
  std::vector<int32_t> ids;
  ids.reserve(pieces.size());
  for (const std::string& p : pieces) {
    int32_t id = -1;
    if (sentencepiece_) {
      id = sentencepiece_->PieceToId(p);  // <unk>'s id for an unknown piece
    } else if (auto it = token_ids_.find(p); it != token_ids_.end()) {
      id = it->second;
    } else {
      id = unk_id_;
    }
    if (id < 0) throw Error(where_ + ": unknown token " + quoted_for_message(p) + " and no <unk>");
    ids.push_back(id);
  }
  return ids;
}

std::string Vocabulary::decode_pieces(const std::vector<std::string>& pieces) const {
  if (sentencepiece_) {
    std::string text;
    const auto status = sentencepiece_->Decode(pieces, &text);
    if (!status.ok()) throw Error(where_ + ": cannot decode pieces (" + status.ToString() + ")");
    return text;
  }
  std::string text;
  for (const auto& p : pieces) text += (text.empty() ? "" : " ") + p;
  return text;
}

int32_t Vocabulary::unk_id() const {
  return sentencepiece_ ? sentencepiece_->unk_id() : unk_id_;
}

std::vector<int32_t> parse_id_line(const std::string& line, int64_t vocab_size,
                                   const std::string& where, int64_t line_number) {
  std::vector<int32_t> ids;
  const std::string at = where + ":" + std::to_string(line_number) + ": ";
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t' && line[end] != '\r') ++end;
    const std::string token = line.substr(i, end - i);
    int64_t value = 0;
    for (char ch : token) {
      if (ch < '0' || ch > '9')
        throw Error(at + "\"" + token + "\" is not a token id (expected non-negative integers)");
      value = value * 10 + (ch - '0');
      if (value >= vocab_size)
        throw Error(at + "token id " + token + " is outside the vocabulary (size " +
                    std::to_string(vocab_size) + ")");
    }
    ids.push_back(int32_t(value));
    i = end;
  }
  return ids;
}

}  // namespace tfm
