// Butterfly all-reduce (mean) of float buffers among a group of peers, over ZeroMQ; and an
// all-gather of byte blobs (allgather()) under the same rules.
//
// Contract:
// - Every member of a group calls allreduce() with the same Group (same members in the same
//   order, same round id; only `rank` differs) and a vector of the same length.
// - Afterwards every member holds bit-identical values: the mean over the members. The owner
//   of a part sums the contributions in rank order, divides, encodes the result once with the
//   codec, and every member (the owner too) decodes those same bytes.
// - Group::left_out leaves members' contributions out of the mean (a robustness guard's
//   decision, the same on every member): the mean is then over the others (zeros when nobody
//   is left), and a left-out member sends no contribution at all, so a NaN in its input is
//   neither sent nor rejected. It still owns its part, reduces the others' contributions for
//   it, and receives the mean. An empty mask, or one of zeros, is the plain mean bit for bit.
// - Bulk data travels on the communicator's own ZeroMQ sockets, never on the actor runtime's
//   control socket.
// - No wait is unbounded: a member whose connection drops or is refused (its process died),
//   or that falls silent (no keepalive, no data) for its silence window (Options::peer_timeout,
//   see liveness.hpp), makes the operation fail with PeerLostError naming it. A member whose
//   data only moves slowly is not lost: keepalives travel beside the data.
// - A failed operation leaves the communicator ready for the next one: with the survivors
//   (a smaller group), or with the same members again. It closes its connections, dropping
//   what was queued, and the next operation opens new ones; its endpoint stays the same.
// - Messages of different operations are told apart by (round_id, members): data of a later
//   operation that arrives early is kept for it, data of an earlier one is dropped. So retrying
//   a failed operation with the same members needs a new round_id (fold an attempt counter in);
//   the usual retry, without the lost member, may keep the round id. An operation of several
//   exchanges retried from its first (Group::first_phase) keeps its other exchanges' data too.
// - One operation at a time per Communicator; it is not thread-safe (but for leave()). Between
//   operations a thread of its own takes what arrives, bounded (butterfly.hpp's
//   receive_between_operations).
//
// Layers (each its own file): types.hpp (this vocabulary, no sockets), wire.hpp (the message
// header and abort notices), transport.hpp (what the schedule needs of a network, with
// zmq_transport.hpp and the socket-free memory_transport.hpp), liveness.hpp (who counts as
// lost: pure functions of the clock), operation.hpp (what every operation shares: the loop,
// round ids, early data, failures), butterfly.hpp and gather.hpp (the schedules), and this
// Communicator, which ties the schedules to a ZmqTransport.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/collective/types.hpp"

namespace zmq {
class context_t;
}

namespace loco::collective {

namespace detail {
struct CommunicatorImpl;
}  // namespace detail

class Communicator {
 public:
  // Members behind NAT (Options::outbound_only, Member::reachable, Group::relay): see
  // docs/guide/nat.md, "Members behind NAT: reverse connections and the relay".
  //
  // Binds the data socket (CollectiveError if it cannot). "tcp://HOST:0" picks a free port;
  // endpoint() reports the result. Bound to a wildcard ("tcp://0.0.0.0:0"), publish a routable
  // address with the same port.
  // Pass a shared ZeroMQ context to use "inproc://" endpoints between communicators of
  // one process; otherwise the communicator owns its context.
  // Side effect, once per process: glibc's M_MMAP_THRESHOLD (32 MiB) and M_TRIM_THRESHOLD
  // (256 MiB) are fixed, so that received chunks do not go back and forth to the kernel
  // (~30 % faster on loopback); set LOCO_COLLECTIVE_KEEP_MALLOC=1 in the environment to skip.
  explicit Communicator(const std::string& bind_endpoint = "tcp://127.0.0.1:0",
                        Options options = {}, std::shared_ptr<zmq::context_t> context = nullptr);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // The endpoint peers connect to (publish it as Member::endpoint). With
  // Options::outbound_only nothing is bound: a name, "nat://" and kx_public().
  const std::string& endpoint() const;
  // This communicator's ephemeral key-exchange public key (publish it as Member::kx_public):
  // what a peer that reaches it only through a relay seals its messages with (seal.hpp).
  std::string kx_public() const;
  // Messages that came through a relay and failed to authenticate (dropped undecoded).
  uint64_t unauthentic_messages() const;
  Options& options();
  detail::Hooks& hooks();

  // Replaces `data` by the mean over the group. Throws PeerLostError / CollectiveError, and
  // then leaves `data` unchanged (the survivors run again with the same inputs).
  void allreduce(const Group& group, std::span<float> data);
  // Writes the mean of the members' `in` to `out` (same length, not overlapping), saving the
  // in-place variant's final copy. On failure `out` holds garbage and `in` is untouched.
  // fp32 over tcp/ipc sends from `in` without copying it; when the call returns (or throws)
  // nothing refers to `in` any more: the caller may change or free it at once.
  void allreduce(const Group& group, std::span<const float> in, std::span<float> out);
  // Several tensors in one operation, as if concatenated in this order (through one copy);
  // unchanged on failure.
  void allreduce(const Group& group, const std::vector<std::span<float>>& tensors);

  // All-gather of byte blobs (sparse, top-k encoded pseudo-gradients): every member of `group`
  // contributes `mine`, of any length of its own (0 too), and gets every member's blob in group
  // order, its own included, bit for bit, so that all decode the same bytes in the same order.
  // A member's blob longer than `max_bytes` is refused with a CollectiveError naming that member
  // (a peer's checked from its first piece's header, before anything is allocated for it), so
  // this member holds at most (K-1) x max_bytes of blobs besides the bounded early data; give
  // every member the same bound (one that allows its own blob more than its peers do may finish
  // while they refuse it). Round ids, liveness, failures and retries are the all-reduce's
  // (above): PeerLostError names a lost member, and the survivors may retry without it under the
  // same round id. An all-gather and an all-reduce need round ids of their own: under one, each
  // refuses the other's data and both fail. Sends `mine` to each of the K-1 others, in pieces of
  // Options::chunk_bytes; last_stats() counts the bytes. `mine` is copied: the caller may change
  // or free it once the call returns or throws.
  std::vector<std::vector<uint8_t>> allgather(const Group& group, std::span<const uint8_t> mine,
                                              size_t max_bytes);

  // Counters of the last operation (also after a failure, up to the failure).
  const Stats& last_stats() const;
  // Data received for no running operation and kept for a later one: its payload bytes (at
  // most Options::max_floats x 8, 16 MiB to 1 GiB; see types.hpp), and the messages dropped
  // so far without blaming anyone (malformed, oversized, expired, over a bound). Between
  // operations a thread of the communicator receives, so that these bounds hold while none
  // runs; during one, these wait for it to end.
  size_t held_bytes() const;
  uint64_t dropped_messages() const;

  // This member leaves for good (its process is stopping): the operation in progress, if any,
  // fails within its poll interval (100 ms), and so does every later one, at once. Each tells
  // its peers, on the control channel, that this member is lost (`reason` in the notice), so
  // that they fail with PeerLostError naming it and can go on without it instead of waiting
  // out its silence window. Thread-safe: the one call that may come from another thread than
  // the operation's. Only the first call's reason is kept.
  void leave(const std::string& reason);
  bool has_left() const;
  // The member at `endpoint` is gone for good, as one who knows says (a job's aggregator, told
  // by the cluster's head that the member's node died): an operation that has it as a member
  // fails within its poll interval with PeerLostError naming it, the one in progress too,
  // instead of waiting out its entry window. A member behind NAT that dies before it enters an
  // operation closes no connection of ours (its connection was to the relay), and its peers
  // waited the whole window (60 s: the soak bench, issue 25). By endpoint, not name: a member
  // that comes back under its name has a new one. Thread-safe, as leave(); the newest 1,024
  // are kept. With `below_round_id` (not 0) only the operations whose round id is below it:
  // the member is out of the rounds planned so far (its planner lost its answer) but may
  // come back, under the same endpoint, in a later one.
  void peer_gone(const std::string& endpoint, const std::string& reason,
                 uint64_t below_round_id = 0);
  // Every operation whose round id is below `round_id` is given up, as whoever planned them
  // says (a job's aggregator that sends its job back to a checkpoint while the members still
  // run a round it sent ahead): the one in progress fails within its poll interval, and one
  // begun later at once, with CollectiveError naming `reason`; later round ids are not
  // touched. Without it, members that went on into a round that some member had already
  // failed waited out that member's entry window in each of the round's operations (minutes:
  // the soak bench's calibration, 2026-11-29). Thread-safe, as leave(); the bound only rises.
  // `as_lost`: this member leaves those operations as leave() does (the others are told it is
  // lost, and finish them without it) instead of failing them for everyone: its planner no
  // longer counts it in those rounds.
  void give_up_below(uint64_t round_id, const std::string& reason, bool as_lost = false);
  // The caller starts its work anew (a job that went back to a checkpoint): what it finished
  // before says nothing of its peers from now on. A peer's notice that it gave up the last
  // operation this member finished, arriving in a later one, otherwise means that the peer
  // will not come to it, and fails it at once; after a rewind the peer does come, and that
  // notice (late, through a relay that was down) failed the redone round too: one fault, two
  // rewinds (the soak's smoke, 2026-12-01). Thread-safe, as leave(): the next operation to
  // begin forgets it, one in progress is not touched.
  void new_attempt();

 private:
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace loco::collective
