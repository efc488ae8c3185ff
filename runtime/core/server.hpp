#pragma once
// The two long-running processes of a cluster: the head and the node.
// `loco start` runs them; tests may run them in-process too.
#include <atomic>
#include <string>
#include <vector>

#include "runtime/core/cluster_types.hpp"
#include "runtime/security/keys.hpp"

namespace loco {

struct HeadConfig {
  std::string bind = "tcp://0.0.0.0:7070";
  std::string advertise;  // host others reach the head at; "" = the bound host
  std::string redis_url;  // required
  int64_t detect_ms = 2000;
  int64_t tick_ms = 100;
  // Dead actors and nodes dead or gone are removed from the store this long after the head
  // saw them so (`loco start --head --retention-s`).
  int64_t retention_ms = 600000;
  // A finished job's record and log are removed from the store this long after it ended
  // (`--job-retention-s`); its folder keeps them (metrics.jsonl, job.yaml).
  int64_t job_retention_ms = 3600000;
  size_t max_message_bytes = size_t(1) << 30;
  // Connections its port holds from any one address: past it a new one is closed at once
  // (`--max-connections-per-source`; 0: no bound). A site behind one NAT address counts as
  // one address.
  size_t max_connections_per_source = 256;
  // Per key (a client's, or the operator's): jobs running at once, and submissions in any
  // minute (`--max-jobs-per-key`, `--max-submissions-per-minute`).
  int max_jobs_per_key = 16;
  int max_submissions_per_minute = 30;
  // The most workers `loco scale` may ask of any job (`--max-job-workers`).
  int max_job_workers = 1024;
  // Entry classes a client may submit a job with (members: any).
  std::vector<std::string> job_entry_classes = {"diloco.OuterAggregator"};
  security::Settings security;  // `loco start` resolves --key / --insecure into this
  // The relay nodes behind NAT use for their actors' collectives (`--relay`, `--relay-public-key`).
  RelayInfo relay;
};

struct NodeConfig {
  std::string head_address;  // "HOST:PORT"
  std::string bind = "tcp://0.0.0.0:0";
  // Host (or HOST:PORT, a port a NAT forwards) others reach this node at; "" = the bound host.
  std::string advertise;
  // false (`loco start --no-listen`): binds no port at all; the node is reached only over the
  // connection it opens to the head (Reachability::reverse), without a probe.
  bool listen = true;
  // Default: cpu = number of cores; `memory` (bytes) is MemTotal of /proc/meminfo unless given.
  Resources resources;
  // Classes a client may spawn on this node (`--spawnable A,B,prefix.*`); default none.
  std::vector<std::string> spawnable;
  // Shared libraries (loaded at start) or folders of them (loaded when an actor needs one:
  // plugins.hpp).
  std::vector<std::string> plugins;
  size_t max_message_bytes = size_t(1) << 30;
  size_t max_connections_per_source = 256;  // as the head's
  int64_t connect_timeout_ms = 30000;
  // On stop: its actors are asked to stop (ActorClass::on_stop) and their methods in progress
  // get this long to end; then the node records that it left and ends the process without
  // them (std::_Exit). 0 or less: wait as long as they take.
  int64_t stop_grace_ms = 30000;
  // An actor killed (a job cancelled) whose method ignores its stop hook and has not returned
  // this long after the kill (a user's `forward` that spins, say) ends the node's process, the
  // only way to end its thread: the node leaves as on a stop, its other actors are restarted
  // elsewhere, and it exits with kExitActorOutlivedKill for its supervisor to start it again
  // (`--kill-grace`; 0 or less: never).
  int64_t kill_grace_ms = 60000;
  // What the jobs of its actors may read and write (loco start --data-root,
  // --checkpoint-root); empty: the working directory.
  std::string data_root, checkpoint_root;
  security::Settings security;  // as the head's; actors' collective sockets use it too
};

// Both run until `stop` becomes true (a signal handler sets it), then leave the
// cluster cleanly. They return the process exit code; errors that stop them
// from starting (Redis or the head unreachable) are printed and return 1.
// `on_ready` is called once with the address the process serves at.
// run_node's exit code when a killed actor outlived kill_grace_ms (see NodeConfig).
inline constexpr int kExitActorOutlivedKill = 3;

int run_head(const HeadConfig& cfg, const std::atomic<bool>& stop,
             const std::function<void(const std::string&)>& on_ready = {});
int run_node(const NodeConfig& cfg, const std::atomic<bool>& stop,
             const std::function<void(const std::string&)>& on_ready = {});

// Keys in the membership store.
namespace keys {
inline const std::string kNodes = "loco:nodes";
inline const std::string kActors = "loco:actors";
inline const std::string kNames = "loco:names";
inline const std::string kEvents = "loco:events";
inline const std::string kJobs = "loco:jobs";
inline std::string alive(const std::string& node) { return "loco:alive:" + node; }
inline std::string job_events(const std::string& job) { return "loco:job:" + job; }
// The job a submission id started, per submitting key ("" for members).
inline std::string submission(const std::string& key, const std::string& id) {
  return "loco:submission:" + key + ":" + id;
}
}  // namespace keys

}  // namespace loco
