#include "actors/outer_aggregator.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <stop_token>
#include <thread>

#include "actors/inner_worker.hpp"
#include "actors/job_records.hpp"
#include "actors/round_decisions.hpp"
#include "actors/timeouts.hpp"
#include "diloco/averager.hpp"
#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "diloco/hf_format.hpp"
#include "diloco/job_schema.hpp"
#include "diloco/memory.hpp"
#include "diloco/simulator.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"

namespace loco::actors {

namespace dl = loco::diloco;
namespace schema = loco::diloco::schema;
namespace fs = std::filesystem;

namespace {

// Seconds on the runtime's one steady clock (runtime/core/util.hpp).
double now_s() { return static_cast<double>(loco::now_ms()) / 1000.0; }

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// Why a call to a worker failed, and whether the worker itself is gone.
struct Failure {
  std::string message;
  bool gone = false;  // its actor died or no longer exists; else it answered with an error
};

// Waits for all futures; returns, per index, the value, or sets the failure.
template <class T>
std::vector<std::optional<T>> gather(std::vector<Future<T>>& fs, std::vector<Failure>& errors,
                                     Millis timeout) {
  std::vector<std::optional<T>> out(fs.size());
  errors.assign(fs.size(), Failure{});
  for (size_t i = 0; i < fs.size(); ++i) {
    try {
      out[i] = fs[i].get(timeout);
    } catch (const ActorDiedError& e) {
      errors[i] = {e.what(), true};
    } catch (const ActorNotFoundError& e) {
      errors[i] = {e.what(), true};
    } catch (const std::exception& e) {
      errors[i] = {e.what(), false};
    }
  }
  return out;
}

// Next to checkpoint "X.pt", each worker's inner state: "X.worker-I.pt".
std::string inner_state_path(const std::string& checkpoint, int slot) {
  std::string base = checkpoint.substr(0, checkpoint.size() - 3);
  return base + ".worker-" + std::to_string(slot) + ".pt";
}

// The job's log says "checkpoint: PATH (round N)" for people; a restarted aggregator reads
// the typed CheckpointRecord events (messages.hpp) that go beside those lines.
constexpr const char* kCheckpointLine = "checkpoint: ";

}  // namespace

// One worker place of the job. Slot i's actor is named "<job>.worker-i"; it is
// active when it holds the current outer state and takes part in rounds.
struct Slot {
  std::string name;
  std::optional<ActorHandle<InnerWorker>> handle;
  std::vector<std::string> endpoints;  // one per local rank
  std::vector<int> shards;
  bool active = false;
  std::string waiting;  // why it could not (re)join, logged when it changes
  // A member that missed a round's deadline (workers.grace_max_s): its inner steps still run;
  // it sits out until they end, then catches up with the current outer state.
  std::optional<Future<InnerResult>> late;
  int64_t late_round = -1;
};

// One round's stream() calls (sync.mode streaming or eager), sent to its members.
struct StreamCalls {
  int64_t round = 0;
  uint64_t op_id = 0;  // of its first fragment (StreamRequest::op_id)
  bool last = false;
  std::vector<int> members;
  std::string checkpoint;  // the checkpoint of the round's end asked of its members ("": none)
  std::vector<Future<StreamResult>> calls;
  double sent = 0;  // now_s() when they went out
};

struct OuterAggregator::State {
  std::string job_id;
  dl::JobConfig cfg;
  Runtime rt;
  std::string folder;
  std::atomic<int64_t> round{0};
  std::atomic<bool> stop{false};
  std::stop_source wake;  // requested with `stop`: ends the loop's waits on calls (loco::wait)
  std::atomic<bool> done{false};
  std::mutex done_mu;
  std::condition_variable done_cv;  // told when `done` is set
  std::thread thread;

  std::vector<Slot> slots;
  int64_t total_steps = 0;
  int target = 0;           // workers wanted: workers.count or `loco scale`
  std::string resume_from;  // checkpoint the job restarts from, if any
  int64_t resume_round = 0;
  // The job (re)starts from resume_from, and no round has completed since: every slot that
  // comes back reads the checkpoint and its own inner state, even after others did.
  bool resuming = false;
  std::deque<std::function<void()>> outbox;  // reports not yet accepted by the head
  bool outbox_stuck = false;
  uint64_t last_op_id = 0;
  std::vector<int> dealt;  // the members the shards were last dealt to
  // Stragglers: how late recent members reported (seconds after their round's median
  // report; the grace window's samples), and the last round's seconds per inner step.
  std::deque<double> lateness;
  std::vector<double> step_seconds;
  // The per-step figures of the round in progress, one list per member that finished.
  std::vector<std::vector<StepFigures>> round_steps;
  std::map<int, int64_t> tokens_of;  // this round's tokens per member (inner.budget: time)
  // Rounds that failed and are done again, counted until they complete (round_decisions.hpp).
  RoundRedos redos;
  // Round r failed for `why`; `fix`: what in the job file would help. It is done again, or,
  // past kMaxRoundRedos redos, the job fails saying why (thrown).
  void round_failed(int64_t r, const std::string& why, const std::string& fix = "") {
    const RedoDecision d = redos.failed(r, why, fix);
    if (d.give_up) throw std::runtime_error(d.message);
    log("round " + std::to_string(r + 1) + " failed: " + why + "; it is redone (" +
        std::to_string(d.redo) + " of at most " + std::to_string(kMaxRoundRedos) + ")");
  }
  std::string stream_failure;  // finish_stream: why the round failed

  // The inner phase of a round with a deadline: waits until every member reported or the
  // grace window after the quorum passed (inner_phase_closed); `late[i]`: member i had not.
  std::vector<std::optional<InnerResult>> gather_inner(std::vector<Future<InnerResult>>& fs,
                                                       std::vector<Failure>& errors,
                                                       std::vector<bool>& late, double& window);

  PathRoots roots;  // its node's: the job's folder and the checkpoints it resumes from are in them
  std::string resume_file;  // checkpoint.resume under the roots ("": none)
  void require_resume_file() const {
    if (!fs::is_regular_file(resume_file))
      throw std::invalid_argument("checkpoint.resume: there is no checkpoint file " + resume_file);
  }

  State(std::string id, const std::string& spec)
      : job_id(std::move(id)),
        cfg(dl::JobConfig::from_yaml(spec)),
        rt(Runtime::current()),
        roots(this_actor().roots) {
    resolve_checkpoint_path(roots, cfg.checkpoint.dir, "checkpoint.dir");
    folder = resolve_checkpoint_path(roots, (fs::path(cfg.checkpoint.dir) / job_id).string(),
                                     "checkpoint.dir/" + job_id);
    // Refused at submission when the file is not there; what it holds is read by run().
    if (!cfg.checkpoint.resume.empty()) {
      resume_file = resolve_checkpoint_path(roots, cfg.checkpoint.resume, "checkpoint.resume");
      require_resume_file();
    }
    target = cfg.workers.count;
  }

  // Reports go to the head, which keeps them in Redis. While it cannot (Redis
  // restarting, say), they wait here in order, and the job goes on.
  void publish(std::function<void()> f) {
    outbox.push_back(std::move(f));
    flush();
  }
  bool flush() {
    while (!outbox.empty()) {
      try {
        outbox.front()();
      } catch (const std::exception& e) {
        if (!outbox_stuck) log_warn(job_id + ": reports wait for the head: " + e.what());
        outbox_stuck = true;
        return false;
      }
      outbox.pop_front();
    }
    if (outbox_stuck) log_info(job_id + ": the head takes reports again");
    outbox_stuck = false;
    return true;
  }
  // Waits `d`, or less once the aggregator is stopped: between two looks at the cluster.
  void pause(Millis d) {
    std::mutex mu;
    std::condition_variable_any cv;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, wake.get_token(), d, [] { return false; });
  }
  void log(const std::string& line) {
    log_info(job_id + ": " + line);
    publish([this, line] { rt.job_log(job_id, line); });
  }
  // The checkpoint file of the state after `r` rounds, in the job's folder.
  std::string checkpoint_file(int64_t r) const {
    return folder + "/ckpt-round-" + std::to_string(r) + ".pt";
  }
  // Where the job goes back to, for the log: "its start" or "its checkpoint of round R".
  std::string resume_point() const {
    return resume_from.empty() ? std::string("its start")
                               : "its checkpoint of round " + std::to_string(resume_round);
  }
  // A checkpoint of round `r` written: the job's resume point from now on, a line for people
  // and the record a restarted aggregator reads; older ones beyond checkpoint.keep go.
  void record_checkpoint(const std::string& path, int64_t r) {
    resume_from = path;
    resume_round = r;
    log(kCheckpointLine + path + " (round " + std::to_string(r) + ")");
    msgpack::sbuffer b;
    msgpack::pack(b, CheckpointRecord{path, r});
    publish([this, data = std::string(b.data(), b.size())] {
      rt.job_record(job_id, kCheckpointRecord, data);
    });
    prune_checkpoints();
  }

  std::vector<int> active() const {
    std::vector<int> v;
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].active) v.push_back(int(i));
    return v;
  }
  ActorHandle<InnerWorker>& worker(int i) { return *slots[size_t(i)].handle; }

  void find_checkpoint();
  void take_resume(int rounds);
  void prune_checkpoints();
  void read_target();
  void note_waiting(int i, const std::string& why);
  bool spawn_slot(int i);
  std::vector<int> acquire(const std::vector<int>& want, int64_t r);
  // sync.mode streaming: a slot that can join does so while round c runs, at a fragment
  // boundary, its stream() call added to c (see the definition).
  void join_mid_round(StreamCalls& c);
  std::optional<int64_t> admit_mid_round(const StreamCalls& c, const Slot& s,
                                         const std::string& why_not);
  Resources worker_resources();
  // At submission: a worker must fit in the largest live node (its `memory` resource, bytes)
  // and, on CUDA, its GPU (`gpu_memory`, bytes per GPU), or the job is refused naming the
  // field (diloco::check_fits). Nodes that advertise neither: not checked, said in the log.
  void check_memory();
  void deal_shards();
  void release(int i, const std::string& why);
  // False when the job must go back to its last checkpoint first (must_rewind).
  [[nodiscard]] bool reconcile(int64_t r);
  // sync.mode streaming or eager: round r as one stream() call per member. send_stream sends
  // them; finish_stream waits for their results (the round's start on the workers, for the
  // attempt's seconds, was `started`) and, when the round stands (its members agree, or the
  // survivors of a lost member do), calls `stands` before anything else (the round's end, from
  // which a round sent ahead counts), then records them. False when a member failed or
  // was lost: the others have landed fragments it never saw, so the round cannot be re-formed
  // as a blocking one is; the job rewinds to its last checkpoint (unless the survivors of a
  // member lost with fragments in flight finished those without it: `finished`, the members
  // that finished the round). `last`: the job's last round; the attempt goes into `records`,
  // the members' figures into `figures` and round_steps.
  // `checkpoint`: the members write a checkpoint of the round's end (StreamRequest::checkpoint),
  // the first member the outer state, each its inner state.
  StreamCalls send_stream(int64_t r, bool last, bool checkpoint, const std::vector<int>& members);
  // A checkpoint asked of a streaming round's members: its files are written under the next
  // round's inner steps, and it is recorded (the job's resume point) once they are, after the
  // next round's results are in (settle_checkpoint); a job that goes back forgets it.
  struct PendingCheckpoint {
    int64_t round = 0;  // rounds done: the checkpoint's name and record
    std::vector<int> members;
    std::vector<Future<std::string>> written;  // InnerWorker::checkpoint_written
  };
  std::optional<PendingCheckpoint> pending_checkpoint;
  void settle_checkpoint();
  bool finish_stream(StreamCalls& c, double started, const std::function<void()>& stands,
                     JobRecords& records, std::vector<MemberFigures>& figures, double& loss,
                     double& inner_secs, uint64_t& theta_hash, std::vector<int>& finished);
  std::optional<double> evaluate(int64_t windows);
  template <class T>
  std::optional<T> ask_any(const std::string& what,
                           const std::function<Future<T>(ActorHandle<InnerWorker>&)>& call);
  void run();

  // ---- run()'s parts, and what they share across rounds ----------------------------------
  // What one pass of a round came to, blocking or streaming: the round completed (its
  // figures), or it failed and is done again (`redo`: by those who can, `rewind`: from the
  // last checkpoint), `why` and `fix` as round_failed takes them.
  struct RoundOutcome {
    enum class Kind { completed, redo, rewind } kind = Kind::completed;
    std::string why, fix;
    std::vector<int> members;  // the round's members (streaming: those that finished it)
    std::vector<int> ready;    // those that finished their inner steps
    std::vector<int> group;    // those that agreed on θ
    double loss = 0, inner_secs = 0;
    double failed_secs = 0;  // in the pass's failed all-reduce attempts
    double results_in = 0;   // streaming: when the round's results were all in
    uint64_t theta_hash = 0;
    std::vector<int> asked_checkpoint;  // streaming: the members asked for a checkpoint
  };
  static RoundOutcome failure(RoundOutcome::Kind k, std::string why, std::string fix = "") {
    RoundOutcome o;
    o.kind = k;
    o.why = std::move(why);
    o.fix = std::move(fix);
    return o;
  }
  int total_rounds = 0;           // cfg.total_rounds()
  int64_t submitted_unix_ms = 0;  // the job's (JobInfo), for its seconds
  std::optional<JobRecords> records;
  // round_time: of the pass that completed round r, without its failed all-reduce attempts.
  // This round's members' figures and who missed its deadline, for the round's report.
  std::vector<MemberFigures> round_members;
  std::vector<int> round_late;
  // Seconds of every all-reduce attempt of this aggregator's life (the dashboard's network time).
  double allreduce_total = 0;
  // sync.mode streaming or eager: the next round's calls, sent right behind this round's (they
  // wait in the members' mailboxes), and when that round began on the workers (this round's
  // results all in: an estimate, as each member begins it when it ends this one).
  std::optional<StreamCalls> ahead;
  double ahead_since = 0;
  Pipeline pipeline_said = Pipeline::last_round;
  int64_t windows = 0;  // validation windows
  double last_val = 0;
  // Whole-job utilization: time in inner steps over the time the members were
  // in the job, all rounds, checkpoints, evaluations and joins included.
  double inner_total = 0, member_seconds = 0;
  int64_t steps_since_eval = 0;

  // The job's start, or its restart from a checkpoint; false when it had ended already.
  bool start();
  // Before the first round: the members, the validation windows, round 0's report.
  void prepare(int64_t r);
  double job_time() const;
  void report(int64_t r, double loss, std::optional<double> val, double tok_s, double util,
              int members, double round_time, uint64_t hash);
  // Back to the last checkpoint (or the start); returns the round the job goes on from.
  int64_t go_back();
  RoundOutcome stream_round(int64_t r, const std::vector<int>& members, double t_round,
                            bool sent_ahead);
  // Streaming: whether round r + 1 goes out right behind round r (said when it changes).
  Pipeline send_ahead(int64_t r, const std::vector<int>& members);
  RoundOutcome blocking_round(int64_t r, const std::vector<int>& members);
  RoundOutcome inner_phase(int64_t r, const std::vector<int>& members);
  void all_reduce(int64_t r, RoundOutcome& o);
  // Round r - 1 completed (r rounds done): evaluation, report, checkpoint.
  void end_round(int64_t r, const RoundOutcome& o, double t_round);
  void checkpoint_round(int64_t r, const std::vector<int>& members,
                        const std::vector<int>& asked_checkpoint);
  // After the last round: final.pt, the workers stopped, the job's end reported.
  void finish(int64_t r);
  // The round's per-step figures into the job's log (a "steps" record: msgpack of
  // std::vector<JobProgress>, step = the job's inner step), for the dashboard. At most 500
  // steps a round (evenly spaced), so that the record stays well under the head's 64 KiB.
  void publish_steps(int64_t r, const std::vector<StepFigures>& steps) {
    const size_t stride = (steps.size() + 499) / 500;
    std::vector<JobProgress> out;
    for (size_t i = 0; i < steps.size(); i += stride) {
      JobProgress p;
      p.step = (r - 1) * cfg.inner.steps + int64_t(i) + 1;
      p.total = total_steps;
      schema::Step s = step_report(steps[i]);
      s.tokens.reset();  // metrics.jsonl's only
      s.cpu_s.reset();
      p.metrics = schema::to_metrics(s);
      out.push_back(std::move(p));
    }
    msgpack::sbuffer buf;
    msgpack::pack(buf, out);
    std::string data(buf.data(), buf.size());
    publish([this, data] { rt.job_record(job_id, schema::record::kSteps, data); });
  }
};

// The last checkpoint this job recorded, when the aggregator was restarted.
void OuterAggregator::State::find_checkpoint() {
  std::string cursor;
  for (;;) {
    JobEvents ev = rt.job_events(job_id, cursor, 1000);
    if (ev.events.empty()) break;
    cursor = ev.events.back().id;
    for (const JobEvent& e : ev.events) {
      if (e.kind != kCheckpointRecord) continue;
      CheckpointRecord rec;
      try {
        // Anyone who can reach the head can append to a job's log: bounded like network input.
        rec = unpack_checked<CheckpointRecord>(e.data, "a checkpoint record");
      } catch (const std::exception& err) {
        log("ignoring a malformed checkpoint record: " + std::string(err.what()));
        continue;
      }
      // Only a checkpoint in this job's folder: a record is not a way to read other files.
      try {
        rec.path = resolve_checkpoint_path(roots, rec.path, "checkpoint record");
      } catch (const PathError& err) {
        log("ignoring a checkpoint record: " + std::string(err.what()));
        continue;
      }
      if (rec.path.rfind(folder + "/", 0) != 0 || !fs::exists(rec.path)) continue;
      resume_from = rec.path;
      resume_round = rec.round;
    }
  }
}

// checkpoint.resume, for a job that has recorded no checkpoint of its own yet: it starts where
// that file left off (a checkpoint of any job or of the simulator, on any cluster), with each
// worker's inner state where the file's job wrote one beside it.
void OuterAggregator::State::take_resume(int rounds) {
  require_resume_file();  // it was there at submission; it may have gone since
  const std::string& path = resume_file;
  dl::CheckpointInfo info;
  try {
    info = dl::checkpoint_info(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument("checkpoint.resume: " + path +
                                " is not a loco checkpoint: " + e.what());
  }
  if (!info.outer_state)
    throw std::invalid_argument("checkpoint.resume: " + path +
                                " holds no outer state (a single or ddp baseline's checkpoint?)");
  if (const std::string d = dl::model_difference(info.config.model, cfg.model); !d.empty())
    throw std::invalid_argument("checkpoint.resume: the model of " + path +
                                " differs from the job's in " + d);
  if (info.config.vocab_size() != cfg.vocab_size())
    throw std::invalid_argument("checkpoint.resume: the vocabulary of " + path + " has " +
                                std::to_string(info.config.vocab_size()) + " tokens, the job's " +
                                std::to_string(cfg.vocab_size()));
  if (info.round >= rounds)
    throw std::invalid_argument(
        "checkpoint.resume: " + path + " is of round " + std::to_string(info.round) +
        " and the job ends at round " + std::to_string(rounds) +
        ": give it more rounds (loco submit --set rounds=N)");
  resume_from = path;
  resume_round = info.round;
}

// checkpoint.keep: the newest `keep` round checkpoints of the job's folder stay, with their
// workers' inner states, and so does the one the job would go back to; older ones go.
void OuterAggregator::State::prune_checkpoints() {
  if (cfg.checkpoint.keep <= 0) return;
  static const std::regex name(R"(ckpt-round-([0-9]{1,9})(\.worker-[0-9]+)?\.pt)");
  std::map<int64_t, std::vector<fs::path>, std::greater<>> rounds;  // newest first
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, name)) rounds[std::stoll(m[1].str())].push_back(e.path());
  }
  int kept = 0;
  for (const auto& [r, files] : rounds) {
    const bool whole =
        std::any_of(files.begin(), files.end(), [](const fs::path& p) {
          return p.filename().string().find(".worker-") == std::string::npos;
        });
    if (whole && kept < cfg.checkpoint.keep) {
      ++kept;
      continue;
    }
    if (whole && r == resume_round) continue;
    for (const fs::path& p : files) fs::remove(p, ec);
    log("checkpoint.keep: removed the checkpoint of round " + std::to_string(r));
  }
}

// `loco scale` writes the job record; bounded by workers.max.
void OuterAggregator::State::read_target() {
  int want = cfg.workers.count;
  try {
    JobInfo info = rt.job(job_id);
    if (info.scale > 0) want = info.scale;
  } catch (const std::exception&) {
    return;  // the head or Redis is away: keep the last target
  }
  if (cfg.workers.max > 0 && want > cfg.workers.max) want = cfg.workers.max;
  if (want != target)
    log("scale: " + std::to_string(target) + " -> " + std::to_string(want) + " workers" +
        (cfg.workers.max > 0 && want == cfg.workers.max ? " (workers.max)" : ""));
  target = want;
}

void OuterAggregator::State::note_waiting(int i, const std::string& why) {
  Slot& s = slots[size_t(i)];
  // Logged when the reason changes; each failed spawn names a new actor id, which does not count.
  static const std::regex actor_id(R"( ?\(a-[0-9a-f]+\))");
  std::string reason = std::regex_replace(why, actor_id, "");
  if (s.waiting != reason) log("worker " + std::to_string(i) + " cannot join yet: " + reason);
  s.waiting = reason;
}

// Slot i's actor, ready for calls: found (restarted by the head after its node died, or from
// before this aggregator was itself restarted) or spawned. False, with the reason noted, when
// it is restarting or cannot be placed now.
bool OuterAggregator::State::spawn_slot(int i) {
  Slot& s = slots[size_t(i)];
  try {
    std::optional<ActorInfo> info;
    try {
      info = rt.lookup(s.name);
    } catch (const ActorNotFoundError&) {
    }
    s.handle.reset();
    if (info && (info->state == ActorState::restarting || info->state == ActorState::pending)) {
      note_waiting(i, "its actor is restarting (" + info->reason + ")");
      return false;
    }
    if (info && info->state != ActorState::dead) s.handle = rt.get_actor<InnerWorker>(s.name);
    if (!s.handle)
      s.handle = rt.spawn<InnerWorker>(ActorOptions()
                                           .with_name(s.name)
                                           .with_resources(worker_resources())
                                           .with_shared_gpus(cfg.workers.share_gpu)
                                           .with_max_restarts(cfg.workers.max_restarts),
                                       job_id, std::string(cfg.to_yaml()), i);
    return true;
  } catch (const std::exception& e) {
    note_waiting(i, e.what());
    return false;
  }
}

// Brings the slots in `want` into the job at round r: spawns their actors (or
// finds them restarted by the head), then initializes them with the outer
// state: copied from a live member, read from the checkpoint, or from the seed.
// Returns the slots that joined.
std::vector<int> OuterAggregator::State::acquire(const std::vector<int>& want, int64_t r) {
  std::vector<int> live;
  std::map<int, double> t0;
  for (int i : want) {
    if (stop) return {};
    t0[i] = now_s();
    if (spawn_slot(i)) live.push_back(i);
  }
  if (live.empty()) return {};
  // Shards as if they all join (reconcile's deal_shards evens them out if some do not).
  const std::vector<int> current = active();
  std::vector<int> members = current;
  members.insert(members.end(), live.begin(), live.end());
  std::sort(members.begin(), members.end());
  for (size_t k = 0; k < members.size(); ++k)
    if (std::find(live.begin(), live.end(), members[k]) != live.end())
      slots[size_t(members[k])].shards =
          dl::round_robin_shards(cfg.data.shards, int(k), int(members.size()));

  // Members that hold the current outer state, one per joiner, spread over them.
  const std::vector<int> sources = copy_sources(current, live);
  auto source_of = [&](size_t k) {
    return sources.empty() ? std::string() : slots[size_t(sources[k])].name;
  };
  const bool fresh = r == 0 && resume_from.empty();
  std::vector<Future<std::vector<std::string>>> eps;
  for (int i : live) eps.push_back(worker(i).call(&InnerWorker::endpoints));
  std::vector<Failure> errors;
  auto got = gather(eps, errors, kWorkerCall);
  std::vector<int> initing;
  std::vector<Future<InitResult>> inits;
  for (size_t k = 0; k < live.size(); ++k) {
    int i = live[k];
    if (!got[k]) {
      note_waiting(i, errors[k].message);
      continue;
    }
    Slot& s = slots[size_t(i)];
    s.endpoints = *got[k];
    WorkerInit wi;
    wi.index = i;
    wi.shards = s.shards;
    // Workers that start with the job read the simulator's streams; later ones new streams.
    wi.stream = fresh ? uint64_t(i) : (uint64_t(r) << 16) | uint64_t(i);
    wi.total_steps = total_steps;
    wi.round = r;
    // While the job resumes from a checkpoint (it started from it, or went back to it), every
    // slot reads it and its own inner state, as the slot was: a slot whose actor comes back
    // later than the others must not copy their moments instead, or the resume is no longer
    // exact. Otherwise a joiner copies the current state from a live member.
    if (!fresh) {
      if (!sources.empty() && !(resuming && !resume_from.empty())) {
        wi.source = source_of(k);
      } else {
        wi.checkpoint = resume_from;
        if (!resume_from.empty()) wi.inner_state = inner_state_path(resume_from, i);
      }
    }
    initing.push_back(i);
    inits.push_back(worker(i).call(&InnerWorker::init, wi));
  }
  auto done = gather(inits, errors, kInitCall);
  std::vector<int> joined;
  for (size_t k = 0; k < initing.size(); ++k) {
    int i = initing[k];
    const std::string source =
        resuming && !resume_from.empty()
            ? std::string()
            : source_of(size_t(std::find(live.begin(), live.end(), i) - live.begin()));
    Slot& s = slots[size_t(i)];
    if (!done[k]) {
      note_waiting(i, errors[k].message);
      continue;
    }
    s.active = true;
    s.waiting.clear();
    joined.push_back(i);
    char line[320];
    std::snprintf(line, sizeof line,
                  "worker %d joined at round %lld on %s: %.1f MB of state %s in %.2f s; "
                  "joined in %.2f s",
                  i, static_cast<long long>(r + 1), worker(i).address().c_str(),
                  double(done[k]->state_bytes) / 1e6,
                  fresh            ? "from the seed"
                  : source.empty() ? ("from " + resume_from).c_str()
                                   : ("copied from " + source).c_str(),
                  done[k]->copy_seconds, now_s() - t0[i]);
    if (!fresh || r > 0) log(line);
    if (cfg.device != dl::DeviceKind::cpu || cfg.ranks_per_worker(false) > 1)
      log("worker " + std::to_string(i) + " trains on " + done[k]->device);
  }
  return joined;
}

// What a worker's actor asks its node for: a cpu, and with a GPU device
// workers.gpus GPUs (their indices are the worker's own unless workers.share_gpu).
// device: auto asks for GPUs when some live node offers them.
Resources OuterAggregator::State::worker_resources() {
  bool cluster_has_gpus = false;
  if (cfg.device == dl::DeviceKind::auto_) {
    for (const NodeStatus& n : rt.status().nodes)
      if (n.node.state == NodeState::alive && n.node.resources.count("gpu") &&
          n.node.resources.at("gpu") >= 1)
        cluster_has_gpus = true;
  }
  Resources r{{"cpu", 1}};
  if (cfg.wants_gpus(cluster_has_gpus)) r["gpu"] = cfg.workers.gpus;
  return r;
}

void OuterAggregator::State::check_memory() {
  std::optional<double> memory, gpu_memory;
  bool gpus = false;
  for (const NodeStatus& n : rt.status().nodes) {
    if (n.node.state != NodeState::alive) continue;
    const Resources& r = n.node.resources;
    auto most = [&](std::optional<double>& m, const char* name) {
      if (auto it = r.find(name); it != r.end()) m = std::max(m.value_or(0), it->second);
    };
    most(memory, "memory");
    most(gpu_memory, "gpu_memory");
    gpus = gpus || (r.count("gpu") && r.at("gpu") >= 1);
  }
  const bool cuda = cfg.wants_gpus(gpus);
  const dl::MemoryEstimate e = dl::worker_memory(cfg, cuda);
  std::string said = "memory: a worker needs about " + dl::gib(e.host_bytes());
  if (cuda) said += " and " + dl::gib(e.device_bytes()) + " on each GPU";
  said += memory ? "; the largest node has " + dl::gib(*memory)
                 : "; no node advertises `memory`: not checked";
  if (cuda)
    said += gpu_memory ? ", the largest GPU " + dl::gib(*gpu_memory)
                       : "; no node advertises `gpu_memory`: the GPUs not checked";
  log(said);
  dl::check_fits(cfg, cuda, memory, gpu_memory);
}

// Deals every data shard over the active workers, round-robin in slot order,
// so that no part of the data goes unread when workers come and go. Says so
// when members of the last dealing are gone, wherever they were lost.
void OuterAggregator::State::deal_shards() {
  std::vector<int> members = active();
  std::vector<int> lost;
  std::vector<int> late;
  for (int m : dealt)
    if (std::find(members.begin(), members.end(), m) == members.end())
      (slots[size_t(m)].late ? late : lost).push_back(m);
  std::vector<Future<void>> sets;
  std::vector<int> who;
  for (size_t k = 0; k < members.size(); ++k) {
    Slot& s = slots[size_t(members[k])];
    auto next = dl::round_robin_shards(cfg.data.shards, int(k), int(members.size()));
    if (next == s.shards) continue;
    s.shards = next;
    who.push_back(members[k]);
    sets.push_back(s.handle->call(&InnerWorker::set_shards, next));
  }
  std::vector<Failure> errors;
  for (size_t k = 0; k < sets.size(); ++k) {
    try {
      sets[k].get(kWorkerCall);
    } catch (const std::exception& e) {
      release(who[k], std::string("could not take its shards: ") + e.what());
    }
  }
  if (!lost.empty()) {
    const std::string n = std::to_string(members.size());
    log("round " + std::to_string(round + 1) + ": lost worker(s) " + join_ints(lost) +
        "; their shards went to the " + n + " others; going on with " + n + " workers");
  }
  if (!late.empty())
    log("round " + std::to_string(round + 1) + ": late worker(s) " + join_ints(late) +
        "; their shards go to the " + std::to_string(members.size()) +
        " others until they are back");
  dealt = members;
}

// The slot leaves the round's members; its actor stays (the head may restart it).
void OuterAggregator::State::release(int i, const std::string& why) {
  slots[size_t(i)].active = false;
  log("worker " + std::to_string(i) + " left: " + why);
}

// Between rounds: act on `loco scale`, bring back or add workers up to the
// target, drop surplus ones; below workers.min, wait for joins up to wait_s.
bool OuterAggregator::State::reconcile(int64_t r) {
  read_target();
  // Surplus workers leave, the highest slots first.
  std::vector<int> members = active();
  for (size_t k = members.size(); k-- > size_t(target);) {
    Slot& s = slots[size_t(members[k])];
    s.active = false;
    try {
      rt.kill(s.handle->id());
    } catch (const std::exception& e) {
      log_warn(job_id + ": stopping " + s.name + ": " + e.what());
    }
    s.handle.reset();
    std::erase(dealt, members[k]);  // left, not lost
    log("worker " + std::to_string(members[k]) + " left: scaled down to " + std::to_string(target));
  }
  const double deadline = now_s() + cfg.workers.wait_s;
  bool said_waiting = false;
  for (;;) {
    if (int(slots.size()) < target) slots.resize(size_t(target));
    std::vector<int> want;
    for (int i = 0; i < target; ++i) {
      Slot& s = slots[size_t(i)];
      if (s.name.empty()) s.name = job_id + ".worker-" + std::to_string(i);
      if (s.active) continue;
      if (s.late) {
        // A member that missed a deadline: its actor is busy until its inner steps end.
        if (!s.late->ready()) continue;
        log("worker " + std::to_string(i) + " ended its inner steps of round " +
            std::to_string(s.late_round + 1) + "; their Δ is dropped, and it catches up at round " +
            std::to_string(r + 1));
        s.late.reset();
      }
      want.push_back(i);
    }
    if (!want.empty()) {
      if (must_rewind(int(active().size()), r, resume_round)) {
        // Every worker is gone, and the outer state with them: go back to the
        // last checkpoint (or the start).
        log("round " + std::to_string(r + 1) + ": no worker holds the outer state; going back to " +
            (resume_from.empty() ? std::string("the start") : resume_from));
        return false;
      }
      acquire(want, r);
    }
    deal_shards();  // also after members left outside a reduce (evaluation, checkpoint)
    const int have = int(active().size());
    if (have >= std::max(1, cfg.workers.min) || stop) return true;
    std::string why;
    for (int i = 0; i < target; ++i)
      if (!slots[size_t(i)].active && !slots[size_t(i)].waiting.empty())
        why += "; worker " + std::to_string(i) + ": " + slots[size_t(i)].waiting;
    if (now_s() > deadline)
      throw std::runtime_error("round " + std::to_string(r + 1) + ": " + std::to_string(have) +
                               " workers, below workers.min = " + std::to_string(cfg.workers.min) +
                               ", for workers.wait_s = " + std::to_string(int(cfg.workers.wait_s)) +
                               " s; no more could join" + why);
    if (!said_waiting)
      log("round " + std::to_string(r + 1) + ": " + std::to_string(have) +
          " workers, below workers.min = " + std::to_string(cfg.workers.min) + "; waiting up to " +
          std::to_string(int(cfg.workers.wait_s)) + " s for more" + why);
    said_waiting = true;
    pause(kClusterPoll);
  }
}

// Validation loss of θ (the same on every member), the windows shared out by
// whole batches so that each member evaluates about 1/K of them. A member lost
// meanwhile leaves the round's members and the others share the work again;
// nothing when none is left.
std::optional<double> OuterAggregator::State::evaluate(int64_t windows) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<int> group = active();
    if (group.empty()) return std::nullopt;
    std::vector<int64_t> counts;
    std::vector<int> who;
    std::vector<Future<double>> parts;
    for (const EvalPart& p : evaluation_split(windows, cfg.inner.batch_size, int(group.size()))) {
      counts.push_back(p.end - p.begin);
      who.push_back(group[size_t(p.member)]);
      parts.push_back(
          worker(group[size_t(p.member)]).call(&InnerWorker::evaluate_windows, p.begin, p.end));
    }
    std::vector<Failure> errors;
    auto got = gather(parts, errors, kEvaluateCall);
    double sum = 0;
    bool complete = true;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (got[i]) {
        sum += *got[i] * double(counts[i]);
      } else {
        complete = false;
        release(who[i], "failed while evaluating: " + errors[i].message);
      }
    }
    if (complete) return sum / double(windows);
  }
  return std::nullopt;
}

// Asks the active members in turn until one answers; a member that fails leaves.
template <class T>
std::optional<T> OuterAggregator::State::ask_any(
    const std::string& what, const std::function<Future<T>(ActorHandle<InnerWorker>&)>& call) {
  for (int m : active()) {
    try {
      return call(worker(m)).get(kCheckpointWrite);
    } catch (const std::exception& e) {
      release(m, "failed " + what + ": " + e.what());
    }
  }
  return std::nullopt;
}

// The job's rounds as a loop over decisions: each round is reconciled, run (blocking or
// streaming), and its outcome applied: recorded and checkpointed, or done again (round_failed).
void OuterAggregator::State::run() {
  if (!start()) return;
  int64_t r = resume_round;
  round = r;
  prepare(r);
  bool failed_before = false;  // the pass before counted round r's failure (round_failed)
  while (r < total_rounds && !stop) {
    // A round sent ahead went out with round r - 1's members, and nothing could change them
    // since (pipeline_next): no reconcile between the two.
    const bool sent_ahead = ahead && ahead->round == r;
    const double t_round = sent_ahead ? ahead_since : now_s();
    // Round r's failure in the pass before was counted there: the rewind it leads to is part
    // of it. A rewind for any other reason (members lost between rounds) counts now.
    const bool counted = std::exchange(failed_before, false);
    if (!sent_ahead && !reconcile(r)) {
      if (!counted) round_failed(r, "no worker holds the outer state any more");
      r = go_back();
      continue;
    }
    const std::vector<int> members = sent_ahead ? ahead->members : active();
    round_members.clear();
    round_late.clear();
    round_steps.clear();
    RoundOutcome o = cfg.sync.mode != dl::SyncMode::blocking
                         ? stream_round(r, members, t_round, sent_ahead)
                         : blocking_round(r, members);
    if (o.kind != RoundOutcome::Kind::completed) {
      round_failed(r, o.why, o.fix);
      failed_before = true;
      if (o.kind == RoundOutcome::Kind::rewind) r = go_back();
      continue;
    }
    if (o.group.size() < o.members.size()) deal_shards();  // the lost ones were released
    redos.completed(r);
    r += 1;
    round = r;
    resuming = false;
    end_round(r, o, t_round);
  }
  if (stop) return;
  finish(r);
}

bool OuterAggregator::State::start() {
  // Restarted by the head after the job ended (its node died late): nothing to do.
  const JobInfo info = rt.job(job_id);
  if (info.finished()) return false;
  submitted_unix_ms = info.submitted_unix_ms;
  total_rounds = cfg.total_rounds();
  total_steps = int64_t(total_rounds) * cfg.inner.steps;
  fs::create_directories(folder);
  find_checkpoint();
  if (resume_from.empty() && !cfg.checkpoint.resume.empty()) take_resume(total_rounds);
  {
    // The job file beside its checkpoints: `loco submit --resume CKPT` needs no other.
    const std::string tmp = folder + "/job.yaml.tmp";
    std::ofstream(tmp) << cfg.to_yaml() << "\n";
    fs::rename(tmp, folder + "/job.yaml");
  }
  // The rounds after the checkpoint are redone (without one, round 0 too): their lines go.
  records.emplace(folder, resume_from.empty() ? -1 : resume_round);
  if (!resume_from.empty()) {
    log("resuming from " + resume_from + ": round " + std::to_string(resume_round) + " of " +
        std::to_string(total_rounds));
  } else {
    log("job " + cfg.name + ": " + std::to_string(cfg.workers.count) + " workers (min " +
        std::to_string(cfg.workers.min) + "), H=" + std::to_string(cfg.inner.steps) + ", " +
        std::to_string(total_rounds) + " rounds, compression " +
        std::string(collective::to_string(cfg.compression)) + "; folder " + folder);
  }
  return true;
}

void OuterAggregator::State::prepare(int64_t r) {
  resuming = !resume_from.empty();
  (void)reconcile(r);
  while (!windows) {
    auto w = ask_any<int64_t>("to count the validation windows",
                              [](auto& h) { return h.call(&InnerWorker::validation_windows); });
    if (w)
      windows = *w;
    else
      (void)reconcile(r);
  }
  if (r == 0) {
    auto v = evaluate(windows);
    auto h =
        ask_any<uint64_t>("to hash θ", [](auto& w) { return w.call(&InnerWorker::theta_hash); });
    if (v) last_val = *v;
    report(0, 0, v, 0, 0, int(active().size()), 0, h.value_or(0));
  }
}

double OuterAggregator::State::job_time() const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return double(ms - submitted_unix_ms) / 1000.0;
}

void OuterAggregator::State::report(int64_t r, double loss, std::optional<double> val, double tok_s,
                                    double util, int members, double round_time, uint64_t hash) {
  // The simulator's line format (loco-train writes the same), plus the job's figures.
  dl::RoundMetrics m;
  m.round = int(r);
  m.inner_steps = r * cfg.inner.steps;
  m.tokens_per_worker = m.inner_steps * cfg.tokens_per_inner_step();
  m.tokens_total = m.tokens_per_worker * members;
  m.train_loss = loss;
  m.val_loss = val;
  m.theta_hash = hash;
  const int failed = records->failed_attempts();
  const double job_seconds = job_time();
  const std::vector<StepFigures> steps = per_step_means(round_steps);
  records->round(
      m, RoundFigures{util, members, round_time, job_seconds, round_members, round_late, steps});
  if (!steps.empty()) publish_steps(r, steps);
  JobProgress p;
  p.step = r;
  p.total = total_rounds;
  schema::Report rep;
  rep.inner_step = r * cfg.inner.steps;
  rep.loss = loss;
  if (val) {
    rep.val_loss = *val;
    rep.val_ppl = std::exp(*val);
  }
  rep.tokens_per_s = tok_s;
  rep.bytes_per_worker = records->bytes_per_worker();
  rep.job_bytes_per_worker = records->job_bytes_per_worker();
  rep.failed_attempts = failed;
  rep.redo = records->redo();
  rep.utilization = util;
  rep.workers = members;
  if (!round_late.empty()) rep.late = int(round_late.size());
  // For the dashboard's axes and /metrics: the tokens the round's members processed, the
  // round's and the job's seconds.
  int64_t round_tokens = 0;
  for (const MemberFigures& f : round_members) round_tokens += f.tokens;
  // A round without its members' figures: H steps each.
  if (round_members.empty() && r > 0)
    round_tokens = int64_t(members) * cfg.inner.steps * int64_t(cfg.tokens_per_inner_step());
  rep.round_tokens = round_tokens;
  rep.round_time = round_time;
  rep.job_time = job_seconds;
  rep.allreduce_seconds_total = allreduce_total;
  p.metrics = schema::to_metrics(rep);
  publish([this, p] { rt.job_progress(job_id, p); });
}

// Every member re-reads the checkpoint, and the rounds after it are redone, their records
// replaced. At the resume round nobody is asked to rewind again.
int64_t OuterAggregator::State::go_back() {
  pending_checkpoint.reset();  // not recorded: it may hold a round that is undone now
  const int64_t r = resume_round;
  round = r;
  resuming = true;
  records->go_back(r);
  for (Slot& s : slots) s.active = false;
  (void)reconcile(r);
  return r;
}

OuterAggregator::State::RoundOutcome OuterAggregator::State::stream_round(
    int64_t r, const std::vector<int>& members, double t_round, bool sent_ahead) {
  RoundOutcome o;
  std::optional<StreamCalls> sent;
  if (sent_ahead) {
    sent = std::move(*ahead);
  } else {
    try {
      sent = send_stream(r, r + 1 == total_rounds,
                         checkpoint_due(r + 1, cfg.checkpoint.every, total_rounds), members);
    } catch (const std::exception& e) {
      // A member's actor could not be reached to send it the round (some others may have
      // it already): back to the checkpoint, which every member re-reads.
      log("round " + std::to_string(r + 1) + " could not be sent: " + e.what() +
          "; the job goes back to " + resume_point());
      return failure(RoundOutcome::Kind::rewind, std::string("it could not be sent: ") + e.what());
    }
  }
  StreamCalls calls = std::move(*sent);
  if (!calls.checkpoint.empty()) o.asked_checkpoint = calls.members;
  ahead.reset();
  const Pipeline p = send_ahead(r, members);
  std::vector<int> finished;
  const bool ok = finish_stream(
      calls, t_round, [&] { o.results_in = ahead_since = now_s(); }, *records, round_members,
      o.loss, o.inner_secs, o.theta_hash, finished);
  if (!ok) {
    log("round " + std::to_string(r + 1) +
        " failed with synchronizations in flight; the job goes back to " + resume_point());
    return failure(RoundOutcome::Kind::rewind, stream_failure);
  }
  // The checkpoint the round before asked for: written under this round's inner steps.
  settle_checkpoint();
  if (o.results_in > 0)
    log_info(job_id + ": round " + std::to_string(r + 1) + " results in " +
             std::to_string(o.results_in - t_round) + " s after it began; bookkeeping " +
             std::to_string(now_s() - o.results_in) + " s; round " + std::to_string(r + 2) + ": " +
             to_string(p));
  o.ready = o.group = o.members = finished;
  return o;
}

Pipeline OuterAggregator::State::send_ahead(int64_t r, const std::vector<int>& members) {
  read_target();
  PipelineInput next;
  next.round = r;
  next.rounds = total_rounds;
  next.evaluation_after =
      evaluation_due(steps_since_eval + cfg.inner.steps, cfg.eval.every, r + 1, total_rounds);
  // Those still in the job: a member of a round that was sent ahead may have been lost since.
  std::vector<int> staying;
  for (int m : members)
    if (slots[size_t(m)].active) staying.push_back(m);
  next.members = int(staying.size());
  next.target = target;
  next.min = cfg.workers.min;
  const Pipeline p = pipeline_next(next);
  // Whether rounds are sent ahead, and why not, said when it changes.
  auto say = [&](Pipeline now) {
    if (now == Pipeline::last_round || now == pipeline_said) return;
    log("round " + std::to_string(r + 2) +
        (now == Pipeline::ahead
             ? ": sent right behind round " + std::to_string(r + 1) +
                   ", which each member begins when it ends round " + std::to_string(r + 1)
             : ": not sent ahead: " + std::string(to_string(now))));
    pipeline_said = now;
  };
  // Sent ahead: round r + 1's calls go out right behind round r's and wait in each member's
  // mailbox, so that a member begins round r + 1 as soon as it ends round r, with no barrier
  // between the rounds and no trip to the aggregator (members drift apart by up to a fragment
  // interval; the collective's entry window lets a member be behind without being lost).
  say(p);
  if (p == Pipeline::ahead) {
    try {
      ahead = send_stream(r + 1, r + 2 == total_rounds,
                          checkpoint_due(r + 2, cfg.checkpoint.every, total_rounds), staying);
    } catch (const std::exception& e) {
      // Some members may hold it already: they begin it after this round, and its proper
      // sending (a round mismatch for them) sends the job back to its checkpoint.
      log("round " + std::to_string(r + 2) + " could not be sent ahead: " + e.what());
      ahead.reset();
    }
  }
  return p;
}

OuterAggregator::State::RoundOutcome OuterAggregator::State::blocking_round(
    int64_t r, const std::vector<int>& members) {
  RoundOutcome o = inner_phase(r, members);
  if (o.kind != RoundOutcome::Kind::completed) return o;
  all_reduce(r, o);
  return o;
}

// 1-2. Every member runs its H inner steps, or (inner.budget: time) steps until the round's
// budget of seconds is spent.
OuterAggregator::State::RoundOutcome OuterAggregator::State::inner_phase(
    int64_t r, const std::vector<int>& members) {
  RoundOutcome o;
  o.members = members;
  const double budget =
      cfg.inner.budget == dl::InnerBudget::time
          ? inner_budget_seconds(cfg.inner.round_seconds, cfg.inner.steps, step_seconds)
          : 0;
  std::vector<Future<InnerResult>> inner;
  for (int m : members)
    inner.push_back(budget > 0 ? worker(m).call(&InnerWorker::inner_timed, r, budget)
                               : worker(m).call(&InnerWorker::inner, r));
  std::vector<Failure> errors;
  std::vector<bool> late;
  double window = 0;
  auto results = gather_inner(inner, errors, late, window);
  step_seconds.clear();
  std::string steps_line;
  // The first member whose inner steps diverged, if any (the cause of a redo below).
  std::string non_finite;
  for (size_t i = 0; i < members.size(); ++i) {
    if (results[i]) {
      std::vector<StepHealth> health;
      for (const StepFigures& f : results[i]->per_step) health.push_back({f.loss, f.grad_norm});
      if (std::string why = non_finite_inner(members[i], results[i]->mean_loss, health);
          !why.empty()) {
        // Its Δ is not finite: it leaves the round (the collective would refuse it), and
        // comes back with the outer state before the next.
        release(members[i], why);
        if (non_finite.empty()) non_finite = why;
        continue;
      }
      o.ready.push_back(members[i]);
      o.loss += results[i]->mean_loss;
      o.inner_secs += results[i]->seconds;
      tokens_of[members[i]] = results[i]->tokens;
      round_members.push_back({members[i], results[i]->steps, results[i]->tokens,
                               results[i]->seconds, cpu_seconds_of(results[i]->per_step)});
      round_steps.push_back(results[i]->per_step);
      if (results[i]->steps > 0) step_seconds.push_back(results[i]->seconds / results[i]->steps);
      steps_line += (steps_line.empty() ? "" : ", ") + std::to_string(members[i]) + ": " +
                    std::to_string(results[i]->steps);
    } else if (late[i]) {
      Slot& s = slots[size_t(members[i])];
      s.late = inner[i];
      s.late_round = r;
      s.active = false;
      round_late.push_back(members[i]);
      char line[200];
      std::snprintf(line, sizeof line,
                    "worker %d missed the deadline of round %lld (%.1f s after the quorum); "
                    "it sits the round out and catches up when its inner steps end",
                    members[i], static_cast<long long>(r + 1), window);
      log(line);
    } else {
      release(members[i], "failed in round " + std::to_string(r + 1) + ": " + errors[i].message);
    }
  }
  if (budget > 0) {
    char line[96];
    std::snprintf(line, sizeof line, " (budget %.2f s)", budget);
    log("round " + std::to_string(r + 1) + ": inner steps per worker " + steps_line + line);
  }
  if (after_inner(int(o.ready.size()), cfg.workers.min) == AfterInner::redo) {
    if (!non_finite.empty()) {
      char fix[96];
      std::snprintf(fix, sizeof fix, "lower inner.lr (%g): the inner steps diverge", cfg.inner.lr);
      return failure(RoundOutcome::Kind::redo, non_finite, fix);
    }
    std::string first;  // the first member that failed, with why
    for (size_t i = 0; i < members.size() && first.empty(); ++i)
      if (!results[i] && !late[i])
        first = "; worker " + std::to_string(members[i]) + " failed: " + errors[i].message;
    return failure(RoundOutcome::Kind::redo,
                   std::to_string(o.ready.size()) +
                       " workers finished their inner steps, below workers.min = " +
                       std::to_string(cfg.workers.min) + first);
  }
  o.loss /= double(o.ready.size());
  return o;
}

// 3-5. The group averages Δ and steps; every member reports θ's hash. The group could not
// agree: o becomes a redo.
void OuterAggregator::State::all_reduce(int64_t r, RoundOutcome& o) {
  std::vector<int> group = o.ready;
  std::vector<Failure> errors;
  std::optional<uint64_t> agreed;
  for (uint64_t attempt = 0; !agreed; ++attempt) {
    ReduceRequest req;
    req.round = r;
    const auto us = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
    last_op_id = req.op_id = std::max(last_op_id + 1, us);
    for (int m : group) {
      req.names.push_back(slots[size_t(m)].name);
      req.endpoints.push_back(slots[size_t(m)].endpoints);
      if (cfg.inner.budget == dl::InnerBudget::time) req.tokens.push_back(tokens_of[m]);
    }
    const double t_attempt = now_s();
    std::vector<Future<ReduceResult>> red;
    for (size_t i = 0; i < group.size(); ++i) {
      req.rank = int(i);
      red.push_back(worker(group[i]).call(&InnerWorker::reduce, req));
    }
    auto rr = gather(red, errors, kReduceCall);
    AttemptRecord rec;
    rec.round = r + 1;
    rec.members = group;
    rec.seconds = now_s() - t_attempt;
    for (size_t i = 0; i < group.size(); ++i) {
      // A member whose reduce failed does not say what it sent before it did.
      rec.bytes.push_back(rr[i] ? std::optional(rr[i]->bytes_sent) : std::nullopt);
      if (!rr[i]) rec.errors.push_back({group[i], errors[i].gone, errors[i].message});
    }
    records->attempt(rec);
    allreduce_total += rec.seconds;
    if (!rec.errors.empty()) o.failed_secs += rec.seconds;
    std::vector<MemberOutcome> outcomes;
    for (size_t i = 0; i < group.size(); ++i) {
      outcomes.push_back(rr[i] ? MemberOutcome{true, rr[i]->theta_hash, false}
                               : MemberOutcome{false, 0, errors[i].gone});
      if (!rr[i] && !errors[i].gone)
        log("worker " + std::to_string(group[i]) + " failed the all-reduce of round " +
            std::to_string(r + 1) + ": " + errors[i].message);
    }
    const AttemptDecision d = after_attempt(group, outcomes, attempt);
    for (size_t i = 0; i < group.size(); ++i) {
      if (!rr[i] && errors[i].gone)
        release(group[i], "lost in the all-reduce of round " + std::to_string(r + 1) + ": " +
                              errors[i].message);
    }
    if (d.kind == AttemptDecision::Kind::diverged) {
      const size_t i =
          size_t(std::find(group.begin(), group.end(), d.diverged_member) - group.begin());
      throw std::runtime_error("round " + std::to_string(r + 1) + ": worker " +
                               std::to_string(d.diverged_member) + " holds a different θ (hash " +
                               std::to_string(rr[i]->theta_hash) + " vs " +
                               std::to_string(rr[0]->theta_hash) + ")");
    }
    if (d.kind == AttemptDecision::Kind::agreed) {
      agreed = d.theta_hash;
      break;
    }
    if (d.kind == AttemptDecision::Kind::give_up) break;
    if (d.next_group.size() < group.size())
      log("round " + std::to_string(r + 1) + " re-formed with " +
          std::to_string(d.next_group.size()) + " workers: " + join_ints(d.next_group));
    group = d.next_group;
  }
  if (!agreed) {
    // The group could not agree: its members' θ may differ now. Drop them all;
    // reconcile brings them back with the outer state of a checkpoint.
    for (int m : group) slots[size_t(m)].active = false;
    o = failure(RoundOutcome::Kind::redo,
                "the all-reduce failed 4 times; the last time: " + errors[0].message);
    return;
  }
  o.group = group;
  o.theta_hash = *agreed;
}

void OuterAggregator::State::end_round(int64_t r, const RoundOutcome& o, double t_round) {
  std::vector<int> members = o.group;
  steps_since_eval += cfg.inner.steps;
  std::optional<double> val;
  if (evaluation_due(steps_since_eval, cfg.eval.every, r, total_rounds)) {
    val = evaluate(windows);
    if (val) {
      last_val = *val;
      steps_since_eval = 0;
    } else {
      log("round " + std::to_string(r) + ": no worker left to evaluate θ; evaluated later");
    }
    members = active();
  }
  // With the next round sent ahead, this one ended as its results were in: what follows here
  // runs under the next round's inner steps, and counts in its time.
  const double round_end = ahead ? o.results_in : now_s();
  const double wall = round_end - t_round;
  inner_total += o.inner_secs;
  const double util = o.inner_secs / (double(o.ready.size()) * wall);
  const double tok_s =
      double(o.ready.size()) * double(cfg.inner.steps) * double(cfg.tokens_per_inner_step()) / wall;
  report(r, o.loss, val, tok_s, util, int(members.size()), wall - o.failed_secs, o.theta_hash);
  if (checkpoint_due(r, cfg.checkpoint.every, total_rounds))
    checkpoint_round(r, members, o.asked_checkpoint);
  member_seconds += double(members.size()) * ((ahead ? o.results_in : now_s()) - t_round);
  flush();
}

void OuterAggregator::State::checkpoint_round(int64_t r, const std::vector<int>& members,
                                              const std::vector<int>& asked_checkpoint) {
  if (cfg.sync.mode != dl::SyncMode::blocking) {
    // Asked with the round's calls (send_stream): its members write it under the next round's
    // inner steps, and it is recorded after that round (settle_checkpoint). Members lost in
    // the round wrote nothing; those that finished it say when their files are written.
    PendingCheckpoint pc;
    pc.round = r;
    for (int m : asked_checkpoint)
      if (std::find(members.begin(), members.end(), m) != members.end()) {
        pc.members.push_back(m);
        pc.written.push_back(worker(m).call(&InnerWorker::checkpoint_written, r));
      }
    pending_checkpoint = std::move(pc);
    return;
  }
  const std::string file = checkpoint_file(r);
  std::vector<Future<std::string>> inner_files;
  for (int m : members)
    inner_files.push_back(
        worker(m).call(&InnerWorker::save_inner_state, inner_state_path(file, m)));
  auto path = ask_any<std::string>("to write a checkpoint", [&](auto& w) {
    return w.call(&InnerWorker::save_checkpoint, file);
  });
  std::vector<Failure> errors;
  gather(inner_files, errors,
         kCheckpointWrite);  // a worker without its file starts afresh on resume
  if (path) record_checkpoint(*path, r);
}

void OuterAggregator::State::finish(int64_t r) {
  // The end: θ's validation loss (if the last evaluation was lost) and final.pt,
  // from whichever workers are there.
  std::optional<std::string> final_path;
  for (int attempt = 0; !final_path; ++attempt) {
    if (attempt > 0) {
      if (attempt > 3) throw std::runtime_error("no worker could write the final checkpoint");
      for (Slot& s : slots) s.active = s.active && s.handle;
      (void)reconcile(r);  // no rewind after the last round: what is left writes final.pt
    }
    if (steps_since_eval > 0) {
      if (auto v = evaluate(windows)) {
        last_val = *v;
        steps_since_eval = 0;
      }
    }
    final_path = ask_any<std::string>("to write the final checkpoint", [&](auto& w) {
      return w.call(&InnerWorker::save_checkpoint, folder + "/final.pt");
    });
  }
  log(kCheckpointLine + *final_path);
  // A finished job holds no cpus.
  for (Slot& s : slots) {
    if (!s.handle) continue;
    try {
      rt.kill(s.handle->id());
    } catch (const std::exception& e) {
      log_warn(job_id + ": stopping " + s.name + ": " + e.what());
    }
  }
  // Plots are drawn outside the job, by whoever wants them (no program runs here).
  log("plots: loco plot " + job_id + " (while the cluster runs), or loco plot --metrics " +
      records->metrics_path());
  char msg[192];
  std::snprintf(
      msg, sizeof msg,
      "validation loss %.4f (perplexity %.2f) after %d rounds; compute utilization %.1f%%",
      last_val, std::exp(last_val), total_rounds,
      100.0 * inner_total / std::max(1e-9, member_seconds));
  // The end must reach the head: wait out a Redis restart (bounded).
  for (const double give_up = now_s() + double(kReportEnd.count());;) {
    try {
      if (flush()) {
        rt.job_finished(job_id, JobState::succeeded, msg);
        break;
      }
    } catch (const std::exception& e) {
      if (now_s() > give_up) throw;
    }
    if (now_s() > give_up)
      throw std::runtime_error("could not report the end of the job to the head");
    std::this_thread::sleep_for(kReportEndRetry);  // a retry of the head, not a wait on calls
  }
}

std::vector<std::optional<InnerResult>> OuterAggregator::State::gather_inner(
    std::vector<Future<InnerResult>>& fs, std::vector<Failure>& errors, std::vector<bool>& late,
    double& window) {
  const size_t n = fs.size();
  late.assign(n, false);
  window = 0;
  if (cfg.workers.grace_max_s <= 0) return gather(fs, errors, kInnerPhase);
  std::vector<double> arrived(n, -1);
  const double phase_start = now_s();
  const int quorum = std::max(1, cfg.workers.min);
  const double limit = now_s() + double(kInnerPhase.count());
  double quorum_at = 0;
  int reported = 0;
  for (;;) {
    // One more report, the phase's close (the quorum's window, or the limit), or a stop.
    const double closes = reported >= quorum ? std::min(quorum_at + window, limit) : limit;
    const auto until = Millis(1 + int64_t(std::ceil(std::max(0.0, closes - now_s()) * 1000)));
    for (size_t i : loco::wait(fs, size_t(reported) + 1, until, wake.get_token())) {
      if (arrived[i] >= 0) continue;
      arrived[i] = now_s();
      if (++reported == quorum) {
        quorum_at = arrived[i];
        window = grace_window(std::vector<double>(lateness.begin(), lateness.end()), kGraceK,
                              kGraceFloorS, cfg.workers.grace_max_s, quorum_at - phase_start);
      }
    }
    if (inner_phase_closed(reported, int(n), cfg.workers.min, cfg.workers.grace_max_s, now_s(),
                           quorum_at, window) ||
        stop || now_s() > limit)
      break;
  }
  std::vector<Future<InnerResult>> done;
  std::vector<size_t> which;
  for (size_t i = 0; i < n; ++i) {
    if (arrived[i] < 0 && !stop) {
      late[i] = true;
      continue;
    }
    done.push_back(fs[i]);
    which.push_back(i);
  }
  std::vector<Failure> errs;
  auto got = gather(done, errs, kEndedCall);
  std::vector<std::optional<InnerResult>> out(n);
  errors.assign(n, Failure{"late: missed the round's deadline", false});
  for (size_t k = 0; k < which.size(); ++k) {
    out[which[k]] = std::move(got[k]);
    errors[which[k]] = errs[k];
  }
  // The samples of the next windows: how late each member was against the round's median.
  std::vector<double> times;
  for (double t : arrived)
    if (t >= 0) times.push_back(t);
  if (times.size() >= 2) {
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const size_t m = sorted.size();
    const double median = m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
    for (double t : times) lateness.push_back(t - median);
    while (lateness.size() > 64) lateness.pop_front();
  }
  return out;
}

StreamCalls OuterAggregator::State::send_stream(int64_t r, bool last, bool checkpoint,
                                                const std::vector<int>& members) {
  StreamRequest req;
  req.round = r;
  req.last = last;
  const std::string file = checkpoint ? checkpoint_file(r + 1) : std::string();
  // One operation id per fragment, all above the last one used (see ReduceRequest::op_id).
  const auto us = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
  req.op_id = std::max(last_op_id + 1, us);
  last_op_id = req.op_id + uint64_t(cfg.sync.fragments) - 1;
  for (int m : members) {
    req.names.push_back(slots[size_t(m)].name);
    req.endpoints.push_back(slots[size_t(m)].endpoints);
  }
  StreamCalls c;
  c.round = r;
  c.op_id = req.op_id;
  c.last = last;
  c.members = members;
  c.checkpoint = file;
  c.sent = now_s();
  for (size_t i = 0; i < members.size(); ++i) {
    req.rank = int(i);
    req.checkpoint = i == 0 ? file : std::string();
    req.inner_state = checkpoint ? inner_state_path(file, members[i]) : std::string();
    c.calls.push_back(worker(members[i]).call(&InnerWorker::stream, req));
  }
  return c;
}

void OuterAggregator::State::settle_checkpoint() {
  if (!pending_checkpoint) return;
  PendingCheckpoint pc = std::move(*pending_checkpoint);
  pending_checkpoint.reset();
  std::vector<Failure> errors;
  // Written while the round after it ran: normally ready by now.
  auto got = gather(pc.written, errors, kCheckpointWrittenCall);
  std::optional<std::string> path;
  for (size_t i = 0; i < pc.members.size(); ++i) {
    if (got[i] && !got[i]->empty()) path = *got[i];
    if (!got[i])  // a worker without its file starts afresh on resume
      log("worker " + std::to_string(pc.members[i]) +
          " did not write its part of the checkpoint of round " + std::to_string(pc.round) + ": " +
          errors[i].message);
  }
  if (!path) {
    log("the checkpoint of round " + std::to_string(pc.round) +
        " was not written; should the job go back, it goes back to " + resume_point());
    return;
  }
  record_checkpoint(*path, pc.round);
}

// join_mid_round's admission of slot `s` into round c: the fragment boundary it joins at,
// agreed by every member; nothing (said with `why_not`) when the round has none left.
std::optional<int64_t> OuterAggregator::State::admit_mid_round(const StreamCalls& c, const Slot& s,
                                                               const std::string& why_not) {
  const int h = cfg.inner.steps;
  const int p = cfg.sync.fragments;
  const int64_t r = c.round;
  // Where: the first boundary past the member furthest on. A member that gets there before
  // the admission reaches it says no; then again at the next one, while the round has one.
  std::optional<int64_t> step;
  for (int attempt = 0; attempt < 4 && !step; ++attempt) {
    std::vector<Future<int64_t>> asked;
    for (int m : c.members) asked.push_back(worker(m).call(&InnerWorker::progress, r));
    std::vector<Failure> errors;
    std::vector<int64_t> progress;
    for (auto& got : gather(asked, errors, kAdmissionCall)) progress.push_back(got ? *got : -1);
    const auto at = mid_round_join_step(r, h, p, cfg.sync.overlap_steps, progress);
    if (!at) {
      log(why_not + "no fragment boundary left before the round's end");
      return std::nullopt;
    }
    AdmitRequest a;
    a.round = r;
    a.step = *at;
    a.name = s.name;
    a.endpoint = s.endpoints[0];
    std::vector<Future<bool>> votes;
    for (int m : c.members) votes.push_back(worker(m).call(&InnerWorker::admit, a));
    bool all = true;
    for (auto& v : gather(votes, errors, kAdmissionCall)) all = all && v && *v;
    a.phase = all ? AdmitRequest::commit : AdmitRequest::abort;
    std::vector<Future<bool>> acks;
    for (int m : c.members) acks.push_back(worker(m).call(&InnerWorker::admit, a));
    (void)gather(acks, errors, kAdmissionCall);
    if (all) step = at;
  }
  if (!step) log(why_not + "the members kept passing the boundaries it was offered");
  return step;
}

// sync.mode streaming: while round c's calls run, a slot that can join takes part from a
// fragment boundary of the round (design.md, "Joining mid-round"): its actor spawned, its
// state copied from a donor's snapshot taken between two of the donor's inner steps, its
// admission agreed by every member in two phases (each says yes only while it is before the
// boundary), then its own stream() call goes out and joins c. It gives up, and the slot joins
// at the next round boundary as before, when a step fails, when the round has no boundary left
// far enough ahead, or as soon as the round's calls have all ended. One joiner per round.
void OuterAggregator::State::join_mid_round(StreamCalls& c) {
  const int h = cfg.inner.steps;
  const int p = cfg.sync.fragments;
  if (cfg.sync.mode != dl::SyncMode::streaming || resuming || stop ||
      !mid_round_join_step(c.round, h, p, cfg.sync.overlap_steps, {c.round * h}))
    return;
  const int64_t r = c.round;
  auto round_over = [&] {
    for (auto& f : c.calls)
      if (!f.ready()) return false;
    return true;
  };
  // Waits for `f` while the round goes on; false once the round's calls have all ended.
  auto while_round = [&](const FutureBase& f) {
    std::vector<const FutureBase*> watched{&f};
    for (const auto& call : c.calls) watched.push_back(&call);
    size_t ended = 0;
    while (!f.ready()) {
      if (round_over() || stop) return false;
      // Until f or one more of the round's calls ends, or a stop.
      ended = loco::wait(watched, ended + 1, Millis::max(), wake.get_token()).size();
    }
    return true;
  };
  // A free slot, and a node to put its actor on: tried every half second while the round
  // runs (a node may arrive at any time).
  int i = -1;
  double t0 = 0;
  for (;;) {
    read_target();
    i = -1;
    for (int j = 0; j < target && i < 0; ++j) {
      if (size_t(j) >= slots.size()) slots.resize(size_t(j) + 1);
      Slot& s = slots[size_t(j)];
      if (!s.active && !s.late &&
          std::find(c.members.begin(), c.members.end(), j) == c.members.end())
        i = j;
    }
    if (i < 0) return;
    Slot& s = slots[size_t(i)];
    if (s.name.empty()) s.name = job_id + ".worker-" + std::to_string(i);
    t0 = now_s();
    if (spawn_slot(i)) break;
    (void)loco::wait(c.calls, c.calls.size(), kClusterPoll, wake.get_token());
    if (round_over() || stop) return;
  }
  Slot& s = slots[size_t(i)];
  const std::string why_not = "worker " + std::to_string(i) + " does not join round " +
                              std::to_string(r + 1) + " mid-round: ";
  try {
    auto eps = worker(i).call(&InnerWorker::endpoints);
    if (!while_round(eps)) return;
    s.endpoints = eps.get(kEndedCall);
    if (s.endpoints.size() != 1) return;
    std::vector<int> members = c.members;
    members.push_back(i);
    std::sort(members.begin(), members.end());
    const auto k = size_t(std::find(members.begin(), members.end(), i) - members.begin());
    s.shards = dl::round_robin_shards(cfg.data.shards, int(k), int(members.size()));
    const int donor = copy_sources(c.members, {i}).at(0);
    WorkerInit wi;
    wi.index = i;
    wi.shards = s.shards;
    wi.stream = (uint64_t(r) << 16) | uint64_t(i);
    wi.total_steps = total_steps;
    wi.round = r;
    wi.source = slots[size_t(donor)].name;
    wi.mid_round = true;
    auto init = worker(i).call(&InnerWorker::init, wi);
    if (!while_round(init)) return;
    const InitResult copied = init.get(kEndedCall);

    const std::optional<int64_t> step = admit_mid_round(c, s, why_not);
    if (!step) return;
    StreamRequest req;
    req.round = r;
    req.op_id = c.op_id;
    req.last = c.last;
    for (int m : c.members) {
      req.names.push_back(slots[size_t(m)].name);
      req.endpoints.push_back(slots[size_t(m)].endpoints);
    }
    req.names.push_back(s.name);
    req.endpoints.push_back(s.endpoints);
    req.rank = int(c.members.size());
    req.from_step = *step;
    req.source = wi.source;
    c.calls.push_back(worker(i).call(&InnerWorker::stream, req));
    c.members.push_back(i);
    s.active = true;
    s.waiting.clear();
    char line[320];
    std::snprintf(line, sizeof line,
                  "worker %d joined round %lld at inner step %lld (a fragment boundary) on %s: "
                  "%.1f MB snapshot of step %lld copied from %s in %.2f s; joined in %.2f s",
                  i, static_cast<long long>(r + 1), static_cast<long long>(*step),
                  worker(i).address().c_str(), double(copied.state_bytes) / 1e6,
                  static_cast<long long>(copied.snapshot_step), wi.source.c_str(),
                  copied.copy_seconds, now_s() - t0);
    log(line);
  } catch (const std::exception& e) {
    log(why_not + e.what());
  }
}

bool OuterAggregator::State::finish_stream(StreamCalls& c, double started,
                                           const std::function<void()>& stands, JobRecords& records,
                                           std::vector<MemberFigures>& figures, double& loss,
                                           double& inner_secs, uint64_t& theta_hash,
                                           std::vector<int>& finished) {
  const int64_t r = c.round;
  const std::vector<int>& members = c.members;
  join_mid_round(c);
  std::vector<Failure> errors;
  auto res = gather(c.calls, errors, kInnerPhase);
  const double seconds = now_s() - std::max(c.sent, started);
  std::vector<MemberOutcome> outcomes;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!res[i]) {
      outcomes.push_back(MemberOutcome{false, 0, errors[i].gone, {}});
      continue;
    }
    MemberOutcome o{true, res[i]->theta_hash, false, {}};
    for (const std::string& name : res[i]->group) {
      int slot = -1;
      for (int m : members)
        if (slots[size_t(m)].name == name) slot = m;
      o.group.push_back(slot);
    }
    std::sort(o.group.begin(), o.group.end());
    outcomes.push_back(std::move(o));
  }
  const OverlappedDecision d = after_overlapped_round(members, outcomes);
  // The next round was sent right behind this one: it began on the members as this one ended,
  // here, whether all of them agreed or the survivors of a lost member did.
  if (d.kind == OverlappedDecision::Kind::agreed || d.kind == OverlappedDecision::Kind::smaller)
    stands();
  AttemptRecord rec;
  rec.round = r + 1;
  rec.members = members;
  rec.seconds = seconds;
  for (size_t i = 0; i < members.size(); ++i) {
    rec.bytes.push_back(res[i] ? std::optional(res[i]->bytes_sent) : std::nullopt);
    if (!res[i]) rec.errors.push_back({members[i], errors[i].gone, errors[i].message});
  }
  records.attempt(rec);
  if (d.kind == OverlappedDecision::Kind::rewind) {
    stream_failure = "its members did not end it in one group";
    for (size_t i = 0; i < members.size(); ++i) {
      if (res[i]) continue;
      if (stream_failure.rfind("worker ", 0) != 0)
        stream_failure = "worker " + std::to_string(members[i]) + " " +
                         (errors[i].gone ? "was lost" : "failed") + ": " + errors[i].message;
      if (errors[i].gone)
        release(members[i], "lost in round " + std::to_string(r + 1) + ": " + errors[i].message);
      else
        log("worker " + std::to_string(members[i]) + " failed round " + std::to_string(r + 1) +
            ": " + errors[i].message);
    }
    return false;
  }
  // Where member (slot) m is in `members`, res and errors.
  auto index_of = [&](int m) {
    return size_t(std::find(members.begin(), members.end(), m) - members.begin());
  };
  if (d.kind == OverlappedDecision::Kind::diverged) {
    // Against the first member that finished (d.theta_hash): members[0] may be one lost.
    throw std::runtime_error("round " + std::to_string(r + 1) + ": worker " +
                             std::to_string(d.diverged_member) + " holds a different θ (hash " +
                             std::to_string(res[index_of(d.diverged_member)]->theta_hash) +
                             " vs " + std::to_string(d.theta_hash) + ")");
  }
  if (d.kind == OverlappedDecision::Kind::smaller)
    for (int m : d.lost) {
      const size_t i = index_of(m);
      release(m,
              "lost in round " + std::to_string(r + 1) +
                  "; the others finished its fragments in flight without it: " + errors[i].message);
    }
  loss = 0;
  inner_secs = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!res[i]) continue;
    const InnerResult& in = res[i]->inner;
    loss += in.mean_loss;
    inner_secs += in.seconds;
    int64_t tokens = 0;
    for (const StepFigures& f : in.per_step) tokens += f.tokens;
    figures.push_back({members[i], in.steps, tokens, in.seconds, cpu_seconds_of(in.per_step)});
    round_steps.push_back(in.per_step);
  }
  loss /= double(d.finished.size());
  theta_hash = d.theta_hash;
  finished = d.finished;
  return true;
}

OuterAggregator::OuterAggregator(std::string job_id, std::string spec)
    : s_((require_own_job("diloco.OuterAggregator", job_id),
          std::make_shared<State>(std::move(job_id), spec))) {
  s_->cfg.validate();
  if (s_->cfg.sync.mode != dl::SyncMode::blocking &&
      (s_->cfg.ranks_per_worker(false) > 1 || s_->cfg.workers.gpus > 1))
    throw dl::ConfigError(
        "sync.mode: streaming and eager run one local rank per worker on a cluster for now "
        "(workers.local_ranks and workers.gpus must be 1)");
  // A corpus outside the node's data root, or missing, fails the submission, not round 1.
  dl::TokenStore::open(resolve_job_data(s_->roots, s_->cfg.data), s_->cfg.vocab_size());
  // So does an `init: hf:DIR` folder outside the data root, missing, or of another model.
  if (!s_->cfg.init.empty())
    dl::check_hf_folder(resolve_data_path(s_->roots, dl::hf_init_dir(s_->cfg.init), "init"),
                        s_->cfg.model, s_->cfg.vocab_size());
  s_->check_memory();
  auto s = s_;
  s_->thread = std::thread([s] {
    try {
      s->run();
    } catch (const std::exception& e) {
      if (!s->stop) {
        log_error(s->job_id + ": " + e.what());
        try {
          s->rt.job_finished(s->job_id, JobState::failed, e.what());
        } catch (const std::exception& e2) {
          log_error(s->job_id + ": could not report the failure: " + e2.what());
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(s->done_mu);
      s->done = true;
    }
    s->done_cv.notify_all();
  });
}

// Killed (job cancelled or finished, or its node leaving): the loop stops at its
// next step. It may be waiting on a call (a reduce, a call to the head that is
// itself waiting on this node), so the node is not held up past a short grace:
// the thread is let go and ends on its own; it holds its State.
OuterAggregator::~OuterAggregator() {
  s_->stop = true;
  s_->wake.request_stop();
  {
    std::unique_lock<std::mutex> lock(s_->done_mu);
    s_->done_cv.wait_for(lock, kStopGrace, [&] { return s_->done.load(); });
  }
  if (s_->done)
    s_->thread.join();
  else
    s_->thread.detach();
}

int64_t OuterAggregator::round() const { return s_->round; }
std::string OuterAggregator::folder() const { return s_->folder; }

LOCO_REGISTER(OuterAggregator, loco::ActorClass<OuterAggregator>("diloco.OuterAggregator")
                                   .constructor<std::string, std::string>()
                                   .method("round", &OuterAggregator::round)
                                   .method("folder", &OuterAggregator::folder));

}  // namespace loco::actors
