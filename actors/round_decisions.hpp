// The aggregator's decisions about a round, as pure functions of what it has seen: no
// actors, no clocks, no LibTorch, so that each rule has a unit test (round_decisions_test)
// and the round loop (outer_aggregator.cpp, its rounds in aggregator_*.cpp) only carries them
// out. The first of the decisions that issue "8 ·" asks for; more move here as the round
// becomes a state machine.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loco::actors {

// After every member ran its inner steps: `finished` of them did, the job needs `min`.
enum class AfterInner { reduce, redo };
AfterInner after_inner(int finished, int min);

// ---- Rounds done again ------------------------------------------------------------------

// A member's inner steps diverged: a step's loss or gradient norm is not finite (a learning
// rate that is finite but far too large, say). Its θ_local, and so its Δ, are not finite
// either: the member cannot take part in the round's all-reduce (the collective refuses NaN
// and Inf), and doing the round again from the same state gives the same result.
struct StepHealth {
  double loss = 0;
  double grad_norm = 0;
};
// "" when the mean loss and every step's loss and gradient norm are finite; else what went
// wrong first, for the job's log: "worker 1's inner loss became non-finite (nan) at step 2 of
// 10". `steps` are the member's inner steps of the round, in order (a member stops at the step
// that diverged: InnerStats::diverged); `of_steps` the round's H (0: as many as `steps`).
std::string non_finite_inner(int member, double mean_loss, const std::vector<StepHealth>& steps,
                             int of_steps = 0);

// A round that does not complete is done again: at once (fewer than workers.min members
// finished their inner steps, some of them because their loss became non-finite), or after
// the job went back to its last checkpoint (the all-reduce gave up, a streaming round failed,
// no worker held the outer state). A cause that does not go away (a learning rate that makes
// the loss non-finite: the same state and data give the same steps; a worker that fails the
// same way each time) would redo one round for ever. So each round's failures are counted
// until it completes (a rewind to an earlier checkpoint does not clear them, nor do the rounds
// it does again before reaching the failing one), and the failure after kMaxRoundRedos redos
// fails the job, saying why. 3: a deterministic cause shows the same result on the first
// redo already, so more redos only spend time; faults that pass (a node lost, a link down)
// rarely hit one round four times in a row, and the elastic tests' and the chaos test's
// faults never do.
inline constexpr int kMaxRoundRedos = 3;

struct RedoDecision {
  bool give_up = false;  // the job fails with `message`
  int redo = 0;          // otherwise: the round is done again, this time its redo number `redo`
  std::string message;   // give_up: the job's failure, naming the round, the cause and the fix
};

class RoundRedos {
 public:
  explicit RoundRedos(int max_redos = kMaxRoundRedos) : max_redos_(max_redos) {}
  // Round `round` (counted from 0) failed for `why` ("worker 1's inner loss became non-finite
  // (nan) at step 2 of 10"); `fix`: what in the job file would help ("" when nothing does).
  RedoDecision failed(int64_t round, const std::string& why, const std::string& fix = "");
  // Round `round` completed: its failures are forgotten.
  void completed(int64_t round) { failures_.erase(round); }
  int failures(int64_t round) const;

 private:
  int max_redos_;
  std::map<int64_t, std::vector<std::string>> failures_;  // the whys, oldest first
};

// Where each of `joiners` copies the outer state from: the members that hold the current one
// (`up_to_date`), spread so that k joiners load k members rather than all one (joiner k copies
// from up_to_date[k mod n]). Empty when nobody holds it (the joiners then read a checkpoint).
std::vector<int> copy_sources(const std::vector<int>& up_to_date, const std::vector<int>& joiners);

// What one member of an all-reduce attempt answered.
struct MemberOutcome {
  bool ok = false;          // its reduce returned
  uint64_t theta_hash = 0;  // θ after the outer step, when ok
  bool gone = false;        // when not ok: its actor is gone (not merely the operation failed)
  // sync.mode streaming, when ok: the members (as in `members`, sorted) its fragments ended
  // the round with; -1 for a name the aggregator does not know. Empty: all of `members`.
  std::vector<int> group;
};

inline constexpr uint64_t kMaxReduceRetries = 3;

struct AttemptDecision {
  enum class Kind {
    agreed,    // every member stepped and all hold the same θ
    diverged,  // every member stepped but θ differs: a bug, the job must stop
    retry,     // the members still there run the all-reduce again (they still hold Δ)
    give_up,   // retries exhausted or nobody left: drop the group, reconcile from a checkpoint
  };
  Kind kind = Kind::give_up;
  uint64_t theta_hash = 0;      // agreed: the common hash
  int diverged_member = -1;     // diverged: the first member whose hash differs from the first's
  std::vector<int> lost;        // members gone during the attempt: release them
  std::vector<int> next_group;  // retry: the members that are still there, in order
  // retry: how long to wait first. Nobody's actor is gone, so what failed was the network
  // between them (a link down, the relay of members behind NAT restarting): the retries back
  // off, 1, 2, 4 s, so that an outage of a few seconds does not use them all up. A retry
  // without a member that is gone starts at once.
  int64_t backoff_ms = 0;
};

// `group[i]` answered `outcomes[i]` in attempt number `attempt` (0-based) of a round.
AttemptDecision after_attempt(const std::vector<int>& group,
                              const std::vector<MemberOutcome>& outcomes, uint64_t attempt);

// sync.mode streaming or eager: a round is one stream() call per member, with
// synchronizations in flight. Every member answered with the same θ: the round stands; a
// different θ: a bug, the job stops; any member failed or gone: the others have landed
// averages it never saw, so no smaller group can finish the round: the job goes back to its
// last checkpoint (`lost`: the gone members, to release).
struct OverlappedDecision {
  // agreed: every member finished with the same θ. smaller: so did the survivors, having
  // finished the fragments in flight without the members `lost` mid-round. diverged: members
  // of one group hold different θ (a bug). rewind: the job goes back to its last checkpoint.
  enum class Kind { agreed, smaller, diverged, rewind };
  Kind kind = Kind::rewind;
  uint64_t theta_hash = 0;   // agreed, smaller
  int diverged_member = -1;  // diverged
  std::vector<int> lost;     // smaller, rewind: members whose actor is gone
  std::vector<int> finished;  // agreed, smaller: the members that finished the round
};
OverlappedDecision after_overlapped_round(const std::vector<int>& members,
                                          const std::vector<MemberOutcome>& outcomes);

// Before a round (reconcile): the job must go back to its last checkpoint (or its start) when
// no member holds the outer state any more and it is past the round it would resume from.
bool must_rewind(int members_holding_state, int64_t round, int64_t resume_round);

// Whether θ is evaluated at the end of round `completed` (counted from 1): `eval.every` inner
// steps have passed since the last evaluation (`steps_since_eval`, this round's included), or
// it is the job's last round.
bool evaluation_due(int64_t steps_since_eval, int64_t every, int64_t completed, int64_t rounds);

// Whether a checkpoint is written at the end of round `completed` (counted from 1):
// `checkpoint.every` > 0 divides it, and it is not the last round (final.pt is written then).
bool checkpoint_due(int64_t completed, int64_t every, int64_t rounds);

// sync.mode streaming or eager: whether round r + 1's stream() calls go to the members right
// behind round r's, so that they wait in each member's mailbox and a member begins round r + 1
// as soon as it ends round r: no barrier between the rounds, no trip to the aggregator, and the
// aggregator's bookkeeping of round r (records, metrics.jsonl, the report and the per-step
// record to the head) runs under round r + 1's inner steps. Members then drift apart by up to a
// fragment interval, which the collective's entry window (allreduce.entry_timeout_s) allows.
// Not when a worker would have to do something else between the two rounds, or the group may
// change:
//   last_round  r is the job's last round: nothing follows;
//   membership  the members are not the target (a join, a scale, a lost slot coming back) or
//               below the minimum: reconcile decides round r + 1's group after round r.
// A member lost during round r is in round r + 1's call too; the survivors drop it from its
// first fragment on, as in round r. A round r that fails sends the job back to its checkpoint
// after round r + 1's calls have ended (the members still in it wait for the failed one up to
// the entry window). A checkpoint of round r's state does not hold round r + 1 back: it is
// asked with round r's calls, and each member copies its state as round r ends and writes it
// under round r + 1's inner steps (StreamRequest::checkpoint). Nor does θ's evaluation after
// round r: the members evaluate a copy of it in the background (StreamRequest::eval_begin).
enum class Pipeline { ahead, last_round, membership };
struct PipelineInput {
  int64_t round = 0;   // r, counted from 0
  int64_t rounds = 0;  // the job's
  int members = 0;  // of round r
  int target = 0;   // workers wanted now (workers.count or `loco scale`)
  int min = 0;      // workers.min
};
Pipeline pipeline_next(const PipelineInput& in);
const char* to_string(Pipeline p);

// How the validation windows [0, windows) are shared out among `members` members: by whole
// batches of `batch_size`, each member about 1/members of them, in member order; a member
// may get none (fewer batches than members). Pairs [begin, end) with member index.
struct EvalPart {
  int member = 0;
  int64_t begin = 0, end = 0;
};
std::vector<EvalPart> evaluation_split(int64_t windows, int64_t batch_size, int members);
// The same by the members' speeds (inner.budget: time: 1 / each one's seconds per step, all
// > 0): each batch goes to the member that would finish it first, so that the evaluation ends
// when the fastest could end it rather than when a straggler's equal share does; in member
// order. A member 3× slower than three others gets a tenth of the batches.
std::vector<EvalPart> evaluation_split(int64_t windows, int64_t batch_size,
                                       const std::vector<double>& speeds);

// ---- Stragglers (inner.budget, workers.grace_max_s) ------------------------------------

// The seconds a round's inner phase gets with inner.budget: time: `configured` when > 0, else
// H × the median of the members' recent seconds per step; 0 (run H steps) when there is no
// measurement yet.
double inner_budget_seconds(double configured, int h, std::vector<double> recent_step_seconds);
// inner.budget: time with token_budget (and rounds: 0): the job ends at its tokens
// (token_budget × workers.count, every member's counted), not at a count of rounds, which a
// time budget cannot know ahead (a slow member adds fewer tokens a round). A round whose
// budget `seconds` would bring the job within kLastRoundStretch rounds of its tokens, at the
// rate its members showed in the last round (`tokens_per_second`, all together), is the last:
// its budget is the remaining tokens' time, so that the job stops at its tokens and not a
// round past them, and no sliver of a round is left for another all-reduce. No rate yet: the
// round is what `seconds` says.
inline constexpr double kLastRoundStretch = 1.5;
struct TokenRound {
  double seconds = 0;  // the round's budget
  bool last = false;
};
TokenRound token_round(double seconds, int64_t remaining, double tokens_per_second);
// The most inner steps each member may take in a time-budgeted round of a job that ends at its
// tokens: its share of the `remaining` tokens at the speeds of the last round (`step_seconds`,
// one per member; a faster member takes more), rounded up, at least one. A round's budget is
// seconds, sized from the last round's speed; a machine that steps 2.5 times faster in this
// round than in the last took 2.5 times the steps, and a job ended a round's tokens past its
// own (Elastic.ATimeBudgetedJobEndsAtItsTokens under load, 2026-12-01: 32,256 tokens of 30,720).
// Capped, no round runs past the tokens by more than a step a member. 0 for every member (no
// cap) when a speed is unknown or no tokens are set.
std::vector<int64_t> token_caps(int64_t remaining, int64_t tokens_per_step,
                                const std::vector<double>& step_seconds);
// Whether the job has its tokens after a round that added `round_tokens`: fewer remain than
// one inner step of each member (the steps are whole; a time budget ends within a step of its
// seconds), or the round was the one token_round sized as the last (`planned_last`) and fell
// short by less than kLastRoundShortfall of what it added: the rate it was sized by is a
// measurement, and another round for a few steps each would cost a whole all-reduce and
// evaluation. A member lost in it leaves more than that: then another round follows.
inline constexpr double kLastRoundShortfall = 0.1;
bool tokens_reached(int64_t remaining, int64_t tokens_per_step, int members,
                    bool planned_last = false, int64_t round_tokens = 0);
// The job's rounds as the loop counts them (for the last round's evaluation, the checkpoints'
// schedule and the progress shown): those done, and the remaining tokens at the last round's
// tokens, at least one more, at most `cap`.
int rounds_estimate(int64_t done_rounds, int64_t remaining, int64_t last_round_tokens, int cap);

// The median of `v` (the mean of the middle two for an even count); `v` must not be empty.
double median(std::vector<double> v);

// The grace window after the quorum: median + k·MAD of the recent lateness samples (seconds a
// member reported after its round's median report; the spread of normal rounds), at least
// `floor_s`, at most `max_s`. With no samples yet (the job's first round): `first_fraction` of
// the seconds the quorum took (`quorum_s`, from the phase's start to the min-th report), in the
// same bounds: a member that much slower than the quorum is late, rather than the whole first
// round waiting up to `max_s` for it. A pure function of the arrival times, so that it adapts
// to what the workers do instead of a timeout tuned by hand.
inline constexpr double kGraceK = 3.0, kGraceFloorS = 1.0, kGraceFirstFraction = 0.5;
double grace_window(std::vector<double> recent_lateness, double k, double floor_s, double max_s,
                    double quorum_s, double first_fraction = kGraceFirstFraction);

// Whether the inner phase of a round is over at `now` (seconds, any origin): every member
// reported; or `grace_max_s` > 0, at least `min` reported (the `min`-th at `quorum_at`) and
// `window` has passed since. The others missed the deadline.
bool inner_phase_closed(int reported, int members, int min, double grace_max_s, double now,
                        double quorum_at, double window);

// The factor member `rank` scales its Δ by before the all-reduce so that the plain mean over
// the group is the mean weighted by the tokens each member processed:
// K · tokens[rank] / Σ tokens. Exactly 1 when every member processed as many tokens (the mean
// is then today's, bit for bit: the worker skips the scaling). With `left_out`
// (collective::Group::left_out: the guard's), over the members not left out only (K and Σ
// theirs); 0 for a member left out.
double member_scale(const std::vector<int64_t>& tokens, int rank,
                    std::span<const uint8_t> left_out = {});

}  // namespace loco::actors
