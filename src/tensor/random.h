// A seeded, platform-independent random generator (xoshiro256** seeded by splitmix64), so a
// given --seed gives the same model and the same training run on every machine and compiler.
#pragma once

#include <cmath>
#include <cstdint>

namespace tfm {

class Random {
 public:
  explicit Random(uint64_t seed) {
    for (uint64_t& word : state_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      word = z ^ (z >> 31);
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 24 random bits (exactly representable as float).
  float uniform() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }

  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }

  // Standard normal by Box–Muller (one value per call; simple and deterministic).
  float normal() {
    const double u1 = (double(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = double(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

}  // namespace tfm
