// Parameter binding (a walk of the parameter tree, model/parameter_tree.h) and checking.
#include "model/weights.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <vector>

#include "model/parameter_tree.h"
#include "tensor/error.h"

namespace tfm {

namespace {

// Map is a const DeviceTensors (weights), a DeviceTensors (gradients) or a const TensorMap
// (single layers for tests); F is const float or float to match.
template <typename Map>
auto& find(Map& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw Error("missing tensor \"" + name + "\"");
  return it->second;
}

// Fills the views of walk_parameters from `tensors`: each tensor's data, or its int8 rows where
// `int8` (null: none) holds the matrix, its float tensor then keeping only its shape.
template <typename Map>
struct Binder : ParameterVisitor {
  Map& tensors;
  const DeviceInt8Weights* int8;

  template <typename F>
  void bind_tensor(F*& slot, Int8Rows* int8_slot, const std::string& name) {
    auto& tensor = find(tensors, name);  // required also when int8 holds it
    if (int8 && int8_slot) {
      if (auto it = int8->find(name); it != int8->end()) {
        *int8_slot = it->second.view();
        slot = nullptr;
        return;
      }
    }
    slot = tensor.ptr();
  }
  template <typename F>
  void linears(const std::string&, const std::vector<LinearPart<F>>& parts) {
    for (const LinearPart<F>& part : parts) {
      bind_tensor(part.linear->weight, &part.linear->int8, part.name + ".weight");
      part.linear->bias = find(tensors, part.name + ".bias").ptr();
    }
  }
  template <typename F>
  void norm(LayerNormParams<F>& params, const std::string& name, const std::string&) {
    params.weight = find(tensors, name + ".weight").ptr();
    params.bias = find(tensors, name + ".bias").ptr();
  }
  template <typename F>
  void tensor(F*& slot, Int8Rows* int8_slot, const TensorPlace& place) {
    bind_tensor(slot, int8_slot, place.name);
  }
};

template <typename F, typename Map>
TransformerParams<F> bind_all(const ModelConfig& config, Map& tensors,
                              const DeviceInt8Weights* int8 = nullptr) {
  TransformerParams<F> w;
  Binder<Map> binder{{}, tensors, int8};
  walk_parameters(config, w, binder);
  return w;
}

// The sizes a single layer's tensors (under `prefix`) imply, for binding it without a model.
ModelConfig layer_config(const TensorMap& tensors, const std::string& prefix,
                         AttentionScoring scoring) {
  const Shape& q = find(tensors, prefix + ".self_attn.q.weight").shape;
  const Shape& fc1 = find(tensors, prefix + ".ffn.fc1.weight").shape;
  if (q.size() != 2 || fc1.size() != 2)
    throw Error("tensors \"" + prefix + ".self_attn.q.weight\" and \"" + prefix +
                ".ffn.fc1.weight\" must be matrices");
  ModelConfig c;
  c.d_model = q[1];
  c.d_ff = fc1[0];
  c.heads = 1;  // the binder reads no shape from the config but these
  c.attention = scoring;
  return c;
}

}  // namespace

EncoderLayerWeights bind_encoder_layer(const TensorMap& tensors, const std::string& prefix,
                                       AttentionScoring scoring) {
  EncoderLayerWeights layer;
  Binder<const TensorMap> binder{{}, tensors, nullptr};
  walk_encoder_layer(layer_config(tensors, prefix, scoring), layer, prefix, "", binder);
  return layer;
}

DecoderLayerWeights bind_decoder_layer(const TensorMap& tensors, const std::string& prefix,
                                       AttentionScoring scoring) {
  DecoderLayerWeights layer;
  Binder<const TensorMap> binder{{}, tensors, nullptr};
  walk_decoder_layer(layer_config(tensors, prefix, scoring), layer, prefix, "", binder);
  return layer;
}

void check_parameter_shapes(const ModelConfig& config, const std::map<std::string, Shape>& shapes,
                            const std::string& where) {
  const auto specs = parameter_specs(config);
  for (const auto& spec : specs) {
    auto it = shapes.find(spec.name);
    if (it == shapes.end()) throw Error(where + ": missing tensor \"" + spec.name + "\"");
    if (it->second != spec.shape)
      throw Error(where + ": tensor \"" + spec.name + "\" has shape " +
                  shape_to_string(it->second) + ", expected " + shape_to_string(spec.shape));
  }
  if (shapes.size() != specs.size()) {
    for (const auto& [name, shape] : shapes) {
      bool used = false;
      for (const auto& spec : specs) used = used || spec.name == name;
      if (!used)
        throw Error(where + ": unexpected tensor " + quoted_for_message(name) + " for this config");
    }
  }
}

TransformerWeights bind_weights(const ModelConfig& config, const DeviceTensors& tensors,
                                const std::string& where, const DeviceInt8Weights* int8) {
  check_parameter_shapes(config, tensors.shapes(), where);
  return bind_all<const float>(config, tensors, int8);
}

namespace {

// f(linear) for every Linear of `weights` (the stacked qkv / kv views included).
template <typename Weights, typename F>
void for_each_linear(Weights& weights, F f) {
  auto attention = [&f](auto& a) {
    for (auto* l : {&a.q, &a.k, &a.v, &a.o, &a.qkv, &a.kv}) f(*l);
  };
  for (auto& layer : weights.encoder_layers) {
    attention(layer.self_attn);
    f(layer.ffn.fc1);
    f(layer.ffn.fc2);
  }
  for (auto& layer : weights.decoder_layers) {
    attention(layer.self_attn);
    attention(layer.cross_attn);
    f(layer.ffn.fc1);
    f(layer.ffn.fc2);
  }
  f(weights.output);
}

// Whether with_rounded_weights rounds this linear's weight.
bool has_rounded_weight(const LinearWeights& l) {
  return l.precision == Precision::kBFloat16 && !l.prepared && l.weight && l.out > 0;
}

// n rounded up to whole words of 16 bytes of bfloat16 (8 elements): where with_rounded_weights
// starts the biases, and each bias's span, so that every bias starts where a GPU library reads
// it in such words.
int64_t whole_words(int64_t n) {
  return (n + 7) / 8 * 8;
}

// Elements of the rounded weights alone (the biases come after them).
int64_t rounded_weight_elements_alone(const TransformerWeights& weights) {
  int64_t n = 0;
  for_each_linear(weights, [&n](const LinearWeights& l) {
    if (has_rounded_weight(l)) n += l.out * l.in;
  });
  return n;
}
// Elements a linear's rounded bias takes after them (0: it has none).
int64_t rounded_bias_span(const LinearWeights& l) {
  return has_rounded_weight(l) && l.bias ? whole_words(l.out) : 0;
}

// f(stacked view, its parts) for the views a bfloat16 training pass multiplies through: each
// self-attention's Q|K|V and each cross-attention's K|V.
template <typename Weights, typename F>
void for_each_training_stack(Weights& weights, F f) {
  for (auto& layer : weights.encoder_layers) {
    auto& a = layer.self_attn;
    f(a.qkv, {&a.q, &a.k, &a.v});
  }
  for (auto& layer : weights.decoder_layers) {
    auto& self = layer.self_attn;
    f(self.qkv, {&self.q, &self.k, &self.v});
    auto& cross = layer.cross_attn;
    f(cross.kv, {&cross.k, &cross.v});
  }
}

// Whether training stacks its projections: TFM_STACKED_PROJECTIONS=0 keeps the separate
// products, to compare the two or to rule the stacking out.
bool stacking_enabled() {
  static const bool enabled = [] {
    const char* setting = std::getenv("TFM_STACKED_PROJECTIONS");
    return !(setting && std::strcmp(setting, "0") == 0);
  }();
  return enabled;
}

// Whether `parts` stack into one view: every part rounded from its float weight, all reading
// the same inputs, with biases all or none.
bool stackable(std::initializer_list<const LinearWeights*> parts) {
  const LinearWeights& first = **parts.begin();
  for (const LinearWeights* p : parts)
    if (!has_rounded_weight(*p) || p->in != first.in || (p->bias == nullptr) != (!first.bias))
      return false;
  return true;
}

}  // namespace

TransformerWeights with_product_precision(TransformerWeights weights, Precision precision) {
  for_each_linear(weights, [precision](LinearWeights& l) {
    l.precision = precision;
    l.tuned_products = true;
  });
  for_each_training_stack(
      weights, [](LinearWeights& stacked, std::initializer_list<const LinearWeights*> parts) {
        if (stacked.prepared || !stacking_enabled() || !stackable(parts)) return;
        stacked = LinearWeights{};
        stacked.in = (*parts.begin())->in;
        for (const LinearWeights* p : parts) stacked.out += p->out;
        stacked.precision = Precision::kBFloat16;
        stacked.tuned_products = true;
      });
  return weights;
}

int64_t stacked_bias_elements(const TransformerWeights& weights) {
  int64_t n = 0;
  for_each_training_stack(weights, [&n](const LinearWeights& stacked,
                                        std::initializer_list<const LinearWeights*> parts) {
    if (stacked.out > 0 && !stacked.prepared && (*parts.begin())->bias) n += stacked.out;
  });
  return n;
}

int64_t rounded_weights_elements(const TransformerWeights& weights) {
  int64_t n = whole_words(rounded_weight_elements_alone(weights));
  for_each_linear(weights, [&n](const LinearWeights& l) { n += rounded_bias_span(l); });
  return n;
}

TransformerWeights with_rounded_weights(const Backend& backend, TransformerWeights weights,
                                        DeviceBuffer<uint16_t>& storage,
                                        DeviceBuffer<float>& stacked_biases) {
  uint16_t* const first = ensure_size(backend, storage, rounded_weights_elements(weights));
  uint16_t* next = first;
  std::vector<RoundingJob> jobs;  // every weight [out, in] and bias at once: one launch on a GPU
  for_each_linear(weights, [&](LinearWeights& l) {
    if (!has_rounded_weight(l)) return;
    jobs.push_back({l.weight, l.out * l.in, next});
    l.rounded = next;
    next += l.out * l.in;
  });
  // The biases after every weight (a stacked view's parts' weights lie side by side).
  next = first + whole_words(next - first);
  for_each_linear(weights, [&](LinearWeights& l) {
    if (rounded_bias_span(l) == 0) return;
    jobs.push_back({l.bias, l.out, next});
    l.rounded_bias = next;
    next += rounded_bias_span(l);
  });
  backend.round_each_to_16_bits(jobs, Precision::kBFloat16);
  float* next_bias = ensure_size(backend, stacked_biases, stacked_bias_elements(weights));
  for_each_training_stack(
      weights, [&](LinearWeights& stacked, std::initializer_list<const LinearWeights*> parts) {
        if (stacked.out == 0 || stacked.prepared) return;
        // The parts' rounded copies lie one after another (for_each_linear's order): the view's.
        const uint16_t* expected = (*parts.begin())->rounded;
        for (const LinearWeights* p : parts) {
          if (p->rounded != expected)
            throw std::logic_error("with_rounded_weights: a stacked view's parts lie apart");
          expected += p->out * p->in;
        }
        stacked.rounded = (*parts.begin())->rounded;
        if (!(*parts.begin())->bias) return;
        // The parts' rounded biases are the view's where they lie one after another (every part
        // but the last a whole number of 16-byte words wide): for its products that round their
        // own bfloat16 output (a training step's Q, K and V written in bfloat16 alone).
        const uint16_t* adjacent = (*parts.begin())->rounded_bias;
        for (const LinearWeights* p : parts) {
          if (!adjacent || p->rounded_bias != adjacent) {
            adjacent = nullptr;
            break;
          }
          adjacent += p->out;
        }
        if (adjacent) stacked.rounded_bias = (*parts.begin())->rounded_bias;
        stacked.bias = next_bias;  // [out]
        for (const LinearWeights* p : parts) {
          backend.copy(p->bias, p->out, next_bias);
          next_bias += p->out;
        }
      });
  return weights;
}

TransformerGradients bind_gradients(const ModelConfig& config, DeviceTensors& gradients) {
  check_parameter_shapes(config, gradients.shapes(), "gradients");
  return bind_all<float>(config, gradients);
}

}  // namespace tfm
