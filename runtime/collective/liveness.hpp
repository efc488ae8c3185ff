// When a member of an operation counts as lost: pure functions of (what we know of the peer,
// now, the rules), so that tests inject the clock. Internal to the collective.
//
// A relay that closes its connection (killed, restarted) proves nothing of the peers behind
// it, but what it held of their messages and ours is gone: a peer we still expect data from
// through it, or still owe data to, fails the operation after the same grace (`relay_lost`),
// as a network failure, not as a lost member (a survivor that dropped a live member would go
// on in a group of its own: the soak bench, issue 25, stood still for minutes that way).
//
// Only what proves a peer gone counts:
// - its connection closed, or a new one was refused (its process or communicator is gone; a
//   grace period lets an abort notice sent just before it exited arrive and say why);
// - it fell silent: no message of this operation at all, keepalive or data, and no bytes on
//   its data connections, for its silence window. Bytes count because on a slow link one chunk
//   may take longer than the window to arrive whole, and a saturated link drops the small
//   keepalives as readily as data. Not those of its control connection: a member in another
//   operation (another attempt at the round, a later exchange) keeps sending keepalives there,
//   and two members that waited on each other stayed alive by them for ever. Bytes are sampled when
//   a keepalive is due and before a verdict, and prove the peer alive at the previous sample (not
//   later: they may have come at any time since). A member in a later round cannot keep this one
//   waiting by its bytes: its data connection opens each operation with a hello, and a hello or
//   data of a later round from a member we still expect data from fails the operation
//   (butterfly.cpp, handle()). Keepalives go every peer_timeout / 4 to every peer on a connection
//   of their own, so a data stream that is merely slow (a shaped link, TCP recovering from a loss)
//   never delays them; a member that only waits on a slower one keeps sending them too. The window
//   is peer_timeout, widened for a peer whose messages have arrived with longer gaps before (twice
//   the longest gap seen, at most kMaxWidening x peer_timeout): a link where TCP stalls for seconds
//   widens its own window, loopback keeps the configured one.
// Slow progress of data is not a sign of death: a live member may wait on a slower one for
// the whole operation. A peer the operation no longer waits on is never judged.
#pragma once

#include <chrono>
#include <optional>

namespace loco::collective::detail {

using Clock = std::chrono::steady_clock;

inline constexpr int kMaxWidening = 4;

struct LivenessRules {
  Clock::duration peer_timeout{std::chrono::milliseconds(3000)};
  Clock::duration keepalive_interval{std::chrono::milliseconds(750)};  // peer_timeout / 4
  Clock::duration grace{std::chrono::milliseconds(250)};               // after a closed connection
  // The window of a peer with its connection open that has sent nothing yet in this operation:
  // at least this long (Options::entry_timeout).
  Clock::duration entry_timeout{0};
  static LivenessRules from(std::chrono::milliseconds peer_timeout,
                            std::chrono::milliseconds entry_timeout = std::chrono::milliseconds(0));
};

// What one member knows of one peer during an operation.
struct PeerState {
  bool expecting = false;                    // data of this operation still expected from it
  bool backlog = false;                      // data of this operation still queued for it
  Clock::time_point heard{};                 // its last message, or the operation's start
  bool heard_in_op = false;                  // a message of it arrived in this operation
  Clock::time_point keepalive_sent{};        // our last keepalive to it
  std::optional<Clock::time_point> dropped;  // when its connection closed or was refused
  std::optional<Clock::time_point> relay_lost;  // when the relay between us closed
  Clock::duration longest_gap{0};            // between its messages, over this communicator's life
  uint64_t bytes_in = 0;                     // on its connections, at the last sample
  Clock::time_point bytes_sampled{};         // when that sample was taken
};

// How long `peer` may stay silent.
Clock::duration silence_window(const LivenessRules& rules, const PeerState& peer);

enum class Verdict { alive, closed, relay_lost, silent };
Verdict judge(const PeerState& peer, Clock::time_point now, const LivenessRules& rules);

// A message from the peer arrived at `now`. The gap before its first message of an operation
// is when it started, not how its link behaves, and does not widen its window.
void note_heard(PeerState& peer, Clock::time_point now);
// A message of an earlier operation from the peer arrived at `now`: it is alive, still
// finishing that one, and has not begun this one (its entry window still holds).
void note_alive(PeerState& peer, Clock::time_point now);

// `total` bytes had arrived on the peer's connections at `now`. More than at the last
// sample proves it alive at that sample's time; a first sample only sets the baseline.
void note_bytes(PeerState& peer, uint64_t total, Clock::time_point now);

bool keepalive_due(const PeerState& peer, Clock::time_point now, const LivenessRules& rules);

// The earliest time at which judge() or keepalive_due() may change its answer.
Clock::time_point next_check(const PeerState& peer, Clock::time_point now,
                             const LivenessRules& rules);

}  // namespace loco::collective::detail
