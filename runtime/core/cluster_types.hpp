#pragma once
// Records the head, the nodes and the clients exchange, and that the head keeps
// in the membership store. All msgpack-serializable.
#include <cstdint>
#include <map>
#include <msgpack.hpp>
#include <string>
#include <vector>

namespace loco {

using Resources = std::map<std::string, double>;

// "cpu=2,gpu=1" -> {cpu: 2, gpu: 1}; throws std::invalid_argument naming the bad part.
Resources parse_resources(const std::string& text);
std::string format_resources(const Resources& r);

struct NodeRecord {
  std::string id;
  std::string address;  // "HOST:PORT" of its ROUTER
  Resources resources;
  std::string state;  // "alive", "dead", "left"
  std::string hostname;
  int64_t pid = 0;
  int64_t started_unix_ms = 0;
  std::string reason;  // why it is dead or left
  MSGPACK_DEFINE(id, address, resources, state, hostname, pid, started_unix_ms, reason)
};

struct ActorInfo {
  std::string id;
  std::string name;  // empty for anonymous actors
  std::string class_name;
  std::string node_id;
  std::string address;  // of its node
  std::string state;    // "pending", "alive", "restarting", "dead"
  int restarts = 0;
  int max_restarts = 0;
  Resources resources;
  std::string reason;  // why it is dead or restarting
  MSGPACK_DEFINE(id, name, class_name, node_id, address, state, restarts, max_restarts, resources,
                 reason)
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
  MSGPACK_DEFINE(class_name, ctor_args, name, resources, max_restarts)
};

// What a node learns from the head when it joins.
struct ClusterInfo {
  std::string redis_url;
  int64_t detect_ms = 0;
  int64_t heartbeat_ms = 0;
  MSGPACK_DEFINE(redis_url, detect_ms, heartbeat_ms)
};

struct NodeStatus {
  NodeRecord node;
  Resources used;
  MSGPACK_DEFINE(node, used)
};

struct ClusterStatus {
  std::string head_address;
  std::string redis_url;
  std::vector<NodeStatus> nodes;
  std::vector<ActorInfo> actors;
  std::vector<std::string> recent_events;  // newest last, human-readable
  MSGPACK_DEFINE(head_address, redis_url, nodes, actors, recent_events)
};

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
  MSGPACK_DEFINE(name, entry_class, spec, resources, max_restarts)
};

struct JobInfo {
  std::string id;  // "job-<hex>"
  std::string name;
  std::string entry_class;
  std::string state;  // "running", "succeeded", "failed", "cancelled"
  std::string message;
  std::string entry_actor;
  int64_t submitted_unix_ms = 0;
  int64_t finished_unix_ms = 0;
  // Workers asked for by `loco scale` (0: as the job file says). The entry actor
  // reads it between rounds; the runtime does not interpret it.
  int scale = 0;
  MSGPACK_DEFINE(id, name, entry_class, state, message, entry_actor, submitted_unix_ms,
                 finished_unix_ms, scale)

  bool finished() const {
    return state == "succeeded" || state == "failed" || state == "cancelled";
  }
};

// One entry of a job's event log: kind "report" (data: a msgpack report),
// "log" (data: a line of text).
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
  MSGPACK_DEFINE(actor_id, class_name, ctor_args)
};

}  // namespace loco
