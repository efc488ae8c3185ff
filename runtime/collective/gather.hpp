// The all-gather of byte blobs over a Transport: every member contributes one blob (of any
// length, its own), and every member gets every member's, in group order. Internal to the
// collective; the public face is Communicator::allgather (allreduce.hpp).
//
// Schedule: direct. Each member sends its blob to each of the K-1 others, in pieces of
// blob_piece_bytes(), one piece per peer in turn, skipping a peer whose queue is still full,
// so that a slow peer does not hold back the others; a receiver appends each peer's pieces in
// the order they come (a connection delivers in order), having checked the blob's length from
// its first piece against max_bytes before allocating anything. A member sends (K-1) b of its
// blob b and receives the sum of the others' blobs: the least any schedule can (a ring moves
// the same bytes over K-1 steps; see docs/guide/collective.md). The loop, liveness, round ids,
// early data and failures are the Operation's (operation.hpp), as for the all-reduce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/collective/operation.hpp"

namespace loco::collective::detail {

// The largest piece of a blob a member sends: a chunk (Options::chunk_bytes), at most the
// largest frame a communicator with these options takes (max_payload_bytes).
size_t blob_piece_bytes(const Options& options);

// Every member's blob, in group order (`mine` at group.rank). Throws CollectiveError naming a
// member whose blob is longer than `max_bytes` (this one's before it sends anything, a peer's
// from its first piece's header), PeerLostError / CollectiveError as the all-reduce does. The
// transport is ready for the next operation either way.
std::vector<std::vector<uint8_t>> gather_blobs(Transport& transport, Workspace& ws,
                                               const Options& options, const Group& group,
                                               std::span<const uint8_t> mine, size_t max_bytes);

}  // namespace loco::collective::detail
