// The collective's vocabulary: groups, codecs, options, errors and counters. No sockets, no
// threads: what the socket-free parts (codecs, the in-process all-reduce, the schedule) and
// their users (diloco's averaging) need, without declaring the Communicator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/collective/compression.hpp"
#include "runtime/security/keys.hpp"

namespace loco::collective {

struct Member {
  std::string name;      // for error messages and logs, e.g. "w3"
  std::string endpoint;  // the member's Communicator::endpoint(), e.g. "tcp://10.0.0.3:7201"
  // Members behind NAT (docs/guide/nat.md, "Members behind NAT"). false: nobody can connect to
  // this member (Options::outbound_only; its endpoint is then a name, "nat://..."). A member
  // sends to a reachable member B over its own connection to B; to an unreachable one A, when
  // it is reachable itself, over A's connection to it; and when neither is, through the
  // group's relay, sealed end to end. Defaults: reachable, as before.
  bool reachable = true;
  // The member's Communicator::kx_public(): its ephemeral key-exchange public key, 64 hex
  // characters. Needed only for a pair that exchanges through the relay ("" otherwise).
  std::string kx_public;
};

// A member as its endpoint describes it: a member behind NAT publishes "nat://" and its
// key-exchange public key (Communicator::endpoint() with Options::outbound_only), which says both
// that it is unreachable and how to seal for it; any other endpoint is reachable.
inline Member member_at(std::string name, std::string endpoint) {
  constexpr std::string_view kNat = "nat://";
  Member m{std::move(name), std::move(endpoint)};
  if (m.endpoint.starts_with(kNat)) {
    m.reachable = false;
    m.kx_public = m.endpoint.substr(kNat.size());
  }
  return m;
}

// A reachable process that forwards between members that cannot reach each other
// (runtime/collective/relay.hpp, `loco relay`). Sees routing ids, sizes and timing, never
// plaintext; cannot forge.
struct RelayEndpoint {
  std::string endpoint;    // e.g. "tcp://relay.example:7300"
  std::string public_key;  // the relay's own CURVE public key (Z85); unused without CURVE
};

struct Group {
  std::vector<Member> members;  // the same list, in the same order, on every member
  int rank = 0;                 // this process's index in `members`
  uint64_t round_id = 0;        // data of other rounds is never mixed into this one
  // Relative sizes of the members' parts, one per member (empty: equal parts). A member that
  // owns a part of p floats of n sends n - p + (k-1) p of them, so a member on a slower link
  // should own a smaller part: part_weights_for_rates() (local.hpp) computes them from
  // measured sending rates. Finite, >= 0, not all 0; the same on every member (they are part
  // of the group's identity, like its members).
  std::vector<double> part_weights;
  // Members whose contributions are left out of the mean (a robustness guard's decision: a
  // pseudo-gradient that is NaN, scaled or sign-flipped), one flag per member, nonzero: left
  // out (empty, or all 0: nobody, bit for bit the plain mean). The mean is the sum, in rank
  // order, of the other members' contributions divided by their count; all zeros when every
  // member is left out. A left-out member still takes part: it owns its part, reduces the
  // others' contributions for it, and receives the mean; it only sends no contribution.
  // The same on every member, like part_weights: part of the group's identity (its
  // fingerprint), so members that disagree refuse each other's data instead of mixing it, and
  // the operation fails (each waits out the other's silence window: PeerLostError).
  // One flag per member or none, else CollectiveError before anything is sent. allgather()
  // gathers every member's blob whatever it says (its caller skips what it leaves out).
  std::vector<uint8_t> left_out;
  // Where two unreachable members (Member::reachable false) exchange; needed only when the
  // group has two of them. Not part of the group's fingerprint.
  RelayEndpoint relay;
  // One operation of several exchanges, each under a round id of its own, in order (DiLoCo's
  // guard: the summaries' all-gather, then the data's all-reduce), which its members, when one
  // is lost in any of them, run again from the first without it: its round ids are
  // [first_phase, last_phase], round_id among them (both 0: round_id alone). A member's message
  // of another of them is then neither a leftover (an earlier exchange's: its sender went back
  // to the first) nor proof that it moved on (a later one's: it is still in the attempt before,
  // and will come back when it learns of the loss): it is kept for the exchange it belongs to.
  // An earlier exchange's says its sender is alive; a later one's says nothing (it may have
  // finished this one, what it sent here lost on the way: its silence here must tell, or each
  // waits for the other for ever). Its notice that it gave up an earlier exchange of this same
  // group fails this one as it failed there (a member lost there is lost here). The same on
  // every member; not part of the fingerprint.
  uint64_t first_phase = 0;
  uint64_t last_phase = 0;
};

struct Options {
  Codec codec = Codec::fp32;
  // Liveness. Members send each other keepalives every peer_timeout / 4 on a connection of
  // their own, beside the data, so that a slow data stream never delays them. A member that
  // the operation still waits on (data expected from it, or queued for it) is lost when its
  // connection closes, or when nothing at all (keepalive or data) arrived from it for its
  // silence window: peer_timeout, widened to twice the longest gap this communicator has seen
  // between that member's messages (a link that stalls TCP for seconds), at most
  // 4 x peer_timeout. See liveness.hpp.
  std::chrono::milliseconds peer_timeout{3000};
  // A peer whose connection is open but that has sent nothing yet in an operation may take this
  // long to begin it (0: peer_timeout, as any silence). For members that enter an operation
  // far apart by design, as Streaming DiLoCo's fragments do (a worker may reach a fragment's
  // synchronization a fragment interval after another): they are not lost, only behind. A peer
  // whose process is gone is still lost at once, by its closed connection.
  std::chrono::milliseconds entry_timeout{0};
  // Parts are streamed in chunks of this many fp32 bytes (before compression). Set it before
  // the Communicator is built: its socket refuses larger frames from then on.
  size_t chunk_bytes = 512 * 1024;
  // The longest vector this communicator will ever reduce, in floats (a DiLoCo worker: its
  // model's parameter count); 0: not known. Bounds what peers may make it hold: no frame
  // larger than a chunk of min(chunk_bytes / 4, max_floats) floats is taken at all, and data
  // for no running operation is held up to 2 x 4 x max_floats bytes (16 MiB to 1 GiB);
  // without it, 1 GiB.
  size_t max_floats = 0;
  // Reject NaN/Inf contributions with a CollectiveError naming the sender.
  bool reject_nonfinite = true;
  // ZeroMQ I/O threads of a communicator that owns its context: on loopback the kernel copies
  // run on them, and two let sends and receives proceed in parallel.
  int io_threads = 2;
  // CURVE on the data socket and on the connections to peers, admitting only the cluster's
  // keys (runtime/security/keys.hpp). Plain TCP by default here, for in-process tests and
  // benches that compare both; a job's workers use their node's settings
  // (loco::Runtime::security()).
  security::Settings security;
  // Behind NAT: bind nothing that peers would dial. The communicator's endpoint() is then a
  // name ("nat://" and its key-exchange public key), its Member has reachable = false, and it
  // connects out to reachable peers and to the group's relay. Set before construction.
  bool outbound_only = false;
};

// Any failure of an operation. member() names the member at fault, when one is known.
class CollectiveError : public std::runtime_error {
 public:
  CollectiveError(const std::string& what, std::string member = {})
      : std::runtime_error(what), member_(std::move(member)) {}
  const std::string& member() const { return member_; }

 private:
  std::string member_;
};

// A member died or went silent during the operation.
class PeerLostError : public CollectiveError {
 public:
  PeerLostError(const std::string& what, std::string peer)
      : CollectiveError(what, peer), peer_(std::move(peer)) {}
  const std::string& peer() const { return peer_; }

 private:
  std::string peer_;
};

struct Stats {
  uint64_t bytes_sent = 0;      // payload + loco framing (header frames), all peers
  uint64_t bytes_received = 0;  // same, of the messages of this operation
  uint64_t payload_bytes_sent = 0;
  uint64_t messages_sent = 0;
  double seconds = 0;
  // This member's sending rate, rate_bytes / rate_seconds: the payload bytes ZeroMQ had taken
  // from it when it took its last reduce-scatter chunk, and the time until then (0 and 0 when
  // it had none to send). Until then it always has data queued, so its own link sets the pace,
  // not the other members; this is what part_weights_for_rates() wants. Only meaningful when
  // what it sends is much more than the kernel's socket buffers hold (MBs per peer): a small
  // vector is taken at once, whatever the link. A member left out of the mean
  // (Group::left_out) sends no reduce-scatter chunk: 0 and 0.
  uint64_t rate_bytes = 0;
  double rate_seconds = 0;
};

namespace detail {
// Test hooks; production code leaves them empty.
struct Hooks {
  // Called after each data message this member sends (argument: messages sent so far).
  std::function<void(uint64_t)> after_send;
};
}  // namespace detail

}  // namespace loco::collective
