// The `loco` command line as users type it, options before and after the job file: a
// repeatable --set takes one value each time, so the job file after it stays the job file
// (it used to be swallowed as one more --set: "give a job file").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "client/process.hpp"
#include "tests/runtime/core/cluster.hpp"

namespace loco::testing {
namespace {

class LocoCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("loco-cli-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "job.yaml") << "name: cli\nrounds: 2\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `loco ARGS` run in dir_: its exit code and what it printed.
  std::pair<int, std::string> loco(std::vector<std::string> args) {
    args.insert(args.begin(), {loco_binary(), "--insecure"});
    const std::string log = (dir_ / "out.log").string();
    Subprocess p(args, Subprocess::Options{.log_path = log, .cwd = dir_.string()});
    const int rc = p.wait(std::chrono::milliseconds(60000)).value_or(-1);
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    return {rc, text.str()};
  }

  std::filesystem::path dir_;
};

TEST_F(LocoCli, SubmitTakesSetsBeforeTheJobFile) {
  // A --set that the job file's validation refuses: the message names the file and the field,
  // so both were read, in this order, before any connection is tried.
  auto [rc, out] = loco({"submit", "--set", "rounds=-3", "--set", "inner.lr=0.1", "job.yaml",
                         "--address", "127.0.0.1:1"});
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(contains(out, "job.yaml: rounds: must be in")) << out;
  EXPECT_FALSE(contains(out, "give a job file")) << out;
  // After the file, as before.
  std::tie(rc, out) = loco({"submit", "job.yaml", "--set", "rounds=-3", "--address", "127.0.0.1:1"});
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(contains(out, "job.yaml: rounds: must be in")) << out;
}

TEST_F(LocoCli, UpTakesSetsBeforeTheJobFile) {
  // `loco up --set ... JOB`: a cluster with no worker nodes comes up, reads the job with the
  // --set applied, refuses it, and goes down (not: runs "job.yaml" as a command).
  auto [rc, out] = loco({"up", "--workers", "0", "--dashboard-port", "-1", "--set",
                         "rounds=-3", "job.yaml"});
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(contains(out, "job.yaml: rounds: must be in")) << out;
  EXPECT_TRUE(contains(out, "stopping the cluster")) << out;
}

#ifdef LOCO_TRAIN_BIN
TEST_F(LocoCli, LocoTrainTakesRepeatedOptionsBeforeTheJobFile) {
  const std::string log = (dir_ / "train.log").string();
  Subprocess p({LOCO_TRAIN_BIN, "train", "--simulate", "2", "--fresh-feedback", "1:0", "--set",
                "rounds=-3", "job.yaml"},
               Subprocess::Options{.log_path = log, .cwd = dir_.string()});
  EXPECT_NE(p.wait(std::chrono::milliseconds(60000)).value_or(0), 0);
  std::stringstream out;
  out << std::ifstream(log).rdbuf();
  EXPECT_TRUE(contains(out.str(), "job.yaml: rounds: must be in")) << out.str();
}
#endif

}  // namespace
}  // namespace loco::testing
