#pragma once
// The OuterAggregator's state: the job, its worker slots and its loop over rounds, private to
// the aggregator's files (docs/design.md, "The aggregator's loop"):
//   outer_aggregator.cpp        the actor, the job's start, reports and checkpoints, and the
//                               loop that applies each round's outcome (run)
//   aggregator_membership.cpp   slots joining (at a round boundary or mid-round) and leaving,
//                               shards, and reconcile between rounds
//   aggregator_blocking.cpp     sync.mode blocking: the inner phase and the all-reduce attempts
//   aggregator_streaming.cpp    sync.mode streaming or eager: a round's stream() calls, the next
//                               round sent ahead, and the round's end (finish_stream)
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "actors/inner_worker.hpp"
#include "actors/job_records.hpp"
#include "actors/outer_aggregator.hpp"
#include "actors/round_decisions.hpp"
#include "actors/timeouts.hpp"
#include "actors/worker_calls.hpp"
#include "diloco/job/config.hpp"
#include "diloco/round/codec_plan.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"

namespace loco::actors {

// Seconds on the runtime's one steady clock (runtime/core/util.hpp).
inline double now_s() { return static_cast<double>(loco::now_ms()) / 1000.0; }

// "1, 2, 3".
std::string join_ints(const std::vector<int>& v);

// Next to checkpoint "X.pt", each worker's inner state: "X.worker-I.pt".
std::string inner_state_path(const std::string& checkpoint, int slot);

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
  // The guard removed it from the job (left out workers.guard.evict_after rounds in a row):
  // why; it never comes back. Empty: it may.
  std::string removed;
  int left_out_streak = 0;  // rounds in a row the guard left it out of
  // Where its actor was when it last joined (ActorHandle::address; "": never joined), and
  // whether it left the members since: a join that is not the same actor reloading the state
  // on the same node (a rewind) goes on the dashboard's timeline (kJoinRecord).
  std::string placed;
  bool left = false;
  // Out of every operation below this id (0: none): a stream() call of it failed as gone while
  // its actor may still run the rounds sent to it (a restarting head lost the answer), so the
  // others were told to finish those rounds without it and it to leave them (drop_from_sent).
  uint64_t dropped_below_op = 0;

  // It may be brought into the job: not a member, not busy with a late round's steps, and not
  // removed by the guard.
  bool may_join() const { return !active && !late && removed.empty(); }
};

// One round's stream() calls (sync.mode streaming or eager), sent to its members.
struct StreamCalls {
  int64_t round = 0;
  uint64_t op_id = 0;  // of its first fragment (StreamRequest::op_id)
  bool last = false;
  std::vector<int> members;
  std::string checkpoint;  // the checkpoint of the round's end asked of its members ("": none)
  // θ's evaluation at the round's end asked of its members (StreamRequest::eval_begin): each
  // part's `member` is a slot. None: not asked.
  std::vector<EvalPart> eval;
  std::vector<Future<StreamResult>> calls;
  std::vector<bool> seen;  // calls whose end tell_gone has looked at
  // The first member that answered with an error (alive, so the round goes back: round_
  // decisions' after_overlapped_round), as tell_gone saw it; and whether the members still
  // running were told to give the round up (give_up_sent).
  std::optional<std::string> failed;
  bool given_up = false;
  double sent = 0;  // now_s() when they went out
};

// non_finite_inner (round_decisions.hpp) of a member's inner steps as it reported them.
std::string non_finite_of(int member, const InnerResult& r, int of_steps);

struct OuterAggregator::State {
  // The job file read, its folder and checkpoint.resume resolved under the node's roots
  // (refused naming the field); the actor's constructor validates the rest.
  State(std::string id, const std::string& spec);

  // ---- The job, and the loop's thread -----------------------------------------------------
  std::string job_id;
  diloco::JobConfig cfg;
  Runtime rt;
  PathRoots roots;  // its node's: the job's folder and the checkpoints it resumes from are in them
  std::string folder;
  std::atomic<int64_t> round{0};
  std::atomic<bool> stop{false};
  std::stop_source wake;  // requested with `stop`: ends the loop's waits on calls (loco::wait)
  std::atomic<bool> done{false};
  std::mutex done_mu;
  std::condition_variable done_cv;  // told when `done` is set
  std::thread thread;

  // ---- What the loop keeps across rounds ---------------------------------------------------
  std::vector<Slot> slots;
  int64_t total_steps = 0;
  int total_rounds = 0;           // cfg.total_rounds()
  int64_t submitted_unix_ms = 0;  // the job's (JobInfo), for its seconds
  int target = 0;                 // workers wanted: workers.count or `loco scale`
  std::string resume_file;        // checkpoint.resume under the roots ("": none)
  std::string resume_from;        // checkpoint the job restarts from, if any
  int64_t resume_round = 0;
  // The job (re)starts from resume_from, and no round has completed since: every slot that
  // comes back reads the checkpoint and its own inner state, even after others did.
  bool resuming = false;
  // A joiner's copy from a live member failed in the last acquire(): reconcile() then asks a
  // live member whether it can hand out the outer state at all (held_state_broken).
  bool copy_failed = false;
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
  // Each member's seconds per inner step in its last round (inner.budget: time: the
  // evaluation is shared by speed).
  std::map<int, double> step_seconds_of;
  // step_seconds_of for each of `members`, in order; 0 where a member's is not known.
  std::vector<double> step_seconds_of_members(const std::vector<int>& members) const {
    std::vector<double> out;
    for (int m : members) {
      const auto it = step_seconds_of.find(m);
      out.push_back(it == step_seconds_of.end() ? 0.0 : it->second);
    }
    return out;
  }
  // A job that ends at its tokens (cfg.ends_at_tokens()): the tokens its rounds averaged, after
  // each completed round from the one it (re)started at (a rewind drops the rounds past its
  // checkpoint), and its members' rate in the last round, all together.
  std::map<int64_t, int64_t> tokens_after;
  int64_t tokens_done() const { return tokens_after.empty() ? 0 : tokens_after.rbegin()->second; }
  double tokens_per_second = 0;
  int64_t resume_tokens = 0;  // CheckpointRecord::tokens of resume_from
  int64_t last_by_tokens = -1;  // the round token_round sized as the last (counted from 0)
  // After round r (counted from 1) completed with group `group`: counts its tokens, and sets
  // total_rounds to r when the job has them, else to the estimate.
  void count_tokens(int64_t r, const std::vector<int>& group);
  // time_limit_minutes: the rounds the job ends at once the limit passed (none before).
  int time_cap = std::numeric_limits<int>::max();
  // Called as round `next` (counted from 0) is about to be sent: past the time limit, it is
  // the job's last (total_rounds and time_cap to next + 1), said in the log once.
  void end_by_time(int64_t next);
  // Rounds that failed and are done again, counted until they complete (round_decisions.hpp).
  RoundRedos redos;
  std::optional<JobRecords> records;
  // This round's members' figures and who missed its deadline, for the round's report.
  std::vector<MemberFigures> round_members;
  std::vector<int> round_late;
  // Whom the guard left out of this round's averages, and why (metrics.jsonl "left_out").
  std::vector<loco::diloco::schema::LeftOutLine> round_left_out;
  // The job's events read so far: the head's cluster records after it go in the next round's
  // metrics (cluster_notes).
  std::string events_cursor;
  uint64_t left_out_total = 0;  // over the job: rounds × members left out (/metrics)
  double round_guard_seconds = -1;  // a member's summary exchanges this round; < 0: none
  // compression auto (diloco/round/codec_plan.hpp): the planner, what the last round measured
  // of the members' links, and the codec each round was sent with (a round's retries and its
  // report use its decision; streaming decides a round when it sends it, perhaps ahead).
  std::optional<loco::diloco::CodecPlanner> planner;
  std::optional<loco::diloco::LinkSample> link;
  std::map<int64_t, loco::diloco::CodecDecision> decisions;
  std::string resume_codec;  // the codec of the checkpoint's round (CheckpointRecord::codec)
  // Round r's codec as requests carry it ("": the job's own compression). Streaming and eager:
  // where the members' planners stand until they have measured (the codec the last operation
  // agreed on), each fragment's operation agreeing on its own (fragment_codec_notes).
  std::string plan_codec(int64_t r, int members);
  // Streaming and eager with compression auto: the codecs the members' operations agreed on, as
  // their results report them (each member's, an operation once): each change said in the log
  // and the timeline, each one into the round's line of metrics.jsonl.
  void fragment_codec_notes(const std::vector<const StreamResult*>& results);
  std::string fragment_codec;  // the codec the last operation reported agreed on
  // The operation each (round, fragment) was last reported of, for the newest rounds.
  std::map<std::pair<int64_t, int>, uint64_t> fragment_codec_ops;
  std::vector<loco::diloco::schema::FragmentCodecLine> round_fragment_codecs;
  // The round's exchanges as the members measured them (bytes and seconds each, 0 bytes: none):
  // the fastest member's (the others' include waits for it), with the round's median seconds
  // per step, for the next decision.
  // `from` says where ("round 3", "round 3's first fragment"; decisions name it).
  void note_link(const std::vector<std::pair<uint64_t, double>>& exchanges,
                 std::vector<double> step_secs, std::string from);
  std::string link_from;  // where `link` was measured
  // Seconds of every all-reduce attempt of this aggregator's life (the dashboard's network time).
  double allreduce_total = 0;
  // sync.mode streaming or eager: the next round's calls, sent right behind this round's (they
  // wait in the members' mailboxes), and when that round began on the workers (this round's
  // results all in: an estimate, as each member begins it when it ends this one).
  std::optional<StreamCalls> ahead;
  double ahead_since = 0;
  Pipeline pipeline_said = Pipeline::last_round;
  // A checkpoint asked of a streaming round's members: its files are written under the next
  // round's inner steps, and it is recorded (the job's resume point) once they are, after the
  // next round's results are in (settle_checkpoint); a job that goes back forgets it.
  struct PendingCheckpoint {
    int64_t round = 0;  // rounds done: the checkpoint's name and record
    std::vector<int> members;
    std::vector<Future<std::string>> written;  // InnerWorker::checkpoint_written
  };
  std::optional<PendingCheckpoint> pending_checkpoint;
  int64_t windows = 0;  // validation windows
  double last_val = 0;
  // Whole-job utilization: time in inner steps over the time the members were
  // in the job, all rounds, checkpoints, evaluations and joins included.
  double inner_total = 0, member_seconds = 0;
  int64_t steps_since_eval = 0;

  // ---- The loop (outer_aggregator.cpp) ------------------------------------------------------
  // What one pass of a round came to, blocking or streaming, for run() to apply: the round
  // completed (its figures); or it failed and is done again (`redo`: by those who can,
  // `rewind`: from the last checkpoint), `why` and `fix` as round_failed takes them; or the
  // members of one group hold different θ (`diverged`, a bug: the job stops, saying `why`).
  struct RoundOutcome {
    enum class Kind { completed, redo, rewind, diverged } kind = Kind::completed;
    std::string why, fix;
    std::vector<int> members;  // the round's members (streaming: those that finished it)
    std::vector<int> ready;    // those that finished their inner steps
    std::vector<int> group;    // those that agreed on θ
    double loss = 0, inner_secs = 0;
    double failed_secs = 0;  // in the pass's failed all-reduce attempts
    double results_in = 0;   // streaming: when the round's results were all in
    uint64_t theta_hash = 0;
    std::vector<int> asked_checkpoint;  // streaming: the members asked for a checkpoint
    std::vector<EvalPart> eval;         // streaming: θ's evaluation asked of them (StreamCalls)
  };
  static RoundOutcome failure(RoundOutcome::Kind k, std::string why, std::string fix = "");
  void run();
  // The job's start, or its restart from a checkpoint; false when it had ended already.
  bool start();
  // Before the first round: the members, the validation windows, round 0's report.
  void prepare(int64_t r);
  // Round r failed for `why`; `fix`: what in the job file would help. It is done again, or,
  // past kMaxRoundRedos redos, the job fails saying why (thrown).
  void round_failed(int64_t r, const std::string& why, const std::string& fix = "");
  // Back to the last checkpoint (or the start); returns the round the job goes on from.
  int64_t go_back();
  // Round r - 1 completed (r rounds done): evaluation, report, checkpoint.
  void end_round(int64_t r, const RoundOutcome& o, double t_round);
  void checkpoint_round(int64_t r, const std::vector<int>& members,
                        const std::vector<int>& asked_checkpoint);
  // After the last round: final.pt, the workers stopped, the job's end reported.
  void finish(int64_t r);
  std::optional<double> evaluate(int64_t windows);
  // Asks the active members in turn until one answers; a member that fails leaves.
  template <class T>
  std::optional<T> ask_any(const std::string& what,
                           const std::function<Future<T>(ActorHandle<InnerWorker>&)>& call);

  // ---- Reports, the log and checkpoint records (outer_aggregator.cpp) -----------------------
  // Reports go to the head, which keeps them in Redis. While it cannot (Redis
  // restarting, say), they wait here in order, and the job goes on.
  void publish(std::function<void()> f);
  bool flush();
  // Waits `d`, or less once the aggregator is stopped: between two looks at the cluster.
  void pause(Millis d);
  void log(const std::string& line);
  // Slot i joined round `r` (1-based) after the job's start, as `line` says: the log, and unless
  // it is a rewind reloading the same actor on the same node, the dashboard's timeline (a
  // kJoinRecord).
  void log_join(int i, int64_t r, const std::string& line);
  // A worker left the job in the current round, as `line` says: the log and the dashboard's
  // timeline (a kLeftRecord).
  void log_left(const std::string& line);
  // A [text, round] record of `kind` (kCodecRecord, kJoinRecord, kLeftRecord) into the job's log.
  void record_line(const char* kind, const std::string& line, int64_t r);
  double job_time() const;
  std::vector<loco::diloco::schema::ClusterLine> cluster_notes();
  void report(int64_t r, double loss, std::optional<double> val, double tok_s, double util,
              int members, double round_time, uint64_t hash);
  // The round's per-step figures into the job's log (a "steps" record: msgpack of
  // std::vector<JobProgress>, step = the job's inner step), for the dashboard. At most 500
  // steps a round (evenly spaced), so that the record stays well under the head's 64 KiB.
  void publish_steps(int64_t r, const std::vector<StepFigures>& steps);
  // The checkpoint file of the state after `r` rounds, in the job's folder.
  std::string checkpoint_file(int64_t r) const;
  // Where the job goes back to, for the log: "its start" or "its checkpoint of round R".
  std::string resume_point() const;
  // A checkpoint of round `r` written: the job's resume point from now on, a line for people
  // and the record a restarted aggregator reads; older ones beyond checkpoint.keep go.
  void record_checkpoint(const std::string& path, int64_t r);
  void require_resume_file() const;
  void find_checkpoint();
  // A departure record (kLeftRecord) that says the guard removed a slot (kRemovedLine, which
  // evict_left_out writes): that slot stays removed after a restart (Slot::removed), and is not
  // filled again. Anything else, or a malformed record, is ignored.
  void note_removed(const std::string& data);
  // "worker N" + kRemovedLine + why: the line, and departure record, of a slot the guard removed.
  static constexpr const char* kRemovedLine = " removed from the job: ";
  void take_resume(int rounds);
  void prune_checkpoints();
  // Whether the checkpoint of round `r` (or `what`, "final.pt") may be written: the job's
  // folder stays within checkpoint.quota_gib and the file system keeps 1 GiB free, by the
  // newest checkpoint's size (before the first: from the model's size). When not, the job's
  // log says why and the job goes on without it.
  bool room_for_checkpoint(int64_t r, const std::string& what = "");

  // ---- Joins and leaves (aggregator_membership.cpp) ----------------------------------------
  std::vector<int> active() const;  // the active slots, in order
  // Slot i's actor. A slot that left the job for good (stop_slot: scaled down, or removed by
  // the guard) has none: asking for it is a bug, said here rather than a freed handle used.
  ActorHandle<InnerWorker>& worker(int i) {
    if (!slots[size_t(i)].handle)
      throw std::logic_error("worker " + std::to_string(i) + " has no actor: it left the job");
    return *slots[size_t(i)].handle;
  }
  void read_target();
  void note_waiting(int i, const std::string& why);
  bool spawn_slot(int i);
  std::vector<int> acquire(const std::vector<int>& want, int64_t r);
  // Why the live members cannot hand out round r's outer state (a fragment's all-reduce failed
  // in flight, so none holds a consistent one): "" when one can, or when it is gone.
  std::string held_state_broken(int64_t r);
  // sync.mode streaming: a slot that can join does so while round c runs, at a fragment
  // boundary, its stream() call added to c (see the definition).
  void join_mid_round(StreamCalls& c);
  // The round's calls that have ended. Each new one that failed as gone (its actor died, or a
  // restarting head lost its answer) is dropped from the rounds sent (drop_from_sent). The
  // first that answered with an error is kept (StreamCalls::failed), unless that member was
  // dropped from the round.
  size_t tell_gone(StreamCalls& c);
  // Member c.members[i], whose call failed as gone, is out of every round sent so far: this
  // aggregator has no answer of it for them. The others still running them are told to finish
  // them without it (InnerWorker::member_gone, for the operations below the next id), and it,
  // should it still run, to leave them as lost (InnerWorker::give_up with as_lost); it may
  // join a later round as before. Without it a worker whose answer the head lost when it
  // restarted went on in the round sent ahead, which the others finished as a group that
  // disagreed about it, and the job went back to its start (the 30-minute soak, 2026-11-29).
  void drop_from_sent(StreamCalls& c, size_t i, const std::string& why);
  // The members whose calls of round c, or of the round sent ahead behind it, have not ended,
  // in slot order, each once, without `except`: those a decision about those rounds must reach.
  std::vector<int> still_running(const StreamCalls& c, int except = -1) const;
  // Tells slot w, dropped from the rounds sent (drop_from_sent), to leave them as lost: best
  // effort, again as it is released (its actor may have been out of reach the first time).
  void leave_dropped(int w);
  // Whether member m of round c was dropped from it (drop_from_sent).
  bool dropped_in(const StreamCalls& c, int m) const {
    return slots[size_t(m)].dropped_below_op > c.op_id;
  }
  // Until the round's calls have all ended (or kInnerPhase passes), telling as tell_gone does.
  void await_stream(StreamCalls& c);
  // A streaming round failed, or will (a member answered with an error): the job goes back.
  // The members still running it, or the round sent ahead behind it, are told to give them up
  // (InnerWorker::give_up), once, and the round sent ahead is dropped. Without it they went on
  // with the round, then the one sent ahead, and each operation waited out the entry window
  // of the member that had failed, before the aggregator could reach them (minutes).
  void give_up_sent(StreamCalls& failed, const std::string& why);
  std::optional<int64_t> admit_mid_round(const StreamCalls& c, const Slot& s,
                                         const std::string& why_not);
  Resources worker_resources();
  // At submission: a worker must fit in the largest live node (its `memory` resource, bytes)
  // and, on CUDA, its GPU (`gpu_memory`, bytes per GPU), or the job is refused naming the
  // field (diloco::check_fits). Nodes that advertise neither: not checked, said in the log.
  void check_memory();
  void deal_shards();
  void release(int i, const std::string& why);
  void stop_slot(int i);
  // The guard's notes of round r (as every member reports them: the first's), recorded by slot.
  void note_left_out(int64_t r, const std::vector<LeftOutNote>& notes, double guard_seconds);
  // After round r completed: each member's streak of rounds left out; those at
  // guard.evict_after are removed from the job, with a message that names them, the round and
  // the rule.
  void evict_left_out(int64_t r, const std::vector<int>& members);
  // False when the job must go back to its last checkpoint first (must_rewind).
  [[nodiscard]] bool reconcile(int64_t r);

  // ---- sync.mode blocking (aggregator_blocking.cpp) ----------------------------------------
  RoundOutcome blocking_round(int64_t r, const std::vector<int>& members);
  RoundOutcome inner_phase(int64_t r, const std::vector<int>& members);
  void all_reduce(int64_t r, RoundOutcome& o);
  // The inner phase of a round with a deadline: waits until every member reported or the
  // grace window after the quorum passed (inner_phase_closed); `late[i]`: member i had not.
  std::vector<std::optional<InnerResult>> gather_inner(std::vector<Future<InnerResult>>& fs,
                                                       std::vector<Failure>& errors,
                                                       std::vector<bool>& late, double& window);

  // ---- sync.mode streaming or eager (aggregator_streaming.cpp) -----------------------------
  RoundOutcome stream_round(int64_t r, const std::vector<int>& members, double t_round,
                            bool sent_ahead);
  // Streaming: whether round r + 1 goes out right behind round r (said when it changes).
  Pipeline send_ahead(int64_t r, const std::vector<int>& members);
  // Round r as one stream() call per member. `checkpoint`: the members write a checkpoint of
  // the round's end (StreamRequest::checkpoint), the first member the outer state, each its
  // inner state.
  StreamCalls send_stream(int64_t r, bool last, bool checkpoint, bool evaluate,
                          const std::vector<int>& members);
  // θ's validation loss from the parts its members evaluated in the background as the round
  // ended (StreamCalls::eval); nothing when a part is missing (its member lost or failed).
  std::optional<double> evaluation_of(int64_t completed, const std::vector<EvalPart>& parts);
  void settle_checkpoint();
  // Waits for round c's results (c's members, and a joiner join_mid_round adds; the round's
  // start on the workers, for the attempt's seconds, was `started`), records the attempt and
  // carries out after_overlapped_round. Completed when the round stands (its members agree,
  // or the survivors of a lost member finished its fragments in flight without it): the
  // members that finished it, their figures (also into round_members and round_steps), and
  // `results_in`, the round's end (from which a round sent ahead counts). A rewind when a
  // member failed or was lost otherwise: the others have landed fragments it never saw, so
  // the round cannot be re-formed as a blocking one is. Diverged when their θ differ.
  RoundOutcome finish_stream(StreamCalls& c, double started);
};

}  // namespace loco::actors
