#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "diloco/averager.hpp"
#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "tests/diloco/test_corpus.hpp"

using namespace loco::diloco;

namespace {

const char* kJob = R"(
name: t
seed: 3
model: {layers: 2, width: 32, heads: 2, context: 16, tied_embeddings: true}
data: {dir: /tmp/x, tokenizer: byte, shards: 8, val_fraction: 0.05}
workers: {count: 2}
inner: {steps: 5, batch_size: 4, lr: 0.001, warmup: 2, weight_decay: 0.1, grad_clip: 1.0, grad_accum: 2, betas: [0.9, 0.95]}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
compression: int8
rounds: 3
checkpoint: {every: 1, dir: ck}
eval: {every: 5, batches: 2}
)";

std::string error_of(const std::string& yaml) {
  try {
    JobConfig::from_yaml(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(Config, ParsesEveryField) {
  const auto c = JobConfig::from_yaml(kJob);
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.model.d_model, 32);
  EXPECT_EQ(c.data.shards, 8);
  EXPECT_EQ(c.inner.grad_accum, 2);
  EXPECT_DOUBLE_EQ(c.inner.betas[1], 0.95);
  EXPECT_EQ(c.compression, Compression::int8);
  EXPECT_EQ(c.vocab_size(), 256);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  // to_yaml round-trips.
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.to_yaml(), c.to_yaml());
}

TEST(Config, RejectsBadValuesNamingTheField) {
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.001", "lr: -1")), "inner.lr: must be > 0, got -1");
  EXPECT_EQ(error_of(replace(kJob, "compression: int8", "compression: int4")),
            "compression: expected one of fp32|fp16|bf16|int8, got 'int4'");
  EXPECT_EQ(error_of(replace(kJob, "tokenizer: byte", "tokenizer: words")),
            "data.tokenizer: expected one of byte|bpe, got 'words'");
  EXPECT_NE(error_of(replace(kJob, "heads: 2", "heads: 3"))
                .find("model.heads: must be a divisor of model.d_model"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "grad_accum: 2", "grad_accum: 3")).find("inner.grad_accum"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "momentum: 0.9", "momentum: 1.5"))
                .find("outer.momentum: must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "layers: 2", "layrs: 2")).find("model.layrs: unknown field"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "steps: 5", "steps: many")).find("inner.steps: cannot read"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "rounds: 3", "rounds: 0")).find("rounds: must be > 0"),
            std::string::npos);
  EXPECT_EQ(error_of(kJob), "");
}

TEST(Compression, Int8ErrorIsBoundedByHalfAStepPerChunk) {
  std::vector<float> x(3 * kInt8ChunkElems + 17);
  std::uint64_t s = 1;
  for (auto& v : x) {
    s = splitmix64(s);
    v = static_cast<float>(static_cast<double>(s % 20001) / 10000.0 - 1.0) *
        (v == x[5] ? 100.f : 1.f);
  }
  x[5] = 50.f;  // one outlier: only its chunk gets a coarse scale
  auto y = x;
  codec_roundtrip(y, Compression::int8);
  for (std::size_t begin = 0; begin < x.size(); begin += kInt8ChunkElems) {
    const std::size_t end = std::min(x.size(), begin + kInt8ChunkElems);
    float amax = 0;
    for (std::size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (std::size_t i = begin; i < end; ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), amax / 127.f / 2.f * 1.0001f) << i;
  }
  auto z = y;  // decoding what was decoded changes nothing
  codec_roundtrip(z, Compression::int8);
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(z[i], y[i], 1e-6f * std::fabs(y[i]));
  EXPECT_EQ(wire_bytes(x.size(), Compression::int8), x.size() + 4 * 4);
}

TEST(Compression, HalfPrecisionEdgeCases) {
  std::vector<float> v = {1.0f,
                          1.0f / 3.0f,
                          65504.f,
                          65520.f,
                          std::ldexp(1.f, -24),
                          std::ldexp(1.f, -25),
                          std::ldexp(3.f, -25),
                          -2.5f};
  codec_roundtrip(v, Compression::fp16);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 0.333251953125f);
  EXPECT_EQ(v[2], 65504.f);
  EXPECT_TRUE(std::isinf(v[3]));
  EXPECT_EQ(v[4], std::ldexp(1.f, -24));
  EXPECT_EQ(v[5], 0.f);                   // tie to even
  EXPECT_EQ(v[6], std::ldexp(1.f, -23));  // tie to even
  EXPECT_EQ(v[7], -2.5f);
  std::vector<float> b = {1.0f + std::ldexp(1.f, -8), 1.0f + std::ldexp(3.f, -8)};
  codec_roundtrip(b, Compression::bf16);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + std::ldexp(1.f, -6));  // 1.5 ulp: tie to even
}

TEST(Averager, EveryMemberGetsTheSameMean) {
  LocalAverager avg;
  for (auto c : {Compression::fp32, Compression::fp16, Compression::bf16, Compression::int8}) {
    std::vector<std::vector<float>> bufs(3, std::vector<float>(5000));
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < 5000; ++i)
        bufs[k][i] = static_cast<float>(k + 1) * 0.01f * static_cast<float>(i % 7);
    std::vector<std::span<float>> spans(bufs.begin(), bufs.end());
    const auto stats = avg.average(spans, c);
    EXPECT_EQ(stats.members, 3);
    EXPECT_EQ(stats.bytes_sent, 2 * 2 * wire_bytes(5000, c) / 3);
    for (std::size_t i = 0; i < 5000; ++i) {
      ASSERT_EQ(bufs[1][i], bufs[0][i]);
      ASSERT_EQ(bufs[2][i], bufs[0][i]);
      ASSERT_NEAR(bufs[0][i], 0.02f * static_cast<float>(i % 7),
                  c == Compression::fp32 ? 1e-6 : 0.01);
    }
  }
}

TEST(Shards, DeterministicAndConfinedToTheirShards) {
  DataConfig d;
  d.dir = loco::diloco::testing::make_corpus_dir("shards");
  d.shards = 16;
  d.val_fraction = 0.1;
  const auto store = TokenStore::open(d);
  EXPECT_EQ(store.tokens().size(),
            std::filesystem::file_size(std::filesystem::path(d.dir) / "corpus" / "a.txt"));
  EXPECT_EQ(store.train_end(), store.tokens().size() - store.tokens().size() / 10);
  // Shards tile the training split.
  std::size_t covered = 0;
  for (int s = 0; s < 16; ++s) {
    const auto [b, e] = store.shard(s);
    EXPECT_EQ(b, covered);
    covered = e;
  }
  EXPECT_EQ(covered, store.train_end());

  const int ctx = 16, batch = 8;
  const auto mine = round_robin_shards(16, 1, 4);
  EXPECT_EQ(mine, (std::vector<int>{1, 5, 9, 13}));
  ShardSampler a(store, mine, ctx, 7, 1), b(store, mine, ctx, 7, 1), other(store, mine, ctx, 7, 2);
  std::vector<std::int64_t> xa(batch * (ctx + 1)), xb(xa.size()), xo(xa.size());
  std::vector<std::vector<std::int64_t>> history;
  for (int i = 0; i < 5; ++i) {
    a.next(batch, xa);
    b.next(batch, xb);
    other.next(batch, xo);
    EXPECT_EQ(xa, xb);
    EXPECT_NE(xa, xo);
    history.push_back(xa);
  }
  // The position is the whole state: rewinding replays the same batches.
  a.set_position(2);
  a.next(batch, xa);
  EXPECT_EQ(xa, history[2]);

  // Every window lies inside one of the worker's shards: find it in the token file.
  const auto tokens = store.tokens();
  ShardSampler c(store, mine, ctx, 7, 1);
  for (int i = 0; i < 20; ++i) {
    c.next(batch, xa);
    for (int w = 0; w < batch; ++w) {
      bool found = false;
      for (int s : mine) {
        const auto [sb, se] = store.shard(s);
        for (std::size_t p = sb; p + ctx + 1 <= se && !found; ++p) {
          bool eq = true;
          for (int j = 0; j <= ctx && eq; ++j) eq = tokens[p + j] == xa[w * (ctx + 1) + j];
          found = eq;
        }
      }
      ASSERT_TRUE(found) << "window " << w << " of batch " << i;
    }
  }

  // Validation windows come from the validation split only and are fixed.
  std::vector<std::int64_t> v1(4 * (ctx + 1)), v2(v1.size());
  validation_windows(store, ctx, 4, v1);
  validation_windows(store, ctx, 4, v2);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(v1[0], store.tokens()[store.train_end()]);
  remove_tree(d.dir);
}

TEST(Tokenizer, BpeTrainsOnTheCorpusAndRoundTrips) {
  DataConfig d;
  d.dir = loco::diloco::testing::make_corpus_dir("bpe", 60000);
  d.tokenizer = TokenizerKind::bpe;
  d.bpe_vocab = 400;
  const auto tok = make_tokenizer(d);
  EXPECT_EQ(tok->vocab_size(), 400);
  const std::string text = "in the beginning god created the heaven.\nand the earth was void.\n";
  const auto ids = tok->encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);  // merges happened
  EXPECT_EQ(tok->decode(ids), text);
  const auto store = TokenStore::open(d);  // tokenizes the corpus once
  EXPECT_GT(store.tokens().size(), 1000u);
  for (auto t : store.tokens().subspan(0, 1000)) ASSERT_LT(t, 400);
  remove_tree(d.dir);
}

// Every job file shipped in examples/ parses and validates.
TEST(Config, ExampleJobFilesAreValid) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(LOCO_SOURCE_DIR "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    JobConfig cfg = JobConfig::from_yaml_file(e.path().string());
    EXPECT_NO_THROW(cfg.validate());
    EXPECT_GT(cfg.total_rounds(), 0);
    ++n;
  }
  EXPECT_GE(n, 2);
}
