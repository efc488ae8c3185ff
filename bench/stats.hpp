// Statistics the benchmarks report.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace loco::bench {

// The median of `v` (the mean of the two middle values for an even count); v is not empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The seconds `f()` takes (steady clock).
inline double seconds_of(auto&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// n roughly normal values of standard deviation ~1e-3 (a sum of four uniforms), the same on
// every run; `stream` picks another sequence (a pseudo-gradient per member).
inline std::vector<float> gradient_like(size_t n, uint64_t stream = 0) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t z = mix(i * 0x9e3779b97f4a7c15ull + 12345 + stream * 0x51ed27ull);
    float s = 0;
    for (int q = 0; q < 4; ++q) s += static_cast<float>((z >> (16 * q)) & 0xffff) / 65536.0f;
    x[i] = (s - 2.0f) * 1.7e-3f;
  }
  return x;
}

}  // namespace loco::bench
