// compression: auto: the ladder, the planner's rule and hysteresis, the codec trace, the job
// file's fields, and what a dense round does with the error feedback (diloco/round/codec_plan.hpp).
#include <gtest/gtest.h>

#include <cmath>
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
  for (const char* n : {"fp32", "fp16", "bf16", "int8", "topk:1", "topk:64", "topk:65536"}) {
    const auto c = parse_choice(n);
    ASSERT_TRUE(c) << n;
    EXPECT_EQ(c->name(), n);
  }
  EXPECT_TRUE(parse_choice("topk:64")->sparse());
  EXPECT_FALSE(parse_choice("int8")->sparse());
  for (const char* n : {"", "int4", "topk", "topk:", "topk:0", "topk:65537", "topk:-1",
                        "topk:64x", "topk: 64", "TOPK:64", "topk:000000000000000064"})
    EXPECT_FALSE(parse_choice(n)) << n;
}

TEST(CodecLadder, LeastLossyFirstAndTopkOnlyWhereTheJobCanRunIt) {
  std::vector<std::string> names;
  for (const auto& c : codec_ladder(job("auto"))) names.push_back(c.name());
  EXPECT_EQ(names, (std::vector<std::string>{"fp32", "bf16", "int8", "topk:64"}));
  // Each rung sends fewer bytes than the one before.
  const JobConfig cfg = job("auto");
  const auto ladder = codec_ladder(cfg);
  for (size_t i = 1; i < ladder.size(); ++i)
    EXPECT_LT(choice_bytes(ladder[i], 6'400'000, 4, cfg.topk),
              choice_bytes(ladder[i - 1], 6'400'000, 4, cfg.topk))
        << ladder[i].name();
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
  // At 100 Mbit/s: fp32 3.1 s, bf16 1.5 s, int8 0.77 s do not fit; topk:64 (0.6 MB) does.
  d = p.decide(2, at(100, 1.5), 4);
  EXPECT_TRUE(d.changed());
  EXPECT_EQ(d.from.name(), "fp32");
  EXPECT_EQ(d.to.name(), "topk:64");
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
  CodecPlanner p(job("{kind: auto, start: topk:64, patience: 1}"), 6'400'000);
  // topk's 0.6 MB in 1 s: 4.8 Mbit/s, at which int8 (9.6 MB) would take 16 s, far past the
  // 0.56 s window; but so small an exchange is mostly latency: the next round probes int8.
  const LinkSample small{600'000, 1.0, 1.5};
  auto d = p.decide(1, small, 4);
  EXPECT_EQ(d.to.name(), "int8");
  EXPECT_NE(d.reason.find("a probe"), std::string::npos) << d.reason;
  // int8 measured at 4.8 Mbit/s: it does not fit; back down, and the next probe waits 2 rounds.
  d = p.decide(2, LinkSample{9'600'000, 16.0, 1.5}, 4);
  EXPECT_EQ(d.to.name(), "topk:64");
  EXPECT_EQ(p.decide(3, small, 4).to.name(), "topk:64");
  EXPECT_EQ(p.decide(4, small, 4).to.name(), "int8");
  // Rounds are sent one ahead in streaming: the decision after a probe may still see the small
  // exchange of the round before it, which cannot show that int8 does not fit: kept.
  EXPECT_EQ(p.decide(5, small, 4).to.name(), "int8");
  // This time int8 fits (the link came back): it stays, and climbs from there as measured.
  d = p.decide(6, at(1000, 1.5, 9'600'000), 4);
  EXPECT_NE(d.to.name(), "topk:64");
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
