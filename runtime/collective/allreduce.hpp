// Butterfly all-reduce (mean) of float buffers among a group of peers.
//
// Contract:
// - Every member of a group calls allreduce() with the same Group (same members in the same
//   order, same round id; only `rank` differs) and a vector of the same length.
// - Afterwards every member holds bit-identical values: the mean over the members. The owner
//   of a part sums the contributions in rank order, divides, encodes the result once with the
//   codec, and every member (the owner too) decodes those same bytes.
// - Bulk data travels on the communicator's own ZeroMQ sockets, never on the actor runtime's
//   control socket.
// - No wait is unbounded: a member whose connection drops or is refused (its process died),
//   or that stops sending for Options::peer_timeout, makes the operation fail with
//   PeerLostError naming it. (A member that is only waiting, on a lost peer for instance, sends
//   keepalives every peer_timeout / 4, so that the others do not take it for lost.) A failed
//   operation leaves the communicator ready for the next one (typically the survivors, with a
//   smaller group).
// - Messages of different operations are told apart by (round_id, members): data of a later
//   operation that arrives early is kept for it, data of an earlier one is dropped. So retrying
//   a failed operation with the same members needs a new round_id (fold an attempt counter in);
//   the usual retry, without the lost member, may keep the round id.
// - One operation at a time per Communicator; it is not thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace zmq {
class context_t;
}

namespace loco::collective {

struct Member {
  std::string name;      // for error messages and logs, e.g. "w3"
  std::string endpoint;  // the member's Communicator::endpoint(), e.g. "tcp://10.0.0.3:7201"
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
};

enum class Codec : uint8_t { fp32, fp16, bf16, int8 };

// "fp32" | "fp16" | "bf16" | "int8"; std::nullopt for anything else.
std::optional<Codec> parse_codec(std::string_view name);
std::string_view to_string(Codec codec);
// Encoded bytes for `count` floats (int8 adds a per-chunk header).
size_t encoded_bytes(Codec codec, size_t count);

struct Options {
  Codec codec = Codec::fp32;
  // A member from which data is still expected and nothing arrived for this long is lost.
  std::chrono::milliseconds peer_timeout{3000};
  // Parts are streamed in chunks of this many fp32 bytes (before compression).
  size_t chunk_bytes = 512 * 1024;
  // Reject NaN/Inf contributions with a CollectiveError naming the sender.
  bool reject_nonfinite = true;
  // ZeroMQ I/O threads of a communicator that owns its context: on loopback the kernel copies
  // run on them, and two let sends and receives proceed in parallel.
  int io_threads = 2;
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
  // vector is taken at once, whatever the link.
  uint64_t rate_bytes = 0;
  double rate_seconds = 0;
};

namespace detail {
// Test hooks; production code leaves them empty.
struct Hooks {
  // Called after each data message this member sends (argument: messages sent so far).
  std::function<void(uint64_t)> after_send;
};
struct CommunicatorImpl;
}  // namespace detail

class Communicator {
 public:
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

  // The endpoint peers connect to (publish it as Member::endpoint).
  const std::string& endpoint() const;
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

  // Counters of the last operation (also after a failure, up to the failure).
  const Stats& last_stats() const;

 private:
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace loco::collective
