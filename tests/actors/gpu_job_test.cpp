// A DiLoCo job whose workers train on a GPU (ctest label `gpu`; skips where
// torch sees no CUDA device, as on CI). One node offers `gpu=1`; two workers
// share it (workers.share_gpu), each told so by the runtime, and the job follows
// loco-train's CPU simulation within float tolerance.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdio>

#include "tests/actors/job_util.hpp"

namespace loco::testing {
namespace {

TEST_F(DilocoJob, TwoWorkersShareOneGpuAndFollowTheCpuSimulation) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "torch sees no CUDA device";
  TestJob j;
  j.data = data_;
  j.ckpt = dir_ + "/ckpt";
  j.workers = j.min = 2;
  j.rounds = 2;
  const std::string cpu_file = dir_ + "/cpu.yaml";
  std::ofstream(cpu_file) << j.yaml();
  Subprocess sim(
      {LOCO_BIN_DIR "/loco", "train", "--simulate", "2", cpu_file, "--out", dir_ + "/sim"},
      Subprocess::Options{.log_path = dir_ + "/sim.log"});
  ASSERT_EQ(sim.wait(Millis(300000)).value_or(-1), 0) << read_file(dir_ + "/sim.log");
  auto expected = val_losses(dir_ + "/sim/metrics.jsonl");

  j.device = "cuda";
  j.share_gpu = true;
  ClusterOptions co;
  co.nodes = 1;
  co.node_resources = "cpu=2,gpu=1";
  co.plugins = LOCO_PLUGIN_DIR_STR;
  LocalCluster c(co);
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(j.yaml()));
  for (const RoundReport& r : job.watch()) {
    EXPECT_EQ(r.workers, 2);
    if (r.round == 1) {  // while the job runs: both workers hold GPU 0, shared
      for (auto& a : client.runtime().status().actors)
        if (a.class_name == "diloco.InnerWorker") {
          EXPECT_EQ(a.gpus, std::vector<int>{0}) << a.name;
          EXPECT_TRUE(a.share_gpus) << a.name;
        }
    }
  }
  JobInfo end = job.wait(Millis(10000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  const std::string log = log_text(job);
  EXPECT_NE(log.find("worker 0 trains on cuda:0 (device: cuda)"), std::string::npos) << log;
  EXPECT_NE(log.find("worker 1 trains on cuda:0 (device: cuda)"), std::string::npos) << log;
  auto got = val_losses(dir_ + "/ckpt/" + job.id() + "/metrics.jsonl");
  ASSERT_EQ(got.size(), expected.size());
  for (auto& [round, loss] : expected) {
    std::printf("round %d: val_loss gpu %.7f cpu simulation %.7f\n", round, got[round], loss);
    EXPECT_LE(std::abs(got[round] - loss) / loss, 1e-3) << "round " << round;
  }
}

// Without share_gpu, a node with one GPU takes one worker: the second cannot be
// placed, and the job says which resource is short.
TEST_F(DilocoJob, WorkersDoNotShareAGpuUnlessAskedTo) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "torch sees no CUDA device";
  TestJob j;
  j.data = data_;
  j.ckpt = dir_ + "/ckpt";
  j.workers = j.min = 2;
  j.rounds = 1;
  j.wait_s = 2;
  j.device = "cuda";
  ClusterOptions co;
  co.nodes = 1;
  co.node_resources = "cpu=2,gpu=1";
  co.plugins = LOCO_PLUGIN_DIR_STR;
  LocalCluster c(co);
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(j.yaml()));
  for (const RoundReport& r : job.watch()) (void)r;
  JobInfo end = job.wait(Millis(30000));
  EXPECT_EQ(end.state, JobState::failed);
  EXPECT_NE(end.message.find("no node has 1 free gpu"), std::string::npos) << end.message;
}

}  // namespace
}  // namespace loco::testing
