#include "runtime/core/runtime.hpp"

#include <optional>

#include "runtime/core/core.hpp"

namespace loco {

Runtime Runtime::connect(const std::string& head_address, ConnectOptions opts) {
  detail::CoreOptions co;
  co.head_address = head_address;
  co.self_name = "driver " + random_id("d");
  co.detect_ms = opts.detect_ms;
  co.heartbeat_ms = std::max<int64_t>(50, opts.detect_ms / 5);
  try {
    co.security = opts.security ? *opts.security : security::resolve("", false);
  } catch (const security::KeyError& e) {
    throw ClusterError(e.what());
  }
  auto core = std::make_shared<detail::Core>(co);
  std::shared_ptr<void> owner(nullptr, [core](void*) { core->shutdown(); });
  // Fail early, with the address, when nothing answers there.
  core->head_call<ClusterInfo>("hello", opts.timeout);
  if (!detail::current_core()) detail::current_core() = core;
  return Runtime(core, owner);
}

Runtime Runtime::current() {
  auto core = detail::current_core();
  if (!core) throw std::logic_error("loco::Runtime::current(): no runtime in this process");
  Runtime rt(core);
  if (!this_actor().actor_id.empty()) rt.actor_ = std::make_shared<ActorContext>(this_actor());
  return rt;
}

// Makes a call to the head from any thread of an actor come from that actor: the head binds
// what it spawns to the actor's job and owner, and writes a job's log only for its own actors.
struct Runtime::Acting {
  explicit Acting(const std::shared_ptr<const ActorContext>& actor) {
    if (actor) scope.emplace(actor.get());
  }
  std::optional<detail::ActorContextScope> scope;
};

std::string Runtime::body_bytes(const detail::Payload& p) {
  if (!p.blobs.empty())
    throw std::invalid_argument("constructor arguments cannot contain loco::Blob");
  return p.body;
}

ActorInfo Runtime::spawn_raw(const SpawnRequest& req) {
  Acting as(actor_);
  return core_->head_call<ActorInfo>("spawn", Millis(60000), req);
}

std::shared_ptr<detail::ActorRef> Runtime::ref_from(const ActorInfo& info) {
  auto ref = std::make_shared<detail::ActorRef>();
  ref->id = info.id;
  ref->name = info.name;
  ref->class_name = info.class_name;
  if (info.state == ActorState::alive) {
    ref->address = info.address;
    ref->node_id = info.node_id;
  }
  return ref;
}

ActorInfo Runtime::lookup(const std::string& name) {
  return core_->head_call<ActorInfo>("lookup", Millis(10000), name);
}

ActorInfo Runtime::locate(const std::string& id) {
  return core_->head_call<ActorInfo>("locate", Millis(10000), id);
}

void Runtime::kill(const std::string& actor_id, bool allow_restart) {
  Acting as(actor_);
  core_->head_call<void>("kill", Millis(10000), actor_id, allow_restart);
}

JobInfo Runtime::submit_job(const JobSubmission& sub) {
  Acting as(actor_);
  // One id for this submission and every retry of it: a head that started the job and lost
  // the answer (or restarted) starts no second one.
  JobSubmission once = sub;
  if (once.submission_id.empty()) once.submission_id = random_id("sub");
  return core_->head_call<JobInfo>("submit_job", Millis(120000), once);
}

JobEvents Runtime::job_events(const std::string& job_id, const std::string& after, int max) {
  Acting as(actor_);
  return core_->head_call<JobEvents>("job_events", Millis(10000), job_id, after, max);
}

std::vector<JobInfo> Runtime::list_jobs() {
  return core_->head_call<std::vector<JobInfo>>("list_jobs", Millis(10000));
}

JobInfo Runtime::cancel_job(const std::string& job_id) {
  Acting as(actor_);
  return core_->head_call<JobInfo>("cancel_job", Millis(30000), job_id);
}

JobInfo Runtime::job(const std::string& job_id) {
  return core_->head_call<JobInfo>("job_info", Millis(10000), job_id);
}

JobInfo Runtime::scale_job(const std::string& job_id, int workers) {
  Acting as(actor_);
  return core_->head_call<JobInfo>("scale_job", Millis(10000), job_id, workers);
}

void Runtime::job_log(const std::string& job_id, const std::string& line) {
  Acting as(actor_);
  core_->head_call<void>("job_event", Millis(10000), job_id, std::string("log"), line);
}

void Runtime::job_record(const std::string& job_id, const std::string& kind,
                         const std::string& data) {
  Acting as(actor_);
  core_->head_call<void>("job_event", Millis(10000), job_id, kind, data);
}

void Runtime::job_progress(const std::string& job_id, const JobProgress& progress) {
  msgpack::sbuffer b;
  msgpack::pack(b, progress);
  Acting as(actor_);
  core_->head_call<void>("job_event", Millis(10000), job_id, std::string("report"),
                         std::string(b.data(), b.size()));
}

void Runtime::job_finished(const std::string& job_id, JobState state, const std::string& message) {
  Acting as(actor_);
  core_->head_call<void>("job_finished", Millis(10000), job_id, state, message);
}

ClusterStatus Runtime::status() { return core_->head_call<ClusterStatus>("status", Millis(10000)); }
ClusterStatus Runtime::status(const StatusQuery& query) {
  return core_->head_call<ClusterStatus>("status_query", Millis(10000), query);
}

}  // namespace loco
