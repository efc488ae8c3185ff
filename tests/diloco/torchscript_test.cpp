// model: {torchscript: FILE}: TorchScript modules that tests/diloco/torchscript_models.py
// scripts and saves (the venv's Python, at the suite's start), trained by loco's InnerTrainer
// and Simulator: θ0 is the file's, every parameter trains, a tied one counts once, checkpoints
// resume bit for bit, and what loco cannot train is refused naming the file.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "diloco/model/torchscript_model.hpp"
#include "diloco/round/simulator.hpp"
#include "diloco/round/trainer.hpp"
#include "tests/diloco/corpus_suite.hpp"
#include "tests/diloco/test_corpus.hpp"

using namespace loco::diloco;

namespace {

class TorchScriptTest : public loco::diloco::testing::CorpusSuite<TorchScriptTest> {
 public:
  static constexpr const char* kCorpus = "torchscript";

 protected:
  static void SetUpTestSuite() {
    CorpusSuite::SetUpTestSuite();
    const std::string cmd = std::string(LOCO_PYTHON) + " " + LOCO_SOURCE_DIR +
                            "/tests/diloco/torchscript_models.py " + *dir_ + "/models --context 16";
    made_ = std::system(cmd.c_str()) == 0;
  }
  void SetUp() override {
    if (!made_) GTEST_SKIP() << "no torch in " << LOCO_PYTHON << " to script the test models";
  }
  static std::string model_file(const std::string& name) { return *dir_ + "/models/" + name; }
  // The small job of the other tests with the module `name` as its model.
  static JobConfig job(const std::string& name) {
    JobConfig c = loco::diloco::testing::small_job(*dir_);
    c.model = ModelConfig{};
    c.model.context = 16;
    c.model.torchscript = model_file(name);
    c.validate();
    return c;
  }
  static bool made_;
};
bool TorchScriptTest::made_ = false;

// The module's parameters as torch.jit.load gives them, flat, in named_parameters() order.
torch::Tensor file_parameters(const std::string& path) {
  auto m = torch::jit::load(path);
  std::vector<torch::Tensor> flat;
  for (const auto& p : m.named_parameters()) flat.push_back(p.value.detach().reshape({-1}));
  return torch::cat(flat);
}

// What `fn` throws, or "" when it does not.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_F(TorchScriptTest, ThetaZeroIsTheFilesParametersAndEveryOneTrains) {
  JobConfig c = job("gru.pt");
  describe_torchscript(c);
  // embed 256×32, the GRU's two 96×32 matrices and two 96 biases, head 256×32 + 256.
  EXPECT_EQ(c.model.torchscript_parameters, 256 * 32 + 2 * 96 * 32 + 2 * 96 + 256 * 32 + 256);
  EXPECT_EQ(c.model.torchscript_hash.size(), 16u);
  const auto store = TokenStore::open(c.data, c.vocab_size());
  InnerTrainer t(c, store, {0, 1}, 0, 8);
  const torch::Tensor theta0 = file_parameters(c.model.torchscript);
  ASSERT_TRUE(torch::equal(t.flat_parameters(), theta0));
  torch::Tensor windows = torch::empty({8, c.model.context + 1}, torch::kInt64);
  validation_windows(store, c.model.context, 8,
                     {windows.data_ptr<std::int64_t>(), static_cast<std::size_t>(windows.numel())});
  const double before = t.evaluate(windows);
  const InnerStats st = t.run_inner_steps(8);
  ASSERT_FALSE(st.diverged);
  const double after = t.evaluate(windows);
  std::printf("gru: %lld parameters, val loss %.4f at θ0, %.4f after 8 steps\n",
              static_cast<long long>(t.parameter_count()), before, after);
  EXPECT_LT(after, before - 0.1);
  // Every parameter tensor got a gradient and moved: the module trains through the flat views.
  std::int64_t at = 0;
  for (const auto& [name, p] : t.model().named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    const auto k = p.numel();
    EXPECT_FALSE(
        torch::equal(t.flat_parameters().slice(0, at, at + k), theta0.slice(0, at, at + k)))
        << name << " did not move";
    EXPECT_EQ(p.data_ptr<float>(), t.flat_parameters().data_ptr<float>() + at) << name;
    at += k;
  }
  EXPECT_EQ(at, t.parameter_count());
}

TEST_F(TorchScriptTest, ATiedParameterCountsOnceAndAConstantBufferIsAllowed) {
  JobConfig c = job("mixer.pt");
  describe_torchscript(c);
  // embed 256×32 (the head is the same tensor), token_mix 16×16, three LayerNorms,
  // the channel MLP 32→64→32.
  EXPECT_EQ(c.model.torchscript_parameters,
            256 * 32 + 16 * 16 + 3 * 2 * 32 + (32 * 64 + 64) + (64 * 32 + 32));
  Simulator sim(c, SimulateOptions{.workers = 2, .mode = Mode::diloco, .rounds = 3});
  const double first = sim.initial_metrics().val_loss.value();
  RoundMetrics m;
  while (!sim.done()) m = sim.run_round();
  std::printf("mixer: val loss %.4f -> %.4f over 3 rounds of 2 workers\n", first, *m.val_loss);
  EXPECT_LT(*m.val_loss, first);
}

TEST_F(TorchScriptTest, CheckpointResumeIsBitIdenticalAndAnotherFileIsRefused) {
  JobConfig c = job("gru.pt");
  const SimulateOptions opt{.workers = 2, .mode = Mode::diloco, .rounds = 4};
  Simulator straight(c, opt);
  std::vector<std::uint64_t> hashes;
  while (!straight.done()) hashes.push_back(straight.run_round().theta_hash);
  const auto path = *dir_ + "/ck/ts.pt";
  {
    Simulator first(c, opt);
    first.run_round();
    first.run_round();
    first.save_checkpoint(path);
  }
  Simulator resumed(c, opt);
  resumed.load_checkpoint(path);
  EXPECT_EQ(resumed.run_round().theta_hash, hashes[2]);
  EXPECT_EQ(resumed.run_round().theta_hash, hashes[3]);
  std::printf("θ after round 4: straight %016llx, resumed from round 2 %016llx\n",
              static_cast<unsigned long long>(straight.theta_hash()),
              static_cast<unsigned long long>(resumed.theta_hash()));
  EXPECT_EQ(resumed.theta_hash(), straight.theta_hash());
  // The checkpoint records the module and its hash; another file is refused on resume, and
  // the commands that know the built-in decoder only refuse it.
  const JobConfig written = checkpoint_config(path);
  EXPECT_EQ(written.model.torchscript, c.model.torchscript);
  EXPECT_EQ(written.model.torchscript_hash.size(), 16u);
  Simulator other(job("gru_other.pt"), opt);
  EXPECT_NE(error_of([&] { other.load_checkpoint(path); }).find("model.torchscript_hash ("),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_model_from_checkpoint(path); }).find("a TorchScript module"),
            std::string::npos);
}

TEST_F(TorchScriptTest, StreamingFragmentsAreRunsOfWholeTensors) {
  JobConfig c = job("gru.pt");
  c.sync.mode = SyncMode::streaming;
  c.sync.fragments = 2;
  c.sync.overlap_steps = 1;
  Simulator sim(c, SimulateOptions{.workers = 2, .mode = Mode::diloco, .rounds = 2});
  while (!sim.done()) sim.run_round();
  EXPECT_TRUE(std::isfinite(sim.evaluate()));
  // 7 tensors (embed 8192, the GRU's 3072, 3072, 96, 96, head 8192, 256): the boundary
  // nearest the half (11488 of 22976) is after the GRU's input weights, at 11264.
  const auto frags = contiguous_fragments({8192, 3072, 3072, 96, 96, 8192, 256}, 2);
  ASSERT_EQ(frags.size(), 2u);
  EXPECT_EQ(frags[0][0].end, 11264);
  EXPECT_EQ(frags[1][0].begin, 11264);
  EXPECT_EQ(frags[1][0].end, 22976);
  c.inner.steps = 8;
  c.sync.fragments = 8;
  c.validate();
  // Refused as the job is described (at submission on a cluster), and by the simulator.
  JobConfig described = c;
  EXPECT_NE(error_of([&] { describe_torchscript(described); }).find("sync.fragments: 8"),
            std::string::npos);
  const std::string e =
      error_of([&] { Simulator s(c, SimulateOptions{.workers = 2, .rounds = 1}); });
  EXPECT_NE(e.find("sync.fragments: 8 fragments of a module of 7 parameter tensors"),
            std::string::npos)
      << e;
}

TEST_F(TorchScriptTest, ContiguousFragmentsCoverTheVectorOnceInWholeTensors) {
  const std::vector<std::int64_t> sizes = {5, 100, 1, 1, 40, 7, 60, 2};
  for (int count = 1; count <= 8; ++count) {
    const auto frags = contiguous_fragments(sizes, count);
    ASSERT_EQ(frags.size(), static_cast<std::size_t>(count));
    std::int64_t at = 0;
    for (const auto& f : frags) {
      ASSERT_EQ(f.size(), 1u);
      EXPECT_EQ(f[0].begin, at);
      EXPECT_GT(f[0].end, f[0].begin);
      at = f[0].end;
    }
    EXPECT_EQ(at, 216);
  }
  EXPECT_THROW(contiguous_fragments(sizes, 9), std::invalid_argument);
  EXPECT_THROW(contiguous_fragments(sizes, 0), std::invalid_argument);
}

TEST_F(TorchScriptTest, WhatLocoCannotTrainIsRefusedNamingTheFileAndTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"forward_one_arg.pt", "ForwardOneArg self, Tensor tokens) -> Tensor`; loco calls forward"},
      {"per_token.pt", "forward returned a Float tensor of shape [16]"},
      {"dropout.pt", "forward draws random numbers in training mode (dropout?)"},
      {"batchnorm.pt", "forward changed the buffer bn.running_mean"},
      {"float64.pt", "parameter embed.weight is Double"},
      {"missing.pt", "no such file"},
      {"vocab64.pt",
       "forward(tokens [1, 16], targets) failed: RuntimeError: index out of range in self"},
  };
  for (const auto& [file, expected] : cases) {
    JobConfig c = job(file);
    const std::string e = error_of([&] { describe_torchscript(c); });
    EXPECT_NE(e.find("model.torchscript " + model_file(file) + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  }
  std::ofstream(model_file("garbage.pt")) << "not a zip";
  JobConfig garbage = job("garbage.pt");
  EXPECT_NE(error_of([&] { describe_torchscript(garbage); }).find("not a TorchScript module"),
            std::string::npos);
  // A file that is not the one the job was described with.
  JobConfig c = job("gru.pt");
  describe_torchscript(c);
  c.model.torchscript = model_file("gru_other.pt");
  const std::string e = error_of([&] { describe_torchscript(c); });
  EXPECT_NE(e.find("but the job records model.torchscript_hash " + c.model.torchscript_hash),
            std::string::npos)
      << e;
  JobConfig size = job("gru.pt");
  size.model.torchscript_parameters = 5;
  EXPECT_NE(error_of([&] {
              describe_torchscript(size);
            }).find("22976 parameters, but the job records model.torchscript_parameters 5"),
            std::string::npos);
}

TEST_F(TorchScriptTest, Bf16AutocastReachesTheModulesOps) {
  JobConfig c = job("gru.pt");
  const auto store = TokenStore::open(c.data, c.vocab_size());
  InnerTrainer fp32(c, store, {0}, 0, 4);
  c.precision = Precision::bf16;
  InnerTrainer bf16(c, store, {0}, 0, 4);
  const double a = fp32.run_inner_steps(1).last_loss, b = bf16.run_inner_steps(1).last_loss;
  std::printf("first step's loss: fp32 %.7f, bf16 autocast %.7f\n", a, b);
  EXPECT_TRUE(std::isfinite(b));
  EXPECT_NE(a, b);
  EXPECT_LT(std::abs(a - b), 0.05);
  EXPECT_EQ(bf16.flat_parameters().scalar_type(), torch::kFloat32);
}

// On a GPU (skipped without CUDA): θ0 is the file's there too, and the module's steps follow
// the CPU's to float rounding (cuDNN's GRU against the CPU kernels).
TEST_F(TorchScriptTest, OnACudaDeviceTheModuleTrainsAsOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA";
  JobConfig c = job("gru.pt");
  const auto store = TokenStore::open(c.data, c.vocab_size());
  InnerTrainer cpu(c, store, {0}, 0, 4);
  InnerTrainer gpu(c, store, {0}, 0, 4, torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(gpu.flat_parameters().is_cuda());
  EXPECT_TRUE(torch::equal(gpu.flat_parameters().cpu(), cpu.flat_parameters()));
  const double a = cpu.run_inner_steps(3).last_loss, b = gpu.run_inner_steps(3).last_loss;
  std::printf("loss of step 3: cpu %.6f, cuda %.6f\n", a, b);
  EXPECT_NEAR(a, b, 1e-2);
}

}  // namespace
