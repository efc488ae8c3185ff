#pragma once
// InnerWorker: one DiLoCo worker of a job, as an actor. It holds a model
// replica with its inner optimizer, the replicated outer state, and its
// pseudo-gradient; the OuterAggregator drives it round by round.
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "diloco/job/config.hpp"
#include "runtime/core/codec.hpp"
#include "runtime/core/paths.hpp"

namespace loco::actors {

// A job's data folder and tokenizer.json (data.dir, data.tokenizer) as a node with `roots`
// allows them: resolved under its data root, PathError naming the field when outside.
diloco::DataConfig resolve_job_data(const PathRoots& roots, diloco::DataConfig d);

class InnerWorker {
 public:
  InnerWorker(std::string job_id, std::string spec, int index);
  ~InnerWorker();
  // The stop hook (ActorClass::on_stop), from another thread: its collective leaves (the
  // fragments in flight fail, naming it lost to the others at once) and a round in progress
  // ends at the next inner step.
  void stop();

  // The endpoints of its collective (bulk data) sockets, one per local rank: rank r
  // averages slice r of Δ with rank r of the other workers.
  std::vector<std::string> endpoints() const;
  // Sets shards and the outer state (copied from a live worker, read from a
  // checkpoint, or from the seed); a worker that rejoins starts over here.
  InitResult init(WorkerInit init);
  // H inner steps, then the pseudo-gradient Δ = θ_global − θ_local, kept until
  // the round's reduce succeeds.
  InnerResult inner(int64_t round);
  // inner.budget: time: inner steps until `seconds` are spent (at least one, at most 4·H and,
  // if `max_steps` is not 0, at most that: its share of a job's remaining tokens), then Δ as
  // inner() does; the result says how many steps and tokens.
  InnerResult inner_timed(int64_t round, double seconds, int64_t max_steps);
  // Averages Δ with the group, applies the outer step, loads θ; returns θ's hash.
  ReduceResult reduce(ReduceRequest req);
  // sync.mode streaming: a whole round, H inner steps with the fragments synchronized and
  // landed on the way (as the simulator does, bit for bit); fragments still on their way at
  // the round's end land in the next call.
  StreamResult stream(StreamRequest req);
  // sync.mode streaming, a worker joining mid-round. These run beside the mailbox
  // (concurrent methods) while stream() holds it. offer_state: the donor takes a snapshot
  // at its next inner step of `round` (or has one) and says its step and size; snapshot_part
  // serves it in parts. landed: the fragments it landed since the snapshot of step `since`
  // and before `upto`, complete once it has reached `upto` (waits up to a second for that);
  // landed_mean: one of their averages. progress: the inner step count its round reached.
  // admit: the two-phase admission of a joiner at a fragment boundary (AdmitRequest);
  // prepare says yes only while this worker is before that boundary.
  JoinOffer offer_state(int64_t round);
  Blob snapshot_part(int64_t round, int64_t step, int64_t offset, int64_t length);
  LandedList landed(int64_t round, int64_t since, int64_t upto);
  Blob landed_mean(int64_t round, int64_t since, int64_t index);
  int64_t progress(int64_t round);
  bool admit(AdmitRequest req);
  // A member of this worker's groups is gone (its actor died, or the aggregator lost its
  // call's answer): its endpoints, why, and from which operations (below `below_op`; 0: all).
  // Every such operation with it, the one in progress too, fails at once naming it, so that a
  // streaming round goes on without it (collective::Communicator::peer_gone). Concurrent.
  void member_gone(MemberGone gone);
  // The aggregator gave up the rounds it had sent this worker whose operations are below
  // `below_op` (it sends the job back to a checkpoint): each of their operations, the one in
  // progress too, fails at once, so that a stream() call of such a round ends within its next
  // synchronization instead of waiting out the entry window of a member that had failed the
  // round before (collective::Communicator::give_up_below). With `as_lost` this member leaves
  // them as lost, and the others finish them without it. Concurrent.
  void give_up(RoundsGivenUp given_up);
  // The checkpoint a stream() call was asked for (StreamRequest::checkpoint, inner_state), of
  // the state after `round` rounds: waits (at most 300 s) until its files are written and
  // returns the outer checkpoint's path ("" when this member wrote its inner state only); fails
  // with the reason when they could not be (a fragment in flight never landed, a write
  // failed). Concurrent: it answers while the next round's stream() holds the mailbox.
  std::string checkpoint_written(int64_t round);
  // The loss a stream() call was asked to evaluate at its round's end (StreamRequest::
  // eval_begin), `round` being the outer state's round then: waits (at most 300 s) for the
  // evaluation, which runs on a model of its own beside the next round's steps. Concurrent.
  double evaluation(int64_t round);
  // Validation loss of the current θ: over every validation window, or over
  // windows [begin, end) so that the members of a round share the work.
  double evaluate();
  double evaluate_windows(int64_t begin, int64_t end);
  int64_t validation_windows() const;
  // What a worker that joins copies from this one in parts (see init), as of
  // the start of `round`: the outer state (θ, momentum, round) and the AdamW
  // moments, serialized. Its size, then [offset, offset + length) of it.
  int64_t join_state_size(int64_t round);
  Blob join_state_part(int64_t round, int64_t offset, int64_t length);
  // Writes a checkpoint (config, round, outer state, this worker's inner state)
  // to `path` atomically; `generate` reads it.
  std::string save_checkpoint(std::string path);
  // This worker's inner state alone (AdamW moments, schedule step, data stream
  // and position), written next to each checkpoint, so that a job resumed from
  // the checkpoint continues every worker exactly.
  std::string save_inner_state(std::string path);
  uint64_t theta_hash() const;
  // The data shards it reads from now on (when workers leave or join).
  void set_shards(std::vector<int> shards);
  std::vector<int> shards() const;

 private:
  const std::shared_ptr<const std::string>& join_state(int64_t round);
  void catch_up(const StreamRequest& req);
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace loco::actors
