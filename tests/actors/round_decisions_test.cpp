// The aggregator's round decisions (actors/round_decisions.hpp) without a cluster.
#include "actors/round_decisions.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace loco::actors {
namespace {

using Kind = AttemptDecision::Kind;

MemberOutcome ok(uint64_t hash) { return {true, hash, false}; }
MemberOutcome failed() { return {false, 0, false}; }
MemberOutcome gone() { return {false, 0, true}; }

TEST(RoundDecisions, TheRoundIsRedoneBelowTheMinimumOrWithNobody) {
  EXPECT_EQ(after_inner(3, 2), AfterInner::reduce);
  EXPECT_EQ(after_inner(2, 2), AfterInner::reduce);
  EXPECT_EQ(after_inner(1, 2), AfterInner::redo);
  EXPECT_EQ(after_inner(0, 0), AfterInner::redo);
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

TEST(RoundDecisions, RewindOnlyWhenNobodyHoldsTheStatePastTheResumeRound) {
  EXPECT_TRUE(must_rewind(0, 5, 4));
  EXPECT_FALSE(must_rewind(1, 5, 4));
  EXPECT_FALSE(must_rewind(0, 4, 4));  // at the resume round already: the checkpoint is read
}

// Every window is evaluated once, by whole batches, about 1/K each.
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

}  // namespace
}  // namespace loco::actors
