// A cluster job that starts from a Hugging Face folder (`init: hf:DIR` in the job file, or the
// whole model from one, `model: {hf: DIR}`): every worker reads the folder, the job holds the
// simulator's θ round for round (the simulator reads the same field), and a folder that is
// missing or of another model fails the submission, naming what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "actors/messages.hpp"
#include "tests/actors/job_util.hpp"

namespace loco::testing {
namespace {

namespace fs = std::filesystem;

std::map<int, std::string> theta_hashes(const std::string& path) {
  std::map<int, std::string> out;
  for (const std::string& line : jsonl(path))
    out[std::stoi(actors::json_field(line, "round"))] = actors::json_field(line, "theta_hash");
  return out;
}

// Runs `loco ARGS...` (loco-train's commands forwarded), logging to dir/log; its exit code.
int loco(const std::string& log, std::vector<std::string> args) {
  args.insert(args.begin(), LOCO_BIN_DIR "/loco");
  Subprocess p(args, Subprocess::Options{.log_path = log});
  return p.wait(Millis(300000)).value_or(-1);
}

// Trains the job `yaml` one round in the simulator and exports it to the folder `hf` (`loco
// export --format hf`): *hash is that round's θ hash, the folder's weights.
void pretrain_and_export(const std::string& dir, const TestJob& pre, const std::string& yaml,
                         const std::string& hf, std::string* hash) {
  const std::string file = dir + "/pre.yaml";
  std::ofstream(file) << yaml;
  ASSERT_EQ(loco(dir + "/pre.log",
                 {"train", "--simulate", "1", file, "--rounds", "1", "--out", dir + "/pre"}),
            0)
      << "see " << dir << "/pre.log";
  ASSERT_EQ(loco(dir + "/export.log",
                 {"export", pre.ckpt + "/latest.pt", "--format", "hf", "--out", hf}),
            0)
      << "see " << dir << "/export.log";
  *hash = theta_hashes(dir + "/pre/metrics.jsonl").at(1);
}

// Runs the job `file` in the simulator (2 workers) and on `client`'s cluster: the same θ hashes
// round by round (rounds 0..2), round 0's `pretrained`. *folder: the cluster job's checkpoints.
void expect_the_simulators_theta(const std::string& dir, const std::string& file,
                                 const std::string& pretrained, Client& client,
                                 std::string* folder) {
  ASSERT_EQ(loco(dir + "/sim.log", {"train", "--simulate", "2", file, "--out", dir + "/sim"}), 0)
      << "see " << dir << "/sim.log";
  const auto expected = theta_hashes(dir + "/sim/metrics.jsonl");
  ASSERT_EQ(expected.size(), 3u);  // rounds 0..2
  EXPECT_EQ(expected.at(0), pretrained);
  JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  *folder = dir + "/ckpt/" + handle.id();
  EXPECT_EQ(theta_hashes(*folder + "/metrics.jsonl"), expected);
}

TEST_F(DilocoJob, AJobStartsFromAnExportedFolderAsTheSimulatorDoes) {
  // A "pretrained" model: one round of the test job, exported through `loco export`.
  TestJob j = job(2, 2, 2);
  TestJob pre = j;
  pre.ckpt = dir_ + "/pre-ckpt";
  const std::string hf = dir_ + "/pretrained-hf";
  std::string pretrained;
  ASSERT_NO_FATAL_FAILURE(pretrain_and_export(dir_, pre, pre.yaml(), hf, &pretrained));

  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml() << "init: hf:" << hf << "\n";
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  std::string folder;
  ASSERT_NO_FATAL_FAILURE(expect_the_simulators_theta(dir_, file, pretrained, client, &folder));

  // A folder that is not there, or holds another model, fails the submission.
  auto refused = [&](const std::string& yaml) -> std::string {
    try {
      client.submit(JobSpec::from_yaml(yaml));
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  std::string e = refused(j.yaml() + "init: hf:" + dir_ + "/nowhere\n");
  EXPECT_NE(e.find("no config.json"), std::string::npos) << e;
  std::string other = j.yaml();
  other.replace(other.find("width: 64"), 9, "width: 32");
  e = refused(other + "init: hf:" + hf + "\n");
  EXPECT_NE(e.find("n_embd is 64, but the job's model.d_model is 32"), std::string::npos) << e;
}

// `model: {hf: DIR}`: the aggregator reads the folder's config.json under its node's data root
// once, at submission, and hands the workers the whole model (and init: hf:DIR); the job holds
// the simulator's θ round for round, the simulator resolving the same file. A qwen2 folder (a
// rotary arch with q/k/v biases), written by `loco export` from a pretrained job.
TEST_F(DilocoJob, AJobTakesItsWholeModelFromAFolderAsTheSimulatorDoes) {
  TestJob j = job(2, 2, 2);
  const std::string shape = "model: {layers: 2, width: 64, heads: 2, context: 32}";
  TestJob pre = j;
  pre.ckpt = dir_ + "/pre-ckpt";
  std::string pre_yaml = pre.yaml();
  ASSERT_NE(pre_yaml.find(shape), std::string::npos);
  pre_yaml.replace(pre_yaml.find(shape), shape.size(),
                   "model: {arch: qwen2, layers: 2, width: 64, heads: 2, kv_heads: 1, context: 32, "
                   "max_positions: 128}");
  const std::string hf = dir_ + "/qwen2-hf";
  std::string pretrained;
  ASSERT_NO_FATAL_FAILURE(pretrain_and_export(dir_, pre, pre_yaml, hf, &pretrained));

  std::string yaml = j.yaml();
  yaml.replace(yaml.find(shape), shape.size(), "model: {hf: " + hf + ", context: 32}");
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << yaml;
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  std::string folder;
  ASSERT_NO_FATAL_FAILURE(expect_the_simulators_theta(dir_, file, pretrained, client, &folder));
  // The job that travelled names every field, and starts from the folder.
  std::ifstream in(folder + "/job.yaml");
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* field : {"arch: qwen2", "kv_heads: 1", "max_positions: 128", "vocab: 256"})
    EXPECT_NE(written.find(field), std::string::npos) << field << " in\n" << written;
  EXPECT_NE(written.find("init: hf:" + hf), std::string::npos) << written;
  EXPECT_EQ(written.find("hf: " + hf), std::string::npos) << written;

  // A field of the job that disagrees with the folder, or a folder that is not there, fails the
  // submission naming it.
  auto refused = [&](const std::string& model) -> std::string {
    std::string y = j.yaml();
    y.replace(y.find(shape), shape.size(), model);
    try {
      client.submit(JobSpec::from_yaml(y));
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  std::string e = refused("model: {hf: " + hf + ", context: 32, layers: 3}");
  EXPECT_NE(e.find("num_hidden_layers is 2, but the job's model.layers is 3"), std::string::npos)
      << e;
  e = refused("model: {hf: " + dir_ + "/nowhere}");
  EXPECT_NE(e.find("no config.json"), std::string::npos) << e;
}

}  // namespace
}  // namespace loco::testing
