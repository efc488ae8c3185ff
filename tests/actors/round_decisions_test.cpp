// The aggregator's round decisions (actors/round_decisions.hpp) without a cluster.
#include "actors/round_decisions.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "actors/exchange_desk.hpp"

namespace loco::actors {
namespace {

using Kind = AttemptDecision::Kind;

MemberOutcome ok(uint64_t hash) { return {true, hash, false}; }
MemberOutcome failed() { return {false, 0, false}; }
MemberOutcome gone() { return {false, 0, true}; }
MemberOutcome ended_with(uint64_t hash, std::vector<int> group) {
  return {true, hash, false, std::move(group)};
}

TEST(RoundDecisions, TheRoundIsRedoneBelowTheMinimumOrWithNobody) {
  EXPECT_EQ(after_inner(3, 2), AfterInner::reduce);
  EXPECT_EQ(after_inner(2, 2), AfterInner::reduce);
  EXPECT_EQ(after_inner(1, 2), AfterInner::redo);
  EXPECT_EQ(after_inner(0, 0), AfterInner::redo);
}

TEST(RoundDecisions, TheFirstNonFiniteStepOfAMemberIsNamed) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(non_finite_inner(1, 5.2, {{5.5, 1.0}, {4.9, 0.8}}), "");
  EXPECT_EQ(non_finite_inner(1, nan, {{5.5, 1.0}, {nan, nan}, {nan, nan}}),
            "worker 1's inner loss became non-finite (nan) at step 2 of 3");
  // The gradient's norm overflows before the loss does: θ_local is not finite after that step.
  EXPECT_EQ(non_finite_inner(0, 5.0, {{5.5, 1.0}, {5.0, inf}}),
            "worker 0's gradient norm became non-finite (inf) at step 2 of 2");
  EXPECT_EQ(non_finite_inner(2, -inf, {{-inf, 1.0}}),
            "worker 2's inner loss became non-finite (-inf) at step 1 of 1");
  EXPECT_EQ(non_finite_inner(3, nan, {}), "worker 3's mean inner loss is non-finite (nan)");
  // A member stops at the step that diverged: "of" the round's H, not of the steps it took.
  EXPECT_EQ(non_finite_inner(1, nan, {{5.5, 1.0}, {nan, nan}}, 10),
            "worker 1's inner loss became non-finite (nan) at step 2 of 10");
}

TEST(RoundDecisions, ARoundThatKeepsFailingFailsTheJobAfterBoundedRedosSayingWhy) {
  RoundRedos redos;
  const std::string why = "worker 0's inner loss became non-finite (nan) at step 2 of 10";
  for (int k = 1; k <= kMaxRoundRedos; ++k) {
    const RedoDecision d = redos.failed(2, why, "lower inner.lr (1e+308)");
    EXPECT_FALSE(d.give_up) << k;
    EXPECT_EQ(d.redo, k);
  }
  const RedoDecision d = redos.failed(2, why, "lower inner.lr (1e+308)");
  ASSERT_TRUE(d.give_up);
  EXPECT_EQ(d.message,
            "round 3: worker 0's inner loss became non-finite (nan) at step 2 of 10; the round was "
            "redone 3 times with the same result; lower inner.lr (1e+308)");
}

TEST(RoundDecisions, RedosAreCountedPerRoundUntilItCompletesWhateverTheReason) {
  RoundRedos redos(2);
  EXPECT_FALSE(redos.failed(4, "the all-reduce failed 4 times").give_up);
  // Other rounds completing (those after a rewind to an earlier checkpoint) clear nothing.
  redos.completed(2);
  redos.completed(3);
  EXPECT_FALSE(redos.failed(3, "no worker holds the outer state").give_up);  // its own count
  EXPECT_EQ(redos.failures(4), 1);
  EXPECT_FALSE(redos.failed(4, "1 workers finished, below workers.min = 2").give_up);
  const RedoDecision d = redos.failed(4, "the all-reduce failed 4 times");
  ASSERT_TRUE(d.give_up);
  EXPECT_EQ(d.message,
            "round 5 failed 3 times (redone 2 times): the all-reduce failed 4 times; then 1 "
            "workers finished, below workers.min = 2; then the all-reduce failed 4 times");
  // A round that completes starts again from nothing.
  redos.completed(3);
  EXPECT_EQ(redos.failures(3), 0);
  EXPECT_EQ(redos.failed(3, "x").redo, 1);
}

TEST(RoundDecisions, JoinersCopyFromDifferentUpToDateMembers) {
  EXPECT_EQ(copy_sources({2, 5, 7}, {0, 1, 3, 4}), (std::vector<int>{2, 5, 7, 2}));
  EXPECT_EQ(copy_sources({4}, {0, 1}), (std::vector<int>{4, 4}));
  EXPECT_TRUE(copy_sources({}, {0, 1}).empty());  // nobody holds it: from a checkpoint
}

TEST(RoundDecisions, EqualHashesAgreeAndADifferentOneIsNamed) {
  auto d = after_attempt({0, 2, 5}, {ok(7), ok(7), ok(7)}, 0);
  EXPECT_EQ(d.kind, Kind::agreed);
  EXPECT_EQ(d.theta_hash, 7u);
  EXPECT_TRUE(d.lost.empty());
  d = after_attempt({0, 2, 5}, {ok(7), ok(7), ok(8)}, 0);
  EXPECT_EQ(d.kind, Kind::diverged);
  EXPECT_EQ(d.diverged_member, 5);
}

TEST(RoundDecisions, SurvivorsRetryAndTheGoneAreReleased) {
  auto d = after_attempt({1, 3, 4, 6}, {failed(), gone(), ok(9), failed()}, 0);
  EXPECT_EQ(d.kind, Kind::retry);
  EXPECT_EQ(d.next_group, (std::vector<int>{1, 4, 6}));  // a member that stepped retries too
  EXPECT_EQ(d.lost, (std::vector<int>{3}));
}

TEST(RoundDecisions, RetriesAreBoundedAndAnEmptyGroupGivesUp) {
  for (uint64_t attempt = 0; attempt < kMaxReduceRetries; ++attempt)
    EXPECT_EQ(after_attempt({0, 1}, {failed(), failed()}, attempt).kind, Kind::retry);
  auto d = after_attempt({0, 1}, {failed(), failed()}, kMaxReduceRetries);
  EXPECT_EQ(d.kind, Kind::give_up);
  EXPECT_TRUE(d.next_group.empty());
  d = after_attempt({0, 1}, {gone(), gone()}, 0);
  EXPECT_EQ(d.kind, Kind::give_up);
  EXPECT_EQ(d.lost, (std::vector<int>{0, 1}));
}

// A retry with everyone still there (the network failed them: a link, the relay) backs off,
// 1, 2, 4 s; one without a member that is gone starts at once.
TEST(RoundDecisions, RetriesOfTheSameGroupBackOffAndThoseWithoutTheGoneDoNot) {
  EXPECT_EQ(after_attempt({0, 1}, {failed(), failed()}, 0).backoff_ms, 1000);
  EXPECT_EQ(after_attempt({0, 1}, {failed(), ok(3)}, 1).backoff_ms, 2000);
  EXPECT_EQ(after_attempt({0, 1}, {failed(), failed()}, 2).backoff_ms, 4000);
  EXPECT_EQ(after_attempt({0, 1}, {failed(), failed()}, kMaxReduceRetries).backoff_ms, 0);
  EXPECT_EQ(after_attempt({0, 1, 2}, {failed(), gone(), failed()}, 0).backoff_ms, 0);
  EXPECT_EQ(after_attempt({0, 1}, {ok(3), ok(3)}, 0).backoff_ms, 0);
}

TEST(RoundDecisions, OutcomesMustMatchTheGroup) {
  EXPECT_THROW(after_attempt({0, 1}, {ok(1)}, 0), std::invalid_argument);
  EXPECT_THROW(after_overlapped_round({0, 1}, {ok(1)}), std::invalid_argument);
}

// Streaming and eager rounds: all answered alike, the round stands; a different θ is named;
// one failure (gone or not) sends the job back to its checkpoint, releasing the gone.
TEST(RoundDecisions, AnOverlappedRoundStandsOrTheJobRewinds) {
  using K = OverlappedDecision::Kind;
  auto d = after_overlapped_round({0, 2, 3}, {ok(7), ok(7), ok(7)});
  EXPECT_EQ(d.kind, K::agreed);
  EXPECT_EQ(d.theta_hash, 7u);
  d = after_overlapped_round({0, 2, 3}, {ok(7), ok(7), ok(8)});
  EXPECT_EQ(d.kind, K::diverged);
  EXPECT_EQ(d.diverged_member, 3);
  d = after_overlapped_round({0, 2, 3}, {ok(7), gone(), failed()});
  EXPECT_EQ(d.kind, K::rewind);
  EXPECT_EQ(d.lost, std::vector<int>{2});
  EXPECT_EQ(after_overlapped_round({}, {}).kind, K::rewind);
}

// A member lost while fragments were in flight: the survivors that finished them without it,
// all with the same group and θ, keep the round; anything less certain goes back.
TEST(RoundDecisions, SurvivorsThatFinishedTheFragmentsAsOneSmallerGroupKeepTheRound) {
  using K = OverlappedDecision::Kind;
  auto d =
      after_overlapped_round({0, 2, 3}, {ended_with(7, {0, 3}), gone(), ended_with(7, {0, 3})});
  EXPECT_EQ(d.kind, K::smaller);
  EXPECT_EQ(d.theta_hash, 7u);
  EXPECT_EQ(d.lost, std::vector<int>{2});
  EXPECT_EQ(d.finished, (std::vector<int>{0, 3}));
  // It died after its last fragment: the survivors' group still holds it, θ is theirs alike.
  d = after_overlapped_round({0, 2, 3}, {ended_with(7, {0, 2, 3}), gone(), ended_with(7, {})});
  EXPECT_EQ(d.kind, K::smaller);
  EXPECT_EQ(d.finished, (std::vector<int>{0, 3}));
  // Survivors that ended with different groups (one dropped the other): back to the checkpoint,
  // even when every member answered, and not taken for a bug.
  EXPECT_EQ(
      after_overlapped_round({0, 2, 3}, {ended_with(7, {0, 3}), gone(), ended_with(8, {3})}).kind,
      K::rewind);
  EXPECT_EQ(after_overlapped_round({0, 2}, {ended_with(7, {0}), ended_with(8, {2})}).kind,
            K::rewind);
  // A survivor outside the group, or a name the aggregator does not know.
  EXPECT_EQ(
      after_overlapped_round({0, 2, 3}, {ended_with(7, {0}), gone(), ended_with(7, {0})}).kind,
      K::rewind);
  EXPECT_EQ(
      after_overlapped_round({0, 3}, {ended_with(7, {-1, 0, 3}), ended_with(7, {-1, 0, 3})}).kind,
      K::rewind);
  // The same group but a different θ is a bug, named.
  d = after_overlapped_round({0, 2, 3}, {ended_with(7, {0, 3}), gone(), ended_with(9, {0, 3})});
  EXPECT_EQ(d.kind, K::diverged);
  EXPECT_EQ(d.diverged_member, 3);
  // A member that failed but is still there may hold a θ of its own: back.
  EXPECT_EQ(
      after_overlapped_round({0, 2, 3}, {ended_with(7, {0, 3}), failed(), ended_with(7, {0, 3})})
          .kind,
      K::rewind);
}

TEST(RoundDecisions, RewindOnlyWhenNobodyHoldsTheStatePastTheResumeRound) {
  EXPECT_TRUE(must_rewind(0, 5, 4));
  EXPECT_FALSE(must_rewind(1, 5, 4));
  EXPECT_FALSE(must_rewind(0, 4, 4));  // at the resume round already: the checkpoint is read
}

// Every window is evaluated once, by whole batches, about 1/K each.
TEST(RoundDecisions, EvaluationAfterEveryStepsOrTheLastRound) {
  EXPECT_FALSE(evaluation_due(12, 24, 1, 10));
  EXPECT_TRUE(evaluation_due(24, 24, 2, 10));
  EXPECT_TRUE(evaluation_due(12, 100000, 10, 10));  // the last round
}

TEST(RoundDecisions, CheckpointsEveryNRoundsButNotAtTheEnd) {
  EXPECT_FALSE(checkpoint_due(3, 0, 10));  // every: 0, none
  EXPECT_FALSE(checkpoint_due(3, 2, 10));
  EXPECT_TRUE(checkpoint_due(4, 2, 10));
  EXPECT_FALSE(checkpoint_due(10, 2, 10));  // final.pt instead
}

// Round r + 1 goes out before round r's results only when nothing else must happen between
// them on a worker, and its group is round r's.
TEST(RoundDecisions, TheNextRoundIsSentAheadOnlyWhenNothingHappensBetween) {
  PipelineInput in;
  in.round = 3;
  in.rounds = 10;
  in.members = in.target = in.min = 4;
  EXPECT_EQ(pipeline_next(in), Pipeline::ahead);
  PipelineInput last = in;
  last.round = 9;
  EXPECT_EQ(pipeline_next(last), Pipeline::last_round);
  last.round = 8;  // round 9 is the last: it is sent ahead, and says so (StreamRequest::last)
  EXPECT_EQ(pipeline_next(last), Pipeline::ahead);
  PipelineInput join = in;
  join.target = 5;  // `loco scale 5`, or slot 4 lost and to be brought back
  EXPECT_EQ(pipeline_next(join), Pipeline::membership);
  join.target = 3;  // scaled down
  EXPECT_EQ(pipeline_next(join), Pipeline::membership);
  PipelineInput few = in;
  few.members = few.target = 2;  // below workers.min: reconcile waits for joiners
  EXPECT_EQ(pipeline_next(few), Pipeline::membership);
  few.min = 0;  // min 0 means 1
  EXPECT_EQ(pipeline_next(few), Pipeline::ahead);
}

TEST(RoundDecisions, EvaluationIsSharedByWholeBatchesAndCoversEveryWindowOnce) {
  for (int64_t windows : {1, 7, 64, 100, 129})
    for (int members : {1, 2, 3, 5, 8}) {
      const auto parts = evaluation_split(windows, 8, members);
      int64_t at = 0;
      for (const EvalPart& p : parts) {
        EXPECT_EQ(p.begin, at);
        EXPECT_LT(p.begin, p.end);
        EXPECT_TRUE(p.end == windows || p.end % 8 == 0) << p.end;
        EXPECT_GE(p.member, 0);
        EXPECT_LT(p.member, members);
        at = p.end;
      }
      EXPECT_EQ(at, windows) << windows << " windows, " << members << " members";
    }
  const auto parts = evaluation_split(128, 8, 4);  // 16 batches: 4 each
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[1].begin, 32);
  EXPECT_EQ(parts[1].end, 64);
  EXPECT_EQ(evaluation_split(8, 8, 3).size(), 1u);  // one batch: one member
  EXPECT_THROW(evaluation_split(8, 0, 3), std::invalid_argument);
}

TEST(Stragglers, EvaluationIsSharedByTheMembersSpeeds) {
  for (int64_t windows : {1, 7, 64, 100, 129}) {
    const auto parts = evaluation_split(windows, 8, std::vector<double>{3, 1, 3, 3});
    int64_t at = 0;
    for (const EvalPart& p : parts) {
      EXPECT_EQ(p.begin, at);
      EXPECT_LT(p.begin, p.end);
      at = p.end;
    }
    EXPECT_EQ(at, windows);
  }
  // 10 batches, one member 3x slower: it gets one, the others three each.
  const auto parts = evaluation_split(80, 8, std::vector<double>{3, 1, 3, 3});
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[1].member, 1);
  EXPECT_EQ(parts[1].end - parts[1].begin, 8);
  EXPECT_EQ(parts[0].end - parts[0].begin, 24);
  // 4 batches: the slow member gets none.
  for (const EvalPart& p : evaluation_split(32, 8, std::vector<double>{3, 1, 3, 3}))
    EXPECT_NE(p.member, 1);
  EXPECT_THROW(evaluation_split(8, 8, std::vector<double>{1, 0}), std::invalid_argument);
  EXPECT_THROW(evaluation_split(8, 8, std::vector<double>{}), std::invalid_argument);
}

TEST(Stragglers, TheBudgetIsTheJobsOrHTimesTheMedianStep) {
  EXPECT_EQ(inner_budget_seconds(12.5, 10, {1, 2, 3}), 12.5);
  EXPECT_EQ(inner_budget_seconds(0, 10, {}), 0);  // nothing measured: H steps
  EXPECT_DOUBLE_EQ(inner_budget_seconds(0, 10, {0.3, 0.1, 0.9}),
                   3.0);  // a slow one is not the median
  EXPECT_DOUBLE_EQ(inner_budget_seconds(0, 4, {0.1, 0.2, 0.3, 0.4}), 1.0);
}

// Median + k·MAD of how late members were, within [floor, max]: one slow outlier does not
// widen the window much; a spread-out group gets a wider one.
TEST(Stragglers, AJobThatEndsAtItsTokensSizesItsLastRoundToThem) {
  // 10 s rounds at 1,000 tokens/s: 40,000 tokens to go are four rounds, none the last.
  EXPECT_EQ(token_round(10, 40000, 1000).seconds, 10);
  EXPECT_FALSE(token_round(10, 40000, 1000).last);
  // 12,000 to go: within 1.5 rounds, so one round of 12 s ends the job (not 10 s, then 2 s).
  EXPECT_DOUBLE_EQ(token_round(10, 12000, 1000).seconds, 12);
  EXPECT_TRUE(token_round(10, 12000, 1000).last);
  // 3,000 to go: a short last round instead of a whole one past the tokens.
  EXPECT_DOUBLE_EQ(token_round(10, 3000, 1000).seconds, 3);
  EXPECT_TRUE(token_round(10, 3000, 1000).last);
  // 16,000: more than 1.5 rounds, a whole round first.
  EXPECT_FALSE(token_round(10, 16000, 1000).last);
  // No rate measured yet: the round is the budget's.
  EXPECT_EQ(token_round(10, 3000, 0).seconds, 10);
  EXPECT_FALSE(token_round(10, 3000, 0).last);
}

// Each member's steps are bounded by its share of the remaining tokens at the last round's
// speeds, rounded up: however much faster the machine steps in this round than in the last,
// the round ends within a step a member of the tokens.
TEST(Stragglers, EachMembersStepsAreBoundedByItsShareOfTheRemainingTokens) {
  // 120 steps of 100 tokens remain; two members at 1 s a step, one at 3 s: 3/7 of the steps
  // each for the fast ones (51.4), 1/7 for the slow one (17.1).
  const auto caps = token_caps(12000, 100, {1.0, 1.0, 3.0});
  EXPECT_EQ(caps, (std::vector<int64_t>{52, 52, 18}));
  int64_t sum = 0;
  for (int64_t c : caps) sum += c;
  EXPECT_GE(sum * 100, 12000);
  EXPECT_LE(sum * 100, 12000 + 3 * 100);
  // Nothing remains: one step each (a round takes at least one).
  EXPECT_EQ(token_caps(0, 100, {1.0, 2.0}), (std::vector<int64_t>{1, 1}));
  // A speed not known (a member that joined without timing its steps), or no tokens a step:
  // no cap, the budget alone decides.
  EXPECT_EQ(token_caps(12000, 100, {1.0, 0.0}), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(token_caps(12000, 0, {1.0, 1.0}), (std::vector<int64_t>{0, 0}));
}

TEST(Stragglers, TokensAreReachedWithinAStepOfEachMemberAndRoundsAreEstimated) {
  EXPECT_TRUE(tokens_reached(0, 1024, 4));
  EXPECT_TRUE(tokens_reached(-5, 1024, 4));
  EXPECT_TRUE(tokens_reached(4095, 1024, 4));
  EXPECT_FALSE(tokens_reached(4096, 1024, 4));
  // The round sized as the last fell 8,192 short of its 186,368: the job ends there, rather
  // than run a round of two steps each. A quarter short (a member lost): another round.
  EXPECT_TRUE(tokens_reached(8192, 1024, 4, true, 186368));
  EXPECT_FALSE(tokens_reached(8192, 1024, 4, false, 186368));
  EXPECT_FALSE(tokens_reached(46592, 1024, 3, true, 186368));
  // 7 rounds done, 25,000 tokens to go at 10,000 a round: 3 more.
  EXPECT_EQ(rounds_estimate(7, 25000, 10000, 1000), 10);
  EXPECT_EQ(rounds_estimate(7, 10000, 10000, 1000), 8);
  EXPECT_EQ(rounds_estimate(7, 25000, 0, 1000), 8);  // no round yet: at least one more
  EXPECT_EQ(rounds_estimate(7, 1 << 30, 1, 100), 100);  // bounded
}

TEST(Stragglers, TheGraceWindowAdaptsToTheSpreadOfArrivals) {
  // Nothing seen yet (the first round): half the seconds the quorum took, in the bounds.
  EXPECT_DOUBLE_EQ(grace_window({}, 3, 1, 30, 8.0), 4.0);
  EXPECT_EQ(grace_window({}, 3, 1, 30, 100.0), 30);  // at most the maximum
  EXPECT_EQ(grace_window({}, 3, 1, 30, 0.5), 1);     // at least the floor
  EXPECT_DOUBLE_EQ(grace_window({}, 3, 1, 30, 8.0, 0.25), 2.0);
  // With samples the quorum's seconds do not matter: the spread of arrivals does.
  EXPECT_EQ(grace_window({0, 0, 0, 0}, 3, 1, 30, 8.0), 1);  // lockstep workers: the floor
  EXPECT_DOUBLE_EQ(grace_window({0.5, 1.0, 1.5, 2.0, 2.5}, 3, 0.1, 30, 8.0), 1.5 + 3 * 0.5);
  EXPECT_DOUBLE_EQ(grace_window({0.1, 0.1, 0.1, 0.1, 40}, 3, 0.05, 30, 8.0), 0.1);  // outlier
  EXPECT_EQ(grace_window({5, 10, 20}, 3, 1, 8, 8.0), 8);  // bounded by the maximum
}

// An injected clock: the phase closes when all reported, or at quorum + window; never before
// the quorum, and never without a deadline.
TEST(Stragglers, TheInnerPhaseClosesAtAllOrAtQuorumPlusWindow) {
  EXPECT_TRUE(inner_phase_closed(3, 3, 2, 0, 0, 0, 0));      // everybody
  EXPECT_FALSE(inner_phase_closed(2, 3, 2, 0, 1e9, 0, 0));   // no deadline: wait for all
  EXPECT_FALSE(inner_phase_closed(1, 3, 2, 30, 1e9, 0, 0));  // below the quorum
  EXPECT_FALSE(inner_phase_closed(2, 3, 2, 30, 104.9, 100, 5));
  EXPECT_TRUE(inner_phase_closed(2, 3, 2, 30, 105, 100, 5));
  EXPECT_TRUE(inner_phase_closed(1, 3, 0, 30, 105, 100, 5));  // min 0 means 1
}


TEST(Stragglers, TokenWeightsAreExactlyOneWhenEqual) {
  EXPECT_EQ(member_scale({512, 512, 512}, 1), 1.0);
  EXPECT_EQ(member_scale({1536, 1536, 1536, 1536, 1536, 1536, 1536}, 6), 1.0);
  // Weighted: 3 members with 100, 300, 200 tokens: Σ scale_k·Δ_k / 3 = Σ t_k·Δ_k / Σ t.
  const std::vector<int64_t> t = {100, 300, 200};
  double sum = 0;
  for (int r = 0; r < 3; ++r) sum += member_scale(t, r);
  EXPECT_DOUBLE_EQ(sum, 3.0);
  EXPECT_DOUBLE_EQ(member_scale(t, 1), 1.5);
  EXPECT_THROW(member_scale(t, 3), std::invalid_argument);
  EXPECT_THROW(member_scale({0, 5}, 0), std::invalid_argument);
  // The guard left member 1 out: the others' weights are over the two of them, its own 0.
  const std::vector<uint8_t> out = {0, 1, 0};
  EXPECT_DOUBLE_EQ(member_scale(t, 0, out), 2.0 * 100 / 300);
  EXPECT_DOUBLE_EQ(member_scale(t, 2, out), 2.0 * 200 / 300);
  EXPECT_EQ(member_scale(t, 1, out), 0.0);
  EXPECT_EQ(member_scale(t, 1, std::vector<uint8_t>{0, 0, 0}), member_scale(t, 1));
  EXPECT_THROW(member_scale(t, 0, std::vector<uint8_t>{0, 1}), std::invalid_argument);
}

// The desk's figures: the mean inner step of the stream() call so far, or of the call before
// until the new one takes a step (FragmentCodecs plans a round's first fragment from it), and
// the seconds of the operations that ended since the last take (StreamResult::exchange_seconds).
TEST(ExchangeDesk, KeepsTheCallsMeanStepAndTheOperationsSecondsUntilTaken) {
  ExchangeDesk desk;
  EXPECT_DOUBLE_EQ(desk.step_seconds(), 0.0);  // none ever
  desk.open();
  desk.add_steps(3.0, 6);
  EXPECT_DOUBLE_EQ(desk.step_seconds(), 0.5);
  desk.add_steps(1.0, 4);
  EXPECT_DOUBLE_EQ(desk.step_seconds(), 0.4);
  desk.put(2.5);
  desk.put(0.5);
  EXPECT_DOUBLE_EQ(desk.take_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(desk.take_seconds(), 0.0);
  desk.open();  // the next call: the last one's mean until it steps
  EXPECT_DOUBLE_EQ(desk.step_seconds(), 0.4);
  desk.add_steps(2.0, 1);
  EXPECT_DOUBLE_EQ(desk.step_seconds(), 2.0);
  desk.open();
  desk.open();  // a call that took no step leaves the mean of the one before
  EXPECT_DOUBLE_EQ(desk.step_seconds(), 2.0);
}

}  // namespace
}  // namespace loco::actors
