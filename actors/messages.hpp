#pragma once
// What the OuterAggregator and the InnerWorkers of a job say to each other.
// No LibTorch: msgpack structs only.
#include <cstdint>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "diloco/data/bounded_file.hpp"
#include "diloco/job/job_schema.hpp"
#include "runtime/core/errors.hpp"
#include "runtime/core/runtime.hpp"

namespace loco::actors {

// Aggregator -> worker, once before its first round (and again when it rejoins).
// Where the outer state (θ, momentum) comes from: `source`, a live worker of the
// job that it copies from; else `checkpoint`, a file; else θ from the seed.
struct WorkerInit {
  int index = 0;            // the worker's slot in the job
  std::vector<int> shards;  // data shards it reads
  uint64_t stream = 0;      // its data stream (the simulator uses the index)
  int64_t total_steps = 0;  // length of the inner schedule
  int64_t round = 0;        // rounds already done by the job
  std::string source;       // actor name of a live worker
  std::string checkpoint;   // path of a checkpoint written by save_checkpoint
  // This slot's inner state as of the last checkpoint (save_inner_state), when there
  // is one: with `checkpoint` the worker continues exactly where the slot was. With
  // `source` it is not used: a worker that joins a live job copies the source's
  // AdamW moments, which are current, and reads a new data stream.
  std::string inner_state;
  // sync.mode streaming, a join mid-round: copy `source`'s snapshot taken at its next inner
  // step of round `round` (InnerWorker::offer_state), not its state at the round's start.
  bool mid_round = false;
  MSGPACK_DEFINE(index, shards, stream, total_steps, round, source, checkpoint, inner_state,
                 mid_round)
};

// What init() did, for the aggregator's log and the time-to-join figure.
struct InitResult {
  int64_t parameters = 0;
  uint64_t theta_hash = 0;
  uint64_t state_bytes =
      0;  // outer state and moments copied from `source`, or the `checkpoint` read
  double copy_seconds = 0;
  std::string device;  // where it trains, and why: "cuda:1 (device: cuda)", "cpu (device: cpu)"
  int64_t snapshot_step = -1;  // mid_round: the inner step count the copied snapshot is of
  // inner.budget: time: the seconds of one inner step's passes, measured at init
  // (InnerTrainer::measure_step_seconds), which size the first round; 0: not measured.
  double step_seconds = 0;
  MSGPACK_DEFINE(parameters, theta_hash, state_bytes, copy_seconds, device, snapshot_step,
                 step_seconds)
};

// sync.mode streaming, a join mid-round (InnerWorker::offer_state): the donor's snapshot,
// taken between two of its inner steps of `round`, after `step` inner steps of the job.
struct JoinOffer {
  int64_t round = 0;
  int64_t step = 0;
  int64_t bytes = 0;  // of the serialized snapshot (snapshot_part)
  MSGPACK_DEFINE(round, step, bytes)
};

// The fragments a donor landed after its snapshot, up to a step (InnerWorker::landed): their
// averages, fetched one by one with landed_mean, let a joiner bring the snapshot up to date.
struct LandedList {
  std::vector<int> fragments;  // in the order they landed
  std::vector<int64_t> lands;  // the inner step count each landed at
  bool complete = false;       // the donor has reached the step asked for: nothing more comes
  MSGPACK_DEFINE(fragments, lands, complete)
};

// Aggregator -> each member of a streaming round: admit `name` into the round's group from
// the fragment boundary `step` on (a two-phase decision: prepare, then commit or abort).
struct AdmitRequest {
  enum Phase : int { prepare = 0, commit = 1, abort = 2 };
  int phase = prepare;
  int64_t round = 0;
  int64_t step = 0;  // the inner step count whose synchronization it takes part in first
  std::string name;
  std::string endpoint;
  MSGPACK_DEFINE(phase, round, step, name, endpoint)
};

// Aggregator -> the other members of a streaming round: a member's call failed with
// ActorDiedError (its actor died, or the head that forwarded the call restarted and its answer
// is lost). Its endpoints (one per local rank, as InnerWorker::endpoints gave them), why, and
// the operations it is gone from: those below `below_op` (the rounds sent so far; 0: all).
struct MemberGone {
  std::vector<std::string> endpoints;
  std::string reason;
  uint64_t below_op = 0;
  MSGPACK_DEFINE(endpoints, reason, below_op)
};

// Aggregator -> the members of a streaming job it sends back to a checkpoint while they still
// run rounds it had sent them (one sent ahead, or one whose calls outlived the round's wait):
// every operation of those rounds, which are all below `below_op`, is given up, and why.
// `as_lost`: only this member leaves them (its call's answer was lost, so the aggregator no
// longer counts it in them); the others are told it is lost and finish them without it.
struct RoundsGivenUp {
  uint64_t below_op = 0;
  std::string reason;
  bool as_lost = false;
  MSGPACK_DEFINE(below_op, reason, as_lost)
};

// One inner step of a worker, as it went: for metrics.jsonl's "steps" and the dashboard.
struct StepFigures {
  double loss = 0;       // the step's training loss (mean over the worker's ranks)
  double lr = 0;         // the learning rate it stepped with
  double grad_norm = 0;  // of the worker's gradient, before clipping
  double seconds = 0;    // wall time of the step
  int64_t tokens = 0;    // processed by the step (all the worker's ranks)
  // Model FLOPs of the step (diloco::training_flops_per_token × tokens), and their share of
  // the peak of the worker's devices (model FLOPs utilization; 0: the peak is not known).
  double flops = 0;
  double mfu = 0;
  int64_t memory_bytes = 0;  // the most device memory allocated during the step (GPU; 0 on CPU)
  // CPU time the worker's process used during the step, all its threads. With one torch thread
  // and nothing else running in it, `seconds` minus this is the time the step waited: for a
  // core on a shared machine, or on something else.
  double cpu_seconds = 0;
  // Of which the thread that ran the step: with one torch thread, the step's own compute;
  // cpu_seconds minus this is what the process's other threads used meanwhile (the collective's
  // operation and ZeroMQ's I/O threads while a streaming round's fragments are on the wire).
  double step_cpu_seconds = 0;
  // The physical devices the step ran on (their CUDA UUIDs), so that the job's MFU counts a
  // GPU that several workers share (workers.share_gpu) once; "" on a CPU: the worker's own.
  std::string device;
  MSGPACK_DEFINE(loss, lr, grad_norm, seconds, tokens, flops, mfu, memory_bytes, cpu_seconds,
                 step_cpu_seconds, device)
};

struct InnerResult {
  int64_t round = 0;
  int steps = 0;
  double mean_loss = 0;
  double seconds = 0;                 // spent in inner steps
  int64_t tokens = 0;                 // processed in those steps (per worker, all its ranks)
  std::vector<StepFigures> per_step;  // one per step, in order (the lead rank's view)
  MSGPACK_DEFINE(round, steps, mean_loss, seconds, tokens, per_step)
};

// Aggregator -> each member of a round's group.
struct ReduceRequest {
  int64_t round = 0;
  std::vector<std::string> names;  // members, in rank order
  // Their collective endpoints, one per local rank (InnerWorker::endpoints): every
  // member has as many, the job's ranks per worker.
  std::vector<std::vector<std::string>> endpoints;
  int rank = 0;
  // The collective's operation id: strictly increasing over the whole job, across
  // re-formed groups, redone rounds and restarted aggregators (microseconds since
  // the epoch), so that no member ever mixes in data of another attempt.
  uint64_t op_id = 0;
  // Tokens each member processed this round, in rank order (inner.budget: time): the mean
  // is weighted by them. Empty, or all equal: the plain mean.
  std::vector<int64_t> tokens;
  // The codec of the round's average (diloco/round/codec_plan.hpp: "fp32", "int8", "topk:64");
  // "": the job's compression. compression auto changes it by rounds; a retry keeps it.
  std::string codec;
  MSGPACK_DEFINE(round, names, endpoints, rank, op_id, tokens, codec)
};

// A member the guard left out of an average (diloco/round/guard.hpp): every member of the operation
// reaches the same verdicts and reports them.
struct LeftOutNote {
  std::string member;  // its name in the group
  int fragment = 0;    // blocking: 0
  std::string rule;
  std::string why;
  MSGPACK_DEFINE(member, fragment, rule, why)
};

struct ReduceResult {
  uint64_t theta_hash = 0;
  uint64_t bytes_sent = 0;
  double seconds = 0;
  std::vector<LeftOutNote> left_out;  // by the guard, in this attempt
  double guard_seconds = 0;           // in the guard's summary exchange
  MSGPACK_DEFINE(theta_hash, bytes_sent, seconds, left_out, guard_seconds)
};

// Aggregator -> each member, once per round in sync.mode streaming. The worker runs its H
// inner steps and synchronizes its fragments with this group as it goes, each fragment's
// all-reduce on a thread of its own while the inner steps go on: no call to the aggregator on
// the critical path. Fragment f of the round uses operation id op_id + f.
struct StreamRequest {
  int64_t round = 0;
  std::vector<std::string> names;                   // members, in rank order
  std::vector<std::vector<std::string>> endpoints;  // their collective endpoints
  int rank = 0;
  uint64_t op_id = 0;
  bool last = false;  // the job's last round: every fragment lands before it returns
  // A worker that joins mid-round (its init copied `source`'s snapshot): it takes part from
  // inner step `from_step` on, a fragment boundary, after bringing the snapshot up to date with
  // the fragments `source` landed since (InnerWorker::landed). Its first fragment's Δ is zero
  // and counts with weight zero. -1: from the round's start, as every member does.
  int64_t from_step = -1;
  std::string source;
  // A checkpoint of the round's end, written under the next round's inner steps
  // (docs/decisions/0035-checkpoints-off-the-critical-path.md): `checkpoint`, the file of the
  // outer state (one member is asked), and `inner_state`, this member's inner state beside it;
  // "" for none. The member copies its state as the round ends and writes it on a thread of its
  // own once the fragments then in flight have landed; InnerWorker::checkpoint_written says when
  // it is on disk.
  std::string checkpoint;
  std::string inner_state;
  // θ's validation loss at the round's end, off the critical path: the member copies θ as the
  // round ends and evaluates validation windows [eval_begin, eval_end) of the copy on a thread
  // of its own, under the next round's inner steps; InnerWorker::evaluation(round + 1) gives
  // the loss. eval_end <= eval_begin: none.
  int64_t eval_begin = 0;
  int64_t eval_end = 0;
  // The codec of the averages of the fragments that synchronize in this round (ReduceRequest's).
  // compression auto: where the members' planners stand until they have measured; each
  // fragment's operation agrees on its own (StreamResult::codecs).
  std::string codec;
  MSGPACK_DEFINE(round, names, endpoints, rank, op_id, last, from_step, source, checkpoint,
                 inner_state, eval_begin, eval_end, codec)
};

// sync.mode streaming and eager with compression auto: the codec a fragment's operation ran,
// as its members agreed on it when it began (diloco/round/codec_plan.hpp: agree_codec).
struct FragmentCodecNote {
  int64_t round = 0;  // the round it synchronized in (0-based)
  int fragment = 0;
  uint64_t op = 0;  // its operation id (a round redone runs its fragments under higher ones)
  std::string codec;
  std::string reason;  // the proposer's reading: "2.1 MB at 4.8 Mbit/s takes 0.4 s, ..."
  MSGPACK_DEFINE(round, fragment, op, codec, reason)
};

struct StreamResult {
  InnerResult inner;        // its seconds: in inner steps only
  uint64_t theta_hash = 0;  // of θ_global once the round's landings are applied
  uint64_t bytes_sent = 0;  // by the fragments' all-reduces that ended in this round
  double wait_seconds = 0;  // inner steps held up waiting for a fragment's average to land
  double seconds = 0;       // the whole call
  // The members its fragments ended the round with: the request's, less any lost mid-round
  // (the survivors finished those fragments without them).
  std::vector<std::string> group;
  std::vector<LeftOutNote> left_out;  // by the guard, in the fragments that ended in this round
  double guard_seconds = 0;           // in those fragments' summary exchanges
  // Seconds of the fragments' exchanges that ended during the call, each from its start on the
  // communicator to its mean: with bytes_sent, what the link gave (compression auto).
  double exchange_seconds = 0;
  // compression auto: the codecs of the fragments' operations agreed since the call before.
  std::vector<FragmentCodecNote> codecs;
  MSGPACK_DEFINE(inner, theta_hash, bytes_sent, wait_seconds, seconds, group, left_out,
                 guard_seconds, exchange_seconds, codecs)
};

// A checkpoint the job wrote (event kind kCheckpointRecord in its event log): what a restarted
// aggregator resumes from.
inline constexpr const char* kCheckpointRecord = diloco::schema::record::kCheckpoint;
struct CheckpointRecord {
  std::string path;
  int64_t round = 0;
  std::string codec;  // compression auto: the codec of the round it ends ("": none, fixed)
  int64_t tokens = 0;  // a job that ends at its tokens: those its rounds averaged up to `round`
  MSGPACK_DEFINE(path, round, codec, tokens)
};

// A line of the job's log that the dashboard's timeline shows, with the round (1-based) it is
// for, recorded under one of these event kinds: compression auto changed the codec
// (kCodecRecord); a worker joined after the job's start (kJoinRecord; not a rewind's reload on
// the same node); a worker left the job (kLeftRecord).
struct LineRecord {
  std::string text;
  int64_t round = 0;
  MSGPACK_DEFINE(text, round)
};
inline constexpr const char* kCodecRecord = diloco::schema::record::kCodec;
inline constexpr const char* kJoinRecord = diloco::schema::record::kJoin;
inline constexpr const char* kLeftRecord = diloco::schema::record::kLeft;

// What a job's actor does first. It exists only inside the job the head created it for: the
// job id its constructor is given must be the one the head bound to it (this_actor().job),
// never a spawner's word; throws PermissionError naming the class otherwise. And from then on
// its node's process opens the files jobs name without following links
// (diloco/data/bounded_file.hpp): the paths were resolved under the node's roots.
inline void begin_job_actor(const char* actor_class, const std::string& job_id) {
  const std::string& bound = loco::this_actor().job;
  if (bound.empty())
    throw loco::PermissionError(std::string(actor_class) +
                                " runs only inside a submitted job (loco submit): the head "
                                "creates a job's actors; this one was spawned outside any job");
  if (bound != job_id)
    throw loco::PermissionError(std::string(actor_class) + " was created for job " + bound +
                                " but given job " + job_id.substr(0, 64) +
                                "; an actor acts only for its own job");
  diloco::open_job_files_without_links(true);
}

}  // namespace loco::actors
