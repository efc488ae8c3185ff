#include "runtime/collective/butterfly.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/collective/codec.hpp"
#include "runtime/collective/local.hpp"

namespace loco::collective::detail {
namespace {

std::string seconds_str(Clock::duration d) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return s.str();
}

// Sent on the data connection, in order with the data.
bool on_data_connection(MsgType t) {
  return t == MsgType::reduce_scatter || t == MsgType::all_gather || t == MsgType::hello;
}

// Thrown inside an operation; carries what the other members should be told.
struct OpFailure {
  AbortKind kind;
  std::string culprit;
  std::string message;
  bool broadcast;
};

Buffer shared_slice(const std::shared_ptr<Bytes>& bytes, size_t offset, size_t len) {
  return Buffer{bytes->data.get() + offset, len, bytes};
}

// The state of one operation on one member.
class Op {
 public:
  Op(Transport& t, Workspace& ws, const Options& options, const Group& group, const float* in,
     float* out, size_t n)
      : t_(t),
        ws_(ws),
        options_(options),
        g_(group),
        in_(in),
        out_(out),
        n_(n),
        k_(static_cast<int>(group.members.size())),
        me_(group.rank),
        codec_(options.codec),
        fp_(fingerprint(group)),
        bounds_(part_bounds(n, group.members.size(), group.part_weights)),
        chunk_(std::max<size_t>(1, options.chunk_bytes / sizeof(float))),
        rules_(LivenessRules::from(options.peer_timeout, options.entry_timeout)) {}

  uint64_t round_id() const { return g_.round_id; }
  uint64_t group_fingerprint() const { return fp_; }
  bool is_member(const std::string& name) const { return rank_of(name) >= 0; }
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
  void drop_outgoing() {
    for (auto& q : urgent_) q.clear();
    for (auto& q : outbox_) q.clear();
  }
  // Tells the peers that this operation failed, on the control channel; not the ones known to
  // be gone (the member lost, a closed connection): a socket left reconnecting to a dead
  // endpoint broke the next operations (CollectiveProcesses.RetriesAfterFailures... fails
  // when the culprit is sent one).
  void broadcast_abort(const OpFailure& f);
  // What this operation learnt of the peers' links, for the next one.
  void keep_gaps() {
    for (int p = 0; p < k_ && p < static_cast<int>(peers_.size()); ++p)
      if (p != me_) ws_.longest_gap[g_.members[p].endpoint] = peers_[p].longest_gap;
  }

 private:
  size_t part_begin(int p) const { return bounds_[static_cast<size_t>(p)]; }
  size_t part_len(int p) const { return part_begin(p + 1) - part_begin(p); }
  size_t chunks(int p) const { return (part_len(p) + chunk_ - 1) / chunk_; }
  size_t chunk_len(int p, size_t c) const { return std::min(chunk_, part_len(p) - c * chunk_); }
  // Where chunk c of part p is encoded in the send buffer.
  size_t enc_offset(int p, size_t c) const {
    return enc_part_[p] + c * encoded_bytes(codec_, chunk_);
  }
  const std::string& ep(int r) const { return g_.members[r].endpoint; }
  std::string who(int r) const { return g_.members[r].name + " (" + ep(r) + ")"; }
  int rank_of(const std::string& name) const {
    for (int r = 0; r < k_; ++r)
      if (g_.members[r].name == name) return r;
    return -1;
  }
  bool expecting(int p) const { return rs_left_[p] > 0 || ag_left_[p] > 0; }
  bool backlog(int p) const { return !urgent_[p].empty() || !outbox_[p].empty(); }

  Header header(MsgType type, int part, size_t offset, size_t count) const {
    Header h;
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

  void enqueue(int peer, const Header& h, Buffer payload, bool urgent);
  bool flush(int peer);
  void send_keepalives(Clock::time_point now);
  void send_keepalive(int p, Clock::time_point now);
  // Samples the bytes that have arrived on peer p's connections (liveness.hpp).
  void sample_bytes(int p, Clock::time_point now);
  void handle(Message& m);
  void handle_abort(const Message& m);
  void reduce_chunk(size_t c);
  [[noreturn]] void fail_nonfinite(size_t c, const float* acc);
  void check_liveness(Clock::time_point now);
  // This member has left (Communicator::leave): the operation fails, and its peers are told
  // that this member is lost, so that they go on without it at once.
  void check_leaving() const {
    if (!ws_.leaving.load(std::memory_order_acquire)) return;
    throw OpFailure{AbortKind::peer_lost, g_.members[me_].name,
                    "member " + who(me_) + " left in round " + std::to_string(g_.round_id) + ": " +
                        ws_.leave_reason,
                    true};
  }
  std::chrono::milliseconds poll_budget(Clock::time_point now);
  bool done() const;

  Transport& t_;
  Workspace& ws_;
  const Options& options_;
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
  LivenessRules rules_;

  struct Outgoing {
    Header h;
    Buffer payload;
  };
  // Per peer: all-gather results overtake queued reduce-scatter chunks, so that both phases
  // stream at once.
  std::vector<std::deque<Outgoing>> urgent_, outbox_;
  std::vector<PeerState> peers_;
  std::vector<size_t> rs_left_, ag_left_;  // chunks still expected from each peer
  std::vector<std::optional<uint64_t>> stale_round_;
  std::vector<std::vector<Buffer>> pending_;  // [chunk][rank] contributions to my part
  std::vector<Addend> addends_;               // reduce_chunk's, kept for its capacity
  std::vector<int> pending_count_;
  size_t reduced_ = 0;
  std::shared_ptr<Bytes> send_;        // reduce-scatter chunks of other parts, my part's result
  std::vector<size_t> enc_part_;       // offset of each part in send_
  bool input_zero_copy_ = false;       // reduce-scatter chunks point into the input
  std::vector<std::string> writable_;  // peers with a backlog, for the transport's wait
  Clock::time_point start_;
  uint64_t handed_bytes_ = 0;            // payload bytes of data messages the transport took
  size_t rs_handed_ = 0, rs_total_ = 0;  // reduce-scatter messages taken / to send
  // reduce-scatter schedule position
  size_t rs_chunk_ = 0;
  int rs_step_ = 1;
  size_t rs_max_chunks_ = 0;
};

void Op::enqueue(int peer, const Header& h, Buffer payload, bool urgent) {
  const std::string& name = g_.members[me_].name;
  ws_.stats.bytes_sent += sizeof(Header) + name.size() + payload.size;
  ws_.stats.payload_bytes_sent += payload.size;
  ++ws_.stats.messages_sent;
  (urgent ? urgent_ : outbox_)[peer].push_back(Outgoing{h, std::move(payload)});
  flush(peer);
  if (ws_.hooks.after_send) ws_.hooks.after_send(ws_.stats.messages_sent);
}

// Hands queued messages to the transport without blocking. True when nothing is left queued.
bool Op::flush(int peer) {
  while (true) {
    auto& box = !urgent_[peer].empty() ? urgent_[peer] : outbox_[peer];
    if (box.empty()) return true;
    Outgoing& o = box.front();
    const size_t bytes = o.payload.size;
    const bool rs = o.h.type == MsgType::reduce_scatter;
    if (!t_.try_send(ep(peer), Channel::data, o.h, g_.members[me_].name, std::move(o.payload))) {
      return false;
    }
    box.pop_front();
    handed_bytes_ += bytes;
    if (rs && ++rs_handed_ == rs_total_) {
      ws_.stats.rate_bytes = handed_bytes_;
      ws_.stats.rate_seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    }
  }
}

// Keepalives go to every peer on the control channel, whatever is queued for it on the data
// channel: a member waiting for a lost peer's data, or whose data moves slowly, must not be
// taken for lost itself.
void Op::send_keepalives(Clock::time_point now) {
  for (int p = 0; p < k_; ++p) {
    if (p == me_ || !keepalive_due(peers_[p], now, rules_)) continue;
    sample_bytes(p, now);
    send_keepalive(p, now);
  }
}

void Op::send_keepalive(int p, Clock::time_point now) {
  peers_[p].keepalive_sent = now;  // when the queue is full, try again an interval later
  Header h = header(MsgType::keepalive, 0, 0, 0);
  if (t_.try_send(ep(p), Channel::control, h, g_.members[me_].name, Buffer{}))
    ws_.stats.bytes_sent += sizeof h + g_.members[me_].name.size();
}

void Op::sample_bytes(int p, Clock::time_point now) {
  auto it = ws_.links.find(ep(p));
  uint64_t total = 0;
  if (it != ws_.links.end()) {
    for (auto l = it->second.begin(); l != it->second.end();) {
      const uint64_t b = t_.link_bytes(*l);
      if (b == 0) {
        l = it->second.erase(l);  // gone (the next message brings its new connection)
      } else {
        total += b;
        ++l;
      }
    }
  }
  note_bytes(peers_[p], total, now);
}

void Op::broadcast_abort(const OpFailure& f) {
  auto body = std::make_shared<std::string>(encode_abort({f.kind, f.culprit, f.message}));
  Buffer payload{reinterpret_cast<const uint8_t*>(body->data()), body->size(), body};
  for (int p = 0; p < k_; ++p) {
    const bool gone = (f.kind == AbortKind::peer_lost && g_.members[p].name == f.culprit) ||
                      (p < static_cast<int>(peers_.size()) && peers_[p].dropped);
    if (p == me_ || gone) continue;
    // Best effort: a peer that cannot take it times out anyway.
    (void)t_.try_send(ep(p), Channel::control, header(MsgType::abort, 0, 0, 0),
                      g_.members[me_].name, payload);
  }
}

void Op::handle_abort(const Message& m) {
  auto abort = decode_abort(m.payload.bytes());
  if (!abort) return;
  if (abort->kind == AbortKind::mismatch && (m.header.total_n != n_ || m.header.codec != codec_)) {
    // The sender disagrees with us: it is the odd one, whatever it blames.
    int s = rank_of(m.sender);
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + (s >= 0 ? who(s) : escape_remote(m.sender)) + " has a vector of " +
                        std::to_string(m.header.total_n) + " floats in codec " +
                        std::string(to_string(m.header.codec)) + ", expected " +
                        std::to_string(n_) + " in " + std::string(to_string(codec_)) +
                        ", in round " + std::to_string(g_.round_id),
                    false};
  }
  throw OpFailure{abort->kind, abort->culprit,
                  "round " + std::to_string(g_.round_id) + " aborted by " + m.sender + ": " +
                      escape_remote(abort->message, 1000),
                  false};
}

void Op::handle(Message& m) {
  const Header& h = m.header;
  if (std::string bad = check_message(h, m.sender.size(), m.payload.size); !bad.empty()) {
    ws_.drop(m, "malformed: " + bad);
    return;
  }
  const bool current = h.round_id == g_.round_id && h.group_fp == fp_;
  if (!current) {
    const int s = rank_of(m.sender);
    const bool member = s >= 0 && s != me_;
    if (h.round_id < g_.round_id) {  // left over from an earlier operation
      if (member) {
        // Still finishing that one, on its way here: alive. (Its earlier operation is bounded
        // like ours, so this cannot keep us waiting for long.)
        if (m.link != 0) ws_.links[ep(s)].insert(m.link);
        note_alive(peers_[s], Clock::now());  // alive, but not yet in this operation
        stale_round_[s] = h.round_id;
      }
      return;
    }
    if (h.round_id == g_.round_id) {
      // Another attempt at this round with another group: the one before ours (its last
      // chunks, sent before the sender learnt that a member was lost) or the next one (the
      // sender dropped the lost member before we did). Neither says anything against the
      // sender: keep it for the attempt it belongs to; a later round id drops it.
      if (h.type != MsgType::keepalive)
        ws_.stash_message(std::move(m), g_.round_id, s < 0, Clock::now());
      return;
    }
    // A later round. Data arrives in order, so a member's data (or hello) of a later round
    // means that none of this one is still coming from it. Its control messages prove nothing
    // of the kind: they overtake data still on its way (and do not count as hearing from it,
    // or two members each in another round could keep each other waiting for ever).
    // Only from a connection known to be that member's: anyone can write its name into a
    // header, and a stranger's claim must not abort the round in the member's name (it is
    // kept like other early data; if the member did move on, its silence in this round tells).
    // Without connection ids (inproc) the name is all there is. The others are told: one that
    // has not yet seen that connection would otherwise wait out its window and blame whoever
    // went silent first, which is then this member, not the one that moved on.
    const bool its_connection =
        m.link == 0 || (member && ws_.links.count(ep(s)) && ws_.links[ep(s)].count(m.link));
    if (member && on_data_connection(h.type) && expecting(s) && its_connection) {
      throw OpFailure{AbortKind::error, m.sender,
                      "member " + who(s) + " sent data for round " + std::to_string(h.round_id) +
                          " while round " + std::to_string(g_.round_id) +
                          " expects more data from it",
                      true};
    }
    if (h.type != MsgType::keepalive)
      ws_.stash_message(std::move(m), g_.round_id, s < 0, Clock::now());
    return;
  }
  const int s = static_cast<int>(h.sender_rank);
  if (h.sender_rank >= static_cast<uint32_t>(k_) || s == me_ || g_.members[s].name != m.sender) {
    // The name and the rank disagree, so neither can be believed: blaming the member it names
    // would let anyone who can reach this socket abort a round in another's name.
    ws_.drop(m, "it claims rank " + std::to_string(h.sender_rank) +
                    ", which is not the rank of that name in round " + std::to_string(g_.round_id));
    return;
  }
  note_heard(peers_[s], Clock::now());
  if (m.link != 0) ws_.links[ep(s)].insert(m.link);
  if (h.type == MsgType::keepalive || h.type == MsgType::hello) return;
  if (h.type == MsgType::abort) handle_abort(m);
  const int part = static_cast<int>(h.part);
  const int expected_part = h.type == MsgType::reduce_scatter ? me_ : s;
  if (h.codec != codec_ || h.total_n != n_ || part != expected_part) {
    std::string msg = "member " + who(s) + " sent ";
    if (h.codec != codec_) {
      msg += "codec " + std::string(to_string(h.codec)) + ", expected " +
             std::string(to_string(codec_));
    } else {
      msg += "data for part " + std::to_string(part) + " of a vector of " +
             std::to_string(h.total_n) + " floats; expected part " + std::to_string(expected_part) +
             " of " + std::to_string(n_) + " floats";
    }
    msg += " in round " + std::to_string(g_.round_id);
    throw OpFailure{AbortKind::mismatch, m.sender, msg, true};
  }
  const size_t c = h.offset / chunk_;
  const bool grid_ok = h.offset % chunk_ == 0 && c < chunks(part) &&
                       h.count == chunk_len(part, c) &&
                       m.payload.size == encoded_bytes(codec_, h.count);
  if (!grid_ok) {
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + who(s) + " sent a malformed chunk (offset " +
                        std::to_string(h.offset) + ", " + std::to_string(h.count) + " floats, " +
                        std::to_string(m.payload.size) + " bytes) for part " +
                        std::to_string(part) + " in round " + std::to_string(g_.round_id) +
                        "; chunk size differs?",
                    true};
  }
  ws_.stats.bytes_received += sizeof(Header) + m.sender.size() + m.payload.size;
  if (h.type == MsgType::reduce_scatter) {
    Buffer& slot = pending_[c][s];
    if (slot.data != nullptr || rs_left_[s] == 0) return;  // duplicate: ignore
    slot = std::move(m.payload);
    --rs_left_[s];
    if (++pending_count_[c] == k_ - 1) reduce_chunk(c);
  } else if (h.type == MsgType::all_gather) {
    if (ag_left_[s] == 0) return;
    decode(codec_, m.payload.data, h.count, out_ + part_begin(s) + h.offset);
    --ag_left_[s];
  }
}

void Op::fail_nonfinite(size_t c, const float* acc) {
  const size_t begin = part_begin(me_) + c * chunk_;
  const size_t len = chunk_len(me_, c);
  for (int r = 0; r < k_; ++r) {
    const float* v = in_ + begin;
    if (r != me_) {
      ws_.scratch.resize(len);
      decode(codec_, pending_[c][r].data, len, ws_.scratch.data());
      v = ws_.scratch.data();
    }
    size_t i = first_nonfinite(v, len);
    if (i < len) {
      throw OpFailure{AbortKind::error, g_.members[r].name,
                      "member " + who(r) + " sent NaN/Inf in round " + std::to_string(g_.round_id) +
                          " (element " + std::to_string(begin + i) + ")",
                      true};
    }
  }
  size_t i = first_nonfinite(acc, len);
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
  for (int r = 0; r < k_; ++r)
    addends_[r] = r == me_ ? Addend{in_ + begin, true} : Addend{pending_[c][r].data, false};
  mean_of(codec_, addends_, len, acc);
  if (options_.reject_nonfinite && !all_finite(acc, len)) fail_nonfinite(c, acc);
  for (auto& b : pending_[c]) b = Buffer{};
  // Encode once; every member, this one too, uses the decoded bytes.
  const size_t at = enc_offset(me_, c);
  uint8_t* enc = send_->data.get() + at;
  const size_t enc_len = encoded_bytes(codec_, len);
  encode(codec_, acc, len, enc);
  for (int step = 1; step < k_; ++step) {
    int p = (me_ + step) % k_;
    enqueue(p, header(MsgType::all_gather, me_, c * chunk_, len), shared_slice(send_, at, enc_len),
            true);
  }
  if (codec_ != Codec::fp32) decode(codec_, enc, len, acc);
  ++reduced_;
}

bool Op::done() const {
  if (rs_chunk_ < rs_max_chunks_ || reduced_ < chunks(me_)) return false;
  for (int p = 0; p < k_; ++p)
    if (p != me_ && (expecting(p) || backlog(p))) return false;
  return true;
}

void Op::check_liveness(Clock::time_point now) {
  int silent = -1;
  for (int p = 0; p < k_; ++p) {
    if (p == me_) continue;
    PeerState& peer = peers_[p];
    peer.expecting = expecting(p);
    peer.backlog = backlog(p);
    switch (judge(peer, now, rules_)) {
      case Verdict::alive:
        break;
      case Verdict::closed:
        throw OpFailure{
            AbortKind::peer_lost, g_.members[p].name,
            "lost member " + who(p) + ": connection closed in round " + std::to_string(g_.round_id),
            true};
      case Verdict::silent:
        sample_bytes(p, now);  // bytes since the last sample prove it alive then
        if (judge(peer, now, rules_) == Verdict::alive) break;
        // The one silent for longest is the likeliest cause of the others' silence.
        if (silent < 0 || peer.heard < peers_[silent].heard) silent = p;
        break;
    }
  }
  if (silent < 0) return;
  const auto window = seconds_str(silence_window(rules_, peers_[silent]));
  if (stale_round_[silent]) {
    throw OpFailure{AbortKind::error, g_.members[silent].name,
                    "member " + who(silent) + " sent data for round " +
                        std::to_string(*stale_round_[silent]) + " but none for round " +
                        std::to_string(g_.round_id) + " in " + window,
                    true};
  }
  throw OpFailure{AbortKind::peer_lost, g_.members[silent].name,
                  "lost member " + who(silent) + ": no data for " + window + " in round " +
                      std::to_string(g_.round_id),
                  true};
}

std::chrono::milliseconds Op::poll_budget(Clock::time_point now) {
  Clock::time_point until = now + std::chrono::milliseconds(100);
  for (int p = 0; p < k_; ++p)
    if (p != me_) until = std::min(until, next_check(peers_[p], now, rules_));
  auto budget = std::chrono::ceil<std::chrono::milliseconds>(until - now);
  return std::max(budget, std::chrono::milliseconds(1));
}

void Op::run() {
  start_ = Clock::now();
  outbox_.resize(k_);
  urgent_.resize(k_);
  peers_.assign(k_, PeerState{});
  for (int p = 0; p < k_; ++p) {
    peers_[p].heard = start_;
    peers_[p].keepalive_sent = start_ - rules_.keepalive_interval;  // one at once
    auto gap = ws_.longest_gap.find(ep(p));
    if (gap != ws_.longest_gap.end()) peers_[p].longest_gap = gap->second;
  }
  rs_left_.assign(k_, chunks(me_));
  ag_left_.assign(k_, 0);
  stale_round_.assign(k_, std::nullopt);
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
  input_zero_copy_ = codec_ == Codec::fp32 && ws_.input_zero_copy &&
                     std::all_of(g_.members.begin(), g_.members.end(), [&](const Member& m) {
                       return t_.releases_sent_payloads(m.endpoint);
                     });
  // With zero-copy fp32 the send buffer only holds my part's result.
  send_ = ws_.send_buffer(input_zero_copy_ ? enc_part_[me_ + 1] : enc_part_[k_]);
  for (int p = 0; p < k_; ++p)
    if (p != me_) (void)t_.take_event(ep(p));  // forget drops before this operation
  // A hello ahead of the data on each data connection (best effort: a queue still full of the
  // last operation's chunks skips it, and the first chunk tells the connection instead).
  for (int p = 0; p < k_; ++p) {
    if (p != me_ && t_.try_send(ep(p), Channel::data, header(MsgType::hello, 0, 0, 0),
                                g_.members[me_].name, Buffer{}))
      ws_.stats.bytes_sent += sizeof(Header) + g_.members[me_].name.size();
  }

  check_leaving();
  // Messages of this operation that arrived during an earlier one.
  for (Workspace::Early& e : ws_.take_stash(Clock::now())) {
    if (e.m.header.round_id < g_.round_id) continue;
    handle(e.m);
  }

  while (!done()) {
    bool progressed = false;
    for (int i = 0; i < 64; ++i) {
      Message m;
      if (!t_.try_receive(m)) break;
      progressed = true;
      handle(m);
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
        Buffer payload;
        if (input_zero_copy_) {
          payload = Buffer{reinterpret_cast<const uint8_t*>(src), len * sizeof(float),
                           InputRefs::take(ws_.input_refs)};
        } else {
          const size_t at = enc_offset(p, rs_chunk_);
          encode(codec_, src, len, send_->data.get() + at);
          payload = shared_slice(send_, at, encoded_bytes(codec_, len));
        }
        enqueue(p, header(MsgType::reduce_scatter, p, rs_chunk_ * chunk_, len), std::move(payload),
                false);
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
    for (int p = 0; p < k_; ++p) {
      // Always drain, so that the wait does not keep waking up for a peer we are done with.
      // A refused connection counts too: a member publishes its endpoint only once bound, so a
      // refusal during the operation means its process or communicator is gone.
      if (p != me_ && t_.take_event(ep(p)) != PeerEvent::none && !peers_[p].dropped)
        peers_[p].dropped = now;
    }
    check_liveness(now);
    check_leaving();
    if (progressed) continue;
    writable_.clear();
    for (int p = 0; p < k_; ++p)
      if (p != me_ && backlog(p)) writable_.push_back(ep(p));
    t_.wait(writable_, poll_budget(now));
  }
  ws_.stats.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
}

void Op::linger_until_delivered() {
  const auto start = Clock::now();
  std::vector<int> waiting;  // the peers that may not have all our data yet
  for (int p = 0; p < k_; ++p)
    if (p != me_ && t_.undelivered(ep(p))) waiting.push_back(p);
  auto stop_waiting = [&](int p) { std::erase(waiting, p); };
  while (!waiting.empty() && Clock::now() - start < kMaxWidening * rules_.peer_timeout) {
    Message m;
    while (t_.try_receive(m)) {
      const Header& h = m.header;
      if (!check_message(h, m.sender.size(), m.payload.size).empty()) {
        ws_.drop(m, "malformed");
      } else if ((h.round_id > g_.round_id || (h.round_id == g_.round_id && h.group_fp != fp_)) &&
                 h.type != MsgType::keepalive) {
        ws_.stash_message(std::move(m), g_.round_id, rank_of(m.sender) < 0, Clock::now());
      } else if (h.round_id == g_.round_id && h.sender_rank < static_cast<uint32_t>(k_) &&
                 g_.members[h.sender_rank].name == m.sender) {
        const int s = static_cast<int>(h.sender_rank);
        note_heard(peers_[s], Clock::now());
        if (h.type == MsgType::abort) stop_waiting(s);
      }
      m = Message{};
    }
    const auto now = Clock::now();
    std::erase_if(waiting, [&](int p) {
      return t_.take_event(ep(p)) == PeerEvent::closed ||
             now - peers_[p].heard > silence_window(rules_, peers_[p]) || !t_.undelivered(ep(p));
    });
    for (int p : waiting)
      if (keepalive_due(peers_[p], now, rules_)) send_keepalive(p, now);
    // Acknowledgements wake nobody: look again soon; on a fast link (the first 2 ms) sooner
    // than the transport's wait can (1 ms steps), which would cost small operations 20 %.
    if (waiting.empty()) break;
    if (Clock::now() - start < std::chrono::milliseconds(2))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else
      t_.wait({}, std::chrono::milliseconds(1));
  }
}

// After a failure: nothing more goes out of this operation, nothing refers to the input, and
// the receive queue is empty (data of later operations kept for them).
void abandon(Transport& t, Workspace& ws, Op& op) {
  ws.last_ok = false;
  op.drop_outgoing();
  t.drop_all();
  // Closing a connection with its queue dropped lets go of the payloads within milliseconds,
  // even towards a frozen peer (tests/collective checks it). The bound guards against the
  // unforeseen: past it, the caller's input might still be read, so say so loudly and stop
  // sending from inputs on this communicator.
  constexpr auto kLimit = std::chrono::milliseconds(2000);
  if (!ws.input_refs->wait_released(kLimit)) {
    ws.input_zero_copy = false;
    spdlog::error(
        "collective: the transport still references the caller's input {} after closing its "
        "connections; sending from a copy from now on",
        seconds_str(kLimit));
  }
  Message m;
  while (t.try_receive(m)) {
    // Kept: later rounds, and another attempt at this one (a peer that already runs the retry
    // without a lost member: dropping its first chunks would leave our retry waiting on them
    // while its keepalives say it is alive).
    const bool later =
        m.header.round_id > op.round_id() ||
        (m.header.round_id == op.round_id() && m.header.group_fp != op.group_fingerprint());
    if (later && m.header.type != MsgType::keepalive &&
        check_message(m.header, m.sender.size(), m.payload.size).empty())
      ws.stash_message(std::move(m), op.round_id(), !op.is_member(m.sender), Clock::now());
    m = Message{};
  }
}

void check_group(const Transport& t, const Group& group) {
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
  if (!same_socket(group.members[group.rank].endpoint, t.endpoint())) {
    throw CollectiveError("allreduce: member " + group.members[group.rank].name + " has endpoint " +
                          group.members[group.rank].endpoint +
                          " in the group, but this communicator is bound to " + t.endpoint());
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
}

}  // namespace

std::shared_ptr<const void> InputRefs::take(const std::shared_ptr<InputRefs>& self) {
  {
    std::lock_guard lock(self->m_);
    ++self->count_;
  }
  return std::shared_ptr<const void>(self.get(), [self](const void*) {
    std::lock_guard lock(self->m_);
    if (--self->count_ == 0) self->cv_.notify_all();
  });
}

bool InputRefs::wait_released(std::chrono::milliseconds limit) {
  std::unique_lock lock(m_);
  return cv_.wait_for(lock, limit, [this] { return count_ == 0; });
}

size_t max_payload_bytes(const Options& options) {
  size_t floats = std::max<size_t>(1, options.chunk_bytes / sizeof(float));
  if (options.max_floats > 0) floats = std::min(floats, options.max_floats);
  size_t widest = kMaxAbortBytes;
  for (Codec c : {Codec::fp32, Codec::fp16, Codec::bf16, Codec::int8})
    widest = std::max(widest, encoded_bytes(c, floats));
  return widest;
}

size_t held_bytes_bound(const Options& options) {
  if (options.max_floats == 0 || options.max_floats > kMaxStashBytes / 8) return kMaxStashBytes;
  return std::clamp(2 * encoded_bytes(Codec::fp32, options.max_floats), kMinStashBytes,
                    kMaxStashBytes);
}

void Workspace::configure(const Options& options) {
  // Early messages wait for their operation at most this long: far longer than members of
  // one job start apart (a straggler's previous operation is bounded by a few timeouts).
  stash_ttl = std::max<Clock::duration>(std::chrono::minutes(10), 100 * options.peer_timeout);
  stash_limit = held_bytes_bound(options);
  max_payload = max_payload_bytes(options);
}

void Workspace::stash_message(Message&& m, uint64_t round_id, bool stranger,
                              Clock::time_point now) {
  if (m.payload.size > max_payload) {
    drop(m, "a payload of " + std::to_string(m.payload.size) +
                " bytes is larger than any operation of this communicator sends (" +
                std::to_string(max_payload) +
                " bytes: a chunk of Options::chunk_bytes, at most "
                "Options::max_floats floats)");
    return;
  }
  if (m.header.round_id - round_id > kMaxRoundsAhead) {
    drop(m, "round " + std::to_string(m.header.round_id) + " is implausibly far ahead of round " +
                std::to_string(round_id));
    return;
  }
  const size_t size = m.payload.size;
  const size_t stranger_limit = std::min(kMaxStrangerStashBytes, stash_limit);
  if (stranger &&
      (stranger_bytes + size > stranger_limit || strangers >= kMaxStrangerStashMessages)) {
    drop(m, "a sender outside the group of round " + std::to_string(round_id) + " already has " +
                std::to_string(stranger_bytes) + " bytes in " + std::to_string(strangers) +
                " messages waiting (limits " + std::to_string(stranger_limit) + " bytes, " +
                std::to_string(kMaxStrangerStashMessages) + " messages)");
    return;
  }
  stash_bytes += size;
  if (stranger) {
    stranger_bytes += size;
    ++strangers;
  }
  stash.push_back(Early{std::move(m), now, stranger});
  while (!stash.empty() && (stash_bytes > stash_limit || stash.size() > kMaxStashMessages)) {
    Early& e = stash.front();
    drop(e.m, "the early messages exceed " + std::to_string(stash_limit) + " bytes or " +
                  std::to_string(kMaxStashMessages) + " messages; the oldest goes");
    stash_bytes -= e.m.payload.size;
    if (e.stranger) {
      stranger_bytes -= e.m.payload.size;
      --strangers;
    }
    stash.pop_front();
  }
}

void Workspace::expire(Clock::time_point now) {
  std::erase_if(stash, [&](const Early& e) {
    if (now - e.at <= stash_ttl) return false;
    drop(e.m, "it waited " + seconds_str(now - e.at) + " for its round, more than " +
                  seconds_str(stash_ttl));
    stash_bytes -= e.m.payload.size;
    if (e.stranger) {
      stranger_bytes -= e.m.payload.size;
      --strangers;
    }
    return true;
  });
}

std::deque<Workspace::Early> Workspace::take_stash(Clock::time_point now) {
  expire(now);
  std::deque<Early> out;
  out.swap(stash);
  stash_bytes = stranger_bytes = strangers = 0;
  return out;
}

size_t receive_between_operations(Transport& t, Workspace& ws, const Options& options,
                                  Clock::time_point now) {
  ws.configure(options);
  ws.expire(now);
  // At most this many per call, so that an operation about to begin does not wait long.
  constexpr size_t kMaxPerCall = 4096;
  size_t taken = 0;
  Message m;
  while (taken < kMaxPerCall && ws.stash_bytes + ws.max_payload <= ws.stash_limit &&
         ws.stash.size() < kMaxStashMessages && t.try_receive(m)) {
    ++taken;
    const Header& h = m.header;
    const bool past = ws.begun && (h.round_id < ws.last_round ||
                                   (h.round_id == ws.last_round && h.group_fp == ws.last_fp));
    if (std::string bad = check_message(h, m.sender.size(), m.payload.size); !bad.empty()) {
      ws.drop(m, "malformed: " + bad);
    } else if (h.type != MsgType::keepalive && !past) {
      // Of a later operation (as any operation would keep it). Before the first one, nobody
      // is a stranger, and no round is known to be far ahead.
      const bool stranger = ws.begun && std::find(ws.last_members.begin(), ws.last_members.end(),
                                                  m.sender) == ws.last_members.end();
      ws.stash_message(std::move(m), ws.begun ? ws.last_round : h.round_id, stranger, now);
    }
    m = Message{};
  }
  return taken;
}

void Workspace::drop(const Message& m, const std::string& why) {
  ++dropped;
  uint64_t held = 0;
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
          .count();
  if (!drop_log.allow(now_ms, &held)) return;
  spdlog::warn("collective: dropped a message from '{}' (round {}, {} payload bytes): {}{}",
               escape_remote(m.sender), m.header.round_id, m.payload.size, why,
               held ? " (" + std::to_string(held) + " more dropped since the last such line)"
                    : std::string());
}

std::shared_ptr<Bytes> Workspace::send_buffer(size_t size) {
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
      b = std::make_shared<Bytes>(size);
      return b;
    }
  }
  send_buffers.push_back(std::make_shared<Bytes>(size));
  if (send_buffers.size() > 4) send_buffers.erase(send_buffers.begin());
  return send_buffers.back();
}

void butterfly_allreduce(Transport& t, Workspace& ws, const Options& options, const Group& group,
                         const float* in, float* out, size_t n) {
  ws.stats = Stats{};
  check_group(t, group);
  ws.configure(options);
  ws.begun = true;
  ws.last_round = group.round_id;
  ws.last_fp = fingerprint(group);
  ws.last_members.clear();
  for (const Member& m : group.members) ws.last_members.push_back(m.name);
  // Peers that left the group: let what is queued for them drain, then close.
  std::vector<std::string> peers;
  for (int p = 0; p < static_cast<int>(group.members.size()); ++p)
    if (p != group.rank) peers.push_back(group.members[p].endpoint);
  t.keep_only(peers, options.peer_timeout);
  if (group.members.size() == 1) {
    if (ws.leaving.load(std::memory_order_acquire))
      throw PeerLostError("member " + group.members[0].name + " left: " + ws.leave_reason,
                          group.members[0].name);
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  Op op(t, ws, options, group, in, out, n);
  try {
    op.run();
    op.linger_until_delivered();
  } catch (const OpFailure& f) {
    op.keep_gaps();
    abandon(t, ws, op);
    if (f.broadcast) op.broadcast_abort(f);
    spdlog::warn("collective: {}", f.message);
    if (f.kind == AbortKind::peer_lost) throw PeerLostError(f.message, f.culprit);
    throw CollectiveError(f.message, f.culprit);
  } catch (...) {
    op.keep_gaps();
    abandon(t, ws, op);
    throw;
  }
  op.keep_gaps();
  ws.last_ok = true;
  // Success means that every peer received all our reduce-scatter chunks (it sent us the
  // results they went into), so all the bytes are out of the input; the transport lets go of
  // the last one within microseconds. Bounded all the same.
  if (!ws.input_refs->wait_released(options.peer_timeout)) {
    spdlog::warn(
        "collective: the transport still referenced the input {} after a successful "
        "operation",
        seconds_str(options.peer_timeout));
    abandon(t, ws, op);
    ws.last_ok = true;
  }
}

}  // namespace loco::collective::detail
