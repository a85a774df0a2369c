// The parameter tree (model/parameter_tree.h) against what it is the one description of: the
// tensor names docs/model-file.md promises, the CTranslate2 variables each tensor is written as,
// and the order init draws in.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "model/config.h"

namespace {

std::string read_doc(const std::string& name) {
  std::ifstream in(std::string(TFM_FIXTURE_DIR) + "/../../docs/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "a.{b,c}.{d,e}" → a.b.d, a.b.e, a.c.d, a.c.e.
std::vector<std::string> expand_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) return {pattern};
  const size_t close = pattern.find('}', open);
  std::vector<std::string> out;
  std::stringstream options(pattern.substr(open + 1, close - open - 1));
  for (std::string option; std::getline(options, option, ',');)
    for (const std::string& rest : expand_braces(pattern.substr(close + 1)))
      out.push_back(pattern.substr(0, open) + option + rest);
  return out;
}

// Every dotted tensor name the page mentions, braces expanded, layer indices written `i`.
std::set<std::string> documented_names(const std::string& page) {
  std::set<std::string> names;
  const std::regex name(
      R"([a-z_]+(\.([a-z_0-9]+|\{[a-z_0-9,]+\}))*\.(\{[a-z,_]+\}|weight|bias|additive_v))");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), name); it != std::sregex_iterator();
       ++it)
    for (const std::string& n : expand_braces(it->str())) names.insert(n);
  return names;
}

std::string with_layer_i(std::string name) {
  return std::regex_replace(name, std::regex(R"(\.layers\.[0-9]+\.)"), ".layers.i.");
}

std::vector<tfm::ModelConfig> variants() {
  std::vector<tfm::ModelConfig> out;
  for (auto share :
       {tfm::EmbeddingSharing::kAll, tfm::EmbeddingSharing::kTarget, tfm::EmbeddingSharing::kNone})
    for (bool extras : {false, true}) {
      tfm::ModelConfig c = tfm::preset_config("tiny");
      c.src_vocab_size = 30;
      c.tgt_vocab_size = 40;
      c.share_embeddings = share;
      if (extras) {
        c.norm = tfm::NormPosition::kPre;
        c.position_encoding = tfm::PositionEncoding::kLearned;
        c.attention = tfm::AttentionScoring::kAdditive;
        c.output_bias = true;
      }
      out.push_back(c);
    }
  return out;
}

TEST(ParameterTree, ModelFileDocumentsEveryTensorOfEveryVariant) {
  const std::string page = read_doc("model-file.md");
  ASSERT_FALSE(page.empty()) << "docs/model-file.md not found";
  const std::set<std::string> documented = documented_names(page);
  for (const tfm::ModelConfig& c : variants())
    for (const tfm::ParameterSpec& spec : tfm::parameter_specs(c))
      EXPECT_TRUE(documented.count(with_layer_i(spec.name)))
          << spec.name << " is not named in docs/model-file.md";
  // And the page's layer tensors all exist (none documented that the model lost).
  std::set<std::string> layer_tensors;
  for (const tfm::ModelConfig& c : variants())
    for (const tfm::ParameterSpec& spec : tfm::parameter_specs(c))
      layer_tensors.insert(with_layer_i(spec.name));
  for (const std::string& name : documented) {
    if (name.find(".layers.i.") != std::string::npos) {
      EXPECT_TRUE(layer_tensors.count(name)) << name << " is documented but not in the model";
    }
  }
}

TEST(ParameterTree, CTranslate2VariablesStackTheProjectionsThatReadOneInput) {
  tfm::ModelConfig c = tfm::preset_config("tiny");
  c.src_vocab_size = c.tgt_vocab_size = 30;
  std::map<std::string, tfm::ParameterSpec> by_name;
  for (const tfm::ParameterSpec& spec : tfm::parameter_specs(c)) by_name[spec.name] = spec;
  const int64_t d = c.d_model;
  // TransformerSpec: self-attention's linear_0 is Q|K|V, cross-attention's linear_1 is K|V.
  const std::string self = "decoder/layer_1/self_attention/linear_0/weight";
  EXPECT_EQ(by_name.at("decoder.layers.1.self_attn.q.weight").ctranslate2,
            std::vector<std::string>{self});
  EXPECT_EQ(by_name.at("decoder.layers.1.self_attn.v.weight").ctranslate2_row, 2 * d);
  EXPECT_EQ(by_name.at("decoder.layers.1.cross_attn.q.weight").ctranslate2,
            std::vector<std::string>{"decoder/layer_1/attention/linear_0/weight"});
  EXPECT_EQ(by_name.at("decoder.layers.1.cross_attn.k.bias").ctranslate2,
            std::vector<std::string>{"decoder/layer_1/attention/linear_1/bias"});
  EXPECT_EQ(by_name.at("decoder.layers.1.cross_attn.v.bias").ctranslate2_row, d);
  EXPECT_EQ(by_name.at("decoder.layers.1.cross_attn.o.weight").ctranslate2,
            std::vector<std::string>{"decoder/layer_1/attention/linear_2/weight"});
  EXPECT_EQ(by_name.at("encoder.layers.0.norm2.weight").ctranslate2,
            std::vector<std::string>{"encoder/layer_0/ffn/layer_norm/gamma"});
  EXPECT_EQ(by_name.at("decoder.layers.0.norm3.bias").ctranslate2,
            std::vector<std::string>{"decoder/layer_0/ffn/layer_norm/beta"});
  // A shared embedding is written as each of CTranslate2's three.
  EXPECT_EQ(by_name.at("embed.weight").ctranslate2,
            (std::vector<std::string>{"encoder/embeddings_0/weight", "decoder/embeddings/weight",
                                      "decoder/projection/weight"}));
  EXPECT_EQ(by_name.at("embed.weight").role, tfm::ParameterRole::kTokenEmbedding);
}

}  // namespace
