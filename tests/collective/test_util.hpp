// Shared by the collective tests and their member process.
#pragma once

#include <bit>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collective/types.hpp"

namespace loco::collective::testing {

// Runs fn(i) for each i in [0, n), each on a thread of its own (the members of one operation),
// and returns what each threw (null where it returned).
template <typename F>
std::vector<std::exception_ptr> on_threads(size_t n, F fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

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

// A reproducible blob of `bytes` bytes for (seed, rank).
inline std::vector<uint8_t> make_blob(uint64_t seed, int rank, size_t bytes) {
  std::vector<uint8_t> b(bytes);
  for (size_t i = 0; i < bytes; ++i)
    b[i] = static_cast<uint8_t>(std::bit_cast<uint32_t>(value(seed, rank, i)) >> 7);
  return b;
}

// A hash of blobs in order, their lengths included.
inline uint64_t hash_blobs(const std::vector<std::vector<uint8_t>>& blobs) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint8_t c) { h = (h ^ c) * 1099511628211ull; };
  for (const auto& b : blobs) {
    for (int i = 0; i < 8; ++i) mix(static_cast<uint8_t>(b.size() >> (8 * i)));
    for (uint8_t c : b) mix(c);
  }
  return h;
}

}  // namespace loco::collective::testing
