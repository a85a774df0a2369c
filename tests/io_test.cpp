// Model files from strangers: safetensors round trip and every kind of corruption, config
// validation, parameter checks, and the exact parameter counts of the paper's models.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/init.h"
#include "model/weights.h"
#include "tensor/error.h"
#include "tensor/file_util.h"
#include "tensor/int8_weights.h"

namespace tfm {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tfm_io_test_" + name)).string();
}

// A safetensors byte string with the given header text and data size.
std::string make_file(const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  return bytes + header + std::string(data_bytes, '\0');
}

void expect_error(const std::string& bytes, const std::string& fragment) {
  try {
    parse_safetensors(bytes, "file.safetensors");
    FAIL() << "no error; expected one containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("file.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripKeepsTensorsAndMetadata) {
  TensorMap tensors;
  tensors["b"] = Tensor({2, 3});
  tensors["a"] = Tensor({5});
  for (int i = 0; i < 6; ++i) tensors["b"].data[size_t(i)] = float(i) - 2.5f;
  const std::string path = temp_path("roundtrip.safetensors");
  write_safetensors(path, tensors, {{"config", "{}"}});
  SafetensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.metadata.at("config"), "{}");
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(file.tensors.at("b").shape, (Shape{2, 3}));
  EXPECT_EQ(file.tensors.at("b").data, tensors["b"].data);
  std::remove(path.c_str());
}

// Tensors of 1 MiB and more are read from disk in one chunk per thread: every element lands
// where it belongs, with 1, 2 and 3 threads (3: chunks of unequal size).
TEST(Safetensors, LargeTensorsReadInParallelChunksRoundTrip) {
  TensorMap tensors;
  tensors["small"] = Tensor({3});
  tensors["large"] = Tensor({1001, 263});  // 1,053,052 bytes, above the parallel threshold
  tensors["larger"] = Tensor({4, 262147});
  float value = 0.f;
  for (auto& [name, tensor] : tensors)
    for (float& x : tensor.data) x = (value += 1.f);
  const std::string path = temp_path("large.safetensors");
  write_safetensors(path, tensors, {});
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const SafetensorsFile file = read_safetensors(path);
    for (const auto& [name, tensor] : tensors) {
      ASSERT_EQ(file.tensors.at(name).shape, tensor.shape) << name << ", " << threads << " threads";
      EXPECT_EQ(file.tensors.at(name).data, tensor.data) << name << ", " << threads << " threads";
    }
  }
  omp_set_num_threads(threads_before);
  std::remove(path.c_str());
}

TEST(Safetensors, RejectsCorruptFiles) {
  expect_error("abc", "shorter than");
  std::string long_header = make_file("{}", 0);
  long_header[0] = char(200);
  expect_error(long_header, "runs past the end");
  expect_error(make_file("not json at all", 0), "not a JSON object");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8),
               "outside the data section");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               "does not match shape");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         12),
               "overlap");
  // Bytes no tensor holds, which the safetensors library refuses too (InvalidOffset,
  // MetadataIncompleteBuffer): a gap, and bytes after the last tensor (e.g. appended).
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               "no tensor holds bytes 0 to 4 of the data section");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9),
               "the data section has 1 bytes after its last tensor");
  expect_error(make_file(R"({"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8),
               "unsupported dtype");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
               "not a non-negative integer");
  expect_error(
      make_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      "larger than the file");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[2]}})", 8), "needs dtype");
}

TEST(Safetensors, TruncatedModelFileIsAnError) {
  ModelConfig c = preset_config("tiny");
  c.src_vocab_size = c.tgt_vocab_size = 50;
  const std::string path = temp_path("truncated.safetensors");
  save_model(init_model(c, 3, tfm::cpu_backend()), path);
  std::string bytes = read_file_bytes(path);
  EXPECT_THROW(parse_safetensors(bytes.substr(0, bytes.size() - 100), path), Error);
  std::remove(path.c_str());
}

TEST(Config, PaperParameterCounts) {
  ModelConfig base = preset_config("base");
  base.src_vocab_size = base.tgt_vocab_size = 37000;
  EXPECT_EQ(parameter_count(base), 63082496);
  ModelConfig big = preset_config("big");
  big.src_vocab_size = big.tgt_vocab_size = 37000;
  EXPECT_EQ(parameter_count(big), 214245376);
}

TEST(Config, JsonRoundTripAndDefaults) {
  ModelConfig c = preset_config("small");
  c.src_vocab_size = 100;
  c.tgt_vocab_size = 90;
  c.share_embeddings = EmbeddingSharing::kTarget;
  c.norm = NormPosition::kPre;
  c.activation = Activation::kGelu;
  c.self_attention_window = 5;
  c.sinusoid_layout = SinusoidLayout::kConcat;
  const ModelConfig back = config_from_json_text(config_to_json_text(c), "test");
  EXPECT_EQ(config_to_json(back), config_to_json(c));
  const ModelConfig defaults =
      config_from_json_text(R"({"src_vocab_size": 10, "tgt_vocab_size": 10})", "t");
  EXPECT_EQ(defaults.d_model, 512);
  EXPECT_EQ(defaults.self_attention_window, -1);
  EXPECT_EQ(defaults.attention, AttentionScoring::kScaledDot);
  // Additive attention adds one [heads, d_k] vector per attention: 3 in a decoder layer's two
  // attentions and the encoder layer's one.
  ModelConfig additive = defaults;
  additive.attention = AttentionScoring::kAdditive;
  EXPECT_EQ(parameter_count(additive) - parameter_count(defaults),
            (additive.encoder_layers + 2 * additive.decoder_layers) * additive.d_model);
  EXPECT_EQ(config_from_json_text(config_to_json_text(additive), "t").attention,
            AttentionScoring::kAdditive);
  EXPECT_TRUE(defaults.src_append_eos);
}

TEST(Config, RejectsUnknownValuesKeysAndInconsistentSizes) {
  auto message = [](const std::string& json) -> std::string {
    try {
      config_from_json_text(json, "cfg.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"norm":"middle"})")
                .find("unknown value \"middle\""),
            std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"attention":"luong"})")
                .find("unknown value \"luong\" for config key \"attention\" (expected one of "
                      "\"scaled_dot\", \"dot\", \"additive\")"),
            std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"attention":1})")
                .find("\"attention\" must be a string"),
            std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"activaton":"relu"})")
                .find("unknown config key"),
            std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"heads":5})").find("divisible"),
            std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":8})").find("share_embeddings"),
            std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"format":"other/2"})")
                .find("unsupported model format"),
            std::string::npos);
  // A later format version is refused by name; the versions this build reads load.
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"format":"transformer-cpp/2"})")
                .find("model format transformer-cpp/2 is newer than this build reads (up to "
                      "transformer-cpp/1)"),
            std::string::npos);
  for (const char* malformed : {"transformer-cpp/0", "transformer-cpp/01", "transformer-cpp/",
                                "transformer-cpp/1x", "transformer-cpp/99999999999"})
    EXPECT_NE(message(std::string(R"({"src_vocab_size":9,"tgt_vocab_size":9,"format":")") +
                      malformed + "\"}")
                  .find("unsupported model format"),
              std::string::npos)
        << malformed;
  EXPECT_EQ(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"format":"transformer-cpp/1"})"), "");
  EXPECT_NE(message(R"({"src_vocab_size":9,"tgt_vocab_size":9,"d_model":"big"})")
                .find("must be an integer"),
            std::string::npos);
  EXPECT_NE(message("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message(R"({"src_vocab_size":2,"tgt_vocab_size":2})").find("outside the vocabulary"),
            std::string::npos);
}

TEST(ModelFile, MissingTensorAndWrongShapeAreNamed) {
  ModelConfig c = preset_config("tiny");
  c.src_vocab_size = c.tgt_vocab_size = 30;
  Model model = init_model(c, 1, tfm::cpu_backend());
  TensorMap missing = model.parameters().to_host();
  missing.erase("decoder.layers.1.ffn.fc2.bias");
  try {
    Model bad(c, std::move(missing), "m.safetensors", tfm::cpu_backend());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor \"decoder.layers.1.ffn.fc2.bias\""),
              std::string::npos);
  }
  TensorMap wrong = model.parameters().to_host();
  wrong["encoder.layers.0.self_attn.q.weight"] = Tensor({64, 63});
  try {
    Model bad(c, std::move(wrong), "m.safetensors", tfm::cpu_backend());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [64, 63], expected [64, 64]"),
              std::string::npos);
  }
}

TEST(ModelFile, InitIsDeterministicAndSaveLoadRoundTrips) {
  ModelConfig c = preset_config("tiny");
  c.src_vocab_size = 40;
  c.tgt_vocab_size = 35;
  c.share_embeddings = EmbeddingSharing::kNone;
  c.output_bias = true;
  c.position_encoding = PositionEncoding::kLearned;
  c.max_positions = 64;
  Model a = init_model(c, 9, tfm::cpu_backend()), b = init_model(c, 9, tfm::cpu_backend()),
        other = init_model(c, 10, tfm::cpu_backend());
  const TensorMap a_host = a.parameters().to_host();
  EXPECT_EQ(a_host.at("encoder.layers.0.ffn.fc1.weight").data,
            b.parameters().to_host().at("encoder.layers.0.ffn.fc1.weight").data);
  EXPECT_NE(a_host.at("encoder.layers.0.ffn.fc1.weight").data,
            other.parameters().to_host().at("encoder.layers.0.ffn.fc1.weight").data);
  const std::string path = temp_path("init.safetensors");
  save_model(a, path);
  Model loaded = load_model(path, tfm::cpu_backend());
  EXPECT_EQ(config_to_json(loaded.config()), config_to_json(c));
  EXPECT_EQ(loaded.parameters().to_host().size(), a_host.size());
  for (const auto& [name, tensor] : loaded.parameters().to_host())
    EXPECT_EQ(a_host.at(name).data, tensor.data) << name;
  std::remove(path.c_str());
}

// A model quantised to int8 (quantize, import of an int8 CTranslate2 model) stores each linear
// weight and embedding as I8 [rows, cols] plus "<name>_scale" F32 [rows]: the file holds exactly
// the values and
// scales the quantiser made, loads them back unchanged for int8, multiplies them out for
// float32, and keeps every other tensor in float32.
TEST(ModelFile, Int8WeightsAreStoredAsTheyAreQuantised) {
  ModelConfig c = preset_config("tiny");
  c.src_vocab_size = 40;
  c.tgt_vocab_size = 35;
  c.share_embeddings = EmbeddingSharing::kNone;
  Model a = init_model(c, 3, tfm::cpu_backend());
  const std::string float_path = temp_path("int8_source.safetensors");
  const std::string int8_path = temp_path("int8.safetensors");
  save_model(a, float_path);
  const Model quantised = load_model(float_path, cpu_backend(), ModelWeights::kInt8);
  save_model(quantised, int8_path);

  const SafetensorsHeader header = read_safetensors_header(int8_path);
  EXPECT_TRUE(stores_int8_weights(header));
  EXPECT_FALSE(stores_int8_weights(read_safetensors_header(float_path)));
  size_t int8_tensors = 0;
  const TensorMap a_host = a.parameters().to_host();
  const std::map<std::string, ParameterRole> roles = parameter_roles(a.config());
  auto held_in_int8 = [&](const std::string& name) { return int8_may_hold(roles.at(name)); };
  for (const auto& [name, tensor] : a_host) {
    if (!held_in_int8(name)) {
      EXPECT_EQ(header.dtypes.at(name), "F32") << name;
      EXPECT_FALSE(header.dtypes.count(name + kInt8ScaleSuffix)) << name;
      continue;
    }
    ++int8_tensors;
    EXPECT_EQ(header.dtypes.at(name), "I8") << name;
    EXPECT_EQ(header.dtypes.at(name + "_scale"), "F32") << name;
    EXPECT_EQ(header.shapes.at(name + "_scale"), Shape{tensor.shape[0]}) << name;
  }
  // The linear weights, the output projection and the two embeddings.
  EXPECT_EQ(int8_tensors, size_t(c.encoder_layers * 6 + c.decoder_layers * 10 + 3));

  const Model int8 = load_model(int8_path, cpu_backend(), ModelWeights::kInt8);
  const Model multiplied_out = load_model(int8_path, tfm::cpu_backend());
  ASSERT_TRUE(int8.holds_int8_weights());
  EXPECT_FALSE(multiplied_out.holds_int8_weights());
  const TensorMap int8_host = int8.parameters().to_host();
  const TensorMap multiplied_out_host = multiplied_out.parameters().to_host();
  for (const auto& [name, tensor] : a_host) {
    if (!held_in_int8(name)) {
      EXPECT_EQ(int8_host.at(name).data, tensor.data) << name;
      EXPECT_EQ(multiplied_out_host.at(name).data, tensor.data) << name;
      continue;
    }
    const Int8Matrix expected = quantize_weight_rows(tensor);
    const Int8Matrix got = int8.int8_weights().at(name).to_host();
    EXPECT_EQ(got.values, expected.values) << name;
    EXPECT_EQ(got.scales, expected.scales) << name;
    EXPECT_TRUE(int8_host.at(name).data.empty()) << name;  // held in int8 only
    const std::vector<float>& w = multiplied_out_host.at(name).data;
    const int64_t cols = tensor.shape[1];
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(w[i], float(expected.values[i]) * expected.scales[i / size_t(cols)]) << name;
      // Within half a quantisation step of the original weight.
      ASSERT_LE(std::fabs(w[i] - tensor.data[i]), 0.5001f * expected.scales[i / size_t(cols)]);
    }
  }
  // The int8 matrices take a quarter of their float32 bytes (plus a scale per row).
  EXPECT_LT(std::filesystem::file_size(int8_path), std::filesystem::file_size(float_path) / 2);
  std::remove(float_path.c_str());
  std::remove(int8_path.c_str());
}

// What a stranger's int8 file can get wrong is refused by name before any tensor is read: I8
// on a tensor that is neither a linear weight nor an embedding, a weight without its scales,
// scales of the wrong shape or type.
TEST(ModelFile, Int8FileErrorsAreNamed) {
  ModelConfig c = preset_config("tiny");
  c.src_vocab_size = c.tgt_vocab_size = 30;
  const TensorMap parameters = init_model(c, 1, tfm::cpu_backend()).parameters().to_host();
  const std::map<std::string, std::string> metadata{{"config", config_to_json_text(c)}};
  const std::string path = temp_path("bad_int8.safetensors");
  const std::string q = "encoder.layers.0.self_attn.q.weight";
  const std::vector<int8_t> values(size_t(64 * 64), 1), norm_values(64, 1);
  const std::vector<float> scales(64, 0.5f);
  auto expect_refused = [&](std::map<std::string, StoredTensor> changes,
                            const std::string& fragment) {
    std::map<std::string, StoredTensor> stored;
    for (const auto& [name, t] : parameters) stored[name] = StoredTensor{"F32", t.shape, t.ptr()};
    for (auto& [name, t] : changes) stored[name] = t;
    write_safetensors(path, stored, metadata);
    try {
      load_model(path, tfm::cpu_backend());
      FAIL() << "no error; expected: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_refused({{"encoder.layers.0.norm1.weight", {"I8", {64}, norm_values.data()}}},
                 "only linear weights and token embeddings may be stored in int8");
  expect_refused({{q, {"I8", {64, 64}, values.data()}}}, "has no \"" + q + "_scale\"");
  expect_refused(
      {{q, {"I8", {64, 64}, values.data()}}, {q + "_scale", {"F32", {32}, scales.data()}}},
      "must be F32 of shape [64]");
  expect_refused({{q + "_scale", {"F32", {64}, scales.data()}}}, "unexpected tensor");
  // Correct: loads, and the weight is 0.5 everywhere in float32.
  std::map<std::string, StoredTensor> stored;
  for (const auto& [name, t] : parameters) stored[name] = {"F32", t.shape, t.ptr()};
  stored[q] = {"I8", {64, 64}, values.data()};
  stored[q + "_scale"] = {"F32", {64}, scales.data()};
  write_safetensors(path, stored, metadata);
  const Model loaded = load_model(path, tfm::cpu_backend());
  EXPECT_EQ(loaded.parameters().to_host().at(q).data, std::vector<float>(64 * 64, 0.5f));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tfm
