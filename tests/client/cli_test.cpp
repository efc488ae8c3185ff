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

  // `argv` run in dir_: its exit code and what it printed.
  std::pair<int, std::string> run(const std::vector<std::string>& argv) {
    const std::string log = (dir_ / "out.log").string();
    Subprocess p(argv, Subprocess::Options{.log_path = log, .cwd = dir_.string()});
    const int rc = p.wait(std::chrono::milliseconds(60000)).value_or(-1);
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    return {rc, text.str()};
  }
  // `loco ARGS` must refuse job.yaml for the --set rounds=-3 among ARGS: the message names the
  // file and the field, so both were read (not: the file taken as one more --set value, "give a
  // job file", or `loco up` running "job.yaml" as a command). What it printed.
  std::string refused(std::vector<std::string> args) {
    args.insert(args.begin(), {loco_binary(), "--insecure"});
    return refused_by(args);
  }
  std::string refused_by(const std::vector<std::string>& argv) {
    auto [rc, out] = run(argv);
    EXPECT_NE(rc, 0) << out;
    EXPECT_TRUE(contains(out, "job.yaml: rounds: must be in")) << out;
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(LocoCli, SubmitTakesSetsBeforeTheJobFile) {
  // Refused before any connection is tried.
  refused({"submit", "--set", "rounds=-3", "--set", "inner.lr=0.1", "job.yaml", "--address",
           "127.0.0.1:1"});
  refused({"submit", "job.yaml", "--set", "rounds=-3", "--address", "127.0.0.1:1"});  // as before
}

TEST_F(LocoCli, UpTakesSetsBeforeTheJobFile) {
  // A cluster with no worker nodes comes up, reads the job with the --set applied, refuses it,
  // and goes down.
  const std::string out = refused(
      {"up", "--workers", "0", "--dashboard-port", "-1", "--set", "rounds=-3", "job.yaml"});
  EXPECT_TRUE(contains(out, "stopping the cluster")) << out;
}

#ifdef LOCO_TRAIN_BIN
// loco-train's job file is a required positional, which CLI11 kept from a greedy --set even
// before its options took one value each: this holds the order users type working there too.
TEST_F(LocoCli, LocoTrainTakesRepeatedOptionsBeforeTheJobFile) {
  refused_by({LOCO_TRAIN_BIN, "train", "--simulate", "2", "--fresh-feedback", "1:0", "--set",
              "rounds=-3", "job.yaml"});
}
#endif

}  // namespace
}  // namespace loco::testing
