// A worker's local ranks (diloco/round/local_group.hpp) as CPU ranks: threads of this process
// over c10d's Gloo backend and a HashStore, the interface that NCCL ranks use on GPUs.
#include "diloco/round/local_group.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "diloco/round/averager.hpp"
#include "diloco/round/simulator.hpp"
#include "diloco/round/trainer.hpp"
#include "tests/diloco/corpus_suite.hpp"
#include "tests/diloco/test_corpus.hpp"

using namespace loco::diloco;
using loco::collective::Codec;

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);

// Ranks as threads (diloco::on_ranks), with int indices.
void on_threads(int n, const std::function<void(int)>& fn) {
  on_ranks(static_cast<std::size_t>(n), [&](std::size_t i) { fn(static_cast<int>(i)); });
}

// The G ranks of one worker, joined concurrently (joining blocks until all have).
std::vector<std::unique_ptr<LocalGroup>> make_group(int g) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<LocalGroup>> ranks(static_cast<std::size_t>(g));
  on_threads(g, [&](int r) {
    ranks[static_cast<std::size_t>(r)] =
        std::make_unique<LocalGroup>(store, r, g, LocalBackend::gloo, kTimeout);
  });
  return ranks;
}

std::uint64_t hash_of(const torch::Tensor& t) { return tensor_hash(t.contiguous().cpu()); }

class LocalGroupTest : public loco::diloco::testing::CorpusSuite<LocalGroupTest> {
 public:
  static constexpr const char* kCorpus = "local-group";

 protected:
  static JobConfig small_job() {
    JobConfig c = loco::diloco::testing::small_job(*dir_);
    c.inner.steps = 3;
    c.inner.warmup = 2;
    c.rounds = 2;
    c.eval = EvalConfig{};  // the default evaluation
    c.validate();
    return c;
  }
};

TEST(LocalSlice, SlicesCoverTheVectorOnceOnVectorBoundaries) {
  for (const std::int64_t n : {0L, 1L, 63L, 64L, 1000L, 123457L})
    for (const int g : {1, 2, 3, 8}) {
      std::int64_t next = 0;
      for (int r = 0; r < g; ++r) {
        const Slice s = local_slice(n, r, g);
        EXPECT_EQ(s.begin, next) << n << " " << g << " " << r;
        EXPECT_LE(s.begin, s.end);
        if (s.end < n) {
          EXPECT_EQ(s.size() % 64, 0) << n << " " << g << " " << r;
        }
        next = s.end;
      }
      EXPECT_EQ(next, n) << n << " " << g;
    }
  EXPECT_EQ(local_slice(1000, 0, 1).size(), 1000);
  EXPECT_THROW(local_slice(10, 2, 2), std::invalid_argument);
}

TEST(LocalGroup, NcclWithoutTheBuildOrAGpuSaysSo) {
  if (nccl_compiled() && torch::cuda::is_available())
    GTEST_SKIP() << "NCCL and a GPU are here: diloco_gpu_test covers them";
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    LocalGroup g(store, 0, 1, LocalBackend::nccl, kTimeout);
    FAIL() << "made an NCCL group without NCCL or a GPU";
  } catch (const LocalGroupError& e) {
    const std::string want =
        nccl_compiled() ? "torch sees no CUDA device" : "this build has no NCCL";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// Every wait is bounded: a rank that never joins, or never calls the collective, makes
// the others throw LocalGroupError within the group's timeout instead of hanging.
TEST(LocalGroup, AMissingRankFailsTheOthersWithinTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    LocalGroup alone(c10::make_intrusive<c10d::HashStore>(), 0, 2, LocalBackend::gloo,
                     std::chrono::milliseconds(300));
    FAIL() << "joined a group of 2 alone";
  } catch (const LocalGroupError& e) {
    EXPECT_NE(std::string(e.what()).find("could not join"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));

  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<LocalGroup>> ranks(2);
  on_threads(2, [&](int r) {
    ranks[r] = std::make_unique<LocalGroup>(store, r, 2, LocalBackend::gloo,
                                            std::chrono::milliseconds(300));
  });
  auto x = torch::ones({100});
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_THROW(ranks[0]->allreduce_mean(x), LocalGroupError);  // rank 1 never calls it
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(20));
}

TEST(LocalGroup, AllreduceMeanAndGatherOverGlooThreads) {
  constexpr int g = 3;
  auto ranks = make_group(g);
  const std::int64_t n = 1000;  // three slices of 384, 384, 232
  std::vector<torch::Tensor> grads(g), thetas(g);
  on_threads(g, [&](int r) {
    auto& group = *ranks[static_cast<std::size_t>(r)];
    grads[r] = torch::arange(n, torch::kFloat32) * static_cast<float>(r + 1);
    group.allreduce_mean(grads[r]);
    thetas[r] = torch::full({n}, -1.0f);
    const Slice s = group.slice(n);
    thetas[r].slice(0, s.begin, s.end).copy_(torch::arange(s.begin, s.end, torch::kFloat32));
    group.all_gather_slices(thetas[r]);
  });
  const auto mean = torch::arange(n, torch::kFloat32) * 2.0f;  // (1 + 2 + 3) / 3
  for (int r = 0; r < g; ++r) {
    EXPECT_TRUE(torch::allclose(grads[r], mean, 1e-6, 0)) << r;
    EXPECT_EQ(hash_of(grads[r]), hash_of(grads[0])) << r;  // the same bytes on every rank
    EXPECT_TRUE(torch::equal(thetas[r], torch::arange(n, torch::kFloat32))) << r;
  }
}

// G ranks × B sequences are one rank's step on G · B: the same windows, the mean of the
// ranks' mean gradients. θ stays bit-identical across the ranks. Against one batch of
// G · B the gradients differ by summation order, which AdamW turns into |Δθ| ~ 1e-6 after
// four steps (on ~0 gradients); against G micro-batches of B, nothing differs.
TEST_F(LocalGroupTest, TwoRanksEqualOneRankWithTheWholeBatch) {
  const auto c = small_job();  // inner.batch_size 4: two ranks of 2
  const auto store = TokenStore::open(c.data);
  const std::vector<int> shards = {0, 1, 2, 3};
  constexpr int steps = 4;
  InnerTrainer whole(c, store, shards, 0, 10);
  const auto ref = whole.run_inner_steps(steps);

  auto ranks = make_group(2);
  std::vector<std::unique_ptr<InnerTrainer>> t(2);
  std::vector<InnerStats> stats(2);
  on_threads(2, [&](int r) {
    t[r] = std::make_unique<InnerTrainer>(c, store, shards, 0, 10, torch::kCPU, ranks[r].get());
    stats[r] = t[r]->run_inner_steps(steps);
  });
  EXPECT_EQ(hash_of(t[0]->flat_parameters()), hash_of(t[1]->flat_parameters()));
  const auto max_diff = [&](const InnerTrainer& a) {
    return (t[0]->flat_parameters() - a.flat_parameters()).abs().max().item<float>();
  };
  EXPECT_TRUE(torch::allclose(t[0]->flat_parameters(), whole.flat_parameters(), 1e-5, 1e-5))
      << "max |Δθ| " << max_diff(whole);
  auto c2 = c;
  c2.inner.grad_accum = 2;  // the ranks' own micro-batches, one after the other
  InnerTrainer accum(c2, store, shards, 0, 10);
  accum.run_inner_steps(steps);
  // Bit for bit: backward of loss / 2 halves every gradient exactly, so a/2 + b/2 is
  // (a + b) / 2, and Gloo's sum of two is a + b on both ranks.
  EXPECT_EQ(hash_of(t[0]->flat_parameters()), hash_of(accum.flat_parameters()))
      << "max |Δθ| " << max_diff(accum);
  EXPECT_NEAR(stats[0].mean_loss, ref.mean_loss, 1e-5);
  EXPECT_EQ(stats[0].mean_loss, stats[1].mean_loss);
  EXPECT_EQ(t[0]->step(), steps);
  EXPECT_EQ(t[0]->sampler().position(), whole.sampler().position());
}

// A one-rank group runs the group's code and computes what no group does, bit for bit,
// through the inner steps and the round's end.
TEST_F(LocalGroupTest, OneRankGroupEqualsNoGroupBitForBit) {
  const auto c = small_job();
  const auto store = TokenStore::open(c.data);
  const std::vector<int> shards = {0, 1, 2, 3};
  auto ranks = make_group(1);
  InnerTrainer plain(c, store, shards, 0, 10);
  InnerTrainer ranked(c, store, shards, 0, 10, torch::kCPU, ranks[0].get());
  OuterOptimizer plain_outer(c.outer, plain.flat_parameters());
  OuterOptimizer ranked_outer(c.outer, ranked.flat_parameters());
  const auto n = static_cast<std::size_t>(plain.parameter_count());
  std::vector<float> d1(n), d2(n);
  for (int round = 0; round < 2; ++round) {
    const auto a = plain.run_inner_steps(3), b = ranked.run_inner_steps(3);
    EXPECT_EQ(a.mean_loss, b.mean_loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    ASSERT_EQ(hash_of(plain.flat_parameters()), hash_of(ranked.flat_parameters())) << round;
    plain.pseudo_gradient(plain_outer.theta(), d1);
    plain_outer.step(d1);
    plain.load_parameters(plain_outer.theta());
    const Slice s = ranks[0]->slice(static_cast<std::int64_t>(n));
    ranked.pseudo_gradient(ranked_outer.theta(), {d2.data() + s.begin, std::size_t(s.size())},
                           s.begin);
    ranked_outer.step({d2.data() + s.begin, std::size_t(s.size())}, s.begin);
    ranked.gather_outer_state(ranked_outer, true);
    EXPECT_EQ(plain_outer.theta_hash(), ranked_outer.theta_hash()) << round;
    EXPECT_EQ(hash_of(plain.flat_parameters()), hash_of(ranked.flat_parameters())) << round;
  }
}

// K workers of G ranks each: every rank computes, averages and steps only its slice, then
// the ranks gather. With fp32, θ, the momentum and θ_local equal the unsliced round bit for
// bit. With a lossy codec the collective sums each part's owner's own values undecoded and
// the others' decoded; slices move the part owners, so the bits differ from the unsliced
// round's (by the codec's rounding), while every rank of every worker still agrees.
class SlicedRound : public LocalGroupTest, public ::testing::WithParamInterface<Codec> {};

TEST_P(SlicedRound, EqualsTheWholeRound) {
  auto c = small_job();
  c.outer = {.lr = 0.7, .momentum = 0.9, .nesterov = true};
  const Codec codec = GetParam();
  const auto store = TokenStore::open(c.data);
  constexpr int k = 2, g = 2;
  std::vector<std::vector<std::unique_ptr<LocalGroup>>> groups;
  for (int w = 0; w < k; ++w) groups.push_back(make_group(g));
  // trainers[w][r], outers[w][r]: rank r of worker w, each with its own outer replica.
  std::vector<std::vector<std::unique_ptr<InnerTrainer>>> trainers(k);
  std::vector<std::vector<std::unique_ptr<OuterOptimizer>>> outers(k);
  for (int w = 0; w < k; ++w) {
    trainers[w].resize(g);
    outers[w].resize(g);
  }
  on_threads(k * g, [&](int i) {
    const int w = i / g, r = i % g;
    trainers[w][r] = std::make_unique<InnerTrainer>(c, store, round_robin_shards(8, w, k), w, 10,
                                                    torch::kCPU, groups[w][r].get());
    outers[w][r] = std::make_unique<OuterOptimizer>(c.outer, trainers[w][r]->flat_parameters());
  });
  OuterOptimizer ref(c.outer, trainers[0][0]->flat_parameters());
  const auto n = trainers[0][0]->parameter_count();
  std::vector<std::vector<float>> deltas(k, std::vector<float>(static_cast<std::size_t>(n)));
  std::vector<std::vector<float>> ref_deltas = deltas;
  LocalAverager averager;
  for (int round = 0; round < 2; ++round) {
    on_threads(k * g, [&](int i) { trainers[i / g][i % g]->run_inner_steps(2); });
    // The unsliced round, from rank 0's θ_local of each worker (all its ranks hold the same).
    for (int w = 0; w < k; ++w) {
      ASSERT_EQ(hash_of(trainers[w][0]->flat_parameters()),
                hash_of(trainers[w][1]->flat_parameters()));
      trainers[w][0]->pseudo_gradient(ref.theta(), ref_deltas[w]);
    }
    std::vector<std::span<float>> whole(ref_deltas.begin(), ref_deltas.end());
    averager.average(whole, codec);
    ref.step(ref_deltas[0]);
    // The sliced round: rank r of every worker computes its slice of Δ ...
    on_threads(k * g, [&](int i) {
      const int w = i / g, r = i % g;
      const Slice s = groups[w][r]->slice(n);
      trainers[w][r]->pseudo_gradient(outers[w][r]->theta(),
                                      {deltas[w].data() + s.begin, std::size_t(s.size())}, s.begin);
    });
    // ... the rank-r slices are averaged across the workers (G butterflies) ...
    for (int r = 0; r < g; ++r) {
      const Slice s = local_slice(n, r, g);
      std::vector<std::span<float>> parts;
      for (int w = 0; w < k; ++w) parts.emplace_back(deltas[w].data() + s.begin, s.size());
      averager.average(parts, codec);
    }
    // ... each rank steps its slice, and the ranks gather.
    on_threads(k * g, [&](int i) {
      const int w = i / g, r = i % g;
      const Slice s = groups[w][r]->slice(n);
      outers[w][r]->step({deltas[w].data() + s.begin, std::size_t(s.size())}, s.begin);
      trainers[w][r]->gather_outer_state(*outers[w][r], true);
    });
    const auto& o = *outers[0][0];
    if (codec == Codec::fp32) {
      EXPECT_EQ(o.theta_hash(), ref.theta_hash()) << round;
      EXPECT_EQ(hash_of(o.momentum()), hash_of(ref.momentum())) << round;
    } else {
      EXPECT_TRUE(torch::allclose(o.theta(), ref.theta(), 0, 1e-4))
          << (o.theta() - ref.theta()).abs().max().item<float>();
      EXPECT_TRUE(torch::allclose(o.momentum(), ref.momentum(), 0, 1e-4));
    }
    for (int w = 0; w < k; ++w)
      for (int r = 0; r < g; ++r) {
        EXPECT_EQ(outers[w][r]->theta_hash(), o.theta_hash()) << round << " " << w << " " << r;
        EXPECT_EQ(hash_of(outers[w][r]->momentum()), hash_of(o.momentum())) << w << " " << r;
        EXPECT_EQ(hash_of(trainers[w][r]->flat_parameters()), o.theta_hash()) << w << " " << r;
        EXPECT_EQ(outers[w][r]->round(), ref.round());
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, SlicedRound, ::testing::Values(Codec::fp32, Codec::bf16),
                         [](const auto& info) {
                           return info.param == Codec::fp32 ? std::string("fp32")
                                                            : std::string("bf16");
                         });

// The simulator with G = 2 local ranks per worker (threads over Gloo, sliced round end)
// computes, round after round, what it computes with one rank reading the worker's batch
// as 2 micro-batches, bit for bit; its checkpoints resume bit-identically.
TEST_F(LocalGroupTest, SimulatorWithTwoLocalRanksEqualsOneRankWithTwoMicroBatches) {
  auto c = small_job();
  c.eval.every = 100;
  c.eval.batches = 1;
  auto one = c;
  one.inner.grad_accum = 2;
  Simulator ranked(c, {.workers = 2, .mode = Mode::diloco, .rounds = 3, .local_ranks = 2});
  Simulator plain(one, {.workers = 2, .mode = Mode::diloco, .rounds = 3});
  const std::string ckpt = *dir_ + "/ranked.pt";
  for (int round = 0; round < 3; ++round) {
    const auto a = ranked.run_round(), b = plain.run_round();
    EXPECT_EQ(a.theta_hash, b.theta_hash) << "round " << round + 1;
    EXPECT_EQ(a.train_loss, b.train_loss) << "round " << round + 1;
    EXPECT_EQ(a.bytes_per_worker, b.bytes_per_worker);
    if (round == 0) ranked.save_checkpoint(ckpt);
  }
  Simulator resumed(c, {.workers = 2, .mode = Mode::diloco, .rounds = 3, .local_ranks = 2});
  resumed.load_checkpoint(ckpt);
  resumed.run_round();
  const auto last = resumed.run_round();
  EXPECT_EQ(last.theta_hash, ranked.theta_hash());
  EXPECT_THROW(Simulator(c, {.workers = 2, .mode = Mode::ddp, .local_ranks = 2}),
               std::invalid_argument);
}

// in_parallel (loco-train --parallel): every index once, never more than `width` at once and
// `width` at once when there is work for them (each call waits, at most 10 s, for a second to
// be running while indices remain to start), and the first exception rethrown after all ran.
TEST(InParallel, RunsEachIndexOnceAtMostWidthAtATime) {
  constexpr std::size_t kN = 6;
  std::mutex mu;
  std::condition_variable cv;
  std::size_t running = 0, most = 0, started = 0;
  std::vector<int> seen(kN, 0);
  EXPECT_THROW(in_parallel(kN, 2,
                           [&](std::size_t i) {
                             std::unique_lock lock(mu);
                             ++seen[i];
                             ++started;
                             most = std::max(most, ++running);
                             cv.notify_all();
                             cv.wait_for(lock, std::chrono::seconds(10),
                                         [&] { return running >= 2 || started == kN; });
                             --running;
                             cv.notify_all();
                             if (i == 3) throw std::runtime_error("index 3");
                           }),
               std::runtime_error);
  EXPECT_EQ(seen, std::vector<int>(kN, 1));
  EXPECT_EQ(most, 2u);
  // Width 1: in order, on the caller's thread.
  std::vector<std::size_t> order;
  const auto caller = std::this_thread::get_id();
  in_parallel(4, 1, [&](std::size_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 3}));
}

// The simulator's workers stepping two at a time compute, round after round, the θ and the
// losses they compute one after another, bit for bit, with error feedback and with fragments.
TEST_F(LocalGroupTest, SimulatorWorkersInParallelEqualThemOneAfterAnother) {
  auto c = small_job();
  c.eval.every = 100;
  c.eval.batches = 1;
  auto sparse = c;
  sparse.sync.mode = SyncMode::streaming;
  sparse.inner.steps = 4;
  sparse.sync.fragments = 2;
  sparse.sync.overlap_steps = 1;
  sparse.sync.mix = 0.5;
  sparse.topk.on = true;
  sparse.topk.chunk = 256;
  sparse.topk.k = 16;
  sparse.validate();
  for (const JobConfig& job : {c, sparse}) {
    Simulator serial(job, {.workers = 3, .mode = Mode::diloco, .rounds = 3});
    Simulator parallel(job, {.workers = 3, .mode = Mode::diloco, .rounds = 3, .parallel = 2});
    for (int round = 0; round < 3; ++round) {
      const auto a = parallel.run_round(), b = serial.run_round();
      EXPECT_EQ(a.theta_hash, b.theta_hash) << job.compression_name() << ", round " << round + 1;
      EXPECT_EQ(a.train_loss, b.train_loss) << job.compression_name() << ", round " << round + 1;
    }
  }
}

}  // namespace
