#include "runtime/core/cluster_types.hpp"

#include <array>
#include <ostream>
#include <stdexcept>

namespace loco {
namespace {

// Names in the order of the enum's values.
template <class E, size_t N>
const std::string& name_of(const std::array<std::string, N>& names, E s) {
  return names.at(static_cast<size_t>(s));
}

template <class E, size_t N>
E parse_state(const std::array<std::string, N>& names, std::string_view what,
              std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<E>(i);
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown " + std::string(what) + " state '" + std::string(name) +
                              "' (known: " + known + ")");
}

// Function-local, so that they are there for callers during static initialisation.
const std::array<std::string, 3>& node_states() {
  static const std::array<std::string, 3> names = {"alive", "dead", "left"};
  return names;
}
const std::array<std::string, 4>& actor_states() {
  static const std::array<std::string, 4> names = {"pending", "alive", "restarting", "dead"};
  return names;
}
const std::array<std::string, 4>& job_states() {
  static const std::array<std::string, 4> names = {"running", "succeeded", "failed", "cancelled"};
  return names;
}

const std::array<std::string, 3>& reachabilities() {
  static const std::array<std::string, 3> names = {"direct", "reverse", "relayed"};
  return names;
}

}  // namespace

const std::string& to_string(Reachability r) { return name_of(reachabilities(), r); }
Reachability parse_reachability(std::string_view name) {
  return parse_state<Reachability>(reachabilities(), "reachability", name);
}
std::ostream& operator<<(std::ostream& os, Reachability r) { return os << to_string(r); }

std::string call_address(const NodeRecord& node) {
  if (behind_nat(node.reachability)) return std::string(kThroughHead) + node.id;
  return node.address;
}

std::string through_head_node(std::string_view address) {
  if (address.substr(0, kThroughHead.size()) != kThroughHead) return {};
  return std::string(address.substr(kThroughHead.size()));
}

const std::string& to_string(NodeState s) { return name_of(node_states(), s); }
const std::string& to_string(ActorState s) { return name_of(actor_states(), s); }
const std::string& to_string(JobState s) { return name_of(job_states(), s); }

NodeState parse_node_state(std::string_view name) {
  return parse_state<NodeState>(node_states(), "node", name);
}
ActorState parse_actor_state(std::string_view name) {
  return parse_state<ActorState>(actor_states(), "actor", name);
}
JobState parse_job_state(std::string_view name) {
  return parse_state<JobState>(job_states(), "job", name);
}

std::ostream& operator<<(std::ostream& os, NodeState s) { return os << to_string(s); }
std::ostream& operator<<(std::ostream& os, ActorState s) { return os << to_string(s); }
std::ostream& operator<<(std::ostream& os, JobState s) { return os << to_string(s); }

}  // namespace loco
