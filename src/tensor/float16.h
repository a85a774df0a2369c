// Conversions between fp32 and the 16-bit float formats found in model files (IEEE half,
// bfloat16); fp32 -> 16 bits rounds to nearest even, as numpy and PyTorch casts do. And the one
// loop that turns a file's raw tensor bytes of any element type into fp32.
#pragma once

#include <cstdint>
#include <cstring>

namespace tfm {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bfloat16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One select rather than an early return, so that loops calling it vectorise.
inline uint16_t float_to_bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return nan ? uint16_t((bits >> 16) | 0x40u)  // quiet NaN
             : uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: Inf
  if (magnitude < 0x38800000u) {                                  // below 2^-14: subnormal
    if (magnitude < 0x33000000u) return sign;                     // below half of 2^-24
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const int dropped = 126 - int(magnitude >> 23);  // f / 2^-24 = mantissa >> dropped (14..24)
    uint32_t value = mantissa >> dropped;
    const uint32_t rest = mantissa & ((1u << dropped) - 1u), half = 1u << (dropped - 1);
    if (rest > half || (rest == half && (value & 1u))) ++value;
    return uint16_t(sign | value);
  }
  uint32_t value = magnitude - 0x38000000u;  // rebias the exponent (127 -> 15)
  value += 0xfffu + ((value >> 13) & 1u);    // round to nearest even on the dropped 13 bits
  return uint16_t(sign | (value >> 13));
}

// dst[i] = to_float(element i) for `count` Elements stored (little-endian, unaligned) at src:
// what the safetensors and CTranslate2 readers convert every non-fp32 tensor with.
template <typename Element, typename ToFloat>
void elements_to_float(const char* src, int64_t count, float* dst, ToFloat to_float) {
  for (int64_t i = 0; i < count; ++i) {
    Element value;
    std::memcpy(&value, src + sizeof(Element) * size_t(i), sizeof(Element));
    dst[i] = to_float(value);
  }
}

}  // namespace tfm
