#pragma once
// Records the head, the nodes and the clients exchange, and that the head keeps
// in the membership store. All msgpack-serializable.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "paths.hpp"

namespace loco {

using Resources = std::map<std::string, double>;

// The life cycle of a node, an actor and a job. On the wire and in the store
// each state travels as its name (to_string), the same words as before the
// enums, so records of either age read the same; `loco status` and `loco jobs`
// print these names.
enum class NodeState : uint8_t { alive, dead, left };
enum class ActorState : uint8_t { pending, alive, restarting, dead };
enum class JobState : uint8_t { running, succeeded, failed, cancelled };
// How a node is reached (docs/guide/nat.md, "Nodes behind NAT"): `direct`, at its address (the
// head dialled it when it joined); `reverse`, only over the connection it opened to the head,
// which forwards calls to its actors; `relayed`, as reverse, and the cluster has a relay (the
// head's --relay): what its actors' collectives exchange with members behind NAT on other
// nodes goes through that relay, sealed end to end.
enum class Reachability : uint8_t { direct, reverse, relayed };
// reverse or relayed: nobody dials it; calls reach it through the head.
inline bool behind_nat(Reachability r) { return r != Reachability::direct; }

// "alive", "dead", ...
const std::string& to_string(NodeState s);
const std::string& to_string(ActorState s);
const std::string& to_string(JobState s);
const std::string& to_string(Reachability r);
// The state called `name`; throws std::invalid_argument naming it and the known
// states. A record or message with an unknown state does not decode.
NodeState parse_node_state(std::string_view name);
ActorState parse_actor_state(std::string_view name);
JobState parse_job_state(std::string_view name);
Reachability parse_reachability(std::string_view name);
// The name, for test failures and logs.
std::ostream& operator<<(std::ostream& os, NodeState s);
std::ostream& operator<<(std::ostream& os, ActorState s);
std::ostream& operator<<(std::ostream& os, JobState s);
std::ostream& operator<<(std::ostream& os, Reachability r);

}  // namespace loco

// States as msgpack strings (see above).
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

#define LOCO_STATE_ADAPTOR(Enum, parse)                                          \
  template <>                                                                    \
  struct pack<Enum> {                                                            \
    template <typename Stream>                                                   \
    packer<Stream>& operator()(packer<Stream>& o, Enum s) const {                \
      const std::string& name = loco::to_string(s);                              \
      o.pack_str(static_cast<uint32_t>(name.size()));                            \
      o.pack_str_body(name.data(), static_cast<uint32_t>(name.size()));          \
      return o;                                                                  \
    }                                                                            \
  };                                                                             \
  template <>                                                                    \
  struct convert<Enum> {                                                         \
    const msgpack::object& operator()(const msgpack::object& o, Enum& s) const { \
      if (o.type != msgpack::type::STR) throw msgpack::type_error();             \
      s = loco::parse(std::string_view(o.via.str.ptr, o.via.str.size));          \
      return o;                                                                  \
    }                                                                            \
  };
  LOCO_STATE_ADAPTOR(loco::NodeState, parse_node_state)
  LOCO_STATE_ADAPTOR(loco::ActorState, parse_actor_state)
  LOCO_STATE_ADAPTOR(loco::JobState, parse_job_state)
  LOCO_STATE_ADAPTOR(loco::Reachability, parse_reachability)
#undef LOCO_STATE_ADAPTOR

  }  // namespace adaptor
}
}  // namespace msgpack

namespace loco {

// "cpu=2,gpu=1" -> {cpu: 2, gpu: 1}; throws std::invalid_argument naming the bad part.
Resources parse_resources(const std::string& text);
std::string format_resources(const Resources& r);
// GPU indices as `loco status` shows them: "0,1", or "-" for none.
std::string format_gpus(const std::vector<int>& gpus);

struct NodeRecord {
  std::string id;
  std::string address;  // "HOST:PORT" of its ROUTER
  Resources resources;
  NodeState state = NodeState::alive;
  std::string hostname;
  int64_t pid = 0;
  int64_t started_unix_ms = 0;
  std::string reason;  // why it is dead or left
  // Classes a client may spawn here (`loco start --spawnable`): names, or prefixes ending in
  // '*' ("wordcount.*"). Empty: none; a member spawns anything the node offers.
  std::vector<std::string> spawnable;
  // Whether the head reached `address` when the node joined (an appended field: an older
  // record decodes as direct). A `reverse` node's address may be empty (`--no-listen`).
  Reachability reachability = Reachability::direct;
  MSGPACK_DEFINE(id, address, resources, state, hostname, pid, started_unix_ms, reason, spawnable,
                 reachability)
};

// Where calls to a node's actors go: its address, or, for a node reached only through the
// head, "head/<node id>": each process sends those to the head it is connected to, which
// forwards them on the node's own connection (detail::Core::route). Nodes ids hold no '/'.
inline constexpr std::string_view kThroughHead = "head/";
std::string call_address(const NodeRecord& node);
// The node id of a "head/<node id>" address; "" for any other.
std::string through_head_node(std::string_view address);

struct ActorInfo {
  std::string id;
  std::string name;  // empty for anonymous actors
  std::string class_name;
  std::string node_id;
  std::string address;  // of its node
  ActorState state = ActorState::pending;
  int restarts = 0;
  int max_restarts = 0;
  Resources resources;
  std::string reason;  // why it is dead or restarting
  // The node's GPU indices (0 .. gpu-1 of its `gpu` resource) the head gave it
  // while it is pending or alive; several actors hold one only with share_gpus.
  std::vector<int> gpus;
  bool share_gpus = false;
  // Whose it is, bound by the head when it creates the actor, never taken from the request's
  // arguments: the job it was created for ("" : none), and the key that owns it (the job's
  // submitter, or the client that spawned it; "" : the operator, a holder of the cluster key)
  // with that key's name.
  std::string job;
  std::string owner;
  std::string owner_name;
  MSGPACK_DEFINE(id, name, class_name, node_id, address, state, restarts, max_restarts, resources,
                 reason, gpus, share_gpus, job, owner, owner_name)
};

// What the head stores for an actor: its info and how to construct it again.
struct ActorRecord {
  ActorInfo info;
  std::string ctor_args;  // msgpack body of the constructor arguments
  MSGPACK_DEFINE(info, ctor_args)
};

struct SpawnRequest {
  std::string class_name;
  std::string ctor_args;
  std::string name;
  Resources resources;
  int max_restarts = 0;
  bool share_gpus = false;  // see ActorOptions::with_shared_gpus
  MSGPACK_DEFINE(class_name, ctor_args, name, resources, max_restarts, share_gpus)
};

// The cluster's relay (`loco relay`): where two members of a job's collective that are both
// behind NAT exchange (runtime/collective/relay.hpp). The head's `--relay` and
// `--relay-public-key`, handed to nodes when they join; empty: none.
struct RelayInfo {
  std::string endpoint;    // "tcp://HOST:PORT"
  std::string public_key;  // the relay's own CURVE public key (Z85), not the cluster's
  MSGPACK_DEFINE(endpoint, public_key)
};

// What a node knows of its own network, for its actors' sockets (a job's collective): whether
// others can dial it, and the cluster's relay.
struct NodeNetwork {
  Reachability reachability = Reachability::direct;
  RelayInfo relay;
};

// What a node learns from the head when it joins. (`relay` is appended: a head from before it
// sends none.)
struct ClusterInfo {
  std::string redis_url;
  int64_t detect_ms = 0;
  int64_t heartbeat_ms = 0;
  RelayInfo relay;
  MSGPACK_DEFINE(redis_url, detect_ms, heartbeat_ms, relay)
};

struct NodeStatus {
  NodeRecord node;
  Resources used;
  // Its heartbeats as the head saw them (FailureDetector::Health); -1: not watched (a dead or
  // departed node, or one the head has not read yet).
  int64_t heartbeat_silent_ms = -1;
  int64_t heartbeat_late = 0;  // came back after half the detection time or more of silence
  int64_t heartbeat_longest_ms = 0;
  MSGPACK_DEFINE(node, used, heartbeat_silent_ms, heartbeat_late, heartbeat_longest_ms)
};

struct ClusterStatus {
  std::string head_address;
  std::string redis_url;
  std::vector<NodeStatus> nodes;
  std::vector<ActorInfo> actors;           // those the query asked for, by id
  std::vector<std::string> recent_events;  // newest last, human-readable
  uint64_t actors_total = 0;               // that match the query, before offset and limit
  MSGPACK_DEFINE(head_address, redis_url, nodes, actors, recent_events, actors_total)
};

// Which actors status lists: in `state` and on node `node` ("": any), sorted by id, from
// `offset`, at most `limit` (0: all). A cluster of thousands of actors is read a page at a time.
struct StatusQuery {
  std::string state;
  std::string node;
  uint64_t offset = 0;
  uint64_t limit = 0;
  MSGPACK_DEFINE(state, node, offset, limit)
};

// The kind of the job event the head writes into every running job when something happens to
// the cluster itself (it started, its Redis came back, its relay went away or came back): data
// is msgpack [text, what], what "head", "redis" or "relay"; the same text is in the job's log
// after "cluster: ".
inline constexpr const char* kClusterRecord = "cluster";

// What the head accepts in a submission and in a job's events, checked before anything is
// stored: a record that large would hold the head's store round trips and every reader.
inline constexpr size_t kMaxJobNameBytes = 256;              // a job's name, an actor class's name
inline constexpr size_t kMaxJobSpecBytes = size_t(1) << 20;  // the job file's text
inline constexpr size_t kMaxJobEventBytes = size_t(64) << 10;  // one event's data

// A job: a unit of work a user submits. The head starts its entry actor (for a
// DiLoCo job, the OuterAggregator) and keeps the job's record and its event log
// in the store. Every actor of a job is named "<job id>.<role>", so that
// cancelling the job can find them all.
struct JobSubmission {
  std::string name;
  std::string entry_class;  // actor class the head spawns to run the job
  std::string spec;         // the job file's text, handed to the entry actor
  Resources resources;      // of the entry actor
  int max_restarts = 0;     // of the entry actor
  // The most workers `loco scale` may ask for (a DiLoCo job: workers.max); 0: the head's cap.
  int max_workers = 0;
  // Made by the submitting client once per job it means to submit (Runtime::submit_job), and
  // sent again with every retry of that submission: the head starts one job per id and key,
  // and answers a repeat with that job (appended: a client from before it sends none).
  std::string submission_id;
  MSGPACK_DEFINE(name, entry_class, spec, resources, max_restarts, max_workers, submission_id)
};

struct JobInfo {
  std::string id;  // "job-<hex>"
  std::string name;
  std::string entry_class;
  JobState state = JobState::running;
  std::string message;
  std::string entry_actor;
  int64_t submitted_unix_ms = 0;
  int64_t finished_unix_ms = 0;
  // Workers asked for by `loco scale` (0: as the job file says). The entry actor
  // reads it between rounds; the runtime does not interpret it.
  int scale = 0;
  // Who submitted it: the key (a client's; "" : the operator) and its name. Cancel, scale and
  // its log need that key, an admin's, or the cluster key.
  std::string owner;
  std::string owner_name;
  int max_workers = 0;  // the bound on `scale` (JobSubmission::max_workers, capped by the head)
  MSGPACK_DEFINE(id, name, entry_class, state, message, entry_actor, submitted_unix_ms,
                 finished_unix_ms, scale, owner, owner_name, max_workers)

  bool finished() const {
    return state == JobState::succeeded || state == JobState::failed ||
           state == JobState::cancelled;
  }
};

// One entry of a job's event log: kind "report" (data: a msgpack report),
// "log" (data: a line of text), kClusterRecord, or a typed record of the job's own.
struct JobEvent {
  std::string id;
  std::string kind;
  std::string data;
  MSGPACK_DEFINE(id, kind, data)
};

// What a job's entry actor reports as it goes (data of a "report" event):
// a step out of a total, and named figures. For DiLoCo: step = round, and
// metrics loss, val_loss, tokens_per_s, bytes_per_worker, utilization, workers, ...
struct JobProgress {
  int64_t step = 0;
  int64_t total = 0;
  std::map<std::string, double> metrics;
  std::string note;
  MSGPACK_DEFINE(step, total, metrics, note)
};

struct JobEvents {
  JobInfo job;
  std::vector<JobEvent> events;
  MSGPACK_DEFINE(job, events)
};

// The node's built-in service: the head talks to it to place actors.
struct CreateActorRequest {
  std::string actor_id;
  std::string class_name;
  std::string ctor_args;
  std::vector<int> gpus;  // the node's GPU indices the actor may use (ActorInfo::gpus)
  std::string job, owner, owner_name;  // ActorInfo's: whose the actor is
  MSGPACK_DEFINE(actor_id, class_name, ctor_args, gpus, job, owner, owner_name)
};

// What an actor learns about its own placement (loco::this_actor()).
struct ActorContext {
  std::string actor_id;
  std::vector<int> gpus;  // indices of its node's GPUs; empty when it asked for none
  PathRoots roots;        // the folders its node lets it read and write (paths.hpp)
  // The job the head created it for ("" : none) and its owner (ActorInfo): its calls carry
  // them, and its node lets only its owner's key call it and only its job's actors call its
  // internal methods.
  std::string job;
  std::string owner;
  std::string owner_name;
};

}  // namespace loco
