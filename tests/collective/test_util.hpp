// Shared by the collective tests and their member process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/collective/types.hpp"

namespace loco::collective::testing {

// A reproducible value in [-1, 1) for (seed, rank, index).
inline float value(uint64_t seed, int rank, size_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
               i * 0x94d049bb133111ebull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23)) - 1.0f;
}

inline std::vector<float> make_data(uint64_t seed, int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(seed, rank, i);
  return v;
}

inline uint64_t hash_floats(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace loco::collective::testing
