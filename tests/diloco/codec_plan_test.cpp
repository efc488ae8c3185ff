// compression: auto: the ladder, the planner's rule and hysteresis, the codec trace, the job
// file's fields, and what a dense round does with the error feedback (diloco/round/codec_plan.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/round/codec_plan.hpp"
#include "diloco/round/delta_averager.hpp"
#include "diloco/round/error_feedback.hpp"
#include "tests/diloco/config_util.hpp"

using namespace loco::diloco;
using loco::collective::Codec;

namespace {

// A 6.4 M-parameter job (the WAN bench's GPT), four workers, H = 12.
JobConfig job(const std::string& compression, const std::string& sync = "") {
  return JobConfig::from_yaml(R"(
name: t
model: {layers: 8, width: 256, heads: 4, context: 64, tied_embeddings: true}
data: {dir: /tmp/x, tokenizer: byte, shards: 8}
workers: {count: 4}
inner: {steps: 12, batch_size: 16}
rounds: 10
compression: )" + compression + "\n" +
                              (sync.empty() ? "" : "sync: " + sync + "\n"));
}

// What a round measured: the slowest member sent `mbit` Mbit/s worth of its bytes, and a step
// took `step_s`.
LinkSample at(double mbit, double step_s, std::uint64_t bytes = 10'000'000) {
  return LinkSample{bytes, double(bytes) * 8 / (mbit * 1e6), step_s};
}

TEST(CodecChoice, NamesRoundTripAndHostileNamesAreRefused) {
  for (const char* n : {"fp32", "fp16", "bf16", "int8", "topk:1", "topk:64", "topk:65536",
                        "topk:410q4", "topk:1q8", "topk:65536q1", "topk:410q4-noef",
                        "topk:64-noef", "topk:65536q8-noef"}) {
    const auto c = parse_choice(n);
    ASSERT_TRUE(c) << n;
    EXPECT_EQ(c->name(), n);
  }
  EXPECT_TRUE(parse_choice("topk:64")->sparse());
  EXPECT_FALSE(parse_choice("int8")->sparse());
  for (const char* n : {"", "int4", "topk", "topk:", "topk:0", "topk:65537", "topk:-1",
                        "topk:64x", "topk: 64", "TOPK:64", "topk:000000000000000064", "topk:064",
                        "topk:64q", "topk:64q0", "topk:64q9", "topk:64q44", "topk:q4", "topk:64q4q4",
                        "topk:64Q4", "topk:-noef", "topk:64-noef-noef", "topk:64q4-NOEF",
                        "topk:64-noefx", "topk:64q4-noef12345678"})
    EXPECT_FALSE(parse_choice(n)) << n;
  // A rung's k and bits override the job's; without them the job's hold.
  TopkConfig t;  // chunk 4096, k 64, bits 2
  const auto tenth = sparse_params(t, *parse_choice("topk:410q4-noef"));
  EXPECT_EQ(tenth.k, 410u);
  EXPECT_EQ(tenth.bits, 4u);
  const auto plain = sparse_params(t, *parse_choice("topk:100"));
  EXPECT_EQ(plain.k, 100u);
  EXPECT_EQ(plain.bits, 2u);
  EXPECT_EQ(sparse_params(t).k, 64u);
}

TEST(ErrorFeedback, ARoundsChoiceSetsTheCodesBits) {
  TopkConfig t;
  t.chunk = 8;
  t.k = 8;
  t.bits = 1;  // two levels a chunk
  t.error_feedback = 0.0;
  const std::vector<float> delta = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto mean_of = [&](const CodecChoice& c) {
    ErrorFeedback fb(t, {delta.size()}, 1);
    const auto code = fb.encode(0, 0, delta, c);
    EXPECT_EQ(code.size(), fb.bytes(0, c)) << c.name();
    std::vector<float> got(delta.size(), 0.0f);
    fb.mean(0, std::vector<std::span<const std::uint8_t>>{code}, got, {}, c);
    return got;
  };
  const auto coarse = mean_of(*parse_choice("topk:8"));
  const auto fine = mean_of(*parse_choice("topk:8q8"));
  std::set<float> levels(coarse.begin(), coarse.end());
  EXPECT_EQ(levels.size(), 2u) << "the job's 1 bit: two levels";
  for (size_t i = 0; i < delta.size(); ++i) EXPECT_NEAR(fine[i], delta[i], 0.05) << i;
}

TEST(ErrorFeedback, ARungWithoutFeedbackSendsDeltasOwnCodeAndLeavesTheBuffer) {
  TopkConfig t;
  t.chunk = 4;
  t.k = 1;
  t.bits = 8;
  t.error_feedback = 1.0;
  ErrorFeedback fb(t, {4}, 1);
  const auto decoded = [&](const std::vector<std::uint8_t>& code, const CodecChoice& c) {
    std::vector<float> got(4, 0.0f);
    fb.mean(0, std::vector<std::span<const std::uint8_t>>{code}, got, {}, c);
    return got;
  };
  // A topk:1 round leaves (0, 0, 3, 0) of (0, 0, 3, 9) in the buffer.
  EXPECT_EQ(decoded(fb.encode(0, 0, std::vector<float>{0, 0, 3, 9}), {}),
            (std::vector<float>{0, 0, 0, 9}));
  // Without feedback, k 2 of Δ = (5, 0, 0, 1) sends 5 and 1, not the buffer's 3 added in...
  const CodecChoice raw = *parse_choice("topk:2-noef");
  EXPECT_EQ(decoded(fb.encode(0, 0, std::vector<float>{5, 0, 0, 1}, raw), raw),
            (std::vector<float>{5, 0, 0, 1}));
  // ...and the buffer still holds the 3 for the next topk round.
  EXPECT_EQ(decoded(fb.encode(0, 0, std::vector<float>{0, 0, 0, 0}), {}),
            (std::vector<float>{0, 0, 3, 0}));
}

TEST(CodecLadder, LeastLossyFirstAndTopkOnlyWhereTheJobCanRunIt) {
  const auto names = [](const JobConfig& cfg) {
    std::vector<std::string> out;
    for (const auto& c : codec_ladder(cfg)) out.push_back(c.name());
    return out;
  };
  EXPECT_EQ(names(job("auto")),
            (std::vector<std::string>{"fp32", "bf16", "int8", "topk:410q4-noef", "topk:64"}));
  // Where k (64) is a tenth of a chunk or more, one sparse rung: k.
  EXPECT_EQ(names(job("{kind: auto, chunk: 256}")),
            (std::vector<std::string>{"fp32", "bf16", "int8", "topk:64"}));
  // Among 4 members each rung sends fewer bytes than the one before.
  const JobConfig cfg = job("auto");
  const auto ladder = codec_ladder(cfg);
  for (size_t i = 1; i < ladder.size(); ++i)
    EXPECT_LT(choice_bytes(ladder[i], 6'400'000, 4, cfg.topk),
              choice_bytes(ladder[i - 1], 6'400'000, 4, cfg.topk))
        << ladder[i].name();
  // Among 12, the tenth's code to each of 11 others sends more than int8's butterfly.
  EXPECT_GT(choice_bytes(ladder[3], 6'400'000, 12, cfg.topk),
            choice_bytes(ladder[2], 6'400'000, 12, cfg.topk));
  EXPECT_EQ(codec_ladder(job("{kind: auto, sparse: false}")).size(), 3u);
  // inner.budget: time weighs Δ by tokens, which topk's error feedback does not carry.
  JobConfig timed = job("auto");
  timed.inner.budget = InnerBudget::time;
  EXPECT_EQ(codec_ladder(timed).size(), 3u);
  EXPECT_FALSE(timed.keeps_feedback());
  EXPECT_TRUE(job("auto").keeps_feedback());
}

TEST(CodecPlanner, BlockingKeepsFp32OnAFastLinkAndFallsAtOnceOnASlowOne) {
  const JobConfig cfg = job("auto");
  CodecPlanner p(cfg, 6'400'000);
  // Round 0: nothing measured yet: the start codec.
  auto d = p.decide(0, std::nullopt, 4);
  EXPECT_EQ(d.to.name(), "fp32");
  EXPECT_FALSE(d.changed());
  // 12 steps of 1.5 s: a 3 % share is 0.56 s. fp32's 38.4 MB per member at 10 Gbit/s: 0.03 s.
  d = p.decide(1, at(10'000, 1.5), 4);
  EXPECT_EQ(d.to.name(), "fp32");
  EXPECT_NEAR(p.window(1.5), 0.03 / 0.97 * 18, 1e-9);
  // At 100 Mbit/s: fp32 3.1 s, bf16 1.5 s, int8 0.77 s do not fit; a tenth at 4 bits (4.2 MB,
  // 0.33 s) does.
  d = p.decide(2, at(100, 1.5), 4);
  EXPECT_TRUE(d.changed());
  EXPECT_EQ(d.from.name(), "fp32");
  EXPECT_EQ(d.to.name(), "topk:410q4-noef");
  EXPECT_EQ(d.reason.find("38.4 MB at 100.0 Mbit/s would take 3.07 s, the window is 0.56 s"),
            0u)
      << d.reason;
  EXPECT_NE(d.reason.find("would take"),
            std::string::npos)
      << d.reason;
  // Slower than anything fits: the lossiest rung, and the reason says so.
  CodecPlanner q(cfg, 6'400'000);
  d = q.decide(1, at(0.1, 1.5), 4);
  EXPECT_EQ(d.to.name(), "topk:64");
  EXPECT_NE(d.reason.find("none fits"), std::string::npos) << d.reason;
}

TEST(CodecPlanner, ASmallExchangeIsProbedAboveAndAFailedProbeWaitsTwiceAsLong) {
  const JobConfig cfg = job("{kind: auto, start: topk:64, patience: 1}");
  CodecPlanner p(cfg, 6'400'000);
  const std::uint64_t tenth =
      choice_bytes(*parse_choice("topk:410q4-noef"), 6'400'000, 4, cfg.topk);
  // topk's 0.6 MB in 1 s: 4.8 Mbit/s, at which the tenth (4.2 MB) would take 7 s, far past the
  // 0.56 s window; but so small an exchange is mostly latency: the next round probes the rung
  // above.
  const LinkSample small{600'000, 1.0, 1.5};
  auto d = p.decide(1, small, 4);
  EXPECT_EQ(d.to.name(), "topk:410q4-noef");
  EXPECT_NE(d.reason.find("a probe"), std::string::npos) << d.reason;
  // The tenth measured at 4.8 Mbit/s: it does not fit; back down, and the next probe waits 2
  // rounds.
  d = p.decide(2, LinkSample{tenth, double(tenth) / 600'000, 1.5}, 4);
  EXPECT_EQ(d.to.name(), "topk:64");
  EXPECT_EQ(p.decide(3, small, 4).to.name(), "topk:64");
  EXPECT_EQ(p.decide(4, small, 4).to.name(), "topk:410q4-noef");
  // Rounds are sent one ahead in streaming: the decision after a probe may still see the small
  // exchange of the round before it, which cannot show that the probe's rung does not fit: kept.
  EXPECT_EQ(p.decide(5, small, 4).to.name(), "topk:410q4-noef");
  // This time it fits (the link came back): it stays, and climbs from there as measured.
  d = p.decide(6, at(1000, 1.5, tenth), 4);
  EXPECT_NE(d.to.name(), "topk:64");
}

TEST(CodecPlanner, ARungThatSendsMoreThanOneAboveItIsPassedOverBothWays) {
  // Among 12 members the tenth's code (to each of 11 others) sends more than int8's butterfly:
  // where int8 does not fit, neither does the tenth, and a climb from topk:64 goes to int8
  // without stopping at the tenth.
  const JobConfig cfg = job("{kind: auto, patience: 1, margin: 1.0}");
  const auto bytes = [&](const char* c) {
    return double(choice_bytes(*parse_choice(c), 6'400'000, 12, cfg.topk));
  };
  ASSERT_GT(bytes("topk:410q4-noef"), bytes("int8"));
  CodecPlanner p(cfg, 6'400'000);
  // A rate at which int8 takes twice the 0.56 s window (12 steps of 1.5 s, a 3 % share).
  const double win = p.window(1.5);
  const double slow = bytes("int8") / (2 * win);
  auto d = p.decide(1, LinkSample{20'000'000, 20'000'000 / slow, 1.5}, 12);
  EXPECT_EQ(d.to.name(), "topk:64");
  // Then a rate at which int8 fits and the tenth does not.
  const double mid = (bytes("int8") + bytes("topk:410q4-noef")) / 2 / win;
  d = p.decide(2, LinkSample{20'000'000, 20'000'000 / mid, 1.5}, 12);
  EXPECT_EQ(d.to.name(), "int8") << d.reason;
}

TEST(CodecPlanner, ClimbsOnlyAfterPatienceRoundsWithinTheMargin) {
  JobConfig cfg = job("{kind: auto, patience: 2, margin: 0.7, start: int8}");
  CodecPlanner p(cfg, 6'400'000);
  EXPECT_EQ(p.current().name(), "int8");
  // Streaming-like window: blocking with a 3 % share of 12 × 10 s steps is 3.7 s; fp32 at 1 Gbit/s
  // takes 0.31 s, well within 0.7 of it.
  auto d = p.decide(1, at(1000, 10), 4);
  EXPECT_FALSE(d.changed()) << "one round is not enough";
  d = p.decide(2, at(1000, 10), 4);
  EXPECT_TRUE(d.changed());
  EXPECT_EQ(d.to.name(), "fp32") << "as far up as fits, not one rung";
  // A link that flaps between fitting and not: it goes down each time it does not fit, and never
  // climbs, since the fitting rounds are never two in a row.
  CodecPlanner q(cfg, 6'400'000);
  std::vector<std::string> seen;
  for (int r = 1; r <= 8; ++r) {
    // At 30 Mbit/s int8 (2.6 s) still fits the 3.7 s window, and bf16 (5.1 s) does not; at
    // 1 Gbit/s everything does.
    const LinkSample s = r % 2 ? at(1000, 10) : at(30, 10);
    seen.push_back(q.decide(r, s, 4).to.name());
  }
  EXPECT_EQ(seen, std::vector<std::string>(8, "int8"));
}

TEST(CodecPlanner, TheStreamingWindowIsTheOverlapOrTheFragmentIntervalWhicheverIsShorter) {
  const JobConfig cfg =
      job("auto", "{mode: streaming, fragments: 4, overlap_steps: 2, mix: 0.5}");
  CodecPlanner p(cfg, 1'600'000);
  EXPECT_DOUBLE_EQ(p.window(1.5), 2 * 1.5);
  const JobConfig wide =
      job("auto", "{mode: streaming, fragments: 4, overlap_steps: 5, mix: 0.5}");
  EXPECT_DOUBLE_EQ(CodecPlanner(wide, 1'600'000).window(1.5), 3 * 1.5);  // H/P = 3 steps
  // A fragment of 1.6 M values at 20 Mbit/s: fp32 (9.6 MB) takes 3.8 s, more than the 3 s;
  // bf16 1.9 s fits. At 10 Mbit/s bf16 takes 3.8 s too, and int8 (~2.4 MB) 1.9 s.
  EXPECT_EQ(p.decide(1, at(20, 1.5), 4).to.name(), "bf16");
  EXPECT_EQ(p.decide(2, at(10, 1.5), 4).to.name(), "int8");
}

TEST(CodecPlanner, ResumesAtTheRungOfACheckpointsCodec) {
  CodecPlanner p(job("auto"), 6'400'000);
  p.resume(*parse_choice("topk:64"));
  EXPECT_EQ(p.current().name(), "topk:64");
  p.resume(*parse_choice("topk:256"));  // not a rung: the first that sends no more
  EXPECT_EQ(p.current().name(), "topk:64");
  p.resume(*parse_choice("fp16"));  // not a rung: the one that sends as few bytes
  EXPECT_EQ(p.current().name(), "bf16");
}

TEST(CodecTrace, ReadsAJobsMetricsOrOneNameALineAndNamesABadLine) {
  EXPECT_EQ(read_codec_trace("fp32\nint8\n\ntopk:64\n"),
            (std::vector<std::string>{"fp32", "int8", "topk:64"}));
  const std::string metrics =
      R"({"round":0,"val_loss":5.1})" "\n"
      R"({"round":1,"codec":"fp32","codec_reason":"x"})" "\n"
      R"({"round":2,"codec":"int8"})" "\n"
      R"({"round":4,"codec":"topk:64"})" "\n";
  EXPECT_EQ(read_codec_trace(metrics),
            (std::vector<std::string>{"fp32", "int8", "int8", "topk:64"}));
  try {
    read_codec_trace("fp32\nint4\n");
    FAIL() << "int4 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_codec_trace(R"({"round":"1","codec":"fp32"})"), std::invalid_argument);
  EXPECT_THROW(read_codec_trace(R"({"round":99999999999,"codec":"fp32"})"),
               std::invalid_argument);
  EXPECT_THROW(read_codec_trace("{not json"), std::invalid_argument);
  EXPECT_THROW(read_codec_trace("\n\n"), std::invalid_argument);
}

TEST(CodecTrace, ReadsTheFragmentsCodecsOfAJobsMetricsALaterLineWinning) {
  const std::string metrics =
      R"({"round":0,"val_loss":5.1})"
      "\n"
      R"({"round":1,"codec":"fp32","fragment_codecs":[{"round":1,"fragment":0,"codec":"fp32"},)"
      R"({"round":1,"fragment":1,"codec":"int8"}]})"
      "\n"
      R"({"round":2,"codec":"fp32","fragment_codecs":[{"round":1,"fragment":1,"codec":"bf16"},)"
      R"({"round":2,"fragment":0,"codec":"topk:64"}]})"
      "\n";
  const FragmentCodecTrace t = read_fragment_codec_trace(metrics);
  EXPECT_EQ(t, (FragmentCodecTrace{{{0, 0}, "fp32"}, {{0, 1}, "bf16"}, {{1, 0}, "topk:64"}}));
  EXPECT_TRUE(read_fragment_codec_trace("fp32\nint8\n").empty());
  for (const char* bad :
       {R"({"round":1,"fragment_codecs":[{"round":1,"fragment":-1,"codec":"fp32"}]})",
        R"({"round":1,"fragment_codecs":[{"round":0,"fragment":0,"codec":"fp32"}]})",
        R"({"round":1,"fragment_codecs":[{"round":1,"fragment":0,"codec":"int4"}]})",
        R"({"round":1,"fragment_codecs":[[1,0,"fp32"]]})",
        R"({"round":1,"fragment_codecs":{"round":1}})", R"({"fragment_codecs": [)"}) {
    try {
      read_fragment_codec_trace(std::string("{\"round\":0}\n") + bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
  }
}

std::vector<std::uint8_t> proposal(std::uint8_t rung, std::uint8_t current, float rate) {
  CodecProposal p;
  p.rung = rung;
  p.current = current;
  p.rate = rate;
  p.window = 3;
  return encode_proposal(p);
}

TEST(FragmentCodecs, TheMembersAgreeOnTheLeastLossyProposalAndAHostileOneAbstains) {
  constexpr std::size_t kRungs = 5;
  constexpr std::uint8_t kNone = CodecProposal::kAbstain;
  const auto back = decode_proposal(proposal(3, 2, 6.25e5f), kRungs);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rung, 3);
  EXPECT_EQ(back->current, 2);
  EXPECT_FLOAT_EQ(back->rate, 6.25e5f);
  EXPECT_FLOAT_EQ(back->window, 3.0f);
  // The least lossy proposal, with its proposer's reading; one that measured nothing abstains.
  std::vector<std::vector<std::uint8_t>> all = {proposal(3, 3, 6e5f), proposal(1, 1, 2e6f),
                                                proposal(kNone, 0, 0)};
  CodecAgreement a = agree_codec(all, kRungs);
  EXPECT_EQ(a.rung, 1);
  EXPECT_EQ(a.proposer, 1);
  EXPECT_FLOAT_EQ(a.reading.rate, 2e6f);
  // Nobody proposes: the least lossy rung any of them stands at.
  a = agree_codec(
      std::vector<std::vector<std::uint8_t>>{proposal(kNone, 4, 0), proposal(kNone, 2, 0)}, kRungs);
  EXPECT_EQ(a.rung, 2);
  EXPECT_EQ(a.proposer, -1);
  // Bytes that are not a proposal count as abstaining: too short, a rung past the ladder, a rung
  // they stand at past it, a rate that is not a number or negative.
  const std::vector<std::vector<std::uint8_t>> hostile = {
      {1, 2, 3},          proposal(7, 0, 1),
      proposal(0, 9, 1),  proposal(0, 0, std::nanf("")),
      proposal(0, 0, -1), std::vector<std::uint8_t>(64, 0)};
  for (const auto& h : hostile) EXPECT_FALSE(decode_proposal(h, kRungs));
  std::vector<std::uint8_t> flag = proposal(0, 0, 1);
  flag[kProposalBytes - 1] = 2;  // the probe byte is 0 or 1
  EXPECT_FALSE(decode_proposal(flag, kRungs));
  all = hostile;
  all.push_back(proposal(4, 4, 1e5f));
  a = agree_codec(all, kRungs);
  EXPECT_EQ(a.rung, 4);
  EXPECT_EQ(a.proposer, int(hostile.size()));
  EXPECT_THROW(agree_codec(hostile, kRungs), std::invalid_argument);
  // A retry without a lost member: a survivor that agreed proposes that rung, one that never
  // heard every proposal its own, which was no less lossy: they agree on the same rung again.
  all = {proposal(2, 2, 1e6f), proposal(1, 1, 2e6f), proposal(3, 3, 5e5f)};
  ASSERT_EQ(agree_codec(all, kRungs).rung, 1);
  const std::vector<std::vector<std::uint8_t>> retry = {proposal(1, 1, 0), proposal(3, 3, 5e5f)};
  EXPECT_EQ(agree_codec(retry, kRungs).rung, 1);
}

TEST(FragmentCodecPlanner, ProposesFromItsLastOperationOnceAndClimbsAfterARoundsWorth) {
  // Four fragments of 1.6 M values, a 2-step window of 1.5 s steps (3 s), patience 1 round.
  const JobConfig cfg = job("{kind: auto, start: fp32, margin: 0.7, patience: 1}",
                            "{mode: streaming, fragments: 4, overlap_steps: 2, mix: 0.5}");
  FragmentCodecPlanner p(cfg, 1'600'000);
  const auto& ladder = p.planner().ladder();
  // Nothing measured: it abstains, standing at the start.
  CodecProposal q = p.propose(4, 1.5);
  EXPECT_EQ(q.rung, CodecProposal::kAbstain);
  EXPECT_EQ(q.current, 0);
  // fp32's 9.6 MB at 5 Mbit/s took 15.4 s: down at once, to a sparse rung (int8's 2.4 MB
  // would take 3.8 s).
  p.measured(9'600'000, 9.6e6 * 8 / 5e6);
  q = p.propose(4, 1.5);
  ASSERT_NE(q.rung, CodecProposal::kAbstain);
  EXPECT_TRUE(ladder[q.rung].sparse()) << ladder[q.rung].name();
  EXPECT_NEAR(q.rate, 625'000, 1);
  EXPECT_FLOAT_EQ(q.window, 3.0f);
  const std::uint8_t low = q.rung;
  p.agreed(low);
  // A reading is used once.
  EXPECT_EQ(p.propose(4, 1.5).rung, CodecProposal::kAbstain);
  // The link back at 1 Gbit/s (2 MB in 16 ms): fp32 fits, taken after four operations in a row
  // (a round's worth of fragments), not at the first.
  for (int i = 0; i < 3; ++i) {
    p.measured(2'000'000, 0.016);
    EXPECT_EQ(p.propose(4, 1.5).rung, low) << "operation " << i;
  }
  p.measured(2'000'000, 0.016);
  EXPECT_EQ(p.propose(4, 1.5).rung, 0);
  // Agreed elsewhere: it stands there, and a seed no longer moves a planner that measured.
  p.agreed(2);
  p.seed(*parse_choice("fp32"));
  EXPECT_EQ(p.planner().rung(), 2);
  FragmentCodecPlanner fresh(cfg, 1'600'000);
  fresh.seed(*parse_choice("int8"));
  EXPECT_EQ(fresh.propose(4, 1.5).current, 2);
  // Small exchanges (under 1 MB) say little of the link: int8's 150 kB in 2 s fits the 3 s
  // window and bf16's predicted 4 s does not, so the planner stays, and after a round's worth
  // of operations it probes bf16, saying so in its proposal.
  FragmentCodecPlanner small(cfg, 100'000);
  small.seed(*parse_choice("int8"));
  std::vector<CodecProposal> seen;
  for (int i = 0; i < 4; ++i) {
    small.measured(150'000, 2.0);
    seen.push_back(small.propose(4, 1.5));
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(seen[i].rung, 2) << "operation " << i;
  EXPECT_EQ(seen[3].rung, 1);
  EXPECT_TRUE(seen[3].probe);
  EXPECT_FALSE(seen[2].probe);
}

TEST(Config, AutoCompressionParsesValidatesAndRoundTrips) {
  const JobConfig a = job("auto");
  EXPECT_TRUE(a.autocodec.on);
  EXPECT_FALSE(a.topk.on);
  EXPECT_EQ(a.topk.outer, OuterRule::nesterov) << "the job's outer step under every rung";
  EXPECT_EQ(a.outer_step().momentum, a.outer.momentum);
  EXPECT_FALSE(a.autocodec.flush) << "keep: the measured better choice (decision 0052)";
  const JobConfig b = job(
      "{kind: auto, share: 0.05, margin: 0.5, patience: 3, sparse: true, start: topk:256, "
      "feedback: flush, chunk: 2048, bits: 3, error_feedback: 0.9}");
  EXPECT_DOUBLE_EQ(b.autocodec.share, 0.05);
  EXPECT_DOUBLE_EQ(b.autocodec.margin, 0.5);
  EXPECT_EQ(b.autocodec.patience, 3);
  EXPECT_EQ(b.autocodec.start, "topk:256");
  EXPECT_TRUE(b.autocodec.flush);
  EXPECT_EQ(b.topk.chunk, 2048);
  const JobConfig again = JobConfig::from_yaml(b.to_yaml());
  EXPECT_EQ(again.autocodec.start, "topk:256");
  EXPECT_TRUE(again.autocodec.flush);
  EXPECT_EQ(again.topk.bits, 3);
  EXPECT_NE(b.compression_name().find("auto"), std::string::npos);
  const auto refused = [](const std::string& c) {
    try {
      job(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused("{kind: auto, k: 64}").find("compression.k: not a field of kind 'auto'"),
            std::string::npos);
  EXPECT_NE(refused("{kind: topk, share: 0.1}").find("compression.share"), std::string::npos);
  EXPECT_NE(refused("{kind: auto, share: 1.5}").find("compression.share"), std::string::npos);
  EXPECT_NE(refused("{kind: auto, start: int4}").find("compression.start"), std::string::npos);
  EXPECT_NE(refused("{kind: auto, start: topk:9999999}").find("compression.start"),
            std::string::npos);
  EXPECT_NE(refused("{kind: auto, feedback: drop}").find("compression.feedback"),
            std::string::npos);
  EXPECT_NE(refused("{kind: auto, sparse: false, start: topk:64}").find("topk rungs"),
            std::string::npos);
  EXPECT_NE(refused("int4").find("compression: expected one of fp32|fp16|bf16|int8|topk|auto"),
            std::string::npos);
  EXPECT_NE(refused("{kind: int4}").find("compression.kind: expected one of"), std::string::npos);
  // `compression: topk` alone: the sparse codec with its defaults.
  const JobConfig t = job("topk");
  EXPECT_TRUE(t.topk.on);
  EXPECT_EQ(t.topk.k, 64);
}

TEST(ErrorFeedbackDense, FlushSendsWhatTopkLeftAndEmptiesTheBufferKeepSendsDeltaAlone) {
  TopkConfig t;
  t.chunk = 8;
  t.k = 2;
  t.bits = 8;
  t.error_feedback = 0.5;
  const std::vector<float> delta = {1, -2, 3, -4, 5, -6, 7, -8};
  for (bool flush : {true, false}) {
    ErrorFeedback fb(t, {delta.size()}, 1);
    // A topk round: the two largest go, the rest stays in the buffer.
    const auto code = fb.encode(0, 0, delta);
    std::vector<float> sent(delta.size(), 0.0f);
    fb.mean(0, std::vector<std::span<const std::uint8_t>>{code}, sent);
    std::vector<float> out(delta.size());
    fb.dense(0, 0, delta, out, flush);
    for (size_t i = 0; i < delta.size(); ++i) {
      const float left = delta[i] - sent[i];  // what the topk round did not send
      EXPECT_FLOAT_EQ(out[i], flush ? 0.5f * left + delta[i] : delta[i]) << i;
    }
    // Then a topk round of zeros sends what the buffer still holds: nothing after a flush.
    const std::vector<float> zero(delta.size(), 0.0f);
    const auto next = fb.encode(0, 0, zero);
    std::vector<float> got(delta.size(), 0.0f);
    fb.mean(0, std::vector<std::span<const std::uint8_t>>{next}, got);
    float norm = 0;
    for (float g : got) norm += std::fabs(g);
    if (flush)
      EXPECT_EQ(norm, 0.0f);
    else
      EXPECT_GT(norm, 0.0f);
  }
  // A Δ that is not finite is passed on as it is, the buffer untouched.
  ErrorFeedback fb(t, {delta.size()}, 1);
  std::vector<float> bad = delta;
  bad[3] = NAN;
  std::vector<float> out(delta.size());
  fb.dense(0, 0, bad, out, true);
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_FLOAT_EQ(out[0], delta[0]);
}

TEST(DeltaAverager, ADenseRoundWithFeedbackAveragesTheFlushedDeltasUnderTheRoundsCodec) {
  TopkConfig t;
  t.chunk = 4;
  t.k = 1;
  t.bits = 8;
  t.error_feedback = 1.0;
  t.mean = SparseMean::members;
  const size_t n = 4, members = 2;
  ErrorFeedback fb(t, {n}, members);
  LocalMembers group(members, {});
  std::vector<std::vector<float>> d = {{1, 2, 3, 4}, {4, 3, 2, 1}};
  std::vector<std::vector<float>> means(members, std::vector<float>(n));
  const auto run = [&](CodecChoice c) {
    DeltaAverager policy(GuardConfig{false}, &fb, c, true);
    const std::vector<std::span<const float>> in(d.begin(), d.end());
    const auto sent = policy.prepare(0, in);
    const auto judged = policy.judge(group, 1, 0, sent);
    const std::vector<std::span<float>> out(means.begin(), means.end());
    policy.reduce(group, 1, 0, judged, judged.left_out(), in, out);
  };
  run(*parse_choice("topk:1"));  // member 0 sends its 4, member 1 its 4: mean (2, 0, 0, 2)
  EXPECT_EQ(means[0], (std::vector<float>{2, 0, 0, 2}));
  run(*parse_choice("fp32"));  // each sends Δ + what it kept: (2,4,6,4) and (4,6,4,2)
  EXPECT_EQ(means[0], (std::vector<float>{3, 5, 5, 3}));
  EXPECT_EQ(means[1], means[0]);
}

}  // namespace
