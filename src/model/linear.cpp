// Linear forward / backward and the dropout key mix.
#include "model/linear.h"

#include <stdexcept>

namespace tfm {

uint64_t dropout_key(uint64_t seed, uint64_t site) {
  uint64_t z = seed ^ (site * 0xD1B54A32D192ED03ull);
  z = (z ^ (z >> 32)) * 0x9E3779B97F4A7C15ull;
  return z ^ (z >> 29);
}

const uint16_t* rounded_copy(const Backend& backend, const LinearWeights& w, const float* x,
                             int64_t rows, int64_t cols, DeviceBuffer<uint16_t>& buffer) {
  if (rows <= 0 || !rounds_to_bfloat16(w)) return nullptr;
  uint16_t* rounded = ensure_size(backend, buffer, rows * cols);  // [rows, cols]
  backend.round_to_16_bits(x, rows, cols, cols, Precision::kBFloat16, rounded);
  return rounded;
}

void linear_forward(const Backend& backend, const LinearWeights& w, const float* x, int64_t rows,
                    float* y, const uint16_t* rounded_x, bool relu, uint16_t* rounded_y,
                    void* relu_mask) {
  if (rounded_y && !reads_bfloat16_input(w))
    throw std::logic_error("linear_forward: a bfloat16 output from a product that does not round");
  if (w.prepared) {  // bias and ReLU (and the rounding) in the product's own pass here too
    w.prepared->multiply({x, rounded_x}, rows, w.in, y, w.out, {w.bias, relu, rounded_y});
  } else if (!w.weight && !(w.rounded && rounds_to_bfloat16(w))) {
    throw std::logic_error(w.int8.values
                               ? "linear_forward: a weight held in int8 is read only once prepared"
                               : "linear_forward: a stacked view is multiplied once "
                                 "with_rounded_weights or prepare_weights filled it");
  } else {  // bias and ReLU in the product's own pass (MatmulEpilogue)
    // Asked for the bfloat16 output alone, the product may round it itself, with the bias
    // rounded too where with_rounded_weights rounded it: nothing compares it with the float32
    // product's rounding.
    MatmulEpilogue epilogue{w.bias, relu, rounded_y};
    epilogue.rounded_by_the_product = rounded_y && !y;
    if (epilogue.rounded_by_the_product) epilogue.rounded_bias = w.rounded_bias;
    epilogue.relu_mask = relu ? relu_mask : nullptr;
    epilogue.may_tune = w.tuned_products;
    backend.matmul(false, true, rows, w.out, w.in, 1.f, {x, rounded_x}, w.in, {w.weight, w.rounded},
                   w.in, 0.f, y, w.out, w.precision, epilogue);
  }
}

void linear_backward(const Backend& backend, const LinearWeights& w, const Linear<float>& g,
                     const float* x, const float* dy, int64_t rows, float* dx, bool accumulate_dx,
                     BackwardScratch& scratch, const uint16_t* rounded_x,
                     const uint16_t* rounded_dy) {
  if (!rounded_dy)
    rounded_dy = rounded_copy(backend, w, dy, rows, w.out, scratch.rounded_d_out);  // [rows, out]
  if (dx) linear_input_backward(backend, w, dy, rounded_dy, rows, dx, accumulate_dx);
  linear_parameter_backward(backend, w, g, x, rounded_x, dy, rounded_dy, w.out, rows);
}

void linear_input_backward(const Backend& backend, const LinearWeights& w, const float* dy,
                           const uint16_t* rounded_dy, int64_t rows, float* dx, bool accumulate_dx,
                           uint16_t* rounded_dx, const ReluGate& gate) {
  MatmulEpilogue epilogue;
  epilogue.relu_output = gate.relu_output;
  epilogue.relu_mask = gate.relu_output ? gate.relu_mask : nullptr;
  epilogue.bias_gradient = gate.relu_output ? gate.bias_gradient : nullptr;
  epilogue.may_tune = w.tuned_products;
  if (rounded_dx) {
    if (dx || accumulate_dx || !rounds_to_bfloat16(w))
      throw std::logic_error(
          "linear_input_backward: a bfloat16 gradient alone is written (not added) by a product "
          "that rounds");
    epilogue.rounded_output = rounded_dx;
    epilogue.rounded_by_the_product = true;
  }
  backend.matmul(false, false, rows, w.in, w.out, 1.f, {dy, rounded_dy}, w.out,
                 {w.weight, w.rounded}, w.in, accumulate_dx ? 1.f : 0.f, dx, w.in, w.precision,
                 epilogue);
}

void linear_parameter_backward(const Backend& backend, const LinearWeights& w,
                               const Linear<float>& g, const float* x, const uint16_t* rounded_x,
                               const float* dy, const uint16_t* rounded_dy, int64_t ldy,
                               int64_t rows) {
  MatmulEpilogue tunable;
  tunable.may_tune = w.tuned_products;
  tunable.a_column_sums = g.bias;  // the bias gradient, Σ_rows dy (inside the product where it can)
  backend.matmul(true, false, w.out, w.in, rows, 1.f, {dy, rounded_dy, ldy}, ldy, {x, rounded_x},
                 w.in, 1.f, g.weight, w.in, w.precision, tunable);
}

void plan_linear_backward(const LinearWeights& w, int64_t rows, BackwardScratch& scratch,
                          WorkspacePlan& plan) {
  if (rows > 0 && rounds_to_bfloat16(w))
    plan.need(scratch.rounded_d_out, rows * w.out);  // [rows, out]
}

}  // namespace tfm
