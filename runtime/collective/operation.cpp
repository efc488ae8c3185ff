#include "runtime/collective/operation.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/collective/codec.hpp"
#include "runtime/collective/local.hpp"

namespace loco::collective::detail {
namespace {

// Sent on the data connection, in order with the data.
bool on_data_connection(MsgType t) {
  return t == MsgType::reduce_scatter || t == MsgType::all_gather || t == MsgType::blob ||
         t == MsgType::hello;
}

// Notes the connection m came on as one of member `endpoint`'s data connections, whose bytes
// are evidence of its life (sample_bytes). Not its control connection: a member in another
// operation keeps sending keepalives on it, and their bytes kept two members that waited on
// each other alive for ever (the soak's rehearsal, 2026-11-30). A keepalive counts as a whole
// message of this operation, or not at all.
void note_data_link(Workspace& ws, const std::string& endpoint, const Message& m) {
  if (m.link != 0 && on_data_connection(m.header.type)) ws.links[endpoint].insert(m.link);
}

void check_group(const Transport& t, const Group& group, std::string_view what) {
  const int k = static_cast<int>(group.members.size());
  if (k == 0 || group.rank < 0 || group.rank >= k) {
    throw CollectiveError(std::string(what) + ": rank " + std::to_string(group.rank) +
                          " is not in a group of " + std::to_string(k) + " members");
  }
  // A tcp socket bound to a wildcard address is published under a routable one: compare ports.
  auto same_socket = [](const std::string& a, const std::string& b) {
    if (a == b) return true;
    if (!a.starts_with("tcp://") || !b.starts_with("tcp://")) return false;
    return a.substr(a.rfind(':')) == b.substr(b.rfind(':'));
  };
  if (!same_socket(group.members[group.rank].endpoint, t.endpoint())) {
    throw CollectiveError(std::string(what) + ": member " + group.members[group.rank].name +
                          " has endpoint " + group.members[group.rank].endpoint +
                          " in the group, but this communicator is bound to " + t.endpoint());
  }
  for (int a = 0; a < k; ++a) {
    for (int b = a + 1; b < k; ++b) {
      if (group.members[a].name == group.members[b].name ||
          group.members[a].endpoint == group.members[b].endpoint) {
        throw CollectiveError(std::string(what) + ": members " + std::to_string(a) + " and " +
                              std::to_string(b) + " share a name or endpoint (" +
                              group.members[a].name + ", " + group.members[a].endpoint + ")");
      }
    }
  }
  try {
    check_left_out(group.left_out, group.members.size());
  } catch (const CollectiveError& e) {
    throw CollectiveError(std::string(what) + ": " + e.what());
  }
  if ((group.first_phase || group.last_phase) &&
      !(group.first_phase <= group.round_id && group.round_id <= group.last_phase)) {
    throw CollectiveError(std::string(what) + ": round " + std::to_string(group.round_id) +
                          " is not among its operation's rounds " +
                          std::to_string(group.first_phase) + " to " +
                          std::to_string(group.last_phase));
  }
}

}  // namespace

bool in_phases(const Group& g, uint64_t round_id) {
  return g.last_phase > g.first_phase && g.first_phase <= round_id && round_id <= g.last_phase;
}

std::string seconds_str(Clock::duration d) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return s.str();
}

Operation::Operation(Transport& t, Workspace& ws, const Options& options, const Group& group,
                     Codec codec, uint64_t total_n)
    : t_(t),
      ws_(ws),
      options_(options),
      g_(group),
      k_(static_cast<int>(group.members.size())),
      me_(group.rank),
      fp_(fingerprint(group)),
      codec_(codec),
      total_n_(total_n),
      rules_(LivenessRules::from(options.peer_timeout, options.entry_timeout)) {}

int Operation::rank_of(const std::string& name) const {
  for (int r = 0; r < k_; ++r)
    if (g_.members[r].name == name) return r;
  return -1;
}

Header Operation::header(MsgType type, uint32_t part, uint64_t offset, uint64_t count) const {
  Header h;
  h.type = type;
  h.codec = codec_;
  h.sender_rank = static_cast<uint32_t>(me_);
  h.part = part;
  h.group_fp = fp_;
  h.round_id = g_.round_id;
  h.total_n = total_n_;
  h.offset = offset;
  h.count = count;
  return h;
}

void Operation::drop_outgoing() {
  for (auto& q : urgent_) q.clear();
  for (auto& q : outbox_) q.clear();
}

void Operation::keep_gaps() {
  for (int p = 0; p < k_ && p < static_cast<int>(peers_.size()); ++p)
    if (p != me_) ws_.longest_gap[g_.members[p].endpoint] = peers_[p].longest_gap;
}

void Operation::check_leaving() const {
  if (ws_.leaving.load(std::memory_order_acquire))
    throw OpFailure{AbortKind::peer_lost, g_.members[me_].name,
                    "member " + who(me_) + " left in round " + std::to_string(g_.round_id) + ": " +
                        ws_.leave_reason,
                    true};
  if (g_.round_id < ws_.given_up_below.load(std::memory_order_acquire)) {
    std::string why;
    bool as_lost = false;
    {
      std::lock_guard lock(ws_.gone_mu);
      why = ws_.given_up_reason;
      as_lost = ws_.given_up_as_lost;
    }
    if (as_lost)  // as leave() does: the others are told this member is lost
      throw OpFailure{
          AbortKind::peer_lost, g_.members[me_].name,
          "member " + who(me_) + " left round " + std::to_string(g_.round_id) + ": " + why, true};
    throw OpFailure{AbortKind::error, "",
                    "round " + std::to_string(g_.round_id) + " was given up: " + why, true};
  }
  // A member said gone by Communicator::peer_gone: lost now, whatever its connections show.
  // Looked up at the start and after each new call only (this runs every poll).
  const uint64_t generation = ws_.gone_generation.load(std::memory_order_acquire);
  if (generation == gone_seen_) return;
  gone_seen_ = generation;
  for (int p = 0; p < k_; ++p) {
    if (p == me_) continue;
    if (auto why = ws_.gone_reason(ep(p), g_.round_id))
      throw OpFailure{
          AbortKind::peer_lost, g_.members[p].name,
          "lost member " + who(p) + " in round " + std::to_string(g_.round_id) + ": " + *why, true};
  }
}

void Operation::enqueue(int peer, const Header& h, Buffer payload, bool urgent) {
  const std::string& name = g_.members[me_].name;
  ws_.stats.bytes_sent += sizeof(Header) + name.size() + payload.size;
  ws_.stats.payload_bytes_sent += payload.size;
  ++ws_.stats.messages_sent;
  (urgent ? urgent_ : outbox_)[peer].push_back(Outgoing{h, std::move(payload)});
  flush(peer);
  if (ws_.hooks.after_send) ws_.hooks.after_send(ws_.stats.messages_sent);
}

// Hands queued messages to the transport without blocking. True when nothing is left queued.
bool Operation::flush(int peer) {
  while (true) {
    const bool bulk = urgent_[peer].empty();
    auto& box = bulk ? outbox_[peer] : urgent_[peer];
    if (box.empty()) return true;
    Outgoing& o = box.front();
    const size_t bytes = o.payload.size;
    if (!t_.try_send(ep(peer), Channel::data, o.h, g_.members[me_].name, std::move(o.payload))) {
      return false;
    }
    box.pop_front();
    handed_bytes_ += bytes;
    if (bulk && ++bulk_handed_ == bulk_total_) {
      ws_.stats.rate_bytes = handed_bytes_;
      ws_.stats.rate_seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    }
  }
}

// Keepalives go to every peer on the control channel, whatever is queued for it on the data
// channel: a member waiting for a lost peer's data, or whose data moves slowly, must not be
// taken for lost itself.
void Operation::send_keepalives(Clock::time_point now) {
  for (int p = 0; p < k_; ++p) {
    if (p == me_ || !keepalive_due(peers_[p], now, rules_)) continue;
    sample_bytes(p, now);
    send_keepalive(p, now);
  }
}

void Operation::send_keepalive(int p, Clock::time_point now) {
  peers_[p].keepalive_sent = now;  // when the queue is full, try again an interval later
  Header h = header(MsgType::keepalive);
  if (t_.try_send(ep(p), Channel::control, h, g_.members[me_].name, Buffer{}))
    ws_.stats.bytes_sent += sizeof h + g_.members[me_].name.size();
}

void Operation::sample_bytes(int p, Clock::time_point now) {
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

void Operation::broadcast_abort(const OpFailure& f) {
  auto body = std::make_shared<std::string>(encode_abort({f.kind, f.culprit, f.message}));
  Buffer payload{reinterpret_cast<const uint8_t*>(body->data()), body->size(), body};
  for (int p = 0; p < k_; ++p) {
    // The member blamed as lost is told too: one that is alive (slow, or late to enter) learns
    // that the others go on without it and leaves the operation (handle_abort), instead of
    // waiting for them and failing a later operation of theirs with what it then receives.
    const bool dropped = p < static_cast<int>(peers_.size()) && peers_[p].dropped;
    if (p == me_ || dropped) continue;
    // Best effort: a peer that cannot take it times out anyway.
    (void)t_.try_send(ep(p), Channel::control, header(MsgType::abort), g_.members[me_].name,
                      payload);
  }
}

void Operation::handle_abort(const Message& m) {
  auto abort = decode_abort(m.payload.bytes());
  if (!abort) return;
  if (abort->kind == AbortKind::mismatch &&
      (m.header.total_n != total_n_ || m.header.codec != codec_)) {
    // The sender disagrees with us: it is the odd one, whatever it blames.
    int s = rank_of(m.sender);
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + (s >= 0 ? who(s) : escape_remote(m.sender)) + " has " +
                        shape(m.header) + ", expected " + shape(header(MsgType::abort)) +
                        ", in round " + std::to_string(g_.round_id),
                    false};
  }
  if (abort->kind == AbortKind::peer_lost && abort->culprit == g_.members[me_].name)
    throw lost_to_the_others(m.sender, g_.round_id, abort->message);
  throw OpFailure{abort->kind, abort->culprit,
                  "round " + std::to_string(g_.round_id) + " aborted by " + m.sender + ": " +
                      escape_remote(abort->message, 1000),
                  false};
}

OpFailure Operation::lost_to_the_others(const std::string& sender, uint64_t round,
                                        const std::string& why) const {
  // It leaves as one that stops does: its notice (peer_lost, itself the culprit) makes it a
  // lost member of whatever operation the others are in, which they finish without it.
  return OpFailure{AbortKind::peer_lost, g_.members[me_].name,
                   "member " + who(me_) + " was lost to " + escape_remote(sender) + " in round " +
                       std::to_string(round) + " (" + escape_remote(why, 1000) +
                       "); it leaves round " + std::to_string(g_.round_id),
                   true};
}

void Operation::handle(Message& m) {
  const Header& h = m.header;
  if (m.forged) {
    // Through a relay, sealed by its sender; it did not open: nothing in it is decoded. Only
    // the relay (or someone on its path) could have changed it, but the member it claims to
    // come from is the one this round cannot go on with.
    ws_.drop(m, "it failed to authenticate");
    const int s = rank_of(m.sender);
    if (s < 0 || s == me_) return;
    throw OpFailure{AbortKind::error, m.sender,
                    "a message from member " + who(s) + " through the relay " +
                        (g_.relay.endpoint.empty() ? std::string("?") : g_.relay.endpoint) +
                        " failed to authenticate in round " + std::to_string(g_.round_id) +
                        " (changed, forged or replayed on its way); dropped undecoded",
                    true};
  }
  if (std::string bad = check_message(h, m.sender.size(), m.payload.size); !bad.empty()) {
    ws_.drop(m, "malformed: " + bad);
    return;
  }
  const bool current = h.round_id == g_.round_id && h.group_fp == fp_;
  if (!current) {
    const int s = rank_of(m.sender);
    const bool member = s >= 0 && s != me_;
    if (h.round_id != g_.round_id && in_phases(g_, h.round_id)) {
      handle_other_phase(m, s, member);
      return;
    }
    if (h.round_id < g_.round_id) {  // left over from an earlier operation
      if (member && h.type == MsgType::abort && expecting(s) &&
          ws_.finished == std::make_pair(h.round_id, h.group_fp)) {
        // It gave up the operation this member finished last: it will not come to this one (a
        // streaming member whose fragment failed fails its round; a blocking one tries the one
        // it gave up again). Without this the round waited out the member's entry window. (A
        // notice of an operation both gave up says nothing of the kind.)
        // One that left (it stopped: scaled down, say, with its last fragment still in flight;
        // or it was dropped from the round) is lost to this operation too: the others finish it
        // without it, as they would have the one it gave up, rather than fail their round.
        const auto abort = decode_abort(m.payload.bytes());
        // It lost this member there, which finished that operation with it: what this member
        // holds of it is not what the others hold, and they go on without it.
        if (abort && abort->kind == AbortKind::peer_lost && abort->culprit == g_.members[me_].name)
          throw lost_to_the_others(m.sender, h.round_id, abort->message);
        const bool left =
            abort && abort->kind == AbortKind::peer_lost && abort->culprit == m.sender;
        throw OpFailure{left ? AbortKind::peer_lost : AbortKind::error, m.sender,
                        "member " + who(s) + (left ? " left after" : " gave up") + " round " +
                            std::to_string(h.round_id) +
                            ", which this member finished, and sends nothing for round " +
                            std::to_string(g_.round_id) + ": " +
                            (abort ? escape_remote(abort->message, 1000) : std::string("?")),
                        true};
      }
      if (member) {
        // Still finishing that one, on its way here: alive. (Its earlier operation is bounded
        // like ours, so this cannot keep us waiting for long.)
        note_data_link(ws_, ep(s), m);
        note_alive(peers_[s], Clock::now());  // alive, but not yet in this operation
        stale_round_[s] = h.round_id;
      }
      return;
    }
    if (h.round_id == g_.round_id) {
      // Another attempt at this round with another group: the one before ours (its last
      // chunks, sent before the sender learnt that a member was lost) or the next one (the
      // sender dropped the lost member before we did). Neither says anything against the
      // sender: keep it for the attempt it belongs to; a later round id drops it. Nor does it
      // count as hearing from it; but should it fall silent in this group, the error says
      // that it runs this round in another (a disagreement on part_weights or left_out shows
      // this way).
      if (h.type != MsgType::keepalive) {
        if (member) other_group_[s] = true;
        ws_.stash_message(std::move(m), g_.round_id, s < 0, Clock::now());
      }
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
  note_data_link(ws_, ep(s), m);
  if (h.type == MsgType::keepalive || h.type == MsgType::hello) return;
  if (h.type == MsgType::abort) handle_abort(m);
  ws_.stats.bytes_received += sizeof(Header) + m.sender.size() + m.payload.size;
  handle_data(s, m);
}

// Another exchange of this operation (Group::first_phase..last_phase): see types.hpp.
void Operation::handle_other_phase(Message& m, int s, bool member) {
  const Header& h = m.header;
  // Of an earlier exchange: it went back to it (it lost a member we have not heard of yet), or
  // it is still there: alive, and on its way. Of a later one: it finished this one, or is in an
  // attempt before ours, which it leaves as soon as it learns of the loss (our notice): proof of
  // nothing here. Counted as hearing from it, a member whose data of this exchange was lost on
  // the way kept us waiting for ever, while our messages of this exchange kept it waiting for our
  // data of the next (the soak's smoke, 2026-11-30): now its silence here tells.
  if (member && h.round_id < g_.round_id) {
    note_data_link(ws_, ep(s), m);
    note_alive(peers_[s], Clock::now());
  }
  if (member && h.type == MsgType::abort && h.round_id < g_.round_id && h.group_fp == fp_ &&
      expecting(s)) {
    // It gave up an earlier exchange of this attempt, which this member finished: it will not
    // come to this one, and goes back to the first without the member it lost there (or fails
    // its round): so does this one, blaming whom it blamed.
    const auto abort = decode_abort(m.payload.bytes());
    throw OpFailure{abort ? abort->kind : AbortKind::error, abort ? abort->culprit : m.sender,
                    "member " + who(s) + " gave up round " + std::to_string(h.round_id) +
                        " of this operation, which this member finished, and sends nothing for "
                        "round " +
                        std::to_string(g_.round_id) + ": " +
                        (abort ? escape_remote(abort->message, 1000) : std::string("?")),
                    true};
  }
  if (h.type != MsgType::keepalive)
    ws_.stash_message(std::move(m), g_.round_id, s < 0, Clock::now());
}

void Operation::report_wait(Clock::time_point now) {
  next_report_ = now + kWaitReports * rules_.peer_timeout;
  auto ago = [&](Clock::time_point t) { return seconds_str(now - t) + " ago"; };
  std::string waits, owes;
  for (int p = 0; p < k_; ++p) {
    if (p == me_) continue;
    const PeerState& peer = peers_[p];
    if (expecting(p)) {
      waits += (waits.empty() ? "" : "; ") + g_.members[p].name + " (alive " + ago(peer.heard) +
               (peer.heard_in_op ? "" : ", nothing of this operation yet") + ", its window " +
               seconds_str(silence_window(rules_, peer)) +
               (stale_round_[p] ? ", data of round " + std::to_string(*stale_round_[p]) : "") +
               (other_group_[p] ? ", in another group of this round" : "") + ")";
    }
    if (backlog(p)) {
      owes += (owes.empty() ? "" : ", ") + g_.members[p].name + " (" +
              std::to_string(urgent_[p].size() + outbox_[p].size()) + " queued)";
    }
  }
  spdlog::warn("collective: round {} (group {:016x}, {} members) has run {}: waiting for {}{}",
               g_.round_id, fp_, k_, seconds_str(now - start_), waits.empty() ? "none" : waits,
               owes.empty() ? std::string() : "; owing " + owes);
}

bool Operation::done() const {
  if (!produced_all()) return false;
  for (int p = 0; p < k_; ++p)
    if (p != me_ && (expecting(p) || backlog(p))) return false;
  return true;
}

void Operation::check_liveness(Clock::time_point now) {
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
      case Verdict::relay_lost:
        // Not the member's fault, nor a sign that it is gone: the round cannot finish as it
        // is (what the relay held is lost), and whoever runs it again decides with whom.
        throw OpFailure{AbortKind::error, "",
                        "the relay " +
                            (g_.relay.endpoint.empty() ? std::string("?") : g_.relay.endpoint) +
                            " closed its connection in round " + std::to_string(g_.round_id) +
                            " (killed or restarted): what it held between this member and member " +
                            who(p) + " is lost",
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
  std::string other;
  if (other_group_[silent]) {
    other =
        "; it sent data for this round in another group (members, part_weights or left_out "
        "differ from this member's)";
  }
  throw OpFailure{AbortKind::peer_lost, g_.members[silent].name,
                  "lost member " + who(silent) + ": no data for " + window + " in round " +
                      std::to_string(g_.round_id) + other,
                  true};
}

std::chrono::milliseconds Operation::poll_budget(Clock::time_point now) {
  Clock::time_point until = now + std::chrono::milliseconds(100);
  for (int p = 0; p < k_; ++p)
    if (p != me_) until = std::min(until, next_check(peers_[p], now, rules_));
  auto budget = std::chrono::ceil<std::chrono::milliseconds>(until - now);
  return std::max(budget, std::chrono::milliseconds(1));
}

void Operation::run() {
  start_ = Clock::now();
  outbox_.assign(k_, {});
  urgent_.assign(k_, {});
  peers_.assign(k_, PeerState{});
  for (int p = 0; p < k_; ++p) {
    peers_[p].heard = start_;
    peers_[p].keepalive_sent = start_ - rules_.keepalive_interval;  // one at once
    auto gap = ws_.longest_gap.find(ep(p));
    if (gap != ws_.longest_gap.end()) peers_[p].longest_gap = gap->second;
  }
  stale_round_.assign(k_, std::nullopt);
  other_group_.assign(k_, false);
  next_report_ = start_ + kWaitReports * rules_.peer_timeout;
  begin();
  for (int p = 0; p < k_; ++p)
    if (p != me_) (void)t_.take_event(ep(p));  // forget drops before this operation
  // A hello ahead of the data on each data connection (best effort: a queue still full of the
  // last operation's chunks skips it, and the first chunk tells the connection instead).
  for (int p = 0; p < k_; ++p) {
    if (p != me_ &&
        t_.try_send(ep(p), Channel::data, header(MsgType::hello), g_.members[me_].name, Buffer{}))
      ws_.stats.bytes_sent += sizeof(Header) + g_.members[me_].name.size();
  }

  check_leaving();
  // Messages of this operation that arrived during an earlier one.
  for (Workspace::Early& e : ws_.take_stash(Clock::now())) {
    if (e.m.header.round_id < g_.round_id && !in_phases(g_, e.m.header.round_id)) continue;
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
    if (produce()) progressed = true;
    if (done()) break;
    auto now = Clock::now();
    for (int p = 0; p < k_; ++p) {
      // Always drain, so that the wait does not keep waking up for a peer we are done with.
      // A refused connection counts too: a member publishes its endpoint only once bound, so a
      // refusal during the operation means its process or communicator is gone.
      if (p == me_) continue;
      const PeerEvent e = t_.take_event(ep(p));
      if (e == PeerEvent::relay_lost && !peers_[p].relay_lost) peers_[p].relay_lost = now;
      if ((e == PeerEvent::closed || e == PeerEvent::refused) && !peers_[p].dropped)
        peers_[p].dropped = now;
    }
    check_liveness(now);
    check_leaving();
    if (now >= next_report_) report_wait(now);
    if (progressed) continue;
    writable_.clear();
    for (int p = 0; p < k_; ++p)
      if (p != me_ && backlog(p)) writable_.push_back(ep(p));
    t_.wait(writable_, poll_budget(now));
  }
  ws_.stats.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
}

void Operation::linger_until_delivered() {
  const auto start = Clock::now();
  std::vector<int> waiting;  // the peers that may not have all our data yet
  for (int p = 0; p < k_; ++p)
    if (p != me_ && t_.undelivered(ep(p))) waiting.push_back(p);
  auto stop_waiting = [&](int p) { std::erase(waiting, p); };
  while (!waiting.empty() && Clock::now() - start < kMaxWidening * rules_.peer_timeout) {
    Message m;
    while (t_.try_receive(m)) {
      const Header& h = m.header;
      if (m.forged || !check_message(h, m.sender.size(), m.payload.size).empty()) {
        ws_.drop(m, m.forged ? "it failed to authenticate" : "malformed");
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
      const PeerEvent e = t_.take_event(ep(p));
      return e == PeerEvent::closed || e == PeerEvent::relay_lost ||
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

void abandon(Transport& t, Workspace& ws, Operation& op) {
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
    // Kept: later rounds, another attempt at this one (a peer that already runs the retry
    // without a lost member: dropping its first chunks would leave our retry waiting on them
    // while its keepalives say it is alive), and another exchange of this operation (a peer
    // that went back to its first exchange without the lost member: its summary, queued behind
    // the notice that failed this exchange, is what our retry waits for; dropped, the retry lost
    // that peer for silence and the round failed: the soak's rehearsal, 2026-11-30).
    const bool kept =
        m.header.round_id > op.round_id() ||
        (m.header.round_id == op.round_id() && m.header.group_fp != op.group_fingerprint()) ||
        (m.header.round_id != op.round_id() && op.has_phase(m.header.round_id));
    if (kept && !m.forged && m.header.type != MsgType::keepalive &&
        check_message(m.header, m.sender.size(), m.payload.size).empty())
      ws.stash_message(std::move(m), op.round_id(), !op.is_member(m.sender), Clock::now());
    m = Message{};
  }
}

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
  if (m.header.round_id > round_id && m.header.round_id - round_id > kMaxRoundsAhead) {
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
    // An earlier exchange of the last operation is not past (Group::first_phase).
    const bool past =
        ws.begun && ((h.round_id < ws.last_round && h.round_id < ws.last_first_phase) ||
                     (h.round_id == ws.last_round && h.group_fp == ws.last_fp));
    if (m.forged) {
      ws.drop(m, "it failed to authenticate");
    } else if (std::string bad = check_message(h, m.sender.size(), m.payload.size);
               !bad.empty()) {
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

void Workspace::note_gone(const std::string& endpoint, const std::string& reason, uint64_t below) {
  std::lock_guard lock(gone_mu);
  std::erase_if(gone, [&](const Gone& g) { return g.endpoint == endpoint; });
  gone.push_back(Gone{endpoint, reason, below});
  while (gone.size() > kMaxGonePeers) gone.pop_front();
  gone_generation.fetch_add(1, std::memory_order_release);
}

void Workspace::give_up_below(uint64_t round_id, const std::string& reason, bool as_lost) {
  std::lock_guard lock(gone_mu);
  if (round_id <= given_up_below.load(std::memory_order_relaxed)) return;
  given_up_reason = reason;
  given_up_as_lost = as_lost;
  given_up_below.store(round_id, std::memory_order_release);
}

std::optional<std::string> Workspace::gone_reason(const std::string& endpoint, uint64_t round_id) {
  std::lock_guard lock(gone_mu);
  for (const Gone& g : gone)
    if (g.endpoint == endpoint && (g.below == 0 || round_id < g.below)) return g.reason;
  return std::nullopt;
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

void begin_operation(Transport& t, Workspace& ws, const Options& options, const Group& group,
                     std::string_view what) {
  ws.stats = Stats{};
  check_group(t, group, what);
  ws.configure(options);
  ws.begun = true;
  if (ws.attempt_begun.exchange(false, std::memory_order_acq_rel)) ws.finished.reset();
  ws.last_round = group.round_id;
  ws.last_fp = fingerprint(group);
  ws.last_first_phase = in_phases(group, group.round_id) ? group.first_phase : group.round_id;
  ws.last_members.clear();
  for (const Member& m : group.members) ws.last_members.push_back(m.name);
  // Peers that left the group: let what is queued for them drain, then close.
  std::vector<std::string> peers;
  for (int p = 0; p < static_cast<int>(group.members.size()); ++p)
    if (p != group.rank) peers.push_back(group.members[p].endpoint);
  t.keep_only(peers, options.peer_timeout);
}

void check_not_left(const Workspace& ws, const Group& group) {
  if (ws.leaving.load(std::memory_order_acquire))
    throw PeerLostError("member " + group.members[group.rank].name + " left: " + ws.leave_reason,
                        group.members[group.rank].name);
}

void run_operation(Transport& t, Workspace& ws, Operation& op) {
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
  ws.finished = std::make_pair(op.round_id(), op.group_fingerprint());
}

}  // namespace loco::collective::detail
