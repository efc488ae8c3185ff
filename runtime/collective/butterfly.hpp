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
// Everything runs in one loop on the caller's thread that alternates receiving (and reducing)
// with producing the next chunk; the transport moves bytes meanwhile. Who is lost is decided
// by liveness.hpp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/collective/liveness.hpp"
#include "runtime/collective/transport.hpp"
#include "runtime/collective/types.hpp"
#include "runtime/core/remote_input.hpp"

namespace loco::collective::detail {

// Counts the payloads that point into the caller's input and that a transport still holds.
class InputRefs {
 public:
  // A reference for one payload; the count drops when the transport releases it.
  static std::shared_ptr<const void> take(const std::shared_ptr<InputRefs>& self);
  // Waits until no payload into the input is held, at most `limit`. True when none is.
  bool wait_released(std::chrono::milliseconds limit);

 private:
  std::mutex m_;
  std::condition_variable cv_;
  size_t count_ = 0;
};

// Encoded bytes shared by the messages that point into them; uninitialized on purpose.
struct Bytes {
  explicit Bytes(size_t n) : data(new uint8_t[n]), size(n) {}
  std::unique_ptr<uint8_t[]> data;
  size_t size;
};

// Bounds on the early messages a member keeps (Workspace::stash). kMaxStashBytes is the hard
// cap, and the bound when Options::max_floats is not known; with it, held_bytes_bound().
inline constexpr size_t kMaxStashBytes = size_t(1) << 30;
inline constexpr size_t kMinStashBytes = size_t(16) << 20;
inline constexpr size_t kMaxStashMessages = size_t(1) << 16;
inline constexpr size_t kMaxStrangerStashBytes = size_t(64) << 20;
inline constexpr size_t kMaxStrangerStashMessages = 1024;
// Round ids are the aggregator's microsecond clock (or small counters in tests): 2^40 us is
// 12.7 days, far more than any gap between two operations of one job.
inline constexpr uint64_t kMaxRoundsAhead = uint64_t(1) << 40;

// The largest payload any operation of a communicator with `options` sends: a chunk of
// min(chunk_bytes / 4, max_floats) floats in the widest codec, or an abort notice.
size_t max_payload_bytes(const Options& options);
// The early data a communicator with `options` holds at most (Workspace::stash_limit). What
// one next operation can send a member before it begins is its peers' reduce-scatter chunks of
// its part, fewer than the whole vector's 4 x max_floats bytes (all-gather data needs its own
// chunks first); twice that leaves room for a retry's leftovers or an uneven part.
size_t held_bytes_bound(const Options& options);

// What a member keeps from one operation to the next.
struct Workspace {
  Stats stats;
  Hooks hooks;
  // Messages of later operations that arrived early. Bounded in bytes (stash_limit) and count;
  // a sender that is not a member of the last operation's group shares a much smaller budget
  // (it may be joining the next one, or be no member at all); a round more than
  // kMaxRoundsAhead ahead is not kept; a payload larger than max_payload is not kept; and what
  // waits longer than `stash_ttl` is dropped, between operations too
  // (receive_between_operations).
  struct Early {
    Message m;
    Clock::time_point at;
    bool stranger = false;
  };
  std::deque<Early> stash;
  size_t stash_bytes = 0;
  size_t stranger_bytes = 0;
  size_t strangers = 0;
  Clock::duration stash_ttl = std::chrono::minutes(10);
  size_t stash_limit = kMaxStashBytes;
  size_t max_payload = size_t(1) << 32;
  // Sets the bounds above from the communicator's options.
  void configure(const Options& options);
  void stash_message(Message&& m, uint64_t round_id, bool stranger, Clock::time_point now);
  // The early messages, taken out of the stash (those past stash_ttl dropped).
  std::deque<Early> take_stash(Clock::time_point now);
  // Drops the early messages that waited past stash_ttl.
  void expire(Clock::time_point now);
  // The last operation begun: its round, its group's fingerprint and members' names (what
  // data received between operations is judged by).
  bool begun = false;
  uint64_t last_round = 0;
  uint64_t last_fp = 0;
  std::vector<std::string> last_members;
  // Messages dropped without blaming anyone (malformed, claiming another member's rank, too
  // far ahead, over the stash's bounds), counted and logged at most once per 10 s.
  uint64_t dropped = 0;
  RateLimit drop_log;
  void drop(const Message& m, const std::string& why);
  // Encoded outgoing data, each buffer reused once no message holds it any more (the last
  // chunks of one operation may still be on their way when the next one starts).
  std::vector<std::shared_ptr<Bytes>> send_buffers;
  std::shared_ptr<Bytes> send_buffer(size_t size);
  // fp32 reduce-scatter chunks are sent straight from the caller's input; turned off for good
  // if a transport ever kept one past the bound after its connections were closed.
  std::shared_ptr<InputRefs> input_refs = std::make_shared<InputRefs>();
  bool input_zero_copy = true;
  std::vector<float> scratch;
  // The longest gap between each peer's messages seen so far (liveness.hpp), by endpoint.
  std::map<std::string, Clock::duration> longest_gap;
  // The connections each peer's messages have come on (Message::link), by endpoint: their
  // bytes are evidence of life between whole messages.
  std::map<std::string, std::set<uint64_t>> links;
  bool last_ok = true;  // whether the last operation succeeded
  // Communicator::leave(): set once, from any thread; every operation from then on fails and
  // names this member lost to its peers. The reason is written before the flag.
  std::atomic<bool> leaving{false};
  std::string leave_reason;
};

// out <- the mean over `group` of the members' `in` (n floats each; `out` may not overlap
// `in`). Throws PeerLostError / CollectiveError naming the member at fault; then `in` is
// untouched, nothing refers to it any more, and `out` holds garbage. The transport is ready
// for the next operation either way.
void butterfly_allreduce(Transport& transport, Workspace& ws, const Options& options,
                         const Group& group, const float* in, float* out, size_t n);

// Between operations (nobody else may use `transport` meanwhile): takes what has arrived into
// the stash, so that data of no operation is held bounded in size and time even while none
// runs. Drops what no operation can use (malformed, larger than max_payload, of the last
// operation or before it), and what waited past stash_ttl; reads no more while the stash has
// no room for a largest payload (the rest waits in the transport, whose queues push back on
// the sender). Returns the messages taken.
size_t receive_between_operations(Transport& transport, Workspace& ws, const Options& options,
                                  Clock::time_point now);

}  // namespace loco::collective::detail
