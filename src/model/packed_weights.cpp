// pack_decoder_weights(): copies each decoder matrix into oneDNN's blocked layout.
#include "model/packed_weights.h"

#include "kernels/elementwise.h"

namespace tfm {

namespace {

PackedMatrix pack(const LinearWeights& w, Precision precision) {
  return PackedMatrix({w.weight}, {w.out}, w.in, precision);
}

// Biases of stacked projections, concatenated; empty when none of them has one.
std::vector<float> stacked_bias(const std::vector<const LinearWeights*>& parts) {
  bool any = false;
  for (const LinearWeights* w : parts) any |= w->bias != nullptr;
  std::vector<float> bias;
  if (!any) return bias;
  for (const LinearWeights* w : parts)
    for (int64_t i = 0; i < w->out; ++i) bias.push_back(w->bias ? w->bias[i] : 0.f);
  return bias;
}

}  // namespace

PackedDecoderWeights pack_decoder_weights(const ModelConfig& config,
                                          const TransformerWeights& weights, Precision precision) {
  PackedDecoderWeights packed{
      {},
      PackedMatrix({weights.output_weight}, {config.tgt_vocab_size}, config.d_model, precision)};
  for (const DecoderLayerWeights& w : weights.decoder_layers) {
    const AttentionWeights &self = w.self_attn, &cross = w.cross_attn;
    packed.layers.push_back(PackedDecoderLayer{
        PackedMatrix({self.q.weight, self.k.weight, self.v.weight},
                     {self.q.out, self.k.out, self.v.out}, self.q.in, precision),
        stacked_bias({&self.q, &self.k, &self.v}),
        pack(self.o, precision),
        pack(cross.q, precision),
        PackedMatrix({cross.k.weight, cross.v.weight}, {cross.k.out, cross.v.out}, cross.k.in,
                     precision),
        stacked_bias({&cross.k, &cross.v}),
        pack(cross.o, precision),
        pack(w.ffn.fc1, precision),
        pack(w.ffn.fc2, precision),
    });
  }
  return packed;
}

void packed_linear_forward(const PackedMatrix& w, const float* bias, const float* x, int64_t rows,
                           float* y) {
  w.multiply(x, rows, w.cols(), y, w.rows());
  if (bias) add_bias(y, bias, rows, w.rows());
}

}  // namespace tfm
