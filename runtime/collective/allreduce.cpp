// Butterfly all-reduce over ZeroMQ.
//
// Sockets: each communicator binds one ROUTER that only receives, and keeps one DEALER per
// peer endpoint that only sends (cached across operations). A data message is three frames:
// a fixed binary Header, the sender's name, and the encoded payload of one chunk.
//
// One operation, on member `me` of K: the vector of n floats is cut into K parts (part p is
// [p*n/K, (p+1)*n/K)), each part into chunks of chunk_bytes/4 floats.
//   reduce-scatter: me sends chunk c of part p (encoded) to p, for c = 0.. and p = me+1.., so
//                   that every owner gets its first chunks from everyone early; fp32 chunks
//                   over tcp/ipc point into the caller's input (zero-copy), and the operation
//                   returns only once ZeroMQ has let go of every one of them;
//   reduce:         when the K-1 contributions for chunk c of my part are in, sum them with
//                   mine in rank order, divide by K, encode once, decode into my result;
//   all-gather:     send those encoded bytes (zero-copy, shared) to every peer.
// Everything runs in one loop on the caller's thread that alternates receiving (and reducing)
// with producing the next chunk; the ZeroMQ I/O thread moves bytes meanwhile.
#include "runtime/collective/allreduce.hpp"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <zmq.hpp>

#include "runtime/collective/codec.hpp"
#include "runtime/collective/local.hpp"

namespace loco::collective {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x52414f4cu;  // "LOAR"
constexpr uint8_t kVersion = 2;           // 2: keepalive

// keepalive: "still in this operation", sent to a peer that got nothing from us for a while, so
// that a member waiting on a lost one is not taken for lost itself.
enum class MsgType : uint8_t { reduce_scatter = 1, all_gather = 2, abort = 3, keepalive = 4 };
enum class AbortKind : uint8_t { error = 0, peer_lost = 1, mismatch = 2 };

#pragma pack(push, 1)
struct Header {
  uint32_t magic;
  uint8_t version;
  MsgType type;
  Codec codec;
  uint8_t reserved;
  uint32_t sender_rank;
  uint32_t part;
  uint64_t group_fp;
  uint64_t round_id;
  uint64_t total_n;  // length of the sender's whole vector, in floats
  uint64_t offset;   // first float of the chunk, relative to the part
  uint64_t count;    // floats in the chunk
};
#pragma pack(pop)

uint64_t fingerprint(const Group& g) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
  };
  mix(std::to_string(g.members.size()));
  for (const Member& m : g.members) {
    mix(m.name);
    mix(m.endpoint);
  }
  for (double w : g.part_weights) {
    uint64_t bits = std::bit_cast<uint64_t>(w);
    mix(std::string_view(reinterpret_cast<const char*>(&bits), sizeof bits));
  }
  return h;
}

std::string seconds_str(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << static_cast<double>(ms.count()) / 1000.0 << " s";
  return s.str();
}

// A received message of some operation: header, sender name, payload.
struct Received {
  Header h{};
  std::string name;
  zmq::message_t payload;
};

// Encoded bytes that ZeroMQ sends without copying; each message holds a reference.
struct Bytes {
  explicit Bytes(size_t n) : data(new uint8_t[n]), size(n) {}  // uninitialized on purpose
  std::unique_ptr<uint8_t[]> data;
  size_t size;
};

void free_shared(void* /*data*/, void* hint) { delete static_cast<std::shared_ptr<Bytes>*>(hint); }

zmq::message_t shared_message(const std::shared_ptr<Bytes>& bytes, size_t offset, size_t len) {
  return zmq::message_t(bytes->data.get() + offset, len, &free_shared,
                        new std::shared_ptr<Bytes>(bytes));
}

// Counts the messages that point into the caller's input. ZeroMQ calls free_input_ref from its
// I/O thread once it is done with one (the bytes are in the kernel, or the message was
// dropped); allreduce() returns only when the count is back to zero.
struct InputRefs {
  std::mutex m;
  std::condition_variable cv;
  size_t count = 0;

  // Waits until ZeroMQ holds no message into the input, at most `limit`. True when it holds none.
  bool wait_released(std::chrono::milliseconds limit) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, limit, [this] { return count == 0; });
  }
};

void free_input_ref(void* /*data*/, void* hint) {
  auto* refs = static_cast<std::shared_ptr<InputRefs>*>(hint);
  {
    std::lock_guard lock((*refs)->m);
    if (--(*refs)->count == 0) (*refs)->cv.notify_all();
  }
  delete refs;
}

zmq::message_t input_message(const std::shared_ptr<InputRefs>& refs, const float* data,
                             size_t count) {
  {
    std::lock_guard lock(refs->m);
    ++refs->count;
  }
  return zmq::message_t(const_cast<float*>(data), count * sizeof(float), &free_input_ref,
                        new std::shared_ptr<InputRefs>(refs));
}

class Op;

// Thrown inside an operation; carries what the other members should be told.
struct OpFailure {
  AbortKind kind;
  std::string culprit;
  std::string message;
  bool broadcast;
};

}  // namespace

struct detail::CommunicatorImpl {
  std::shared_ptr<zmq::context_t> ctx;
  zmq::socket_t router;
  std::string endpoint;
  Options options;
  detail::Hooks hooks;
  Stats stats;
  std::map<std::string, std::unique_ptr<zmq::socket_t>> dealers;  // by endpoint
  // A PAIR per dealer that receives its ZeroMQ monitor events: a dropped connection tells that
  // a peer died (SIGKILL closes its sockets) long before the peer timeout would.
  std::map<std::string, std::unique_ptr<zmq::socket_t>> monitors;  // by endpoint
  uint64_t monitor_serial = 0;
  std::deque<Received> stash;  // messages of later operations that arrived early
  size_t stash_bytes = 0;
  std::unique_ptr<float[]> result;  // the output, copied to the caller's buffer on success
  // Encoded outgoing data of operations, each reused once no message holds it any more (the
  // last chunks of one operation may still be on their way when the next one starts).
  std::vector<std::shared_ptr<Bytes>> send_buffers;

  std::shared_ptr<Bytes> send_buffer(size_t size) {
    size = std::max<size_t>(size, 1);
    std::shared_ptr<Bytes>* best = nullptr;
    for (auto& b : send_buffers) {
      if (b.use_count() == 1 && b->size >= size && (!best || b->size < (*best)->size)) best = &b;
    }
    if (best) return *best;
    // Replace a free buffer that is too small, else add one; a buffer that a message of a
    // failed operation still references is never written again.
    for (auto& b : send_buffers) {
      if (b.use_count() == 1) {
        b.reset();
        b = std::make_shared<Bytes>(size);
        return b;
      }
    }
    send_buffers.push_back(std::make_shared<Bytes>(size));
    if (send_buffers.size() > 4) send_buffers.erase(send_buffers.begin());
    return send_buffers.back();
  }
  size_t result_capacity = 0;
  // fp32 reduce-scatter chunks are sent straight from the caller's input (see Op::run); these
  // count the messages ZeroMQ still holds. Turned off for good if ZeroMQ ever kept one past
  // the bound after its sockets were closed (never seen; see release_input()).
  std::shared_ptr<InputRefs> input_refs = std::make_shared<InputRefs>();
  bool input_zero_copy = true;
  std::vector<float> input;  // concatenation of several tensors
  std::vector<float> scratch;
  bool last_ok = true;  // whether the last operation succeeded

  zmq::socket_t& dealer(const std::string& ep) {
    auto it = dealers.find(ep);
    if (it != dealers.end()) return *it->second;
    auto s = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::dealer);
    s->set(zmq::sockopt::linger, 0);
    // A short queue in ZeroMQ (the kernel's socket buffer holds more): what waits, waits in
    // our outbox, where all-gather results overtake reduce-scatter chunks.
    s->set(zmq::sockopt::sndhwm, 4);
    s->set(zmq::sockopt::reconnect_ivl, 50);
    s->set(zmq::sockopt::reconnect_ivl_max, 500);
    std::string monitor_ep = "inproc://loco-collective-monitor-" +
                             std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                             std::to_string(++monitor_serial);
    if (zmq_socket_monitor(s->handle(), monitor_ep.c_str(),
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED) == 0) {
      auto m = std::make_unique<zmq::socket_t>(*ctx, zmq::socket_type::pair);
      m->set(zmq::sockopt::linger, 0);
      m->connect(monitor_ep);
      monitors[ep] = std::move(m);
    }
    s->connect(ep);
    return *dealers.emplace(ep, std::move(s)).first->second;
  }

  // What happened to the connection to `ep` since the last call (drains the events):
  // 1 it dropped, 2 a connection attempt was refused, 0 neither (or nothing known).
  int dropped(const std::string& ep) {
    auto it = monitors.find(ep);
    if (it == monitors.end()) return 0;
    int seen = 0;
    zmq::message_t event, addr;
    while (it->second->recv(event, zmq::recv_flags::dontwait)) {
      if (event.more()) (void)it->second->recv(addr, zmq::recv_flags::none);
      uint16_t id = 0;
      if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
      if (id == ZMQ_EVENT_DISCONNECTED) seen = 1;
      if (id == ZMQ_EVENT_CONNECT_RETRIED && seen == 0) seen = 2;
    }
    return seen;
  }

  void close_dealer(const std::string& ep, std::chrono::milliseconds linger) {
    auto it = dealers.find(ep);
    if (it == dealers.end()) return;
    it->second->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    dealers.erase(it);
    monitors.erase(ep);
  }

  float* result_buffer(size_t n) {
    if (n > result_capacity) {
      result.reset(new float[n]);
      result_capacity = n;
    }
    return result.get();
  }

  void stash_message(Received&& r) {
    constexpr size_t kMaxStashBytes = size_t{1} << 30;
    constexpr size_t kMaxStashMessages = 1 << 16;
    stash_bytes += r.payload.size();
    stash.push_back(std::move(r));
    while (!stash.empty() && (stash_bytes > kMaxStashBytes || stash.size() > kMaxStashMessages)) {
      stash_bytes -= stash.front().payload.size();
      stash.pop_front();
    }
  }

  // Receives one message without waiting. Returns false when none is ready.
  bool try_receive(Received& out, uint64_t& bytes) {
    zmq::message_t id;
    if (!router.recv(id, zmq::recv_flags::dontwait)) return false;
    std::vector<zmq::message_t> frames;
    while (router.get(zmq::sockopt::rcvmore)) {
      zmq::message_t f;
      (void)router.recv(f, zmq::recv_flags::none);  // the rest of a multipart is already here
      frames.push_back(std::move(f));
    }
    if (frames.size() != 3 || frames[0].size() != sizeof(Header)) {
      out.h.magic = 0;
      return true;
    }
    std::memcpy(&out.h, frames[0].data(), sizeof(Header));
    out.name = frames[1].to_string();
    out.payload = std::move(frames[2]);
    bytes = sizeof(Header) + out.name.size() + out.payload.size();
    return true;
  }

  void run(const Group& group, const float* in, float* out, size_t n);
  void abandon(Op& op);
  void close_all_dealers();
  void release_input();
};

namespace {

// The state of one operation on one member.
class Op {
 public:
  uint64_t round_id() const { return g_.round_id; }
  Op(detail::CommunicatorImpl& impl, const Group& group, const float* in, float* out, size_t n)
      : impl_(impl),
        g_(group),
        in_(in),
        out_(out),
        n_(n),
        k_(static_cast<int>(group.members.size())),
        me_(group.rank),
        codec_(impl.options.codec),
        fp_(fingerprint(group)),
        bounds_(part_bounds(n, group.members.size(), group.part_weights)),
        chunk_(std::max<size_t>(1, impl.options.chunk_bytes / sizeof(float))),
        timeout_(impl.options.peer_timeout),
        keepalive_interval_(std::max<std::chrono::milliseconds::rep>(1, timeout_.count() / 4)) {}

  void run();
  // Drops the messages not yet handed to ZeroMQ (they may point into the input).
  void drop_outgoing() {
    for (auto& q : urgent_) q.clear();
    for (auto& q : outbox_) q.clear();
    for (auto& o : sending_) o.reset();
  }
  // Tells the peers (except `except`) that this operation failed.
  void broadcast_abort(const OpFailure& f, const std::string& except);

 private:
  size_t part_begin(int p) const { return bounds_[static_cast<size_t>(p)]; }
  size_t part_len(int p) const { return part_begin(p + 1) - part_begin(p); }
  size_t chunks(int p) const { return (part_len(p) + chunk_ - 1) / chunk_; }
  size_t chunk_len(int p, size_t c) const { return std::min(chunk_, part_len(p) - c * chunk_); }
  // Where chunk c of part p is encoded in the send buffer.
  size_t enc_offset(int p, size_t c) const {
    return enc_part_[p] + c * encoded_bytes(codec_, chunk_);
  }
  std::string who(int r) const { return g_.members[r].name + " (" + g_.members[r].endpoint + ")"; }
  int rank_of(const std::string& name) const {
    for (int r = 0; r < k_; ++r)
      if (g_.members[r].name == name) return r;
    return -1;
  }
  bool expecting(int p) const { return rs_left_[p] > 0 || ag_left_[p] > 0; }

  Header header(MsgType type, int part, size_t offset, size_t count) const {
    Header h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.type = type;
    h.codec = codec_;
    h.sender_rank = static_cast<uint32_t>(me_);
    h.part = static_cast<uint32_t>(part);
    h.group_fp = fp_;
    h.round_id = g_.round_id;
    h.total_n = n_;
    h.offset = offset;
    h.count = count;
    return h;
  }

  void enqueue(int peer, const Header& h, zmq::message_t payload, bool data, bool urgent);
  bool flush(int peer);
  void send_keepalives(Clock::time_point now);
  void handle(Received& r);
  void handle_abort(const Received& r);
  void reduce_chunk(size_t c);
  [[noreturn]] void fail_nonfinite(size_t c, const float* acc);
  void check_timeouts(Clock::time_point now);
  Clock::duration poll_budget(Clock::time_point now) const;
  bool done() const;

  detail::CommunicatorImpl& impl_;
  const Group& g_;
  const float* in_;
  float* out_;
  size_t n_;
  int k_;
  int me_;
  Codec codec_;
  uint64_t fp_;
  std::vector<size_t> bounds_;  // where each member's part begins; n_ at the end
  size_t chunk_;
  std::chrono::milliseconds timeout_;
  // A peer that got nothing from us for this long gets a keepalive.
  std::chrono::milliseconds keepalive_interval_;

  struct Outgoing {
    std::vector<zmq::message_t> frames;
    size_t next = 0;
    size_t payload_bytes = 0;
    bool reduce_scatter = false;
  };
  // Per peer: all-gather results overtake queued reduce-scatter chunks, so that both phases
  // stream at once; `sending_` is a message ZeroMQ has taken only some frames of.
  std::vector<std::deque<Outgoing>> urgent_, outbox_;
  std::vector<std::optional<Outgoing>> sending_;
  bool backlog(int p) const { return sending_[p] || !urgent_[p].empty() || !outbox_[p].empty(); }
  std::vector<Clock::time_point> heard_;         // last message from each peer
  std::vector<Clock::time_point> sent_;          // last send progress to each peer
  std::vector<Clock::time_point> keepalive_at_;  // last keepalive attempt to each peer
  std::vector<size_t> rs_left_, ag_left_;        // chunks still expected from each peer
  std::vector<std::optional<uint64_t>> stale_round_;
  std::vector<std::optional<Clock::time_point>> dropped_;  // when a peer's connection dropped
  std::chrono::milliseconds grace_;                        // a peer's last message of another round
  std::vector<std::vector<zmq::message_t>> pending_;       // [chunk][rank] contributions to my part
  std::vector<detail::Addend> addends_;                    // reduce_chunk's, kept for its capacity
  std::vector<int> pending_count_;
  size_t reduced_ = 0;
  std::shared_ptr<Bytes> send_;   // reduce-scatter chunks of other parts, my part's result
  std::vector<size_t> enc_part_;  // offset of each part in send_
  // fp32 over tcp/ipc: reduce-scatter chunks point into the input instead of a copy. Not over
  // inproc, where the peer itself would hold our message until it reads it.
  bool input_zero_copy_ = false;
  Clock::time_point start_;              // when run() began
  uint64_t handed_bytes_ = 0;            // payload bytes of data messages ZeroMQ has taken
  size_t rs_handed_ = 0, rs_total_ = 0;  // reduce-scatter messages taken / to send
  // reduce-scatter schedule position
  size_t rs_chunk_ = 0;
  int rs_step_ = 1;
  size_t rs_max_chunks_ = 0;
};

void Op::enqueue(int peer, const Header& h, zmq::message_t payload, bool data, bool urgent) {
  Outgoing o;
  const std::string& name = g_.members[me_].name;
  impl_.stats.bytes_sent += sizeof(Header) + name.size() + payload.size();
  if (data) {
    impl_.stats.payload_bytes_sent += payload.size();
    ++impl_.stats.messages_sent;
  }
  o.payload_bytes = data ? payload.size() : 0;
  o.reduce_scatter = h.type == MsgType::reduce_scatter;
  o.frames.emplace_back(&h, sizeof h);
  o.frames.emplace_back(name.data(), name.size());
  o.frames.push_back(std::move(payload));
  (urgent ? urgent_ : outbox_)[peer].push_back(std::move(o));
  flush(peer);
  if (data && impl_.hooks.after_send) impl_.hooks.after_send(impl_.stats.messages_sent);
}

// Hands queued messages to ZeroMQ without blocking. Returns true when the outbox is empty.
bool Op::flush(int peer) {
  if (!backlog(peer)) return true;
  zmq::socket_t& s = impl_.dealer(g_.members[peer].endpoint);
  while (true) {
    if (!sending_[peer]) {
      auto& box = !urgent_[peer].empty() ? urgent_[peer] : outbox_[peer];
      if (box.empty()) return true;
      sending_[peer] = std::move(box.front());
      box.pop_front();
    }
    Outgoing& o = *sending_[peer];
    while (o.next < o.frames.size()) {
      auto flags = zmq::send_flags::dontwait;
      if (o.next + 1 < o.frames.size()) flags = flags | zmq::send_flags::sndmore;
      if (!s.send(o.frames[o.next], flags)) return false;
      ++o.next;
    }
    handed_bytes_ += o.payload_bytes;
    if (o.reduce_scatter && ++rs_handed_ == rs_total_) {
      impl_.stats.rate_bytes = handed_bytes_;
      impl_.stats.rate_seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    }
    sending_[peer].reset();
    sent_[peer] = Clock::now();
  }
}

// A member that waits (for a lost peer's data, or to send to it) sends nothing to the others,
// who would then take it for lost too, and might name it before it names the real culprit.
// Keepalives go only where nothing is queued: a message still waiting means either that the
// peer takes our data (and so hears from us) or that it is the one not reading.
void Op::send_keepalives(Clock::time_point now) {
  for (int p = 0; p < k_; ++p) {
    if (p == me_ || backlog(p) || now - std::max(sent_[p], keepalive_at_[p]) < keepalive_interval_)
      continue;
    keepalive_at_[p] = now;  // when ZeroMQ's queue is full, try again an interval later
    Header h = header(MsgType::keepalive, 0, 0, 0);
    const std::string& name = g_.members[me_].name;
    zmq::socket_t& s = impl_.dealer(g_.members[p].endpoint);
    // All frames or none: past the first frame ZeroMQ takes the rest of a multipart message.
    if (s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
      (void)s.send(zmq::buffer(name), zmq::send_flags::sndmore);
      (void)s.send(zmq::message_t(), zmq::send_flags::none);
      impl_.stats.bytes_sent += sizeof h + name.size();
      sent_[p] = now;
    }
  }
}

void Op::broadcast_abort(const OpFailure& f, const std::string& except) {
  std::string body(1, static_cast<char>(f.kind));
  body += f.culprit;
  body.push_back('\0');
  body += f.message;
  for (int p = 0; p < k_; ++p) {
    if (p == me_ || g_.members[p].name == except) continue;
    Header h = header(MsgType::abort, 0, 0, 0);
    zmq::socket_t& s = impl_.dealer(g_.members[p].endpoint);
    const std::string& name = g_.members[me_].name;
    // Best effort: a fresh socket has room, and a peer that cannot take it times out anyway.
    if (s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
      (void)s.send(zmq::buffer(name), zmq::send_flags::sndmore);
      (void)s.send(zmq::buffer(body), zmq::send_flags::none);
    }
  }
}

void Op::handle_abort(const Received& r) {
  std::string_view body(static_cast<const char*>(r.payload.data()), r.payload.size());
  if (body.empty()) return;
  auto kind = static_cast<AbortKind>(body[0]);
  size_t z = body.find('\0', 1);
  std::string culprit(body.substr(1, z == std::string_view::npos ? 0 : z - 1));
  std::string message(z == std::string_view::npos ? body.substr(1) : body.substr(z + 1));
  std::string prefix = "round " + std::to_string(g_.round_id) + " aborted by " + r.name + ": ";
  if (kind == AbortKind::mismatch && (r.h.total_n != n_ || r.h.codec != codec_)) {
    // The sender disagrees with us: it is the odd one, whatever it blames.
    int s = rank_of(r.name);
    throw OpFailure{AbortKind::mismatch, r.name,
                    "member " + (s >= 0 ? who(s) : r.name) + " has a vector of " +
                        std::to_string(r.h.total_n) + " floats in codec " +
                        std::string(to_string(r.h.codec)) + ", expected " + std::to_string(n_) +
                        " in " + std::string(to_string(codec_)) + ", in round " +
                        std::to_string(g_.round_id),
                    false};
  }
  throw OpFailure{kind, culprit, prefix + message, false};
}

void Op::handle(Received& r) {
  if (r.h.magic != kMagic || r.h.version != kVersion) return;  // not ours: drop
  const bool current = r.h.round_id == g_.round_id && r.h.group_fp == fp_;
  if (!current) {
    if (r.h.round_id < g_.round_id) {  // left over from an earlier operation
      int s = rank_of(r.name);
      if (s >= 0) stale_round_[s] = r.h.round_id;
      return;
    }
    int s = rank_of(r.name);
    if (s >= 0 && s != me_ && r.h.round_id > g_.round_id && expecting(s)) {
      // A member only moves on after sending us all its data of this round.
      throw OpFailure{AbortKind::error, r.name,
                      "member " + who(s) + " sent data for round " + std::to_string(r.h.round_id) +
                          " while round " + std::to_string(g_.round_id) +
                          " expects more data from it",
                      false};
    }
    if (r.h.type != MsgType::keepalive) impl_.stash_message(std::move(r));
    return;
  }
  const int s = static_cast<int>(r.h.sender_rank);
  if (s < 0 || s >= k_ || s == me_ || g_.members[s].name != r.name) {
    throw OpFailure{AbortKind::error, r.name,
                    "a message of round " + std::to_string(g_.round_id) + " from '" + r.name +
                        "' claims rank " + std::to_string(r.h.sender_rank) +
                        ", which is not its rank in this group",
                    false};
  }
  heard_[s] = Clock::now();
  if (r.h.type == MsgType::keepalive) return;
  if (r.h.type == MsgType::abort) handle_abort(r);
  const int part = static_cast<int>(r.h.part);
  const int expected_part = r.h.type == MsgType::reduce_scatter ? me_ : s;
  if (r.h.codec != codec_ || r.h.total_n != n_ || part != expected_part) {
    std::string msg = "member " + who(s) + " sent ";
    if (r.h.codec != codec_) {
      msg += "codec " + std::string(to_string(r.h.codec)) + ", expected " +
             std::string(to_string(codec_));
    } else {
      msg += "data for part " + std::to_string(part) + " of a vector of " +
             std::to_string(r.h.total_n) + " floats; expected part " +
             std::to_string(expected_part) + " of " + std::to_string(n_) + " floats";
    }
    msg += " in round " + std::to_string(g_.round_id);
    throw OpFailure{AbortKind::mismatch, r.name, msg, true};
  }
  const size_t c = r.h.offset / chunk_;
  const bool grid_ok = r.h.offset % chunk_ == 0 && c < chunks(part) &&
                       r.h.count == chunk_len(part, c) &&
                       r.payload.size() == encoded_bytes(codec_, r.h.count);
  if (!grid_ok) {
    throw OpFailure{AbortKind::mismatch, r.name,
                    "member " + who(s) + " sent a malformed chunk (offset " +
                        std::to_string(r.h.offset) + ", " + std::to_string(r.h.count) +
                        " floats, " + std::to_string(r.payload.size()) + " bytes) for part " +
                        std::to_string(part) + " in round " + std::to_string(g_.round_id) +
                        "; chunk size differs?",
                    true};
  }
  impl_.stats.bytes_received += sizeof(Header) + r.name.size() + r.payload.size();
  if (r.h.type == MsgType::reduce_scatter) {
    auto& slot = pending_[c][s];
    if (slot.size() != 0 || rs_left_[s] == 0) return;  // duplicate: ignore
    slot = std::move(r.payload);
    --rs_left_[s];
    if (++pending_count_[c] == k_ - 1) reduce_chunk(c);
  } else if (r.h.type == MsgType::all_gather) {
    if (ag_left_[s] == 0) return;
    detail::decode(codec_, static_cast<const uint8_t*>(r.payload.data()), r.h.count,
                   out_ + part_begin(s) + r.h.offset);
    --ag_left_[s];
  }
}

void Op::fail_nonfinite(size_t c, const float* acc) {
  const size_t begin = part_begin(me_) + c * chunk_;
  const size_t len = chunk_len(me_, c);
  for (int r = 0; r < k_; ++r) {
    const float* v = in_ + begin;
    if (r != me_) {
      impl_.scratch.resize(len);
      detail::decode(codec_, static_cast<const uint8_t*>(pending_[c][r].data()), len,
                     impl_.scratch.data());
      v = impl_.scratch.data();
    }
    size_t i = detail::first_nonfinite(v, len);
    if (i < len) {
      throw OpFailure{AbortKind::error, g_.members[r].name,
                      "member " + who(r) + " sent NaN/Inf in round " + std::to_string(g_.round_id) +
                          " (element " + std::to_string(begin + i) + ")",
                      true};
    }
  }
  size_t i = detail::first_nonfinite(acc, len);
  throw OpFailure{AbortKind::error, "",
                  "the sum overflowed to Inf at element " + std::to_string(begin + i) +
                      " in round " + std::to_string(g_.round_id),
                  true};
}

void Op::reduce_chunk(size_t c) {
  const size_t begin = part_begin(me_) + c * chunk_;
  const size_t len = chunk_len(me_, c);
  float* acc = out_ + begin;
  // Rank order, so that the result does not depend on arrival order.
  addends_.resize(k_);
  for (int r = 0; r < k_; ++r) {
    addends_[r] =
        r == me_ ? detail::Addend{in_ + begin, true} : detail::Addend{pending_[c][r].data(), false};
  }
  detail::mean_of(codec_, addends_, len, acc);
  if (impl_.options.reject_nonfinite && !detail::all_finite(acc, len)) fail_nonfinite(c, acc);
  for (auto& m : pending_[c]) m = zmq::message_t();
  // Encode once; every member, this one too, uses the decoded bytes.
  const size_t at = enc_offset(me_, c);
  uint8_t* enc = send_->data.get() + at;
  const size_t enc_len = encoded_bytes(codec_, len);
  detail::encode(codec_, acc, len, enc);
  for (int step = 1; step < k_; ++step) {
    int p = (me_ + step) % k_;
    enqueue(p, header(MsgType::all_gather, me_, c * chunk_, len),
            shared_message(send_, at, enc_len), true, true);
  }
  if (codec_ != Codec::fp32) detail::decode(codec_, enc, len, acc);
  ++reduced_;
}

bool Op::done() const {
  if (rs_chunk_ < rs_max_chunks_ || reduced_ < chunks(me_)) return false;
  for (int p = 0; p < k_; ++p)
    if (p != me_ && (expecting(p) || backlog(p))) return false;
  return true;
}

void Op::check_timeouts(Clock::time_point now) {
  // A dropped connection: wait a moment for a message that says why (an abort notice that was
  // sent just before the peer exited) before calling the peer lost.
  for (int p = 0; p < k_; ++p) {
    if (p != me_ && dropped_[p] && now - *dropped_[p] > grace_ && (expecting(p) || backlog(p))) {
      throw OpFailure{
          AbortKind::peer_lost, g_.members[p].name,
          "lost member " + who(p) + ": connection closed in round " + std::to_string(g_.round_id),
          true};
    }
  }
  int worst = -1;
  Clock::time_point oldest = now;
  for (int p = 0; p < k_; ++p) {
    if (p == me_) continue;
    Clock::time_point t = Clock::time_point::max();
    if (expecting(p)) t = heard_[p];
    if (backlog(p)) t = std::min(t, sent_[p]);
    if (t != Clock::time_point::max() && now - t > timeout_ && t < oldest) {
      oldest = t;
      worst = p;
    }
  }
  if (worst < 0) return;
  if (stale_round_[worst]) {
    throw OpFailure{AbortKind::error, g_.members[worst].name,
                    "member " + who(worst) + " sent data for round " +
                        std::to_string(*stale_round_[worst]) + " but none for round " +
                        std::to_string(g_.round_id) + " in " + seconds_str(timeout_),
                    true};
  }
  throw OpFailure{AbortKind::peer_lost, g_.members[worst].name,
                  "lost member " + who(worst) + ": no data for " + seconds_str(timeout_) +
                      " in round " + std::to_string(g_.round_id),
                  true};
}

Clock::duration Op::poll_budget(Clock::time_point now) const {
  Clock::duration budget = std::chrono::milliseconds(100);
  for (int p = 0; p < k_; ++p) {
    if (p == me_) continue;
    if (expecting(p)) budget = std::min(budget, heard_[p] + timeout_ - now);
    if (backlog(p)) budget = std::min(budget, sent_[p] + timeout_ - now);
    if (!backlog(p)) {
      budget = std::min(budget, std::max(sent_[p], keepalive_at_[p]) + keepalive_interval_ - now);
    }
    if (dropped_[p]) budget = std::min(budget, *dropped_[p] + grace_ - now);
  }
  return std::max(budget, Clock::duration(std::chrono::milliseconds(1)));
}

void Op::run() {
  start_ = Clock::now();
  outbox_.resize(k_);
  urgent_.resize(k_);
  sending_.resize(k_);
  heard_.assign(k_, start_);
  sent_.assign(k_, start_);
  keepalive_at_.assign(k_, start_);
  rs_left_.assign(k_, chunks(me_));
  ag_left_.assign(k_, 0);
  stale_round_.assign(k_, std::nullopt);
  dropped_.assign(k_, std::nullopt);
  grace_ = std::min(timeout_, std::chrono::milliseconds(250));
  rs_left_[me_] = 0;
  for (int p = 0; p < k_; ++p) {
    if (p != me_) ag_left_[p] = chunks(p);
    if (p != me_) rs_total_ += chunks(p);
    rs_max_chunks_ = std::max(rs_max_chunks_, chunks(p));
  }
  pending_.resize(chunks(me_));
  for (auto& v : pending_) v.resize(k_);
  pending_count_.assign(chunks(me_), 0);
  enc_part_.assign(k_ + 1, 0);
  for (int p = 0; p < k_; ++p) {
    size_t c = chunks(p);
    enc_part_[p + 1] = enc_part_[p] + (c == 0 ? 0
                                              : (c - 1) * encoded_bytes(codec_, chunk_) +
                                                    encoded_bytes(codec_, chunk_len(p, c - 1)));
  }
  input_zero_copy_ = codec_ == Codec::fp32 && impl_.input_zero_copy &&
                     std::all_of(g_.members.begin(), g_.members.end(), [](const Member& m) {
                       return m.endpoint.starts_with("tcp://") || m.endpoint.starts_with("ipc://");
                     });
  // With zero-copy fp32 the send buffer only holds my part's result.
  send_ = impl_.send_buffer(input_zero_copy_ ? enc_part_[me_ + 1] : enc_part_[k_]);
  for (int p = 0; p < k_; ++p) {
    if (p == me_) continue;
    impl_.dealer(g_.members[p].endpoint);         // connect early
    (void)impl_.dropped(g_.members[p].endpoint);  // forget drops before this operation
  }

  // Messages of this operation that arrived during an earlier one.
  std::deque<Received> early;
  early.swap(impl_.stash);
  impl_.stash_bytes = 0;
  for (Received& r : early) {
    if (r.h.round_id < g_.round_id) continue;
    handle(r);
  }

  std::vector<zmq_pollitem_t> items;
  while (!done()) {
    bool progressed = false;
    for (int i = 0; i < 64; ++i) {
      Received r;
      uint64_t bytes = 0;
      if (!impl_.try_receive(r, bytes)) break;
      progressed = true;
      handle(r);
    }
    for (int p = 0; p < k_; ++p)
      if (p != me_) flush(p);
    send_keepalives(Clock::now());
    // Produce the next reduce-scatter chunk, unless that peer is still congested.
    while (rs_chunk_ < rs_max_chunks_) {
      int p = (me_ + rs_step_) % k_;
      if (rs_chunk_ < chunks(p)) {
        if (backlog(p)) break;
        size_t len = chunk_len(p, rs_chunk_);
        const float* src = in_ + part_begin(p) + rs_chunk_ * chunk_;
        zmq::message_t msg;
        if (input_zero_copy_) {
          msg = input_message(impl_.input_refs, src, len);
        } else {
          const size_t at = enc_offset(p, rs_chunk_);
          detail::encode(codec_, src, len, send_->data.get() + at);
          msg = shared_message(send_, at, encoded_bytes(codec_, len));
        }
        enqueue(p, header(MsgType::reduce_scatter, p, rs_chunk_ * chunk_, len), std::move(msg),
                true, false);
        progressed = true;
      }
      if (++rs_step_ == k_) {
        rs_step_ = 1;
        ++rs_chunk_;
      }
      if (progressed) break;
    }
    if (done()) break;
    auto now = Clock::now();
    check_timeouts(now);
    if (progressed) continue;
    for (int p = 0; p < k_; ++p) {
      // Always drain, so that poll() does not keep waking up for a peer we are done with.
      // A refused connection counts too: a member publishes its endpoint only once bound, so a
      // refusal during the operation means its process or communicator is gone.
      if (p != me_ && impl_.dropped(g_.members[p].endpoint) != 0 && !dropped_[p]) dropped_[p] = now;
    }
    items.clear();
    items.push_back({static_cast<void*>(impl_.router), 0, ZMQ_POLLIN, 0});
    for (int p = 0; p < k_; ++p) {
      auto m = impl_.monitors.find(g_.members[p].endpoint);
      if (p != me_ && m != impl_.monitors.end())
        items.push_back({static_cast<void*>(*m->second), 0, ZMQ_POLLIN, 0});
    }
    for (int p = 0; p < k_; ++p) {
      if (p != me_ && backlog(p)) {
        items.push_back(
            {static_cast<void*>(impl_.dealer(g_.members[p].endpoint)), 0, ZMQ_POLLOUT, 0});
      }
    }
    auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(poll_budget(now));
    zmq::poll(items.data(), items.size(), budget);
  }
  impl_.stats.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
}

}  // namespace

void detail::CommunicatorImpl::run(const Group& group, const float* in, float* out, size_t n) {
  stats = Stats{};
  const int k = static_cast<int>(group.members.size());
  if (k == 0 || group.rank < 0 || group.rank >= k) {
    throw CollectiveError("allreduce: rank " + std::to_string(group.rank) +
                          " is not in a group of " + std::to_string(k) + " members");
  }
  // A tcp socket bound to a wildcard address is published under a routable one: compare ports.
  auto same_socket = [](const std::string& a, const std::string& b) {
    if (a == b) return true;
    if (!a.starts_with("tcp://") || !b.starts_with("tcp://")) return false;
    return a.substr(a.rfind(':')) == b.substr(b.rfind(':'));
  };
  if (!same_socket(group.members[group.rank].endpoint, endpoint)) {
    throw CollectiveError("allreduce: member " + group.members[group.rank].name + " has endpoint " +
                          group.members[group.rank].endpoint +
                          " in the group, but this communicator is bound to " + endpoint);
  }
  for (int a = 0; a < k; ++a) {
    for (int b = a + 1; b < k; ++b) {
      if (group.members[a].name == group.members[b].name ||
          group.members[a].endpoint == group.members[b].endpoint) {
        throw CollectiveError("allreduce: members " + std::to_string(a) + " and " +
                              std::to_string(b) + " share a name or endpoint (" +
                              group.members[a].name + ", " + group.members[a].endpoint + ")");
      }
    }
  }
  // Peers that left the group: let what is queued for them drain, then close.
  for (auto it = dealers.begin(); it != dealers.end();) {
    bool member = std::any_of(group.members.begin(), group.members.end(),
                              [&](const Member& m) { return m.endpoint == it->first; });
    if (!member) {
      it->second->set(zmq::sockopt::linger, static_cast<int>(options.peer_timeout.count()));
      monitors.erase(it->first);
      it = dealers.erase(it);
    } else {
      ++it;
    }
  }
  if (k == 1) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  Op op(*this, group, in, out, n);
  try {
    op.run();
  } catch (const OpFailure& f) {
    abandon(op);
    if (f.broadcast) op.broadcast_abort(f, f.kind == AbortKind::peer_lost ? f.culprit : "");
    spdlog::warn("collective: {}", f.message);
    if (f.kind == AbortKind::peer_lost) throw PeerLostError(f.message, f.culprit);
    throw CollectiveError(f.message, f.culprit);
  } catch (...) {
    abandon(op);
    throw;
  }
  last_ok = true;
  // Success means that every peer received all our reduce-scatter chunks (it sent us the
  // results they went into), so all the bytes are out of the input; ZeroMQ lets go of the last
  // message on its next write event, within microseconds. Bounded all the same.
  if (!input_refs->wait_released(options.peer_timeout)) {
    spdlog::warn("collective: ZeroMQ still referenced the input {} after a successful operation",
                 seconds_str(options.peer_timeout));
    close_all_dealers();
    release_input();
  }
}

void detail::CommunicatorImpl::close_all_dealers() {
  std::vector<std::string> eps;
  for (auto& [ep, s] : dealers) eps.push_back(ep);
  for (auto& ep : eps) close_dealer(ep, std::chrono::milliseconds(0));
}

void detail::CommunicatorImpl::abandon(Op& op) {
  last_ok = false;
  // Drop whatever is still queued for this operation: stale data only delays the peers, and it
  // may point into the caller's input, which the caller may free once we throw.
  op.drop_outgoing();
  close_all_dealers();
  release_input();
  // Empty our receive queues now: ZeroMQ stops reading a connection whose queue is full, and
  // then never sees its peer close it (left in CLOSE-WAIT, one per failed operation, until the
  // process runs out of sockets). Data of later operations is kept for them.
  Received r;
  uint64_t bytes = 0;
  while (try_receive(r, bytes)) {
    if (r.h.magic == kMagic && r.h.round_id > op.round_id()) stash_message(std::move(r));
    r = Received{};
  }
}

void detail::CommunicatorImpl::release_input() {
  // Closing a socket with linger 0 makes ZeroMQ drop its queue and the message it was writing
  // within milliseconds, even with a frozen peer (tests/collective checks it). The bound guards
  // against the unforeseen: past it, the caller's input might still be read, so say so loudly
  // and stop sending from inputs on this communicator.
  constexpr auto kLimit = std::chrono::milliseconds(2000);
  if (input_refs->wait_released(kLimit)) return;
  input_zero_copy = false;
  spdlog::error(
      "collective: ZeroMQ still references the caller's input {} after closing its sockets; "
      "sending from a copy from now on",
      seconds_str(kLimit));
}

namespace {
// ZeroMQ allocates each received chunk in its I/O thread and we free it in ours. With glibc's
// default, adaptive thresholds those buffers keep going back to the kernel, and every chunk
// then costs page faults and page zeroing: measured 16x more faults and ~30% slower.
void tune_malloc_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (getenv("LOCO_COLLECTIVE_KEEP_MALLOC") != nullptr) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
}
}  // namespace

Communicator::Communicator(const std::string& bind_endpoint, Options options,
                           std::shared_ptr<zmq::context_t> context)
    : impl_(std::make_unique<detail::CommunicatorImpl>()) {
  tune_malloc_once();
  impl_->options = options;
  impl_->ctx = context ? std::move(context)
                       : std::make_shared<zmq::context_t>(std::max(1, options.io_threads));
  impl_->router = zmq::socket_t(*impl_->ctx, zmq::socket_type::router);
  impl_->router.set(zmq::sockopt::linger, 0);
  impl_->router.set(zmq::sockopt::rcvhwm, 4096);
  // The ROUTER only receives; should it ever route, an unknown peer must be an error.
  impl_->router.set(zmq::sockopt::router_mandatory, true);
  std::string ep = bind_endpoint;
  if (ep.starts_with("tcp://") && ep.ends_with(":0")) ep = ep.substr(0, ep.size() - 1) + "*";
  try {
    impl_->router.bind(ep);
  } catch (const zmq::error_t& e) {
    throw CollectiveError("collective: cannot bind the data socket to " + bind_endpoint + ": " +
                          e.what());
  }
  impl_->endpoint = impl_->router.get(zmq::sockopt::last_endpoint);
}

Communicator::~Communicator() {
  // After a success, let the last chunks reach slower peers, bounded by the peer timeout; after
  // a failure only abort notices are queued: give them a moment, their peers may be gone.
  auto linger = impl_->options.peer_timeout;
  if (!impl_->last_ok) linger = std::min(linger, std::chrono::milliseconds(500));
  for (auto& [ep, s] : impl_->dealers)
    s->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
}

const std::string& Communicator::endpoint() const { return impl_->endpoint; }
Options& Communicator::options() { return impl_->options; }
detail::Hooks& Communicator::hooks() { return impl_->hooks; }
const Stats& Communicator::last_stats() const { return impl_->stats; }

void Communicator::allreduce(const Group& group, std::span<float> data) {
  float* out = impl_->result_buffer(data.size());
  impl_->run(group, data.data(), out, data.size());
  std::memcpy(data.data(), out, data.size() * sizeof(float));
}

void Communicator::allreduce(const Group& group, std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size()) {
    throw CollectiveError("allreduce: input has " + std::to_string(in.size()) +
                          " floats but output " + std::to_string(out.size()));
  }
  const float* a = in.data();
  const float* b = out.data();
  if (!in.empty() && a < b + out.size() && b < a + in.size()) {
    throw CollectiveError("allreduce: input and output overlap; use the in-place overload");
  }
  impl_->run(group, in.data(), out.data(), in.size());
}

void Communicator::allreduce(const Group& group, const std::vector<std::span<float>>& tensors) {
  if (tensors.size() == 1) return allreduce(group, tensors[0]);
  size_t n = 0;
  for (auto t : tensors) n += t.size();
  impl_->input.resize(n);
  size_t at = 0;
  for (auto t : tensors) {
    std::copy(t.begin(), t.end(), impl_->input.begin() + static_cast<ptrdiff_t>(at));
    at += t.size();
  }
  float* out = impl_->result_buffer(n);
  impl_->run(group, impl_->input.data(), out, n);
  at = 0;
  for (auto t : tensors) {
    std::copy(out + at, out + at + t.size(), t.begin());
    at += t.size();
  }
}

}  // namespace loco::collective
