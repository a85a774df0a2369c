// CTranslate2 model.bin reading (versions 1-6) and writing (version 6).
#include "io/ctranslate2_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
    result.spec_revision = in.read<uint32_t>();
  }
  const uint32_t count = in.read<uint32_t>();
  std::map<std::string, RawVariable> raw;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string name = in.read_string();
    const uint8_t rank = in.read<uint8_t>();
    if (rank > 8)
      in.fail("variable " + quoted_for_message(name) + " has rank " + std::to_string(rank));
    Shape shape;
    uint64_t numel = 1;
    for (uint8_t r = 0; r < rank; ++r) {
      const uint32_t dim = in.read<uint32_t>();
      if (dim != 0 && numel > bytes.size() / dim)
        in.fail("variable " + quoted_for_message(name) + " is larger than the file");
      numel *= dim;
      shape.push_back(dim);
    }
    CtDtype dtype;
    uint64_t byte_count;
    if (result.version >= 4) {
      const uint8_t id = in.read<uint8_t>();
      if (id > 5)
        in.fail("variable " + quoted_for_message(name) + " has unknown dtype id " +
                std::to_string(id));
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
        in.fail("variable " + quoted_for_message(name) + " has item size " +
                std::to_string(item_size));
      if (element_count != numel)
        in.fail("variable " + quoted_for_message(name) + " element count does not match its shape");
      byte_count = uint64_t(item_size) * element_count;
    }
    static const int kItemSize[] = {4, 1, 2, 4, 2, 2};
    if (byte_count != numel * uint64_t(kItemSize[int(dtype)]))
      in.fail("variable " + quoted_for_message(name) + " byte count does not match its shape");
    const char* data = in.take(byte_count, "variable " + quoted_for_message(name));
    Tensor t(shape);
    const int64_t count = int64_t(numel);
    auto cast = [](auto v) { return float(v); };
    switch (dtype) {
      case CtDtype::kF32:
        if (count > 0) std::memcpy(t.ptr(), data, size_t(count) * 4);  // empty: ptr() is null
        break;
      case CtDtype::kI8:
        elements_to_float<int8_t>(data, count, t.ptr(), cast);
        break;
      case CtDtype::kI16:
        elements_to_float<int16_t>(data, count, t.ptr(), cast);
        break;
      case CtDtype::kI32:
        elements_to_float<int32_t>(data, count, t.ptr(), cast);
        break;
      case CtDtype::kF16:
        elements_to_float<uint16_t>(data, count, t.ptr(), half_to_float);
        break;
      case CtDtype::kBF16:
        elements_to_float<uint16_t>(data, count, t.ptr(), bfloat16_to_float);
        break;
    }
    if (!raw.emplace(name, RawVariable{std::move(t), dtype}).second)
      in.fail("variable " + quoted_for_message(name) + " appears twice");
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

  // Dequantise: w = q / scale, per output row (scale [rows]) or one scalar. CTranslate2 gives
  // an int16 weight saved without a scale its old global scale, 1000; int8 needs its scale.
  const std::string suffix = "_scale";
  auto ends_with = [](const std::string& s, const std::string& end) {
    return s.size() > end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  for (auto& [name, variable] : raw) {
    // A weight's quantisation scale is read with its weight below; other names that end in
    // "_scale" (an attention's queries_scale) are variables of their own.
    if (ends_with(name, suffix) && raw.count(name.substr(0, name.size() - suffix.size()))) continue;
    result.stored_dtypes[name] = variable.dtype;
    auto scale_it = raw.find(name + suffix);
    const bool integer_weight =
        (variable.dtype == CtDtype::kI8 || variable.dtype == CtDtype::kI16) &&
        !variable.values.shape.empty() && ends_with(name, "weight");
    if (scale_it == raw.end() && !integer_weight) {
      result.variables.emplace(name, std::move(variable.values));
      continue;
    }
    Tensor default_scale{Shape{}};
    default_scale.data = {1000.f};
    if (scale_it == raw.end() && variable.dtype == CtDtype::kI8)
      throw Error(where + ": int8 variable " + quoted_for_message(name) + " has no " +
                  quoted_for_message(name + suffix));
    const Tensor& scale = scale_it == raw.end() ? default_scale : scale_it->second.values;
    Tensor& w = variable.values;
    const int64_t rows = w.shape.empty() ? 1 : w.shape[0];
    const int64_t row_size = rows ? w.numel() / rows : 0;
    if (scale.numel() != 1 && scale.numel() != rows)
      throw Error(where + ": scale " + quoted_for_message(name + suffix) +
                  " does not match its weight's rows");
    Int8Matrix* stored = nullptr;
    if (variable.dtype == CtDtype::kI8 && w.shape.size() == 2) {
      stored = &result.int8_matrices[name];
      stored->shape = w.shape;
      stored->values.assign(w.data.begin(), w.data.end());  // exact: the values are int8
      stored->scales.resize(size_t(rows));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale.numel() == 1 ? scale.data[0] : scale.data[size_t(r)];
      if (!(s != 0.f) || !std::isfinite(s))
        throw Error(where + ": scale " + quoted_for_message(name + suffix) +
                    " holds 0 or a non-finite value");
      for (int64_t c = 0; c < row_size; ++c) w.data[size_t(r * row_size + c)] /= s;
      if (stored) stored->scales[size_t(r)] = 1.f / s;
    }
    result.variables.emplace(name, std::move(w));
  }
  for (auto& [alias, target] : aliases) {
    auto it = result.variables.find(target);
    if (it == result.variables.end())
      throw Error(where + ": alias " + quoted_for_message(alias) + " names missing variable " +
                  quoted_for_message(target));
    result.variables.emplace(alias, it->second);
    result.stored_dtypes[alias] = result.stored_dtypes[target];
    auto int8 = result.int8_matrices.find(target);
    if (int8 != result.int8_matrices.end()) result.int8_matrices.emplace(alias, int8->second);
  }
  return result;
}

CtQuantization parse_ct_quantization(const std::string& name) {
  if (name == "int8_float32") return CtQuantization::kInt8;
  for (CtQuantization q :
       {CtQuantization::kFloat32, CtQuantization::kInt8, CtQuantization::kInt8Float16,
        CtQuantization::kInt8BFloat16, CtQuantization::kInt16, CtQuantization::kFloat16,
        CtQuantization::kBFloat16})
    if (name == ct_quantization_name(q)) return q;
  throw Error("unknown quantization \"" + name +
              "\" (expected float32, int8, int8_float32, int8_float16, int8_bfloat16, int16, "
              "float16 or bfloat16)");
}

const char* ct_quantization_name(CtQuantization q) {
  switch (q) {
    case CtQuantization::kFloat32:
      return "float32";
    case CtQuantization::kInt8:
      return "int8";
    case CtQuantization::kInt8Float16:
      return "int8_float16";
    case CtQuantization::kInt8BFloat16:
      return "int8_bfloat16";
    case CtQuantization::kInt16:
      return "int16";
    case CtQuantization::kFloat16:
      return "float16";
    case CtQuantization::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

namespace {

template <typename T>
std::string to_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

}  // namespace

CtVariable ct_int8_scalar(const std::string& name, int8_t value) {
  return {name, CtDtype::kI8, {}, std::string(1, char(value))};
}

CtVariable ct_int16_scalar(const std::string& name, int16_t value) {
  return {name, CtDtype::kI16, {}, to_bytes(std::vector<int16_t>{value})};
}

CtVariable ct_float32_scalar(const std::string& name, float value) {
  return {name, CtDtype::kF32, {}, to_bytes(std::vector<float>{value})};
}

namespace {

// range / amax in float32 (as numpy computes it), the scale that maps values of magnitude up to
// amax onto [-range, range]. As CTranslate2 4.8's converter does for int8 rows: zeros (amax 0)
// take amax as range (scale 1, values 0), and a magnitude below range / FLT_MAX keeps the scale
// FLT_MAX instead of overflowing to inf (inf * w is no integer).
float quantization_scale(float range, float amax) {
  if (amax == 0.f) amax = range;
  return range / std::max(amax, range / std::numeric_limits<float>::max());
}

}  // namespace

void append_ct_variable(std::vector<CtVariable>& out, const std::string& name, const Tensor& tensor,
                        bool quantizable, CtQuantization quantization) {
  const std::vector<float>& w = tensor.data;
  const bool int8 = quantization == CtQuantization::kInt8 ||
                    quantization == CtQuantization::kInt8Float16 ||
                    quantization == CtQuantization::kInt8BFloat16;
  if (quantizable && int8) {
    const int64_t rows = tensor.shape.empty() ? 1 : tensor.shape[0];
    const int64_t row_size = rows ? tensor.numel() / rows : 0;
    std::vector<int8_t> q(w.size());
    std::vector<float> scales(size_t(rows), 0.f);  // [rows]
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0.f;
      for (int64_t c = 0; c < row_size; ++c)
        amax = std::max(amax, std::fabs(w[size_t(r * row_size + c)]));
      const float scale = quantization_scale(127.f, amax);
      scales[size_t(r)] = scale;
      for (int64_t c = 0; c < row_size; ++c)
        q[size_t(r * row_size + c)] = int8_t(std::nearbyint(w[size_t(r * row_size + c)] * scale));
    }
    out.push_back({name, CtDtype::kI8, tensor.shape, to_bytes(q)});
    out.push_back({name + "_scale", CtDtype::kF32, {rows}, to_bytes(scales)});
    return;
  }
  if (quantizable && quantization == CtQuantization::kInt16) {
    float amax = 0.f;
    for (float v : w) amax = std::max(amax, std::fabs(v));
    // CTranslate2 4.8's converter divides by max|w| as it is here, so a matrix of zeros gets
    // the scale inf and values cast from NaN; ours gets what its int8 rows get.
    const float scale = quantization_scale(1024.f, amax);  // 2^10 / max|w|
    std::vector<int16_t> q(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      q[i] = int16_t(std::clamp(std::nearbyint(w[i] * scale), -32768.f, 32767.f));
    out.push_back({name, CtDtype::kI16, tensor.shape, to_bytes(q)});
    out.push_back({name + "_scale", CtDtype::kF32, {}, to_bytes(std::vector<float>{scale})});
    return;
  }
  const bool half =
      quantization == CtQuantization::kFloat16 || quantization == CtQuantization::kInt8Float16;
  if (half || quantization == CtQuantization::kBFloat16 ||
      quantization == CtQuantization::kInt8BFloat16) {
    std::vector<uint16_t> bits(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      bits[i] = half ? float_to_half(w[i]) : float_to_bfloat16(w[i]);
    out.push_back({name, half ? CtDtype::kF16 : CtDtype::kBF16, tensor.shape, to_bytes(bits)});
    return;
  }
  out.push_back({name, CtDtype::kF32, tensor.shape, to_bytes(w)});
}

std::string serialize_ctranslate2_model(
    const std::string& spec_name, uint32_t spec_revision, std::vector<CtVariable> variables,
    const std::vector<std::pair<std::string, std::string>>& aliases) {
  std::string out;
  auto put_u32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto put_string = [&](const std::string& s) {
    if (s.size() >= 65535) throw Error("CTranslate2 name too long: " + s.substr(0, 64) + "...");
    const uint16_t length = uint16_t(s.size() + 1);
    out.append(reinterpret_cast<const char*>(&length), 2);
    out += s;
    out += '\0';
  };
  std::sort(variables.begin(), variables.end(),
            [](const CtVariable& a, const CtVariable& b) { return a.name < b.name; });
  put_u32(6);
  put_string(spec_name);
  put_u32(spec_revision);
  put_u32(uint32_t(variables.size()));
  for (const CtVariable& v : variables) {
    put_string(v.name);
    out += char(uint8_t(v.shape.size()));
    for (int64_t dim : v.shape) put_u32(uint32_t(dim));
    out += char(uint8_t(v.dtype));
    if (v.bytes.size() > 0xffffffffull)
      throw Error("CTranslate2 variable \"" + v.name + "\" is larger than 4 GiB");
    put_u32(uint32_t(v.bytes.size()));
    out += v.bytes;
  }
  put_u32(uint32_t(aliases.size()));
  for (const auto& [alias, target] : aliases) {
    put_string(alias);
    put_string(target);
  }
  return out;
}

}  // namespace tfm
