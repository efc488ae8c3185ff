#pragma once
// The head's decisions, as pure functions of (state, now): no clock reads, no
// I/O, so that tests drive them directly with an injected time.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/cluster_types.hpp"

namespace loco {

// ---- placement --------------------------------------------------------------

struct NodeView {
  std::string id;
  Resources total;
  Resources used;
  int actors = 0;
};

struct Placement {
  std::optional<std::string> node;  // where to place, or nothing
  std::string reason;               // why nothing fits ("no node has 2 free gpu: ...")
};

// Picks the node with enough free resources of every kind that `demand` names,
// spreading load: the most free cpu after placement, then the fewest actors,
// then the smallest id. Nodes in `exclude` are skipped.
Placement place(const std::vector<NodeView>& nodes, const Resources& demand,
                const std::set<std::string>& exclude = {});

// ---- failure detection --------------------------------------------------------

// Decides which nodes are dead from what the head reads in the store: each
// node's heartbeat key (a counter the node bumps, with a TTL). A node is dead
// when its heartbeat has not changed for `timeout_ms` of the head's own clock,
// so clock skew between hosts does not matter.
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

  int64_t timeout_ms() const { return timeout_ms_; }

 private:
  struct Seen {
    std::optional<std::string> heartbeat;
    int64_t changed_at = 0;
  };
  int64_t timeout_ms_;
  std::map<std::string, Seen> seen_;
};

}  // namespace loco
