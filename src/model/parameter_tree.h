// The model's parameters, described once: walk_parameters() visits every parameter tensor of a
// configuration in a fixed order, with our name, its shape, its role and where CTranslate2 keeps
// it, over the views the layers read (model/weights.h). Every reader and writer walks this one
// tree: the parameter list and count (parameter_specs), initialisation, binding of weights and
// gradients, the CTranslate2 import and export, `info`, and the test that checks
// docs/model-file.md. A new parameter is added here (and to the view it belongs to).
//
// A visitor has four methods, each called in the tree's order:
//   scope(ct2_scope)              entering a layer or an attention / feed-forward block
//   linears(ct2_scope, parts)     the Linears CTranslate2 stacks into one variable of that
//                                 scope (its /weight and /bias rows, in part order); each part
//                                 is our <name>.weight [out, in] and <name>.bias [out]
//   norm(params, name, ct2_scope) a layer norm: <name>.weight (CTranslate2's gamma), .bias (beta)
//   tensor(slot, int8_slot, place) any other tensor (embeddings, the output projection when it is
//                                 its own, position tables, additive attention's v); int8_slot
//                                 is set for the matrices int8 inference may hold in int8
#pragma once

#include <string>
#include <vector>

#include "model/weights.h"

namespace tfm {

// A tensor outside the linears and norms, and where CTranslate2 keeps it (none, one or, for a
// shared embedding, each variable it serves as).
struct TensorPlace {
  std::string name;
  Shape shape;
  ParameterRole role;
  std::vector<std::string> ctranslate2;
};

// One Linear of a group that CTranslate2 stacks row-wise.
template <typename F>
struct LinearPart {
  Linear<F>* linear;
  std::string name;  // ours, without .weight / .bias
};

namespace parameter_tree_detail {

template <typename F, typename Visitor>
void attention(const ModelConfig& c, Attention<F>& a, const std::string& ours,
               const std::string& theirs, bool self_attention, Visitor& v) {
  const int64_t d = c.d_model;
  for (Linear<F>* l : {&a.q, &a.k, &a.v, &a.o}) {
    l->out = d;
    l->in = d;
  }
  a.scoring = c.attention;
  v.scope(theirs);
  // CTranslate2 stacks the projections that read one input: Q|K|V of self-attention, K|V of
  // cross-attention (MultiHeadAttentionSpec: linear_0.., then the output projection).
  if (self_attention) {
    v.linears(
        theirs + "/linear_0",
        std::vector<LinearPart<F>>{{&a.q, ours + ".q"}, {&a.k, ours + ".k"}, {&a.v, ours + ".v"}});
    v.linears(theirs + "/linear_1", std::vector<LinearPart<F>>{{&a.o, ours + ".o"}});
  } else {
    v.linears(theirs + "/linear_0", std::vector<LinearPart<F>>{{&a.q, ours + ".q"}});
    v.linears(theirs + "/linear_1",
              std::vector<LinearPart<F>>{{&a.k, ours + ".k"}, {&a.v, ours + ".v"}});
    v.linears(theirs + "/linear_2", std::vector<LinearPart<F>>{{&a.o, ours + ".o"}});
  }
  if (c.attention == AttentionScoring::kAdditive)
    v.tensor(
        a.additive_v, nullptr,
        TensorPlace{ours + ".additive_v", {c.heads, c.head_dim()}, ParameterRole::kAdditiveV, {}});
}

template <typename F, typename Visitor>
void feed_forward(const ModelConfig& c, FeedForward<F>& f, const std::string& ours,
                  const std::string& theirs, Visitor& v) {
  f.fc1.out = f.fc2.in = c.d_ff;
  f.fc1.in = f.fc2.out = c.d_model;
  v.scope(theirs);
  v.linears(theirs + "/linear_0", std::vector<LinearPart<F>>{{&f.fc1, ours + ".fc1"}});
  v.linears(theirs + "/linear_1", std::vector<LinearPart<F>>{{&f.fc2, ours + ".fc2"}});
}

}  // namespace parameter_tree_detail

// An encoder layer: ours "encoder.layers.i", CTranslate2's "encoder/layer_i".
template <typename F, typename Visitor>
void walk_encoder_layer(const ModelConfig& c, EncoderLayer<F>& layer, const std::string& ours,
                        const std::string& theirs, Visitor& v) {
  namespace detail = parameter_tree_detail;
  v.scope(theirs);
  detail::attention(c, layer.self_attn, ours + ".self_attn", theirs + "/self_attention", true, v);
  v.norm(layer.norm1, ours + ".norm1", theirs + "/self_attention/layer_norm");
  detail::feed_forward(c, layer.ffn, ours + ".ffn", theirs + "/ffn", v);
  v.norm(layer.norm2, ours + ".norm2", theirs + "/ffn/layer_norm");
}

// A decoder layer: ours "decoder.layers.i", CTranslate2's "decoder/layer_i".
template <typename F, typename Visitor>
void walk_decoder_layer(const ModelConfig& c, DecoderLayer<F>& layer, const std::string& ours,
                        const std::string& theirs, Visitor& v) {
  namespace detail = parameter_tree_detail;
  v.scope(theirs);
  detail::attention(c, layer.self_attn, ours + ".self_attn", theirs + "/self_attention", true, v);
  v.norm(layer.norm1, ours + ".norm1", theirs + "/self_attention/layer_norm");
  detail::attention(c, layer.cross_attn, ours + ".cross_attn", theirs + "/attention", false, v);
  v.norm(layer.norm2, ours + ".norm2", theirs + "/attention/layer_norm");
  detail::feed_forward(c, layer.ffn, ours + ".ffn", theirs + "/ffn", v);
  v.norm(layer.norm3, ours + ".norm3", theirs + "/ffn/layer_norm");
}

// The whole model, in the order parameter_specs lists it. The views' aliases (a shared embedding
// as target embedding and output projection) are set here too, so a binder fills each tensor once.
template <typename F, typename Visitor>
void walk_parameters(const ModelConfig& c, TransformerParams<F>& w, Visitor& v) {
  const int64_t d = c.d_model;
  const std::string source_embedding = "encoder/embeddings_0/weight",
                    target_embedding = "decoder/embeddings/weight",
                    projection = "decoder/projection";
  auto token_table = [&](F*& slot, Int8Rows& int8, const char* name, int64_t vocabulary,
                         std::vector<std::string> ctranslate2) {
    v.tensor(
        slot, &int8,
        TensorPlace{name, {vocabulary, d}, ParameterRole::kTokenEmbedding, std::move(ctranslate2)});
  };
  switch (c.share_embeddings) {
    case EmbeddingSharing::kAll:
      token_table(w.src_embed, w.src_embed_int8, "embed.weight", c.src_vocab_size,
                  {source_embedding, target_embedding, projection + "/weight"});
      w.tgt_embed = w.output.weight = w.src_embed;
      w.tgt_embed_int8 = w.output.int8 = w.src_embed_int8;
      break;
    case EmbeddingSharing::kTarget:
      token_table(w.src_embed, w.src_embed_int8, "src_embed.weight", c.src_vocab_size,
                  {source_embedding});
      token_table(w.tgt_embed, w.tgt_embed_int8, "tgt_embed.weight", c.tgt_vocab_size,
                  {target_embedding, projection + "/weight"});
      w.output.weight = w.tgt_embed;
      w.output.int8 = w.tgt_embed_int8;
      break;
    case EmbeddingSharing::kNone:
      token_table(w.src_embed, w.src_embed_int8, "src_embed.weight", c.src_vocab_size,
                  {source_embedding});
      token_table(w.tgt_embed, w.tgt_embed_int8, "tgt_embed.weight", c.tgt_vocab_size,
                  {target_embedding});
      v.tensor(w.output.weight, &w.output.int8,
               TensorPlace{"out_proj.weight",
                           {c.tgt_vocab_size, d},
                           ParameterRole::kLinearWeight,
                           {projection + "/weight"}});
      break;
  }
  w.output.in = d;
  w.output.out = c.tgt_vocab_size;
  if (c.output_bias)
    v.tensor(w.output.bias, nullptr,
             TensorPlace{"out_proj.bias",
                         {c.tgt_vocab_size},
                         ParameterRole::kLinearBias,
                         {projection + "/bias"}});
  // Learned position tables; CTranslate2 keeps the rows a model adds per position in
  // <stack>/position_encodings/encodings, which the export writes for every position scheme.
  if (c.position_encoding == PositionEncoding::kLearned) {
    v.tensor(w.encoder_pos_embed, nullptr,
             TensorPlace{"encoder.pos_embed.weight",
                         {c.max_positions, d},
                         ParameterRole::kPositionEmbedding,
                         {}});
    v.tensor(w.decoder_pos_embed, nullptr,
             TensorPlace{"decoder.pos_embed.weight",
                         {c.max_positions, d},
                         ParameterRole::kPositionEmbedding,
                         {}});
  }
  w.encoder_layers.resize(size_t(c.encoder_layers));
  for (int64_t i = 0; i < c.encoder_layers; ++i)
    walk_encoder_layer(c, w.encoder_layers[size_t(i)], "encoder.layers." + std::to_string(i),
                       "encoder/layer_" + std::to_string(i), v);
  if (c.norm == NormPosition::kPre) v.norm(w.encoder_norm, "encoder.norm", "encoder/layer_norm");
  w.decoder_layers.resize(size_t(c.decoder_layers));
  for (int64_t i = 0; i < c.decoder_layers; ++i)
    walk_decoder_layer(c, w.decoder_layers[size_t(i)], "decoder.layers." + std::to_string(i),
                       "decoder/layer_" + std::to_string(i), v);
  if (c.norm == NormPosition::kPre) v.norm(w.decoder_norm, "decoder.norm", "decoder/layer_norm");
}

// A visitor's defaults: nothing for each call. Visitors derive from it and hide what they use.
struct ParameterVisitor {
  void scope(const std::string&) {}
  template <typename F>
  void linears(const std::string&, const std::vector<LinearPart<F>>&) {}
  template <typename F>
  void norm(LayerNormParams<F>&, const std::string&, const std::string&) {}
  template <typename F>
  void tensor(F*&, Int8Rows*, const TensorPlace&) {}
};

}  // namespace tfm
