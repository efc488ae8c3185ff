#pragma once
// The head's decisions, as pure functions of (state, now): no clock reads, no
// I/O, so that tests drive them directly with an injected time.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/cluster_types.hpp"

namespace loco {

// ---- placement --------------------------------------------------------------

// GPUs are a resource with identity: a node started with `gpu=N` has devices
// 0 .. N-1 (as its process sees them, CUDA_VISIBLE_DEVICES applied), and an
// actor that asks for `gpu: G` gets G of those indices. What one actor holds:
struct GpuHold {
  std::vector<int> indices;
  bool shared = false;  // ActorOptions::share_gpus
};

struct NodeView {
  std::string id;
  Resources total;
  Resources used;  // "gpu": indices held (by anyone), not the sum of demands
  int actors = 0;
  std::vector<GpuHold> gpus;  // of the actors that occupy the node
  // The head dials it (Reachability::direct); a node behind NAT is called through the head, and
  // its one uplink can cut it off alone.
  bool direct = true;
};

// The nodes as placement sees them: what the actors that occupy them (pending or
// alive) hold; a dead or restarting actor holds nothing, its GPUs included.
std::vector<NodeView> node_views(const std::vector<NodeRecord>& nodes,
                                 const std::vector<ActorInfo>& actors);

// `count` of a node's `total` GPU indices for a new actor, lowest first: free
// ones for an exclusive actor; for a shared one, any not held by an exclusive
// actor, the least shared first. nullopt when there are not enough.
std::optional<std::vector<int>> assign_gpus(int total, const std::vector<GpuHold>& held, int count,
                                            bool shared);

// Counts `actor` (placed, pending or alive) on its node in `views`, as node_views() would: a
// tick that places many actors updates its views instead of recomputing them.
void occupy(std::vector<NodeView>& views, const ActorInfo& actor);

struct Placement {
  std::optional<std::string> node;  // where to place, or nothing
  std::string reason;               // why nothing fits ("no node has 2 free gpu: ...")
  std::vector<int> gpus;            // the node's GPU indices for the actor (assign_gpus)
};

// Picks the node with enough free resources of every kind that `demand` names,
// spreading load: the most free cpu after placement, then a node the head dials
// before one behind NAT (a job's aggregator, placed first, stays off the NATed
// sites' uplinks), then the fewest actors, then the smallest id. Nodes in `exclude` are skipped. A
// demand of `gpu` must be whole and is met with indices (assign_gpus; `share_gpus` as there).
Placement place(const std::vector<NodeView>& nodes, const Resources& demand,
                const std::set<std::string>& exclude = {}, bool share_gpus = false);

// place() as the head places: not on a node behind NAT that `connected` says has no connection
// to the head now (it has just joined again after its uplink came back: its record is in Redis
// before its connection is up, and nothing sent there would arrive); not on a suspect when
// another node fits (after an outage of Redis every node may be silent a while, none dead).
Placement place_reachable(const std::vector<NodeView>& nodes, const Resources& demand,
                          const std::set<std::string>& suspects,
                          const std::function<bool(const std::string&)>& connected,
                          bool share_gpus = false);

// ---- what a request may ask --------------------------------------------------

// The most GPUs one actor may ask for: placement hands them out by index.
inline constexpr int kMaxGpusPerActor = 4096;
// Resources every node knows without declaring them.
inline const std::set<std::string> kBuiltinResources = {"cpu", "gpu", "memory", "gpu_memory"};
// "" when `demand` is acceptable, else why not, naming the resource: every amount finite, not
// negative and at most 1e15, every name a builtin one or one that `declared` (the names the
// nodes declare) holds. A negative or NaN amount would switch placement's accounting off.
std::string check_resources(const Resources& demand, const std::set<std::string>& declared);

// "" when `bytes` is within `limit`, else "FIELD: N bytes, more than the limit of L bytes".
std::string size_over(const std::string& field, size_t bytes, size_t limit);

// "" when a spawn request is acceptable before placement, else why not, naming the field: a
// class name of 1 to 256 bytes, an actor name of at most 256, constructor arguments of at most
// 16 MiB (kept in the store and sent again on every restart), 0 to 1000 restarts, resources
// as check_resources says (`declared`: the names the live nodes declare; nullptr: sizes and
// numbers only, before the store is read).
std::string check_spawn_request(const SpawnRequest& req, const std::set<std::string>* declared);

// Whether `class_name` is named by `patterns` (a name, or a prefix ending in '*').
bool class_matches(const std::vector<std::string>& patterns, const std::string& class_name);

// "" when a job may be scaled to `workers`, else why not: at least 1, at most the job's own
// bound `job_max` (0: none) and the cluster's `cluster_max`.
std::string check_scale(int workers, int job_max, int cluster_max);

// Per-key bounds on submissions: at most `max_running` jobs running at once and `per_minute`
// submissions in any 60 s. Pure but for its memory of recent submissions (times given).
class SubmissionLimits {
 public:
  SubmissionLimits(int max_running, int per_minute)
      : max_running_(max_running), per_minute_(per_minute) {}
  // "" and the submission counted, or why `key` (named `name`) may not submit now.
  std::string admit(const std::string& key, const std::string& name, int running, int64_t now_ms);
  // Keys with no submission in the last minute are forgotten: memory stays the active keys'.
  size_t keys() const { return recent_.size(); }

 private:
  int max_running_, per_minute_;
  std::map<std::string, std::vector<int64_t>> recent_;  // key -> submission times, oldest first
};

// ---- failure detection --------------------------------------------------------

// Decides which nodes are dead from what the head reads in the store: each
// node's heartbeat key (a counter the node bumps, with a TTL). A node is dead
// when its heartbeat has not changed for its window of the head's own clock,
// so clock skew between hosts does not matter. The window is `timeout_ms`,
// widened to twice the longest silence the node came back from, at most four
// times `timeout_ms`: the collective's rule for its peers (liveness.hpp). A node
// whose uplink a job's data fills (a 5 Mbit/s site behind NAT sending fp32
// fragments) shows its heartbeats stalling by seconds before it is ever taken for
// dead; a node that never stalled is still found within `timeout_ms`.
class FailureDetector {
 public:
  explicit FailureDetector(int64_t timeout_ms) : timeout_ms_(timeout_ms) {}

  // What the store showed for `node` at `now`; nullopt when its key is gone.
  void observe(const std::string& node, const std::optional<std::string>& heartbeat, int64_t now);
  void forget(const std::string& node);
  // Treat every node as just heard from (after the head or the store was away).
  void grace(int64_t now);

  struct Verdict {
    std::string node;
    std::string reason;  // "missed heartbeats for 2.1 s"
  };
  std::vector<Verdict> dead(int64_t now) const;
  // Nodes silent for half the timeout or more: not dead yet, but no place for a new actor.
  std::set<std::string> suspects(int64_t now) const;

  // How a node's heartbeats have come, for people and /metrics.
  struct Health {
    int64_t silent_ms = 0;   // since its heartbeat last changed (the head's clock)
    int64_t late = 0;        // times it came back after a silence of half the timeout or more
    int64_t longest_ms = 0;  // the longest silence it came back from
  };
  // nullopt for a node not watched (dead, left, or not seen yet).
  std::optional<Health> health(const std::string& node, int64_t now) const;

  int64_t timeout_ms() const { return timeout_ms_; }
  // The silence after which `node` is dead (timeout_ms for a node not watched).
  int64_t window_ms(const std::string& node) const;

 private:
  struct Seen {
    std::optional<std::string> heartbeat;
    int64_t changed_at = 0;
    int64_t late = 0;
    int64_t longest_ms = 0;
  };
  int64_t window_of(const Seen& s) const;
  int64_t timeout_ms_;
  std::map<std::string, Seen> seen_;
};

}  // namespace loco
