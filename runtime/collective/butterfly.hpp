// The butterfly all-reduce schedule over a Transport. Internal to the collective; the public
// face is Communicator (allreduce.hpp), which pairs it with a ZmqTransport.
//
// One operation, on member `me` of K: the vector of n floats is cut into K parts (part_bounds),
// each part into chunks of chunk_bytes/4 floats.
//   reduce-scatter: me sends chunk c of part p (encoded) to p, for c = 0.. and p = me+1.., so
//                   that every owner gets its first chunks from everyone early; fp32 chunks
//                   point into the caller's input where the transport allows it (zero-copy),
//                   and the operation returns only once the transport has let go of them;
//   reduce:         when the K-1 contributions for chunk c of my part are in, sum them with
//                   mine in rank order, divide by K, encode once, decode into my result;
//   all-gather:     send those encoded bytes (shared, uncopied) to every peer.
// Members left out of the mean (Group::left_out) send no reduce-scatter chunk, and nobody
// expects one from them (one that comes anyway fails the round as a mismatch naming its
// sender). A chunk reduces when the contributions of the m members included are in: the owner
// adds them in rank order (its own values only if it is included itself) and divides by m;
// with m = 0 the result is zeros. A left-out member still owns its part and receives the
// all-gather, so all it sends is its part's all-gather, (K-1) x its part.
// Everything runs in one loop on the caller's thread that alternates receiving (and reducing)
// with producing the next chunk; the transport moves bytes meanwhile. The loop, round ids,
// early data, liveness and failures are the Operation's (operation.hpp); this is the schedule.
#pragma once

#include <cstddef>

#include "runtime/collective/operation.hpp"

namespace loco::collective::detail {

// out <- the mean over `group` of the members' `in` (n floats each; `out` may not overlap
// `in`). Throws PeerLostError / CollectiveError naming the member at fault; then `in` is
// untouched, nothing refers to it any more, and `out` holds garbage. The transport is ready
// for the next operation either way.
void butterfly_allreduce(Transport& transport, Workspace& ws, const Options& options,
                         const Group& group, const float* in, float* out, size_t n);

}  // namespace loco::collective::detail
