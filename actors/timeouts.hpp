#pragma once
// Every timeout of a DiLoCo job's actors, in one place, each with why it is what it is.
//
// The ones a job tunes are fields of its job file (diloco::JobConfig): workers.wait_s (below
// workers.min, how long to wait for joins), workers.grace_max_s (the stragglers' window),
// inner.round_seconds (inner.budget: time), allreduce.peer_timeout_s and
// allreduce.entry_timeout_s (the collective). The grace window's floor, kGraceFloorS, is a
// parameter of the pure decision that uses it (round_decisions.hpp). What is here no job needs
// to tune: bounds on calls that end on their own. A worker that dies ends its calls much sooner,
// within the runtime's detection time (design.md, "Failure semantics"); these catch a call
// that hangs on a live actor.
#include <chrono>

#include "runtime/core/util.hpp"

namespace loco::actors {

// ---- The aggregator's calls to its workers -----------------------------------------------

// endpoints() and set_shards(): answered at once between rounds; a minute covers a loaded node.
inline constexpr std::chrono::seconds kWorkerCall{60};
// init(): copies the outer state and AdamW moments from a member, or reads a checkpoint:
// minutes for a large model over a slow link or filesystem.
inline constexpr std::chrono::seconds kInitCall{600};
// evaluate_windows(): a member's share of the validation windows.
inline constexpr std::chrono::seconds kEvaluateCall{300};
// evaluation(): a member's share of the windows evaluated in the background (StreamRequest::
// eval_begin) under the next round's steps, which slow it down; the worker waits this long for
// it, the aggregator's call 30 s more, so that the worker's error arrives first.
inline constexpr std::chrono::seconds kEvaluation{300};
inline constexpr std::chrono::seconds kEvaluationCall = kEvaluation + std::chrono::seconds(30);
// Writing a checkpoint (a model and its moments, to a filesystem the nodes share): the
// aggregator's save_checkpoint and save_inner_state calls, and a worker's wait for its write in
// the background (InnerWorker::checkpoint_written).
inline constexpr std::chrono::seconds kCheckpointWrite{300};
// checkpoint_written(): the worker waits kCheckpointWrite itself; longer, so that its error,
// which names the cause, arrives rather than a TimeoutError.
inline constexpr std::chrono::seconds kCheckpointWrittenCall =
    kCheckpointWrite + std::chrono::seconds(30);
// reduce(): the all-reduce of Δ and the outer step. A member that stops sending is lost after
// allreduce.peer_timeout_s, long before.
inline constexpr std::chrono::seconds kReduceCall{600};
// A round's inner phase: inner() (blocking rounds) and stream() (streaming and eager), the H
// inner steps of a real model; an hour bounds a round that hangs.
inline constexpr std::chrono::seconds kInnerPhase{3600};
// get() of a call that loco::wait said has ended: it answers at once. Also how long a stopping
// aggregator gives the inner calls that had not (gather_inner).
inline constexpr Millis kEndedCall{1000};
// progress() and admit() of a mid-round join: concurrent methods, answered beside the round.
inline constexpr std::chrono::seconds kAdmissionCall{10};

// ---- The aggregator and the head ------------------------------------------------------------

// The head tells no one when an actor restarts, a node arrives or a job is scaled: reconcile
// (below workers.min) and a mid-round joiner's spawn ask it again after this.
inline constexpr Millis kClusterPoll{500};
// The end of a job must reach the head: wait out a restart of the head or of Redis...
inline constexpr std::chrono::seconds kReportEnd{600};
// ...trying again after this.
inline constexpr Millis kReportEndRetry{500};
// A stopped aggregator (job cancelled or finished, its node leaving) waits this long for its
// loop to end, then lets the thread go: the node is not held up by a call in progress.
inline constexpr Millis kStopGrace{2000};

// ---- A worker's calls and waits -------------------------------------------------------------

// A joiner's state copy: join_state_size() and each part (about 100 ms of the measured rate),
// and a mid-round joiner's landed() and landed_mean(): one reply each, at most 16 MB.
inline constexpr std::chrono::seconds kStateCopyCall{60};
// offer_state(): the donor waits this long for its snapshot between two of its inner steps,
// longer than any inner step.
inline constexpr std::chrono::seconds kOfferState{120};
// The joiner's offer_state() call: the donor's own wait and a margin, so that its error arrives.
inline constexpr std::chrono::seconds kOfferStateCall = kOfferState + std::chrono::seconds(30);
// landed(): the donor holds the call this long for its steps to reach the joiner's boundary,
// then answers with what landed so far (a long poll: the joiner asks again at once).
inline constexpr std::chrono::seconds kLandedHold{1};
// A mid-round joiner waits this long in all for its donor to reach the boundary it joins at:
// up to a fragment interval of inner steps.
inline constexpr std::chrono::seconds kCatchUp{600};
// A member at an admission's boundary waits this long for the commit or abort: normally the
// decision came long before.
inline constexpr std::chrono::seconds kAdmitDecision{30};
// The outer checkpoint of a streaming round waits this long for the fragments in flight at the
// round's end to land (their all-reduces; allreduce.peer_timeout_s ends a lost one sooner).
inline constexpr std::chrono::seconds kLandedCopies{600};

}  // namespace loco::actors
