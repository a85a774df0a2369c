// The sinusoid table.
#include "model/positional_encoding.h"

#include <cmath>

namespace tfm {

int64_t sinusoid_table_elements(const ModelConfig& config) {
  return config.position_encoding == PositionEncoding::kSinusoidal
             ? config.max_positions * config.d_model
             : 0;
}

void fill_sinusoid_table(const ModelConfig& config, float* table) {
  const int64_t d = config.d_model;
  for (int64_t p = 0; p < config.max_positions; ++p) {
    float* out = table + p * d;
    const double position = double(p);
    if (config.sinusoid_layout == SinusoidLayout::kInterleaved) {
      for (int64_t i = 0; 2 * i < d; ++i) {
        const double angle = position / std::pow(10000.0, double(2 * i) / double(d));
        out[2 * i] = float(std::sin(angle));
        if (2 * i + 1 < d) out[2 * i + 1] = float(std::cos(angle));
      }
    } else {
      const int64_t half = d / 2;
      const double increment = std::log(10000.0) / double(half - 1);
      for (int64_t j = 0; j < half; ++j) {
        const double angle = position * std::exp(-double(j) * increment);
        out[j] = float(std::sin(angle));
        out[half + j] = float(std::cos(angle));
      }
    }
  }
}

}  // namespace tfm
