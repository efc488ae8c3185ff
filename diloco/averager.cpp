#include "diloco/averager.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace loco::diloco {

namespace {

// IEEE binary16, round to nearest even, with subnormals, inf and nan.
std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)
    return static_cast<std::uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {  // subnormal half (or zero)
    const float a = std::bit_cast<float>(absx);
    // a * 2^24 rounded to nearest even gives the subnormal mantissa.
    const float m = std::nearbyint(a * 16777216.0f);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(m));
  }
  const std::uint32_t mant_odd = (absx >> 13) & 1u;
  std::uint32_t v = absx + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<std::uint16_t>(sign | (v >> 13));
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

float bf16_roundtrip(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return f;  // nan stays nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return std::bit_cast<float>(x & 0xffff0000u);
}

}  // namespace

void codec_roundtrip(std::span<float> x, Compression c) {
  switch (c) {
    case Compression::fp32:
      return;
    case Compression::fp16:
      for (float& v : x) v = half_to_float(float_to_half(v));
      return;
    case Compression::bf16:
      for (float& v : x) v = bf16_roundtrip(v);
      return;
    case Compression::int8:
      for (std::size_t begin = 0; begin < x.size(); begin += kInt8ChunkElems) {
        const std::size_t end = std::min(x.size(), begin + kInt8ChunkElems);
        float amax = 0.0f;
        for (std::size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
        if (amax == 0.0f || !std::isfinite(amax)) {
          if (amax == 0.0f) continue;
          throw std::runtime_error("codec_roundtrip: int8 chunk holds a non-finite value");
        }
        const float scale = amax / 127.0f;
        const float inv = 127.0f / amax;
        for (std::size_t i = begin; i < end; ++i) {
          const float q = std::clamp(std::round(x[i] * inv), -127.0f, 127.0f);
          x[i] = q * scale;
        }
      }
      return;
  }
}

std::uint64_t wire_bytes(std::size_t n, Compression c) {
  switch (c) {
    case Compression::fp32:
      return 4ull * n;
    case Compression::fp16:
    case Compression::bf16:
      return 2ull * n;
    case Compression::int8:
      return n + 4ull * ((n + kInt8ChunkElems - 1) / kInt8ChunkElems);
  }
  return 0;
}

std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, Compression c) {
  if (k <= 1) return 0;
  return 2ull * static_cast<std::uint64_t>(k - 1) * wire_bytes(n, c) /
         static_cast<std::uint64_t>(k);
}

AverageStats LocalAverager::average(std::span<const std::span<float>> locals, Compression c) {
  if (locals.empty()) throw std::invalid_argument("LocalAverager::average: no members");
  const std::size_t n = locals[0].size();
  for (const auto& l : locals)
    if (l.size() != n)
      throw std::invalid_argument("LocalAverager::average: buffers differ in length (" +
                                  std::to_string(l.size()) + " vs " + std::to_string(n) + ")");
  const int k = static_cast<int>(locals.size());
  AverageStats stats{k, allreduce_bytes_per_member(n, k, c)};
  if (k == 1) return stats;  // nothing is sent: the worker keeps its exact pseudo-gradient
  sum_.assign(n, 0.0f);
  scratch_.resize(n);
  for (const auto& l : locals) {
    std::copy(l.begin(), l.end(), scratch_.begin());
    codec_roundtrip(scratch_, c);
    for (std::size_t i = 0; i < n; ++i) sum_[i] += scratch_[i];
  }
  const float inv_k = 1.0f / static_cast<float>(k);
  for (std::size_t i = 0; i < n; ++i) sum_[i] *= inv_k;
  codec_roundtrip(sum_, c);
  for (const auto& l : locals) std::copy(sum_.begin(), sum_.end(), l.begin());
  return stats;
}

}  // namespace loco::diloco
