#include "runtime/collective/liveness.hpp"

#include <algorithm>

namespace loco::collective::detail {

LivenessRules LivenessRules::from(std::chrono::milliseconds peer_timeout,
                                  std::chrono::milliseconds entry_timeout) {
  LivenessRules r;
  r.peer_timeout = peer_timeout;
  r.entry_timeout = entry_timeout;
  r.keepalive_interval = std::max<Clock::duration>(peer_timeout / 4, std::chrono::milliseconds(1));
  r.grace = std::min<Clock::duration>(peer_timeout, std::chrono::milliseconds(250));
  return r;
}

Clock::duration silence_window(const LivenessRules& rules, const PeerState& peer) {
  const Clock::duration w = std::clamp<Clock::duration>(2 * peer.longest_gap, rules.peer_timeout,
                                                        kMaxWidening * rules.peer_timeout);
  return peer.heard_in_op ? w : std::max(w, rules.entry_timeout);
}

Verdict judge(const PeerState& peer, Clock::time_point now, const LivenessRules& rules) {
  if (!peer.expecting && !peer.backlog) return Verdict::alive;
  if (peer.dropped && now - *peer.dropped > rules.grace) return Verdict::closed;
  if (peer.relay_lost && now - *peer.relay_lost > rules.grace) return Verdict::relay_lost;
  if (now - peer.heard > silence_window(rules, peer)) return Verdict::silent;
  return Verdict::alive;
}

void note_heard(PeerState& peer, Clock::time_point now) {
  if (peer.heard_in_op) peer.longest_gap = std::max(peer.longest_gap, now - peer.heard);
  peer.heard = now;
  peer.heard_in_op = true;
}

void note_alive(PeerState& peer, Clock::time_point now) { peer.heard = std::max(peer.heard, now); }

void note_bytes(PeerState& peer, uint64_t total, Clock::time_point now) {
  if (total > peer.bytes_in && peer.bytes_sampled != Clock::time_point{})
    peer.heard = std::max(peer.heard, peer.bytes_sampled);
  peer.bytes_in = total;
  peer.bytes_sampled = now;
}

bool keepalive_due(const PeerState& peer, Clock::time_point now, const LivenessRules& rules) {
  return now - peer.keepalive_sent >= rules.keepalive_interval;
}

Clock::time_point next_check(const PeerState& peer, Clock::time_point now,
                             const LivenessRules& rules) {
  Clock::time_point t = peer.keepalive_sent + rules.keepalive_interval;
  if (peer.expecting || peer.backlog) {
    t = std::min(t, peer.heard + silence_window(rules, peer));
    if (peer.dropped) t = std::min(t, *peer.dropped + rules.grace);
    if (peer.relay_lost) t = std::min(t, *peer.relay_lost + rules.grace);
  }
  return std::max(t, now);
}

}  // namespace loco::collective::detail
