// parameter_specs(): the parameter tree (parameter_tree.h) walked into a flat list.
#include "model/parameter_tree.h"

namespace tfm {

namespace {

struct SpecCollector : ParameterVisitor {
  std::vector<ParameterSpec>& specs;
  const ModelConfig& config;

  void linears(const std::string& scope, const std::vector<LinearPart<const float>>& parts) {
    int64_t row = 0;
    for (const LinearPart<const float>& part : parts) {
      const Linear<const float>& l = *part.linear;
      specs.push_back({part.name + ".weight",
                       {l.out, l.in},
                       ParameterRole::kLinearWeight,
                       {scope + "/weight"},
                       row});
      specs.push_back(
          {part.name + ".bias", {l.out}, ParameterRole::kLinearBias, {scope + "/bias"}, row});
      row += l.out;
    }
  }
  void norm(LayerNormParams<const float>&, const std::string& name, const std::string& scope) {
    specs.push_back(
        {name + ".weight", {config.d_model}, ParameterRole::kNormScale, {scope + "/gamma"}});
    specs.push_back(
        {name + ".bias", {config.d_model}, ParameterRole::kNormShift, {scope + "/beta"}});
  }
  void tensor(const float*&, Int8Rows*, const TensorPlace& place) {
    specs.push_back({place.name, place.shape, place.role, place.ctranslate2});
  }
};

}  // namespace

std::vector<ParameterSpec> parameter_specs(const ModelConfig& c) {
  std::vector<ParameterSpec> specs;
  SpecCollector collector{{}, specs, c};
  TransformerParams<const float> scratch;
  walk_parameters(c, scratch, collector);
  return specs;
}

std::map<std::string, ParameterRole> parameter_roles(const ModelConfig& c) {
  std::map<std::string, ParameterRole> roles;
  for (const ParameterSpec& spec : parameter_specs(c)) roles.emplace(spec.name, spec.role);
  return roles;
}

}  // namespace tfm
