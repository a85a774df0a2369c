// CTranslate2 model.bin reader and TransformerSpec -> transformer-cpp mapping.
#include "io/ctranslate2.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file_util.h"
#include "tensor/error.h"
#include "tensor/float16.h"

namespace tfm {

namespace {

// Bounds-checked little-endian reader over the file's bytes.
class ByteReader {
 public:
  ByteReader(const std::string& bytes, const std::string& where) : bytes_(bytes), where_(where) {}

  template <typename T>
  T read() {
    need(sizeof(T), "a number");
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  // uint16 length (including the trailing NUL), then the bytes.
  std::string read_string() {
    const uint16_t length = read<uint16_t>();
    if (length == 0) fail("a string has length 0 (it must include its NUL)");
    need(length, "a string");
    std::string s(bytes_.data() + offset_, length - 1);
    offset_ += length;
    return s;
  }

  const char* take(uint64_t n, const std::string& what) {
    need(n, what);
    const char* p = bytes_.data() + offset_;
    offset_ += n;
    return p;
  }

  bool at_end() const { return offset_ == bytes_.size(); }
  [[noreturn]] void fail(const std::string& message) const {
    throw Error(where_ + ": not a valid CTranslate2 model: " + message + " (at byte " +
                std::to_string(offset_) + ")");
  }

 private:
  void need(uint64_t n, const std::string& what) const {
    if (n > bytes_.size() - offset_) fail("file ends inside " + what);
  }
  const std::string& bytes_;
  const std::string& where_;
  size_t offset_ = 0;
};

enum class CtDtype { kF32, kI8, kI16, kI32, kF16, kBF16 };

struct RawVariable {
  Tensor values;  // converted to fp32, not yet dequantised
  CtDtype dtype;
};

}  // namespace

CTranslate2Variables parse_ctranslate2_model(const std::string& bytes, const std::string& where) {
  ByteReader in(bytes, where);
  CTranslate2Variables result;
  result.version = in.read<uint32_t>();
  if (result.version < 1 || result.version > 6)
    in.fail("unsupported binary version " + std::to_string(result.version) + " (supported: 1-6)");
  if (result.version >= 2) {
    result.spec_name = in.read_string();
    in.read<uint32_t>();  // spec revision
  }
  const uint32_t count = in.read<uint32_t>();
  std::map<std::string, RawVariable> raw;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string name = in.read_string();
    const uint8_t rank = in.read<uint8_t>();
    if (rank > 8) in.fail("variable \"" + name + "\" has rank " + std::to_string(rank));
    Shape shape;
    uint64_t numel = 1;
    for (uint8_t r = 0; r < rank; ++r) {
      const uint32_t dim = in.read<uint32_t>();
      if (dim != 0 && numel > bytes.size() / dim)
        in.fail("variable \"" + name + "\" is larger than the file");
      numel *= dim;
      shape.push_back(dim);
    }
    CtDtype dtype;
    uint64_t byte_count;
    if (result.version >= 4) {
      const uint8_t id = in.read<uint8_t>();
      if (id > 5) in.fail("variable \"" + name + "\" has unknown dtype id " + std::to_string(id));
      dtype = CtDtype(id);
      byte_count = in.read<uint32_t>();
    } else {
      const uint8_t item_size = in.read<uint8_t>();
      const uint32_t element_count = in.read<uint32_t>();
      if (item_size == 4)
        dtype = CtDtype::kF32;
      else if (item_size == 2)
        dtype = CtDtype::kI16;
      else if (item_size == 1)
        dtype = CtDtype::kI8;
      else
        in.fail("variable \"" + name + "\" has item size " + std::to_string(item_size));
      if (element_count != numel)
        in.fail("variable \"" + name + "\" element count does not match its shape");
      byte_count = uint64_t(item_size) * element_count;
    }
    static const int kItemSize[] = {4, 1, 2, 4, 2, 2};
    if (byte_count != numel * uint64_t(kItemSize[int(dtype)]))
      in.fail("variable \"" + name + "\" byte count does not match its shape");
    const char* data = in.take(byte_count, "variable \"" + name + "\"");
    Tensor t(shape);
    float* out = t.ptr();
    for (uint64_t e = 0; e < numel; ++e) {
      switch (dtype) {
        case CtDtype::kF32:
          std::memcpy(out + e, data + 4 * e, 4);
          break;
        case CtDtype::kI8:
          out[e] = float(int8_t(data[e]));
          break;
        case CtDtype::kI16: {
          int16_t v;
          std::memcpy(&v, data + 2 * e, 2);
          out[e] = float(v);
          break;
        }
        case CtDtype::kI32: {
          int32_t v;
          std::memcpy(&v, data + 4 * e, 4);
          out[e] = float(v);
          break;
        }
        case CtDtype::kF16: {
          uint16_t v;
          std::memcpy(&v, data + 2 * e, 2);
          out[e] = half_to_float(v);
          break;
        }
        case CtDtype::kBF16: {
          uint16_t v;
          std::memcpy(&v, data + 2 * e, 2);
          out[e] = bfloat16_to_float(v);
          break;
        }
      }
    }
    if (!raw.emplace(name, RawVariable{std::move(t), dtype}).second)
      in.fail("variable \"" + name + "\" appears twice");
  }
  std::vector<std::pair<std::string, std::string>> aliases;
  if (result.version >= 3) {
    const uint32_t alias_count = in.read<uint32_t>();
    for (uint32_t i = 0; i < alias_count; ++i) {
      std::string alias = in.read_string();
      std::string target = in.read_string();
      aliases.emplace_back(std::move(alias), std::move(target));
    }
  }
  if (!in.at_end()) in.fail("trailing bytes after the last variable");

  // Dequantise: w = q / scale, per output row (scale [rows]) or one scalar.
  const std::string suffix = "_scale";
  for (auto& [name, variable] : raw) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      continue;
    auto scale_it = raw.find(name + suffix);
    if (scale_it == raw.end()) {
      result.variables.emplace(name, std::move(variable.values));
      continue;
    }
    const Tensor& scale = scale_it->second.values;
    Tensor& w = variable.values;
    const int64_t rows = w.shape.empty() ? 1 : w.shape[0];
    const int64_t row_size = rows ? w.numel() / rows : 0;
    if (scale.numel() != 1 && scale.numel() != rows)
      throw Error(where + ": scale \"" + name + suffix + "\" does not match its weight's rows");
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale.numel() == 1 ? scale.data[0] : scale.data[size_t(r)];
      if (!(s != 0.f) || !std::isfinite(s))
        throw Error(where + ": scale \"" + name + suffix + "\" holds 0 or a non-finite value");
      for (int64_t c = 0; c < row_size; ++c) w.data[size_t(r * row_size + c)] /= s;
    }
    result.variables.emplace(name, std::move(w));
  }
  for (auto& [alias, target] : aliases) {
    auto it = result.variables.find(target);
    if (it == result.variables.end())
      throw Error(where + ": alias \"" + alias + "\" names missing variable \"" + target + "\"");
    result.variables.emplace(alias, it->second);
  }
  return result;
}

namespace {

std::vector<std::string> read_vocabulary(const std::string& directory, const std::string& side) {
  namespace fs = std::filesystem;
  for (const std::string& stem : {side + "_vocabulary", std::string("shared_vocabulary")}) {
    const std::string txt = directory + "/" + stem + ".txt",
                      json = directory + "/" + stem + ".json";
    if (fs::exists(txt)) {
      std::istringstream lines(read_file_bytes(txt));
      std::vector<std::string> tokens;
      for (std::string line; std::getline(lines, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        tokens.push_back(line);
      }
      return tokens;
    }
    if (fs::exists(json)) {
      nlohmann::json j = nlohmann::json::parse(read_file_bytes(json), nullptr, false);
      if (j.is_discarded() || !j.is_array()) throw Error(json + ": not a JSON list of tokens");
      std::vector<std::string> tokens;
      for (const auto& t : j) {
        if (!t.is_string()) throw Error(json + ": not a JSON list of tokens");
        tokens.push_back(t.get<std::string>());
      }
      return tokens;
    }
  }
  throw Error(directory + ": no " + side + "_vocabulary.txt/.json or shared_vocabulary.txt/.json");
}

}  // namespace

ImportedModel import_ctranslate2(const std::string& directory) {
  const std::string model_path = directory + "/model.bin";
  CTranslate2Variables file = parse_ctranslate2_model(read_file_bytes(model_path), model_path);
  TensorMap& v = file.variables;
  auto fail = [&](const std::string& message) -> void { throw Error(model_path + ": " + message); };
  auto take = [&](const std::string& name) -> Tensor {
    auto it = v.find(name);
    if (it == v.end()) fail("missing variable \"" + name + "\"");
    Tensor t = std::move(it->second);
    v.erase(it);
    return t;
  };
  // Scalar flags newer converters store as variables.
  auto take_flag = [&](const std::string& name, float fallback) {
    auto it = v.find(name);
    if (it == v.end()) return fallback;
    if (it->second.numel() != 1) fail("variable \"" + name + "\" is not a scalar");
    const float value = it->second.data[0];
    v.erase(it);
    return value;
  };

  if (!file.spec_name.empty() && file.spec_name.find("Transformer") == std::string::npos)
    fail("spec \"" + file.spec_name + "\" is not a Transformer encoder-decoder");
  ImportedModel out;
  ModelConfig& c = out.config;
  c.norm = NormPosition::kPre;
  c.share_embeddings = EmbeddingSharing::kNone;
  c.output_bias = true;
  c.activation = Activation::kRelu;
  c.layer_norm_eps = 1e-6;
  c.position_encoding = PositionEncoding::kSinusoidal;
  c.sinusoid_layout = SinusoidLayout::kConcat;
  c.position_offset = 1;
  c.src_append_eos = false;
  c.heads = file.spec_name.find("Big") != std::string::npos ? 16 : 8;
  c.heads = int64_t(take_flag("encoder/num_heads", float(c.heads)));
  take_flag("decoder/num_heads", float(c.heads));
  if (take_flag("encoder/pre_norm", 1.f) == 0.f || take_flag("decoder/pre_norm", 1.f) == 0.f)
    c.norm = NormPosition::kPost;
  const float activation = take_flag("encoder/activation", 2.f);  // CTranslate2: 0 gelu, 2 relu
  take_flag("decoder/activation", activation);
  if (activation == 0.f)
    c.activation = Activation::kGelu;
  else if (activation != 2.f)
    fail("unsupported activation id " + std::to_string(int(activation)));
  if (take_flag("encoder/scale_embeddings", 1.f) == 0.f) c.scale_embeddings = false;
  take_flag("decoder/scale_embeddings", 1.f);

  // Embeddings, output projection and position tables.
  Tensor src_embed = take("encoder/embeddings/weight");
  Tensor tgt_embed = take("decoder/embeddings/weight");
  if (src_embed.shape.size() != 2 || tgt_embed.shape.size() != 2)
    fail("embeddings are not matrices");
  c.d_model = src_embed.shape[1];
  c.src_vocab_size = src_embed.shape[0];
  c.tgt_vocab_size = tgt_embed.shape[0];
  TensorMap& p = out.parameters;
  p["src_embed.weight"] = std::move(src_embed);
  p["tgt_embed.weight"] = std::move(tgt_embed);
  p["out_proj.weight"] = take("decoder/projection/weight");
  if (v.count("decoder/projection/bias")) {
    p["out_proj.bias"] = take("decoder/projection/bias");
  } else {
    p["out_proj.bias"] = Tensor({c.tgt_vocab_size});
  }
  if (v.count("encoder/position_encodings/encodings")) {  // older converters stored the table
    c.position_encoding = PositionEncoding::kLearned;
    c.position_offset = 0;
    p["encoder.pos_embed.weight"] = take("encoder/position_encodings/encodings");
    p["decoder.pos_embed.weight"] = take("decoder/position_encodings/encodings");
    c.max_positions = p["encoder.pos_embed.weight"].shape[0];
    if (p["decoder.pos_embed.weight"].shape != p["encoder.pos_embed.weight"].shape)
      fail("encoder and decoder position tables differ in shape");
  }

  const int64_t d = c.d_model;
  auto split_rows = [&](Tensor fused, int64_t parts, const std::vector<std::string>& names) {
    if (fused.shape.empty() || fused.shape[0] != parts * d)
      fail("fused projection has the wrong number of rows");
    const int64_t part_size = fused.numel() / parts;
    for (int64_t i = 0; i < parts; ++i) {
      Shape shape = fused.shape;
      shape[0] = d;
      Tensor t(shape);
      std::copy_n(fused.data.begin() + i * part_size, part_size, t.data.begin());
      p[names[size_t(i)]] = std::move(t);
    }
  };
  auto map_linear = [&](const std::string& from, const std::string& to) {
    p[to + ".weight"] = take(from + "/weight");
    p[to + ".bias"] = take(from + "/bias");
  };
  auto map_norm = [&](const std::string& from, const std::string& to) {
    p[to + ".weight"] = take(from + "/gamma");
    p[to + ".bias"] = take(from + "/beta");
  };
  auto map_self_attention = [&](const std::string& from, const std::string& to) {
    split_rows(take(from + "/linear_0/weight"), 3,
               {to + ".q.weight", to + ".k.weight", to + ".v.weight"});
    split_rows(take(from + "/linear_0/bias"), 3, {to + ".q.bias", to + ".k.bias", to + ".v.bias"});
    map_linear(from + "/linear_1", to + ".o");
  };
  auto map_ffn = [&](const std::string& from, const std::string& to) {
    map_linear(from + "/linear_0", to + ".fc1");
    map_linear(from + "/linear_1", to + ".fc2");
  };
  auto count_layers = [&](const std::string& stack) {
    int64_t n = 0;
    while (v.count(stack + "/layer_" + std::to_string(n) + "/ffn/linear_0/weight")) ++n;
    return n;
  };
  c.encoder_layers = count_layers("encoder");
  c.decoder_layers = count_layers("decoder");
  if (c.encoder_layers == 0 || c.decoder_layers == 0) fail("no encoder or decoder layers found");
  for (int64_t i = 0; i < c.encoder_layers; ++i) {
    const std::string from = "encoder/layer_" + std::to_string(i),
                      to = "encoder.layers." + std::to_string(i);
    map_self_attention(from + "/self_attention", to + ".self_attn");
    map_norm(from + "/self_attention/layer_norm", to + ".norm1");
    map_ffn(from + "/ffn", to + ".ffn");
    map_norm(from + "/ffn/layer_norm", to + ".norm2");
  }
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    const std::string from = "decoder/layer_" + std::to_string(i),
                      to = "decoder.layers." + std::to_string(i);
    map_self_attention(from + "/self_attention", to + ".self_attn");
    map_norm(from + "/self_attention/layer_norm", to + ".norm1");
    map_linear(from + "/attention/linear_0", to + ".cross_attn.q");
    split_rows(take(from + "/attention/linear_1/weight"), 2,
               {to + ".cross_attn.k.weight", to + ".cross_attn.v.weight"});
    split_rows(take(from + "/attention/linear_1/bias"), 2,
               {to + ".cross_attn.k.bias", to + ".cross_attn.v.bias"});
    map_linear(from + "/attention/linear_2", to + ".cross_attn.o");
    map_norm(from + "/attention/layer_norm", to + ".norm2");
    map_ffn(from + "/ffn", to + ".ffn");
    map_norm(from + "/ffn/layer_norm", to + ".norm3");
  }
  if (c.norm == NormPosition::kPre) {
    map_norm("encoder/layer_norm", "encoder.norm");
    map_norm("decoder/layer_norm", "decoder.norm");
  }
  if (!v.empty())
    fail("unsupported variable \"" + v.begin()->first +
         "\" (a model feature this importer does not know)");
  if (d % c.heads != 0)
    fail("d_model " + std::to_string(d) + " is not divisible by " + std::to_string(c.heads) +
         " heads");
  c.d_ff = p["encoder.layers.0.ffn.fc1.weight"].shape[0];

  // Vocabularies: CTranslate2 appends <unk> when the file lacks it.
  out.source_tokens = read_vocabulary(directory, "source");
  out.target_tokens = read_vocabulary(directory, "target");
  for (auto* tokens : {&out.source_tokens, &out.target_tokens})
    if (std::find(tokens->begin(), tokens->end(), "<unk>") == tokens->end())
      tokens->push_back("<unk>");
  if (int64_t(out.source_tokens.size()) != c.src_vocab_size ||
      int64_t(out.target_tokens.size()) != c.tgt_vocab_size)
    fail("vocabulary sizes (" + std::to_string(out.source_tokens.size()) + ", " +
         std::to_string(out.target_tokens.size()) + ") do not match the embeddings (" +
         std::to_string(c.src_vocab_size) + ", " + std::to_string(c.tgt_vocab_size) + ")");
  auto find_id = [&](const std::vector<std::string>& tokens, const std::string& token,
                     int64_t fallback) {
    auto it = std::find(tokens.begin(), tokens.end(), token);
    return it == tokens.end() ? fallback : int64_t(it - tokens.begin());
  };
  c.pad_id = find_id(out.target_tokens, "<blank>", 0);
  c.bos_id = find_id(out.target_tokens, "<s>", 1);
  c.eos_id = find_id(out.target_tokens, "</s>", 2);
  if (c.pad_id != find_id(out.source_tokens, "<blank>", c.pad_id) ||
      c.eos_id != find_id(out.source_tokens, "</s>", c.eos_id))
    fail("source and target vocabularies disagree on the ids of <blank> and </s>");
  validate_config(c, model_path);
  return out;
}

}  // namespace tfm
