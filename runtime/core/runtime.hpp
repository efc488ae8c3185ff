#pragma once
// loco's runtime as its users see it: connect to a cluster, spawn actors,
// look them up by name, read the cluster's status.
//
//   loco::Runtime rt = loco::Runtime::connect("127.0.0.1:7070");
//   auto kv = rt.spawn<KvStore>(loco::ActorOptions().with_name("kv").with_max_restarts(1));
//   kv.call(&KvStore::put, "k", "v").get();
//   auto same = rt.get_actor<KvStore>("kv");
#include <memory>
#include <optional>
#include <string>

#include "actor.hpp"
#include "../security/keys.hpp"

namespace loco {

struct ConnectOptions {
  Millis timeout{10000};  // how long to wait for the head to answer
  int64_t detect_ms = 2000;
  // The cluster key, or plain TCP. Unset: $LOCO_INSECURE=1 gives plain TCP, else the key file
  // $LOCO_KEY or ~/.loco/cluster.key (security::resolve); ClusterError if there is none.
  std::optional<security::Settings> security;
};

class Runtime {
 public:
  // A driver: a process that only calls actors. Throws ClusterError when the
  // head does not answer within the timeout.
  static Runtime connect(const std::string& head_address, ConnectOptions opts = {});
  // Inside an actor method (or its constructor): the runtime of the node that hosts it. Its
  // calls name that actor as their sender from any thread, so that the head knows which job
  // they come from (a job's log is written only by the job's own actors).
  static Runtime current();

  template <class T, class... Args>
  ActorHandle<T> spawn(const ActorOptions& opts, Args&&... ctor_args) {
    static_assert(std::is_constructible_v<T, std::decay_t<Args>...>,
                  "T has no constructor taking these arguments");
    SpawnRequest req;
    req.class_name = detail::class_entry<T>().name;
    detail::Payload args = detail::pack_payload(std::make_tuple(std::forward<Args>(ctor_args)...));
    req.ctor_args = body_bytes(args);
    req.name = opts.name;
    req.resources = opts.resources;
    req.max_restarts = opts.max_restarts;
    req.share_gpus = opts.share_gpus;
    return ActorHandle<T>(core_, ref_from(spawn_raw(req)));
  }

  // A named actor; throws ActorNotFoundError when there is none.
  template <class T>
  ActorHandle<T> get_actor(const std::string& name) {
    ActorInfo info = lookup(name);
    if (info.class_name != detail::class_entry<T>().name)
      throw ActorNotFoundError("actor '" + name + "' is a " + info.class_name + ", not a " +
                               detail::class_entry<T>().name);
    return ActorHandle<T>(core_, ref_from(info));
  }
  // An actor by id (for instance one listed by status()).
  template <class T>
  ActorHandle<T> actor(const std::string& id) {
    return ActorHandle<T>(core_, ref_from(locate(id)));
  }

  ActorInfo lookup(const std::string& name);
  ActorInfo locate(const std::string& id);
  // Kills an actor; with allow_restart it is restarted if it has restarts left.
  void kill(const std::string& actor_id, bool allow_restart = false);
  ClusterStatus status();
  // Only the actors `query` asks for (a state, a node, a page); nodes and events as status().
  ClusterStatus status(const StatusQuery& query);

  // Jobs (see JobSubmission). Clients submit and watch; a job's actors report.
  JobInfo submit_job(const JobSubmission& sub);
  JobEvents job_events(const std::string& job_id, const std::string& after, int max = 1000);
  std::vector<JobInfo> list_jobs();
  JobInfo cancel_job(const std::string& job_id);
  JobInfo job(const std::string& job_id);
  // Asks a running job for `workers` workers (JobInfo::scale); its entry actor acts on it.
  JobInfo scale_job(const std::string& job_id, int workers);
  void job_log(const std::string& job_id, const std::string& line);
  // A typed record of the job's own in its event log (kind: not "log" or "report"; data:
  // msgpack, say): what the job must read back, as a restarted entry actor its checkpoints,
  // kept apart from the log lines that are for people.
  void job_record(const std::string& job_id, const std::string& kind, const std::string& data);
  void job_progress(const std::string& job_id, const JobProgress& progress);
  void job_finished(const std::string& job_id, JobState state, const std::string& message);

  // "HOST:PORT" other processes reach this one at ("" for a driver): inside an actor, its node.
  std::string address() const { return core_->address(); }
  // The engine, for runtime/'s own code and white-box tests; scripts/check-deps refuses it in
  // actors/, client/ and examples/, which use the methods above.
  std::shared_ptr<detail::Caller> core() const { return core_; }
  // What this process's sockets use; an actor's own sockets (a job's collective) use it too.
  const security::Settings& security() const { return core_->security(); }
  // Inside an actor: whether its node accepts connections (direct) or is behind NAT
  // (reverse), and the cluster's relay; what a job's collective sockets need to know.
  NodeNetwork network() const { return core_->network(); }

 private:
  explicit Runtime(std::shared_ptr<detail::Caller> core, std::shared_ptr<void> owner = nullptr)
      : core_(std::move(core)), owner_(std::move(owner)) {}
  static std::string body_bytes(const detail::Payload& p);
  ActorInfo spawn_raw(const SpawnRequest& req);
  static std::shared_ptr<detail::ActorRef> ref_from(const ActorInfo& info);

  // Makes the calls of this thread name actor_ as their sender until the scope ends.
  struct Acting;

  std::shared_ptr<detail::Caller> core_;
  std::shared_ptr<void> owner_;                // shuts a driver's core down with its last copy
  std::shared_ptr<const ActorContext> actor_;  // the actor whose runtime this is, if any
};

// Inside an actor's constructor or methods: its id and the GPU indices of its
// node that the head gave it (ActorOptions, resources {gpu: G}). Elsewhere: empty.
const ActorContext& this_actor();

}  // namespace loco
