// The collective's arithmetic without its sockets: what every member of Communicator::allreduce
// ends up holding, computed in one process from all K inputs. diloco's simulator averages
// through it, so that its numbers are those of a distributed run, compression included.
// Library loco_collective_codec (this and the codecs): no ZeroMQ, no threads, no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "runtime/collective/allreduce.hpp"

namespace loco::collective {

// out <- the mean that allreduce() with `options` (codec, chunk_bytes, reject_nonfinite) gives
// every member of a K-member group whose rank r contributes inputs[r]:
//   the vector is cut into K parts (part p = [p n/K, (p+1) n/K)), each part into chunks of
//   chunk_bytes/4 floats; for each chunk of part p, its owner p adds, in rank order, its own
//   values as they are and every other member's after the codec's round trip, divides by K,
//   encodes the result once, and everyone (the owner too) uses its decoding.
// Bit for bit what the Communicator computes (tests/diloco/core_test checks it against one).
// K = 1 copies. Throws CollectiveError for a non-finite mean when options.reject_nonfinite.
// `out` must have the inputs' length and must not overlap them.
void local_allreduce(std::span<const std::span<const float>> inputs, std::span<float> out,
                     const Options& options = {});

// x <- decode(encode(x)), chunk by chunk of chunk_bytes/4 floats: what a receiver of x gets.
void codec_roundtrip(Codec codec, std::span<float> x, size_t chunk_bytes = Options{}.chunk_bytes);

// Payload bytes (framing excluded) that one member sends in allreduce() of n floats among k
// members, averaged over the members: the reduce-scatter sends the other parts' encoded chunks,
// the all-gather the own part's to each of the k - 1 others, 2 (k-1)/k of the encoded vector.
uint64_t allreduce_payload_bytes(size_t n, int k, Codec codec,
                                 size_t chunk_bytes = Options{}.chunk_bytes);

}  // namespace loco::collective
