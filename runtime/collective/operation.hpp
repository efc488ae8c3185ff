// What every operation of the collective shares, whatever its schedule (butterfly.hpp's
// all-reduce, gather.hpp's all-gather). Internal to the collective.
//
// - Workspace: what a member keeps from one operation to the next: early data of later
//   operations (the stash, bounded in bytes, messages and time), send buffers, what liveness
//   learnt of each peer's link, the counters of the last operation.
// - Operation: one operation on one member, apart from what it sends. It opens with a hello on
//   every data connection, sends keepalives on the control one, hands queued messages to the
//   transport as it takes them, tells this operation's messages from those of others (round id
//   and group fingerprint: early data kept, late data dropped), checks each message
//   (check_message, rank against name), judges the peers it waits on (liveness.hpp), and on a
//   failure tells the others. A schedule is a subclass: what it sends (produce), what it still
//   expects from each peer (expecting) and what it does with a peer's data (handle_data).
// - run_operation: runs one to its end, or abandons it and throws the error that names the
//   member at fault; the transport is ready for the next operation either way.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
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

// `bytes[offset, offset + len)`, sharing their ownership.
inline Buffer shared_slice(const std::shared_ptr<Bytes>& bytes, size_t offset, size_t len) {
  return Buffer{bytes->data.get() + offset, len, bytes};
}

// "3.0 s", for messages.
std::string seconds_str(Clock::duration d);

// Whether `round_id` is one of the exchanges of g's operation (Group::first_phase).
bool in_phases(const Group& g, uint64_t round_id);

// Bounds on the early messages a member keeps (Workspace::stash). kMaxStashBytes is the hard
// cap, and the bound when Options::max_floats is not known; with it, held_bytes_bound().
inline constexpr size_t kMaxStashBytes = size_t(1) << 30;
// Communicator::peer_gone's endpoints kept (the newest).
inline constexpr size_t kMaxGonePeers = 1024;
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
// one next all-reduce can send a member before it begins is its peers' reduce-scatter chunks of
// its part, fewer than the whole vector's 4 x max_floats bytes (its all-gather phase needs the
// member's chunks first); twice that leaves room for a retry's leftovers or an uneven part. A
// next all-gather of blobs sends it the others' blobs, (K-1) x b: far less for top-k blobs of a
// hundredth of the vector.
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
  uint64_t last_first_phase = 0;  // its Group::first_phase, or its round when it has none
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
  // The round id and group fingerprint of the last operation that succeeded: a member's abort
  // notice of that operation, arriving in a later one, says that it gave up what we finished.
  std::optional<std::pair<uint64_t, uint64_t>> finished;
  // Communicator::new_attempt(), from any thread: the next operation to begin forgets
  // `finished`. Across an attempt that rule is false: a member that gave up an operation of the
  // attempt before comes to the operations of this one.
  std::atomic<bool> attempt_begun{false};
  // Communicator::leave(): set once, from any thread; every operation from then on fails and
  // names this member lost to its peers. The reason is written before the flag.
  std::atomic<bool> leaving{false};
  std::string leave_reason;
  // Communicator::peer_gone(): endpoints of members gone, with why, from any thread (the newest
  // kMaxGonePeers): for good, or with `below` (not 0) for round ids below it only.
  // `gone_generation` counts the calls, so that an operation looks its peers up again only
  // after a new one.
  struct Gone {
    std::string endpoint, reason;
    uint64_t below = 0;
  };
  void note_gone(const std::string& endpoint, const std::string& reason, uint64_t below);
  std::optional<std::string> gone_reason(const std::string& endpoint, uint64_t round_id);
  std::mutex gone_mu;
  std::deque<Gone> gone;
  std::atomic<uint64_t> gone_generation{0};
  // Communicator::give_up_below(): operations below this round id fail (0: none), with why
  // (under gone_mu).
  void give_up_below(uint64_t round_id, const std::string& reason, bool as_lost);
  std::atomic<uint64_t> given_up_below{0};
  std::string given_up_reason;
  bool given_up_as_lost = false;  // left as lost (Communicator::give_up_below's as_lost)
};

// Thrown inside an operation; carries what the other members should be told.
struct OpFailure {
  AbortKind kind;
  std::string culprit;
  std::string message;
  bool broadcast;
};

// One operation on one member (see the top of this file). Not reusable: one object per call.
class Operation {
 public:
  // `codec` and `total_n` are the operation's shape, carried by every message it sends: a peer
  // whose mismatch notice carries another shape is the odd one, whatever it blames.
  Operation(Transport& t, Workspace& ws, const Options& options, const Group& group, Codec codec,
            uint64_t total_n);
  virtual ~Operation() = default;
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

  uint64_t round_id() const { return g_.round_id; }
  uint64_t group_fingerprint() const { return fp_; }
  bool is_member(const std::string& name) const { return rank_of(name) >= 0; }
  // Whether `round_id` is one of this operation's exchanges (Group::first_phase..last_phase).
  bool has_phase(uint64_t round_id) const { return in_phases(g_, round_id); }
  // Runs the operation until this member has sent all it sends and received all it expects.
  // Throws OpFailure.
  void run();
  // After run() succeeded: our last data may still be on its way to peers that wait for it
  // (in ZeroMQ's queue, or in the kernel unacknowledged). On a saturated link TCP can hold
  // those bytes back for longer than the peers' silence window (exponential retransmission
  // backoff), and a member that has returned sends nothing more: it would be taken for lost.
  // So it keeps sending keepalives to each such peer until the peer's kernel has all its
  // bytes, the peer aborts or closes, or falls silent for its window; at most
  // kMaxWidening x peer_timeout in all. Messages of later operations are kept for them.
  void linger_until_delivered();
  // Drops the messages not yet handed to the transport (they may point into the input).
  void drop_outgoing();
  // Tells the peers that this operation failed, on the control channel; not the ones known to
  // be gone (the member lost, a closed connection): a socket left reconnecting to a dead
  // endpoint broke the next operations (CollectiveProcesses.RetriesAfterFailures... fails
  // when the culprit is sent one).
  void broadcast_abort(const OpFailure& f);
  // What this operation learnt of the peers' links, for the next one.
  void keep_gaps();

 protected:
  // The schedule. begin() runs once, at the start of run(), before the data of this operation
  // that arrived early is handled: it sets up what the others read, and may throw OpFailure.
  virtual void begin() = 0;
  // Whether data of this operation is still expected from peer p.
  virtual bool expecting(int p) const = 0;
  // Whether this member has produced all it sends.
  virtual bool produced_all() const = 0;
  // Queues the next data messages (enqueue); true when it queued any.
  virtual bool produce() = 0;
  // A data message of this operation (not a keepalive, hello or abort) from member s: its
  // header passed check_message, its rank is its name's, and its bytes are counted.
  virtual void handle_data(int s, Message& m) = 0;
  // What a member whose messages carry header `h` runs, for a mismatch's message ("a vector of
  // 10 floats in codec fp32").
  virtual std::string shape(const Header& h) const = 0;

  const std::string& ep(int r) const { return g_.members[r].endpoint; }
  std::string who(int r) const { return g_.members[r].name + " (" + ep(r) + ")"; }
  int rank_of(const std::string& name) const;
  bool backlog(int p) const { return !urgent_[p].empty() || !outbox_[p].empty(); }
  // A header of this operation; data messages fill in the rest.
  Header header(MsgType type, uint32_t part = 0, uint64_t offset = 0, uint64_t count = 0) const;
  // Queues a data message for `peer` and hands what it can to the transport. Urgent messages
  // overtake the others queued for that peer. Stats::rate_* are read off when the transport has
  // taken the last of the `bulk_total_` messages that are not urgent.
  void enqueue(int peer, const Header& h, Buffer payload, bool urgent);

  Transport& t_;
  Workspace& ws_;
  const Options& options_;
  const Group& g_;
  int k_;
  int me_;
  uint64_t fp_;
  Codec codec_;
  uint64_t total_n_;
  LivenessRules rules_;
  size_t bulk_total_ = 0;  // set by begin()

 private:
  struct Outgoing {
    Header h;
    Buffer payload;
  };

  bool flush(int peer);
  void send_keepalives(Clock::time_point now);
  void send_keepalive(int p, Clock::time_point now);
  // Samples the bytes that have arrived on peer p's connections (liveness.hpp).
  void sample_bytes(int p, Clock::time_point now);
  void handle(Message& m);
  void handle_abort(const Message& m);
  // This member, blamed as lost by `sender` in `round` (its notice's `why`), leaves this
  // operation: the failure it throws.
  OpFailure lost_to_the_others(const std::string& sender, uint64_t round,
                               const std::string& why) const;
  void handle_other_phase(Message& m, int sender_rank, bool member);
  void check_liveness(Clock::time_point now);
  // A line in the log every kWaitReports x peer_timeout (a minute by default) an operation
  // runs: whom it waits for and what it last heard of each, whom it still owes data. Liveness
  // bounds a dead member's wait; a live one may wait on a slower one for long, and this says
  // who holds the round.
  static constexpr int kWaitReports = 20;
  void report_wait(Clock::time_point now);
  Clock::time_point next_report_{};
  // This member has left (Communicator::leave): the operation fails, and its peers are told
  // that this member is lost, so that they go on without it at once. So does a member said
  // gone (Communicator::peer_gone), naming that one; and one whose round was given up
  // (Communicator::give_up_below).
  void check_leaving() const;
  mutable uint64_t gone_seen_ = 0;  // Workspace::gone_generation at check_leaving's last look
  std::chrono::milliseconds poll_budget(Clock::time_point now);
  bool done() const;

  // Per peer: urgent messages overtake the others queued.
  std::vector<std::deque<Outgoing>> urgent_, outbox_;
  std::vector<PeerState> peers_;
  std::vector<std::optional<uint64_t>> stale_round_;
  // Peers that sent data of this round under another group fingerprint (for the error message).
  std::vector<bool> other_group_;
  std::vector<std::string> writable_;  // peers with a backlog, for the transport's wait
  Clock::time_point start_;
  uint64_t handed_bytes_ = 0;  // payload bytes of data messages the transport took
  size_t bulk_handed_ = 0;     // messages that are not urgent taken
};

// Begins an operation on this member: resets the counters, checks the group (CollectiveError,
// `what` naming the call), records it as the last operation (what data between operations is
// judged by) and keeps connections to its members only (those to others drain, then close).
void begin_operation(Transport& t, Workspace& ws, const Options& options, const Group& group,
                     std::string_view what);
// A group of one exchanges nothing; a member that has left fails all the same.
void check_not_left(const Workspace& ws, const Group& group);
// Runs `op` to its end (run, then linger_until_delivered). On a failure abandons it, tells the
// peers when it found the failure itself, and throws PeerLostError or CollectiveError naming
// the member at fault.
void run_operation(Transport& t, Workspace& ws, Operation& op);
// After a failure: nothing more goes out of `op`, nothing refers to the input (bounded wait),
// and the receive queue is empty (data of later operations kept for them).
void abandon(Transport& t, Workspace& ws, Operation& op);

// Between operations (nobody else may use `transport` meanwhile): takes what has arrived into
// the stash, so that data of no operation is held bounded in size and time even while none
// runs. Drops what no operation can use (malformed, larger than max_payload, of the last
// operation or before it), and what waited past stash_ttl; reads no more while the stash has
// no room for a largest payload (the rest waits in the transport, whose queues push back on
// the sender). Returns the messages taken.
size_t receive_between_operations(Transport& transport, Workspace& ws, const Options& options,
                                  Clock::time_point now);

}  // namespace loco::collective::detail
