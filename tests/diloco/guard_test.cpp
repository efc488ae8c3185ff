// The guard's rule (diloco/round/guard.hpp) on synthetic pseudo-gradients: honest members share a
// direction plus their own noise, as DiLoCo workers on different shards of one corpus do; a
// faulty one is what guard::corrupt makes of an honest one. Torch-free.
#include "diloco/round/guard.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace loco::diloco::guard {
namespace {

constexpr std::size_t kN = 20000;

// K honest Δ: a common direction (weight `shared`) plus independent noise, each of norm ~1.
std::vector<std::vector<float>> honest(int k, double shared, std::uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<double> common(kN);
  for (double& c : common) c = z(rng);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(k), std::vector<float>(kN));
  const double own = std::sqrt(1 - shared * shared);
  for (auto& d : out)
    for (std::size_t i = 0; i < kN; ++i)
      d[i] = static_cast<float>((shared * common[i] + own * z(rng)) / std::sqrt(double(kN)));
  return out;
}

std::vector<Verdict> judged(const std::vector<std::vector<float>>& deltas,
                            const GuardConfig& cfg = {}) {
  std::vector<Summary> s;
  for (const auto& d : deltas) s.push_back(summarize(d, static_cast<std::size_t>(cfg.sketch)));
  return judge(facts_of(s), cfg);
}

std::vector<std::string> rules(const std::vector<Verdict>& v) {
  std::vector<std::string> out;
  for (const auto& x : v) out.push_back(x.left_out ? x.rule : "");
  return out;
}

TEST(Guard, HonestMembersAreAllAveraged) {
  for (double shared : {0.2, 0.5, 0.9})
    for (int k : {2, 3, 4, 8}) {
      const auto v = judged(honest(k, shared, 7 + std::uint64_t(k)));
      for (const auto& x : v) EXPECT_FALSE(x.left_out) << "K " << k << " shared " << shared << ": " << x.why;
    }
}

TEST(Guard, EachFaultIsLeftOutByItsRule) {
  const struct {
    Fault fault;
    const char* rule;
  } cases[] = {{Fault::nan, "non-finite"}, {Fault::scale, "norm"}, {Fault::flip, "direction"}};
  for (const auto& c : cases) {
    auto d = honest(4, 0.5);
    corrupt(d[2], c.fault, 3);
    const auto r = rules(judged(d));
    EXPECT_EQ(r, (std::vector<std::string>{"", "", c.rule, ""})) << c.rule;
  }
}

TEST(Guard, NoiseOfAnHonestNormIsKeptAndAnUnalignedHonestMemberToo) {
  // Noise agrees about zero with everyone, however well the honest members agree: not opposed,
  // it is kept (the direction rule leaves out what pushes against the others).
  for (double shared : {0.0, 0.5, 0.9}) {
    auto d = honest(4, shared);
    corrupt(d[1], Fault::noise, 5);
    const auto v = judged(d);
    for (const auto& x : v) EXPECT_FALSE(x.left_out) << shared << ": " << x.why;
    EXPECT_LT(std::abs(v[1].agreement), 0.1);
  }
  // An honest member that shares nothing with the others (agreement about 0) among members
  // that agree well is kept too; one that opposes them is not.
  auto d = honest(4, 0.8);
  d[3] = honest(1, 0.0, 99)[0];
  EXPECT_FALSE(judged(d)[3].left_out);
  corrupt(d[3], Fault::flip, 1);
  for (float& v : d[3]) v = 0.5f * v - 0.5f * d[0][&v - d[3].data()];
  EXPECT_EQ(judged(d)[3].rule, "direction");
}

TEST(Guard, FewerThanThreeMembersOnlyLoseNonFinite) {
  auto d = honest(2, 0.5);
  corrupt(d[1], Fault::scale, 1);
  EXPECT_EQ(rules(judged(d)), (std::vector<std::string>{"", ""}));
  corrupt(d[1], Fault::nan, 1);
  EXPECT_EQ(rules(judged(d)), (std::vector<std::string>{"", "non-finite"}));
}

TEST(Guard, TheNormBoundIsTheJobFilesRatio) {
  auto d = honest(5, 0.5);
  for (float& x : d[0]) x *= 2.5f;
  GuardConfig cfg;
  cfg.max_norm_ratio = 3;
  EXPECT_FALSE(judged(d, cfg)[0].left_out);
  cfg.max_norm_ratio = 2;
  const auto v = judged(d, cfg);
  EXPECT_EQ(v[0].rule, "norm");
  EXPECT_NEAR(v[0].norm_ratio, 2.5, 0.15);
  EXPECT_NE(v[0].why.find("x the median"), std::string::npos) << v[0].why;
}

TEST(Guard, OffLeavesNobodyOut) {
  auto d = honest(4, 0.5);
  corrupt(d[0], Fault::nan, 1);
  GuardConfig cfg;
  cfg.on = false;
  for (const auto& x : judged(d, cfg)) EXPECT_FALSE(x.left_out);
}

TEST(Guard, AZeroDeltaIsNotJudgedOnDirection) {
  // A joiner's first fragment: zero, of weight zero; the rule leaves it to the caller.
  auto d = honest(4, 0.5);
  std::fill(d[3].begin(), d[3].end(), 0.0f);
  for (const auto& x : judged(d)) EXPECT_FALSE(x.left_out) << x.why;
}

TEST(Guard, AbstainingMembersAreLeftOutAndNamed) {
  auto d = honest(4, 0.5);
  std::vector<Summary> s;
  for (const auto& x : d) s.push_back(summarize(x, 256));
  s[1] = abstaining(kN, 256);
  const auto v = judge(facts_of(s), GuardConfig{});
  EXPECT_EQ(rules(v), (std::vector<std::string>{"", "abstained", "", ""}));
}

TEST(Guard, SummariesRoundTripAndRefuseBadBytes) {
  const auto d = honest(1, 0.5)[0];
  const Summary s = summarize(d, 64);
  const auto bytes = encode(s);
  ASSERT_EQ(bytes.size(), encoded_bytes(64));
  const Summary back = decode(bytes, 64);
  EXPECT_EQ(back.norm, s.norm);
  EXPECT_EQ(back.sketch, s.sketch);
  EXPECT_TRUE(back.finite);
  // Wrong length (checked before anything is read), wrong magic, unknown flags.
  auto shorter = bytes;
  shorter.pop_back();
  EXPECT_THROW(decode(shorter, 64), SummaryError);
  EXPECT_THROW(decode(bytes, 63), SummaryError);
  auto bad = bytes;
  bad[0] = 'X';
  EXPECT_THROW(decode(bad, 64), SummaryError);
  bad = bytes;
  bad[5] |= 0x80;
  EXPECT_THROW(decode(bad, 64), SummaryError);
  // A "finite" summary that carries a NaN is a non-finite one.
  bad = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 20, &nan, 4);
  EXPECT_FALSE(decode(bad, 64).finite);
  // Malformed summaries leave their member out, named.
  std::vector<std::vector<std::uint8_t>> all(4, bytes);
  all[2] = shorter;
  const auto v = judge(facts_of(all, 64), GuardConfig{});
  EXPECT_EQ(v[2].rule, "malformed");
  EXPECT_NE(v[2].why.find("bytes"), std::string::npos) << v[2].why;
}

TEST(Guard, SketchIndicesAreSpreadAndTheSameEverywhere) {
  const auto a = sketch_indices(1000, 100);
  EXPECT_EQ(a, sketch_indices(1000, 100));
  ASSERT_EQ(a.size(), 100u);
  for (std::size_t j = 0; j < a.size(); ++j) {
    EXPECT_GE(a[j], j * 10);
    EXPECT_LT(a[j], (j + 1) * 10);
  }
  EXPECT_EQ(sketch_indices(5, 100).size(), 5u);
}

TEST(Guard, SparseCodesAreJudgedExactly) {
  collective::sparse::Params p;
  p.chunk = 1024;
  p.k = 64;
  auto d = honest(4, 0.8);
  corrupt(d[3], Fault::flip, 1);
  std::vector<std::vector<std::uint8_t>> codes;
  std::vector<float> sent(kN);
  for (const auto& x : d) codes.push_back(collective::sparse::encode(x, p, sent));
  codes[1].clear();  // abstains
  std::vector<std::span<const std::uint8_t>> views(codes.begin(), codes.end());
  const Facts f = sparse_facts(views, p, kN);
  // Judged on the entries both codes sent: the honest codes agree there far more than over
  // all of θ, and the noise is that of the entries shared.
  EXPECT_GT(f.cosine[0 * 4 + 2], 2 * f.gram[0 * 4 + 2] / std::sqrt(f.gram[0] * f.gram[2 * 4 + 2]));
  EXPECT_GT(f.noise, 3.0 / std::sqrt(20 * 64.0));
  EXPECT_LT(f.noise, 1.0);
  const auto v = judge(f, GuardConfig{});
  // With one abstaining, 3 remain: the flipped one disagrees with the other two.
  EXPECT_EQ(rules(v), (std::vector<std::string>{"", "abstained", "", "direction"}));
  // A code cut short is malformed, named by the codec's message.
  codes[1] = codes[0];
  codes[1].resize(codes[1].size() - 3);
  views.assign(codes.begin(), codes.end());
  EXPECT_EQ(judge(sparse_facts(views, p, kN), GuardConfig{})[1].rule, "malformed");
}

TEST(Guard, FaultsAreNamedAndDeterministic) {
  EXPECT_EQ(parse_fault("flip"), Fault::flip);
  EXPECT_THROW(parse_fault("zero"), std::invalid_argument);
  auto a = honest(1, 0.5)[0], b = a;
  corrupt(a, Fault::noise, 9);
  corrupt(b, Fault::noise, 9);
  EXPECT_EQ(a, b);
  const Summary before = summarize(honest(1, 0.5)[0], 16), after = summarize(a, 16);
  EXPECT_NEAR(after.norm, before.norm, 1e-3 * before.norm);
}

}  // namespace
}  // namespace loco::diloco::guard
