// The trainer on a CUDA device (ctest label `gpu`; every test skips where
// torch sees no CUDA device, as on CI). What a GPU run must keep: it follows the
// CPU run within float tolerance, the outer state stays in host memory, and
// checkpoints move between devices.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "diloco/round/local_group.hpp"
#include "diloco/round/simulator.hpp"
#include "diloco/round/trainer.hpp"
#include "tests/diloco/corpus_suite.hpp"
#include "tests/diloco/test_corpus.hpp"

using namespace loco::diloco;

namespace {

class CudaTest : public loco::diloco::testing::CorpusSuite<CudaTest> {
 public:
  static constexpr const char* kCorpus = "gpu";

 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "torch sees no CUDA device";
  }
  static JobConfig small_job() {
    JobConfig c = loco::diloco::testing::small_job(*dir_);
    c.rounds = 5;
    c.validate();
    return c;
  }
};

const torch::Device kCuda(torch::kCUDA, 0);

torch::serialize::InputArchive round_trip(const InnerTrainer& t) {
  torch::serialize::OutputArchive out;
  t.save(out, "worker.");
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);  // no device given: tensors come back where they were saved
  return in;
}

// ‖a − b‖ / ‖b − start‖: how far two runs drifted apart, relative to how far they moved.
double drift(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& start) {
  return (a.cpu() - b.cpu()).norm().item<double>() / (b.cpu() - start).norm().item<double>();
}

}  // namespace

TEST_F(CudaTest, InnerStepsOnTheGpuFollowTheCpuFor20Steps) {
  const auto c = small_job();
  const auto store = TokenStore::open(c.data);
  InnerTrainer cpu(c, store, {0, 1, 2, 3}, 0, 20);
  InnerTrainer gpu(c, store, {0, 1, 2, 3}, 0, 20, kCuda);
  EXPECT_TRUE(gpu.flat_parameters().is_cuda());
  const torch::Tensor start = cpu.flat_parameters().clone();
  EXPECT_TRUE(torch::equal(gpu.flat_parameters().cpu(), start));  // same initialisation
  for (int s = 0; s < 20; ++s) {
    const auto a = cpu.run_inner_steps(1), b = gpu.run_inner_steps(1);
    EXPECT_NEAR(b.last_loss, a.last_loss, 1e-3 * a.last_loss) << "step " << s;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-2 * a.grad_norm) << "step " << s;
  }
  EXPECT_LT(drift(gpu.flat_parameters(), cpu.flat_parameters(), start), 1e-2);

  // Pseudo-gradients land in host memory against a host θ.
  std::vector<float> dc(size_t(cpu.parameter_count())), dg(dc.size());
  cpu.pseudo_gradient(start, dc);
  gpu.pseudo_gradient(start, dg);
  const auto tc = flat_view(dc), tg = flat_view(dg);
  EXPECT_LT((tc - tg).norm().item<double>() / tc.norm().item<double>(), 1e-2);

  const int n = 2 * c.inner.batch_size;
  torch::Tensor windows = torch::empty({n, c.model.context + 1}, torch::kInt64);
  validation_windows(store, c.model.context, n,
                     {windows.data_ptr<std::int64_t>(), size_t(windows.numel())});
  const double vc = cpu.evaluate(windows), vg = gpu.evaluate(windows);
  EXPECT_NEAR(vg, vc, 1e-3 * vc);
}

TEST_F(CudaTest, OuterStateStaysOnTheHostAndLoadsBackOntoTheGpu) {
  const auto c = small_job();
  const auto store = TokenStore::open(c.data);
  InnerTrainer gpu(c, store, {0, 1}, 0, 20, kCuda);
  OuterOptimizer outer(c.outer, gpu.flat_parameters());
  EXPECT_TRUE(outer.theta().is_cpu());
  EXPECT_TRUE(outer.momentum().is_cpu());
  gpu.run_inner_steps(4);
  std::vector<float> delta(size_t(gpu.parameter_count()));
  gpu.pseudo_gradient(outer.theta(), delta);
  outer.step(delta);
  gpu.load_parameters(outer.theta());
  EXPECT_TRUE(gpu.flat_parameters().is_cuda());
  EXPECT_TRUE(torch::equal(gpu.flat_parameters().cpu(), outer.theta()));
  EXPECT_EQ(tensor_hash(gpu.flat_parameters().cpu()), outer.theta_hash());
}

TEST_F(CudaTest, DilocoRoundsOnTheGpuFollowTheCpu) {
  auto c = small_job();  // 5 rounds of 4 steps: 20 inner steps per worker
  SimulateOptions opt{.workers = 2, .mode = Mode::diloco, .rounds = 5};
  Simulator cpu(c, opt);
  c.device = DeviceKind::cuda;
  Simulator gpu(c, opt);
  while (!cpu.done()) {
    const auto a = cpu.run_round(), b = gpu.run_round();  // each checks its workers' θ agree
    EXPECT_NEAR(b.train_loss, a.train_loss, 1e-3 * a.train_loss) << "round " << a.round;
    ASSERT_EQ(a.val_loss.has_value(), b.val_loss.has_value());
    if (a.val_loss) {
      EXPECT_NEAR(*b.val_loss, *a.val_loss, 1e-3 * *a.val_loss);
    }
  }
}

TEST_F(CudaTest, CheckpointTakenOnTheGpuResumesOnTheCpuAndBack) {
  const auto c = small_job();
  const auto store = TokenStore::open(c.data);
  InnerTrainer gpu(c, store, {0, 1, 2, 3}, 3, 40, kCuda);
  gpu.run_inner_steps(5);
  auto ar = round_trip(gpu);
  // A fresh tensor for each read: InputArchive::read into a defined tensor set_()s it onto the
  // archive's, so reading a second key into the same one would repoint the first key's entry.
  torch::Tensor saved_params, saved_moment;
  ar.read("worker.params", saved_params);
  EXPECT_TRUE(saved_params.is_cpu()) << "checkpoints hold CPU tensors";
  ar.read("worker.exp_avg", saved_moment);
  EXPECT_TRUE(saved_moment.is_cpu());

  // GPU → CPU: the same state exactly, then the same training within tolerance.
  InnerTrainer cpu(c, store, {0, 1, 2, 3}, 3, 40);
  cpu.load(ar, "worker.");
  EXPECT_TRUE(torch::equal(cpu.flat_parameters(), gpu.flat_parameters().cpu()));
  EXPECT_EQ(cpu.step(), gpu.step());
  EXPECT_EQ(cpu.sampler().position(), gpu.sampler().position());
  const torch::Tensor at5 = cpu.flat_parameters().clone();
  cpu.run_inner_steps(5);
  gpu.run_inner_steps(5);
  EXPECT_LT(drift(gpu.flat_parameters(), cpu.flat_parameters(), at5), 1e-2);

  // CPU → GPU: exactly the CPU's state on the device.
  auto back = round_trip(cpu);
  InnerTrainer gpu2(c, store, {0, 1, 2, 3}, 3, 40, kCuda);
  gpu2.load(back, "worker.");
  EXPECT_TRUE(gpu2.flat_parameters().is_cuda());
  EXPECT_TRUE(torch::equal(gpu2.flat_parameters().cpu(), cpu.flat_parameters()));
  EXPECT_EQ(gpu2.adam_steps(), cpu.adam_steps());

  // A whole simulation: checkpointed on the GPU, resumed on the CPU, and back.
  auto gc = small_job();
  gc.device = DeviceKind::cuda;
  SimulateOptions opt{.workers = 2, .mode = Mode::diloco, .rounds = 5};
  const auto path = (std::filesystem::path(c.data.dir) / "ck" / "gpu.pt").string();
  const auto path2 = (std::filesystem::path(c.data.dir) / "ck" / "cpu.pt").string();
  Simulator on_gpu(gc, opt);
  on_gpu.run_round();
  on_gpu.run_round();
  on_gpu.save_checkpoint(path);
  Simulator on_cpu(c, opt);
  on_cpu.load_checkpoint(path);
  EXPECT_EQ(on_cpu.theta_hash(), on_gpu.theta_hash());  // θ is host memory: bit-identical
  const auto a = on_cpu.run_round(), b = on_gpu.run_round();
  EXPECT_NEAR(a.train_loss, b.train_loss, 1e-3 * b.train_loss);
  on_cpu.save_checkpoint(path2);
  Simulator again(gc, opt);
  again.load_checkpoint(path2);
  EXPECT_EQ(again.theta_hash(), on_cpu.theta_hash());
  EXPECT_NO_THROW(again.run_round());
}

// A worker's local ranks on GPUs are NCCL ranks (diloco/round/local_group.hpp). These machines
// have one GPU: a one-rank NCCL group, the path that G ranks take, against no group.
TEST_F(CudaTest, OneRankNcclGroupFollowsNoGroup) {
  if (!nccl_compiled()) GTEST_SKIP() << "this build has no NCCL";
  const auto c = small_job();
  const auto store = TokenStore::open(c.data);
  LocalGroup group(c10::make_intrusive<c10d::HashStore>(), 0, 1, LocalBackend::nccl,
                   std::chrono::seconds(60));
  auto x = torch::arange(1000, torch::dtype(torch::kFloat32).device(kCuda));
  const auto before = x.clone();
  group.allreduce_mean(x);
  EXPECT_TRUE(torch::equal(x, before));
  group.all_gather_slices(x);
  EXPECT_TRUE(torch::equal(x, before));

  InnerTrainer plain(c, store, {0, 1, 2, 3}, 0, 20, kCuda);
  InnerTrainer ranked(c, store, {0, 1, 2, 3}, 0, 20, kCuda, &group);
  const auto a = plain.run_inner_steps(3), b = ranked.run_inner_steps(3);
  EXPECT_NEAR(b.mean_loss, a.mean_loss, 1e-5 * a.mean_loss);
  EXPECT_TRUE(torch::allclose(ranked.flat_parameters(), plain.flat_parameters(), 1e-5, 1e-6));
  OuterOptimizer outer(c.outer, torch::zeros({ranked.parameter_count()}));
  std::vector<float> d(size_t(ranked.parameter_count()));
  ranked.pseudo_gradient(outer.theta(), d, 0);
  outer.step(d, 0);
  ranked.gather_outer_state(outer, true);
  EXPECT_TRUE(outer.theta().is_cpu());
  EXPECT_TRUE(torch::equal(ranked.flat_parameters().cpu(), outer.theta()));
}

// The pinned, chunked staging of θ_local and θ (diloco/round/host_staging.hpp): a chunk that does
// not divide the length, every chunk handed over once, in order, with the device's values; and
// back onto the device bit for bit.
TEST_F(CudaTest, HostStagingMovesEveryChunkOnceInOrderBothWays) {
  const std::int64_t n = 10007, chunk = 1000;
  const torch::Tensor host = torch::randn({n});
  const torch::Tensor dev = host.to(kCuda);
  HostStaging staging(chunk);
  std::vector<std::int64_t> offsets;
  torch::Tensor back = torch::full({n}, -1.0f);
  staging.to_host(dev, [&](std::int64_t off, const torch::Tensor& piece) {
    EXPECT_TRUE(piece.is_cpu());
    offsets.push_back(off);
    back.slice(0, off, off + piece.numel()).copy_(piece);
  });
  std::vector<std::int64_t> expected;
  for (std::int64_t off = 0; off < n; off += chunk) expected.push_back(off);
  EXPECT_EQ(offsets, expected);
  EXPECT_TRUE(torch::equal(back, host));
  torch::Tensor onto = torch::zeros({n}, torch::TensorOptions().device(kCuda));
  staging.to_device(host * 2, onto);
  EXPECT_TRUE(torch::equal(onto.cpu(), host * 2));
  EXPECT_THROW(staging.to_device(torch::zeros({n - 1}), onto), std::invalid_argument);
}
