// Averaging pseudo-gradients across the workers of a round, and the numerics
// of compressing them. No LibTorch here: the distributed Averager (issue 4)
// wraps runtime/collective, which knows no LibTorch either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "diloco/config.hpp"

namespace loco::diloco {

// Elements per int8 quantization chunk: each chunk carries one fp32 scale.
inline constexpr std::size_t kInt8ChunkElems = 4096;

// Replaces x by what the receiver of x, compressed with c, decodes: the fp16
// or bf16 round trip (round to nearest even), or int8 symmetric uniform
// quantization with one scale per kInt8ChunkElems chunk (scale = max|x|/127,
// q = round-half-away(x/scale) in [-127, 127]). fp32 leaves x unchanged.
// This is the one place where loco's compression math lives on the diloco
// side; the collective must decode to the same values (issue 4 can swap this
// for the collective's own codec).
// Known difference: runtime/collective's int8 (branch collective, 86f46d5) is
// min-max (asymmetric, 255 steps) per chunk of Options::chunk_bytes / 4 floats
// inside each member's part; the owner adds its own contribution unquantized
// and divides the sum by K (this function's LocalAverager multiplies by 1/K
// and quantizes every contribution). Issue 4 should make this function call that codec (with the
// same part and chunk boundaries) so that simulator and cluster agree.
void codec_roundtrip(std::span<float> x, Compression c);

// Bytes that n elements take on the wire with compression c (int8 includes the scales).
std::uint64_t wire_bytes(std::size_t n, Compression c);

// Bytes one member sends in a butterfly (reduce-scatter + all-gather) all-reduce
// of n elements among k members: 2 (k-1)/k of the compressed vector.
std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, Compression c);

struct AverageStats {
  int members = 0;               // workers in the round
  std::uint64_t bytes_sent = 0;  // by each member
};

// Averages one round's pseudo-gradients.
//
// Contract: `locals` are the buffers that this process holds (K of them in the
// simulator, one per process distributed), all of the same length. On return
// every buffer of every member of the round holds the same bytes: the mean
// over all members, computed with the numerics of `c` (each member's
// contribution decoded as codec_roundtrip does, summed in fp32 in member
// order, multiplied by 1/count in fp32, and the mean decoded once more, as the
// owner of a part quantizes it once for the all-gather). Throws on failure
// (for instance a member lost); the buffers are then unspecified.
class Averager {
 public:
  virtual ~Averager() = default;
  virtual AverageStats average(std::span<const std::span<float>> locals, Compression c) = 0;
};

// The simulator's Averager: every member is a local buffer.
class LocalAverager final : public Averager {
 public:
  AverageStats average(std::span<const std::span<float>> locals, Compression c) override;

 private:
  std::vector<float> sum_;      // reused across rounds
  std::vector<float> scratch_;  // one member's decoded contribution
};

}  // namespace loco::diloco
