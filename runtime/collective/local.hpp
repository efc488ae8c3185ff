// The collective's arithmetic without its sockets: what every member of Communicator::allreduce
// ends up holding, computed in one process from all K inputs. diloco's simulator averages
// through it, so that its numbers are those of a distributed run, compression included.
// Library loco_collective_codec (this and the codecs): no ZeroMQ, no threads, no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/collective/types.hpp"

namespace loco::collective {

// out <- the mean that allreduce() with `options` (codec, chunk_bytes, reject_nonfinite) gives
// every member of a K-member group whose rank r contributes inputs[r]:
//   the vector is cut into K parts (part p = [p n/K, (p+1) n/K)), each part into chunks of
//   chunk_bytes/4 floats; for each chunk of part p, its owner p adds, in rank order, its own
//   values as they are and every other member's after the codec's round trip, divides by K,
//   encodes the result once, and everyone (the owner too) uses its decoding.
// `left_out` is Group::left_out: the members it flags are not among the addends and not
// counted in the division (all zeros when it flags everyone); their inputs are never read.
// Bit for bit what the Communicator computes (tests/diloco/core_test checks it against one).
// K = 1 copies (or zeros, left out). Throws CollectiveError for a non-finite mean when
// options.reject_nonfinite, naming a member whose input is not finite, and for a `left_out`
// that is neither empty nor one flag per input. `out` must have the inputs' length and must
// not overlap them.
void local_allreduce(std::span<const std::span<const float>> inputs, std::span<float> out,
                     const Options& options = {}, std::span<const uint8_t> left_out = {});

// x <- decode(encode(x)), chunk by chunk of chunk_bytes/4 floats: what a receiver of x gets.
void codec_roundtrip(Codec codec, std::span<float> x, size_t chunk_bytes = Options{}.chunk_bytes);

// Payload bytes (framing excluded) that one member sends in allreduce() of n floats among k
// members, averaged over the members: the reduce-scatter sends the other parts' encoded chunks,
// the all-gather the own part's to each of the k - 1 others, 2 (k-1)/k of the encoded vector.
uint64_t allreduce_payload_bytes(size_t n, int k, Codec codec,
                                 size_t chunk_bytes = Options{}.chunk_bytes);
// Payload bytes that member `rank` sends, with parts cut by `weights` (empty: equal parts).
// A member that `left_out` (Group::left_out) flags sends only its own part's all-gather; the
// others send what they would without it (a left-out member still owns its part).
uint64_t allreduce_payload_bytes_of(size_t n, int k, int rank, Codec codec,
                                    std::span<const double> weights = {},
                                    std::span<const uint8_t> left_out = {},
                                    size_t chunk_bytes = Options{}.chunk_bytes);

// Where the k parts of n floats begin, and n at the end (k + 1 values): part p is
// [p n/k, (p+1) n/k) with no weights, else cut at n times the cumulative weight share, rounded
// down. Throws CollectiveError for weights of another count, negative, non-finite or all 0.
std::vector<size_t> part_bounds(size_t n, size_t k, std::span<const double> weights = {});

// Group::left_out for k members: empty, or one flag per member; else CollectiveError.
void check_left_out(std::span<const uint8_t> left_out, size_t k);
// Whether member r's contribution is left out of the mean (`left_out` checked as above).
inline bool is_left_out(std::span<const uint8_t> left_out, size_t r) {
  return !left_out.empty() && left_out[r] != 0;
}

// Part weights for members that send at `rates` (bytes/s, or any common unit), that make
// their sending times equal where they can: owning p of n floats, a member sends
// n + (k-2) p, so it gets p = (T rate - n) / (k-2) for the T that sums the parts to n;
// a member too slow for any part gets 0 (it still sends n). Equal weights for k <= 2 (the
// part changes nothing there), when a rate is not finite or <= 0 (nothing to go by), or when
// the fastest is within kEqualRates of the slowest (measurement noise, not slower links).
inline constexpr double kEqualRates = 1.1;
std::vector<double> part_weights_for_rates(std::span<const double> rates);

}  // namespace loco::collective
