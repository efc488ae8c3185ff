// A DiLoCo job distributed over 4 node processes gives the simulator's
// validation loss curve (fp32, and int8: the simulator averages with the
// collective's own numerics), and bad job files fail the
// submission with the field's name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "actors/messages.hpp"
#include "diloco/job/config.hpp"
#include "runtime/security/keys.hpp"
#include "tests/actors/job_util.hpp"

namespace loco::testing {
namespace {

namespace fs = std::filesystem;

std::string job_yaml(const std::string& data, const std::string& ckpt,
                     const std::string& compression, int rounds = 3, int min_workers = 4) {
  TestJob j;
  j.data = data;
  j.ckpt = ckpt;
  j.compression = compression;
  j.rounds = rounds;
  j.min = min_workers;
  return j.yaml();
}

// `loco train --simulate K FILE --out DIR/NAME` (the simulator through the command line, its
// output in DIR/NAME.log): whether it ended well.
::testing::AssertionResult simulate(const std::string& dir, const std::string& file, int k,
                                    const std::string& name = "sim",
                                    const std::vector<std::string>& more = {}) {
  std::vector<std::string> argv = {LOCO_BIN_DIR "/loco", "train",  "--simulate", std::to_string(k),
                                   file,                 "--out",  dir + "/" + name};
  argv.insert(argv.end(), more.begin(), more.end());
  Subprocess p(argv, Subprocess::Options{.log_path = dir + "/" + name + ".log"});
  if (p.wait(Millis(300000)).value_or(-1) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "loco train --simulate " << k << " " << file
                                       << " failed; see " << dir << "/" << name << ".log";
}

// A distributed job's validation loss round by round against the simulator's: the same rounds,
// each within 1e-4 relative (the distributed evaluation sums shared windows in another order).
void expect_val_losses_match(const std::map<int, double>& got,
                             const std::map<int, double>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [round, loss] : expected) {
    ASSERT_TRUE(got.count(round)) << "round " << round;
    const double g = got.at(round);
    std::printf("round %d: val_loss distributed %.7f simulated %.7f (rel diff %.2e)\n", round, g,
                loss, std::abs(g - loss) / loss);
    EXPECT_LE(std::abs(g - loss) / loss, 1e-4)
        << "round " << round << ": distributed " << g << ", simulated " << loss;
  }
}

class DilocoParity : public DilocoJob, public ::testing::WithParamInterface<std::string> {};

TEST_P(DilocoParity, DistributedOverFourNodesMatchesTheSimulator) {
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << job_yaml(data_, dir_ + "/ckpt", GetParam());

  // The simulator, through the `loco train` command.
  std::string sim_out = dir_ + "/sim";
  ASSERT_TRUE(simulate(dir_, file, 4));
  auto expected = val_losses(sim_out + "/metrics.jsonl");
  ASSERT_GE(expected.size(), 4u);  // rounds 0..3

  // The same job on 4 node processes, one worker each.
  LocalCluster c(one_worker_per_node(4));
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml_file(file));
  std::vector<int> rounds;
  for (const RoundReport& r : job.watch()) {
    rounds.push_back(r.round);
    EXPECT_EQ(r.workers, 4);
  }
  JobInfo end = job.wait(Millis(10000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  EXPECT_EQ(rounds, (std::vector<int>{0, 1, 2, 3}));
  // The four workers ran on four different nodes.
  std::set<std::string> nodes;
  for (auto& a : client.runtime().status().actors)
    if (a.class_name == "diloco.InnerWorker") nodes.insert(a.node_id);
  EXPECT_EQ(nodes.size(), 4u);

  std::string folder = dir_ + "/ckpt/" + job.id();
  const auto got = val_losses(folder + "/metrics.jsonl");
  ASSERT_NO_FATAL_FAILURE(expect_val_losses_match(got, expected));
  EXPECT_LT(got.rbegin()->second, got.begin()->second);  // it learned something
  EXPECT_TRUE(fs::exists(folder + "/final.pt"));
  // Written by the nodes for their operator alone (a node's umask 077): the job's folder 0700,
  // its files 0600, so that another user's job cannot read them (issue "21 ·").
  for (const std::string& p : {folder, folder + "/final.pt", folder + "/metrics.jsonl"})
    EXPECT_EQ(fs::status(p).permissions() & (fs::perms::group_all | fs::perms::others_all),
              fs::perms::none)
        << p;
}

// compression as the job file writes it: the dense codecs, and the sparse one (topk, chunks of
// 256 with 16 values each sent: the test model is small).
constexpr const char* kTopk = "{kind: topk, chunk: 256, k: 16}";
bool is_topk(const std::string& compression) { return compression == kTopk; }
INSTANTIATE_TEST_SUITE_P(Compression, DilocoParity, ::testing::Values("fp32", "bf16", "int8", kTopk),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return is_topk(i.param) ? std::string("topk") : i.param;
                         });

// round -> θ's hash, from a metrics.jsonl of loco-train or of a job.
std::map<int, std::string> theta_hashes(const std::string& path) {
  std::map<int, std::string> out;
  for (const std::string& line : jsonl(path))
    out[std::stoi(actors::json_field(line, "round"))] = actors::json_field(line, "theta_hash");
  return out;
}

// `loco submit --resume CHECKPOINT` on the cluster at `address` (its job file is the one beside
// the checkpoint): the θ hashes of the job it ran, the newest of `client`'s jobs.
std::map<int, std::string> resumed_hashes(Client& client, const std::string& address,
                                          const std::string& checkpoint, const std::string& dir) {
  std::set<std::string> before;
  for (const JobInfo& j : client.jobs()) before.insert(j.id);
  Subprocess p({LOCO_BIN_DIR "/loco", "submit", "--address", address, "--resume", checkpoint},
               Subprocess::Options{.log_path = dir + "/resume.log"});
  EXPECT_EQ(p.wait(Millis(300000)).value_or(-1), 0) << "see " << dir << "/resume.log";
  for (const JobInfo& j : client.jobs())
    if (!before.count(j.id)) return theta_hashes(dir + "/ckpt/" + j.id + "/metrics.jsonl");
  ADD_FAILURE() << "no job was resumed from " << checkpoint;
  return {};
}

// A worker with G local ranks (here 2 CPU ranks over Gloo, as G GPUs over NCCL would be): the
// ranks step data-parallel, and at a round's end rank r of each worker averages slice r of Δ
// over its own butterfly. 2 such workers on 2 nodes hold the θ of the simulator's
// `--simulate 2` with the same job file, round for round, bit for bit (fp32 and int8).
TEST_P(DilocoParity, TwoLocalRanksPerWorkerHoldTheSimulatorsThetaBitForBit) {
  TestJob j = job(2, 2, 3);
  j.compression = GetParam();
  j.local_ranks = 2;
  if (is_topk(GetParam())) {
    // The sparse codec runs one local rank per worker for now: the job file says why it is not.
    try {
      diloco::JobConfig::from_yaml(j.yaml());
      ADD_FAILURE() << "compression topk with 2 local ranks was accepted";
    } catch (const diloco::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("topk runs one local rank per worker"),
                std::string::npos)
          << e.what();
    }
    return;
  }
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml();

  const std::string sim_out = dir_ + "/sim";
  ASSERT_TRUE(simulate(dir_, file, 2));
  std::ifstream sim_log(dir_ + "/sim.log");
  const std::string sim_text((std::istreambuf_iterator<char>(sim_log)), {});
  EXPECT_NE(sim_text.find("of 2 local ranks"), std::string::npos) << sim_text;
  const auto expected = theta_hashes(sim_out + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 4u);  // rounds 0..3

  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  const std::string log = log_text(handle);
  EXPECT_NE(log.find("2 local ranks"), std::string::npos) << log;
  const auto got = theta_hashes(dir_ + "/ckpt/" + handle.id() + "/metrics.jsonl");
  EXPECT_EQ(got, expected);
}

// Streaming DiLoCo on a cluster: 2 fragments, each landing one inner step after it synchronized
// (so the round's last fragment lands in the next round, and is in flight at the checkpoints of
// rounds 1 and 2; the second is copied into the buffers the first was written from), mixed half
// and half. Each worker synchronizes its fragments itself, on threads, while
// its inner steps go on; θ equals the simulator's round for round, bit for bit.
TEST_P(DilocoParity, StreamingFragmentsHoldTheSimulatorsThetaBitForBit) {
  TestJob j = job(2, 2, 3);
  j.compression = GetParam();
  j.checkpoint_every = 1;
  j.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  j.eval_every = 1000;  // θ evaluated at the end only (evaluating holds no round back either:
                        // StreamingRoundsAreSentAheadThroughEvaluations)
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml();

  const std::string sim_out = dir_ + "/sim";
  ASSERT_TRUE(simulate(dir_, file, 2));
  const auto expected = theta_hashes(sim_out + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 4u);  // rounds 0..3
  // The control: blocking DiLoCo on the same job holds another θ from round 1 on.
  TestJob b = j;
  b.sync = "";
  std::ofstream(dir_ + "/blocking.yaml") << b.yaml();
  ASSERT_TRUE(simulate(dir_, dir_ + "/blocking.yaml", 2, "sim-blocking"));
  EXPECT_NE(theta_hashes(dir_ + "/sim-blocking/metrics.jsonl").at(1), expected.at(1));

  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(handle);
  const std::string folder = dir_ + "/ckpt/" + handle.id();
  EXPECT_EQ(theta_hashes(folder + "/metrics.jsonl"), expected);
  EXPECT_TRUE(fs::exists(folder + "/ckpt-round-2.pt"));
  EXPECT_TRUE(fs::exists(folder + "/final.pt"));
  // Pipelined through the checkpoint: round 3 went out right behind round 2 (nothing held it
  // back), and the checkpoint of round 2, written under round 3's inner steps once round 2's
  // last fragment had landed, was recorded.
  const std::string log = log_text(handle);
  EXPECT_NE(log.find("round 2: sent right behind round 1"), std::string::npos) << log;
  EXPECT_EQ(log.find("not sent ahead"), std::string::npos) << log;
  EXPECT_NE(log.find("ckpt-round-1.pt (round 1)"), std::string::npos) << log;
  EXPECT_NE(log.find("ckpt-round-2.pt (round 2)"), std::string::npos) << log;
  // A job that fixes the sparse codec is told at submission what it has cost where loco measured
  // it (issue 24, item 5), and only such a job.
  EXPECT_EQ(log.find("compression topk: what sparse pseudo-gradients cost") != std::string::npos,
            is_topk(GetParam()))
      << log;
  for (const char* f : {"ckpt-round-2.worker-0.pt", "ckpt-round-2.worker-1.pt"})
    EXPECT_TRUE(fs::exists(folder + "/" + f)) << f << "\n" << log;
  // That checkpoint is of round 2's state with the fragment then in flight: a job resumed from
  // it holds the simulator's θ of round 3, bit for bit.
  const auto again = resumed_hashes(client, c.head_address(), folder + "/ckpt-round-2.pt", dir_);
  EXPECT_EQ(again.count(2), 0u);
  EXPECT_EQ(again.at(3), expected.at(3));
}

// compression: auto on a cluster. Started at topk (k 64 of chunks of 256), with a window that
// loopback's dense codecs fit (a blocking round's share of 0.9; streaming: 19 of the 20 steps
// between fragments), it climbs to a dense codec within the job (by prediction or by a probe),
// each member keeping its error feedback for a later topk average. Blocking: the aggregator
// decides each round's codec from what the round before measured. Streaming: each fragment's
// operation runs the codec its members agree on as it begins, so a switch falls inside a round,
// and its code is made then, on the operation's thread. The simulator given the job's
// metrics.jsonl as its codec trace holds the job's θ round for round, bit for bit, across the
// switches; a job resumed from a checkpoint goes on with the codec of the checkpoint's round.
class AutoCodecParity : public DilocoJob, public ::testing::WithParamInterface<std::string> {};

// A job's fragments' codecs in the order of their operations ("fragment_codecs").
std::vector<std::string> fragment_codecs(const std::string& metrics) {
  std::map<std::pair<int, int>, std::string> at;
  for (const std::string& line : jsonl(metrics)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("fragment_codecs"))
      for (const auto& e : j["fragment_codecs"])
        at[{e["round"].get<int>(), e["fragment"].get<int>()}] = e["codec"].get<std::string>();
  }
  std::vector<std::string> out;
  for (const auto& [k, c] : at) out.push_back(c);
  return out;
}

TEST_P(AutoCodecParity, TheSimulatorReplaysTheJobsCodecsBitForBit) {
  const bool streaming = GetParam() == "streaming";
  TestJob j = job(2, 2, 4);
  j.compression = "{kind: auto, chunk: 256, start: topk:64, share: 0.9, margin: 1.0, patience: 1}";
  j.checkpoint_every = 3;
  j.eval_every = 1000;
  if (streaming) {
    j.steps = 40;
    j.sync = "{mode: streaming, fragments: 2, overlap_steps: 19, mix: 0.5}";
  }
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml();

  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(handle);
  const std::string folder = dir_ + "/ckpt/" + handle.id();
  const std::string metrics = folder + "/metrics.jsonl";
  std::vector<std::string> codecs;  // rounds 1..4
  for (const std::string& line : jsonl(metrics))
    if (line.find("\"codec\"") != std::string::npos) {
      codecs.push_back(actors::json_field(line, "codec"));
      EXPECT_NE(line.find("\"codec_reason\""), std::string::npos) << line;
    }
  ASSERT_EQ(codecs.size(), 4u) << "every round says its codec";
  EXPECT_EQ(codecs.front(), "\"topk:64\"");
  const std::string log = log_text(handle);
  EXPECT_NE(log.find("topk:64 → "), std::string::npos) << log;
  EXPECT_NE(log.find("the window is"), std::string::npos) << log;
  // The codecs in the order they ran: the rounds' (blocking), or every fragment's operation
  // (streaming: 2 a round, each agreed by its members as it began).
  std::vector<std::string> ran = codecs;
  if (streaming) {
    ran = fragment_codecs(metrics);
    ASSERT_EQ(ran.size(), 8u) << "every operation says its codec";
    EXPECT_EQ(ran.front(), "topk:64");
    for (std::string& name : ran) name = "\"" + name + "\"";
    EXPECT_NE(log.find("'s reading)"), std::string::npos) << log;
    // Each change's reason in metrics.jsonl too, beside the codec.
    bool reasons = false;
    for (const std::string& line : jsonl(metrics))
      reasons |= line.find("\"reason\":\"") != std::string::npos;
    EXPECT_TRUE(reasons);
    std::string joined;
    for (const std::string& name : ran) joined += name + " ";
    std::cout << "the operations' codecs: " << joined << "\n";
  }
  // A dense average after a topk one: the switch the error feedback must survive.
  bool switched = false;
  for (size_t i = 1; i < ran.size(); ++i)
    switched |=
        ran[i - 1].find("topk") != std::string::npos && ran[i].find("topk") == std::string::npos;
  EXPECT_TRUE(switched) << log;
  // Each change is a "codec" record of the job's events too (the dashboard's timeline).
  int records = 0, changes = 0;
  for (size_t i = 1; i < ran.size(); ++i) changes += ran[i] != ran[i - 1];
  for (const JobEvent& e : client.runtime().job_events(handle.id(), "", 1000).events)
    if (e.kind == actors::kCodecRecord) {
      const auto rec = unpack_checked<actors::LineRecord>(e.data, "a codec record");
      EXPECT_NE(rec.text.find(" → "), std::string::npos) << rec.text;
      EXPECT_GE(rec.round, streaming ? 1 : 2);
      ++records;
    }
  EXPECT_EQ(records, changes);

  ASSERT_TRUE(simulate(dir_, file, 2, "sim", {"--codec-trace", metrics}));
  const auto expected = theta_hashes(dir_ + "/sim/metrics.jsonl");
  EXPECT_EQ(theta_hashes(metrics), expected);
  // The control: the same trace without its switch (topk:64 throughout) holds another θ.
  std::ofstream(dir_ + "/topk.trace") << "topk:64\n";
  ASSERT_TRUE(simulate(dir_, file, 2, "sim-topk", {"--codec-trace", dir_ + "/topk.trace"}));
  EXPECT_NE(theta_hashes(dir_ + "/sim-topk/metrics.jsonl").at(4), expected.at(4));

  // Resumed from round 3's checkpoint, the job goes on with that round's codec and the members'
  // error feedback: its first round's θ is the job's when it ran the same codecs (the round
  // after a resume decides from a measurement the checkpoint does not hold).
  const auto again = resumed_hashes(client, c.head_address(), folder + "/ckpt-round-3.pt", dir_);
  std::string resumed_codec, resumed_metrics;
  for (const JobInfo& job : client.jobs())
    if (job.id != handle.id()) {
      resumed_metrics = dir_ + "/ckpt/" + job.id + "/metrics.jsonl";
      for (const std::string& line : jsonl(resumed_metrics))
        if (resumed_codec.empty() && line.find("\"codec\"") != std::string::npos)
          resumed_codec = actors::json_field(line, "codec");
    }
  EXPECT_EQ(resumed_codec, codecs[2]);
  const std::vector<std::string> job_ops = fragment_codecs(metrics);
  const bool same_codecs =
      streaming
          ? job_ops.size() == 8 && fragment_codecs(resumed_metrics) ==
                                       std::vector<std::string>(job_ops.begin() + 6, job_ops.end())
          : codecs[3] == codecs[2];
  if (same_codecs) {
    EXPECT_EQ(again.at(4), expected.at(4));
  }
}

// compression auto in streaming, every worker killed mid-job: the rounds in flight are redone
// (or, with no member left, the job goes back to its start), and the redone operations agree
// on codecs of their own. Every operation of every round is in metrics.jsonl once the job
// ends: the aggregator takes each operation's newest report (by operation id), not the first
// it saw of its round and fragment.
TEST_F(DilocoJob, AfterARewindEveryRedoneOperationReportsItsCodec) {
  TestJob j = job(2, 2, 8);  // killed at round 2: six rounds of room, each about a second
  j.compression = "{kind: auto, chunk: 256, start: topk:64, share: 0.9, margin: 1.0, patience: 1}";
  j.steps = 40;
  j.sync = "{mode: streaming, fragments: 2, overlap_steps: 19, mix: 0.5}";
  j.eval_every = 1000;
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
  bool killed = false;
  for (const RoundReport& r : handle.watch()) {
    if (killed || r.round < 2) continue;
    killed = true;
    for (auto& a : client.runtime().status().actors)
      if (a.name.rfind(handle.id() + ".worker-", 0) == 0 && a.state == ActorState::alive)
        client.runtime().kill(a.id);
  }
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_TRUE(killed);
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(handle);
  const std::string log = log_text(handle);
  const std::string metrics = dir_ + "/ckpt/" + handle.id() + "/metrics.jsonl";
  std::set<std::pair<int, int>> reported;
  int lines = 0, redone = 0;
  for (const std::string& line : jsonl(metrics)) {
    const auto m = nlohmann::json::parse(line);
    redone += m.value("redo", 0) > 0;
    ++lines;
    if (!m.contains("fragment_codecs")) continue;
    for (const auto& e : m["fragment_codecs"])
      reported.insert({e["round"].get<int>(), e["fragment"].get<int>()});
  }
  EXPECT_EQ(lines, 9) << "rounds 0 to 8, each once";
  EXPECT_GT(redone, 0) << log;
  std::set<std::pair<int, int>> every;
  for (int r = 1; r <= 8; ++r)
    for (int f = 0; f < 2; ++f) every.insert({r, f});
  EXPECT_EQ(reported, every) << log;
  // And each with the codec it ran: the simulator given the job's metrics holds its θ.
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml();
  ASSERT_TRUE(simulate(dir_, file, 2, "sim", {"--codec-trace", metrics}));
  EXPECT_EQ(theta_hashes(metrics), theta_hashes(dir_ + "/sim/metrics.jsonl")) << log;
}

INSTANTIATE_TEST_SUITE_P(Sync, AutoCodecParity, ::testing::Values("blocking", "streaming"));

// θ evaluated every round does not hold the next round back: each member evaluates its share
// of the validation windows on a copy of θ as the round ends, on a model of its own beside the
// next round's steps (StreamRequest::eval_begin). Every round is sent right behind the one
// before, and every round's validation loss is the simulator's.
TEST_F(DilocoJob, StreamingRoundsAreSentAheadThroughEvaluations) {
  TestJob j = job(2, 2, 4);
  j.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  j.eval_every = j.steps;  // every round
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml();
  const std::string sim_out = dir_ + "/sim";
  ASSERT_TRUE(simulate(dir_, file, 2));
  const auto expected = val_losses(sim_out + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 5u);  // rounds 0..4, each evaluated

  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(handle);
  const std::string log = log_text(handle);
  // Said when it changes: once sent ahead, never "not sent ahead" after.
  EXPECT_NE(log.find("round 2: sent right behind round 1"), std::string::npos) << log;
  EXPECT_EQ(log.find("not sent ahead"), std::string::npos) << log;
  EXPECT_EQ(log.find("share of θ's evaluation is missing"), std::string::npos) << log;
  ASSERT_NO_FATAL_FAILURE(expect_val_losses_match(
      val_losses(dir_ + "/ckpt/" + handle.id() + "/metrics.jsonl"), expected));
}

// time_limit_minutes: a job of far more rounds than its minutes hold ends with the round planned
// once they passed (in streaming, the round already sent ahead runs too), and ends as at its
// rounds: θ evaluated, final.pt written, the job succeeded; its log says why it ended there.
class TimeLimit : public DilocoJob, public ::testing::WithParamInterface<const char*> {};

TEST_P(TimeLimit, TheJobEndsWithTheRoundPlannedOnceItsMinutesPassedAndSucceeds) {
  TestJob j = job(2, 2, 100000);
  if (std::string(GetParam()) == "streaming")
    j.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  j.eval_every = 40 * j.steps;
  j.time_limit_minutes = 0.1;  // 6 s
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
  JobInfo end = handle.wait(Millis(180000));
  const std::string log = log_text(handle);
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log;
  const size_t at = log.find(" is the last: ");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_NE(log.find("its time_limit_minutes 0.1", at), std::string::npos) << log;
  const int last = std::stoi(log.substr(log.rfind("round ", at) + 6));
  const std::string folder = dir_ + "/ckpt/" + handle.id();
  // Every round up to the last once, none after it; θ evaluated at the end.
  EXPECT_EQ(expect_each_round_once(folder + "/metrics.jsonl"), last);
  EXPECT_GT(last, 1);
  EXPECT_LT(last, 100000);
  EXPECT_EQ(val_losses(folder + "/metrics.jsonl").count(last), 1u);
  EXPECT_TRUE(std::filesystem::exists(folder + "/final.pt"));
  EXPECT_NE(log.find("after " + std::to_string(last) + " rounds"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Sync, TimeLimit, ::testing::Values("blocking", "streaming"));

// The eager outer step on a cluster: each round's average lands 2 inner steps into the next
// round, the workers going on meanwhile from their own Δ stepped. θ equals the simulator's
// round for round, bit for bit; a checkpoint is taken with an average in flight.
TEST_P(DilocoParity, EagerOuterStepHoldsTheSimulatorsThetaBitForBit) {
  TestJob j = job(2, 2, 3);
  j.compression = GetParam();
  j.checkpoint_every = 2;
  j.sync = "{mode: eager, overlap_steps: 2}";
  j.eval_every = 1000;  // θ evaluated at the end only
  const std::string file = dir_ + "/job.yaml";
  std::ofstream(file) << j.yaml();
  const std::string sim_out = dir_ + "/sim";
  ASSERT_TRUE(simulate(dir_, file, 2));
  const auto expected = theta_hashes(sim_out + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 4u);

  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(handle);
  const std::string folder = dir_ + "/ckpt/" + handle.id();
  EXPECT_EQ(theta_hashes(folder + "/metrics.jsonl"), expected);
  EXPECT_TRUE(fs::exists(folder + "/ckpt-round-2.pt"));
  const std::string log = log_text(handle);
  EXPECT_NE(log.find("round 2: sent right behind round 1"), std::string::npos) << log;
  EXPECT_EQ(log.find("not sent ahead"), std::string::npos) << log;
  // The checkpoint of round 2, written under round 3's steps with round 2's average in flight
  // and each worker's provisional θ: resumed from it, the job holds the simulator's θ.
  const auto again = resumed_hashes(client, c.head_address(), folder + "/ckpt-round-2.pt", dir_);
  EXPECT_EQ(again.count(2), 0u);
  EXPECT_EQ(again.at(3), expected.at(3));
}

// A model of the user's own (model: {torchscript: FILE}: a GRU language model that
// tests/diloco/torchscript_models.py scripts with the venv's torch): 2 workers on 2 nodes hold
// the simulator's θ round for round, bit for bit, blocking and streaming (fragments of whole
// tensors). The aggregator describes the file at submission (its hash and size go into the job
// every worker gets and checks its own file against, and into the job file beside the
// checkpoints), and refuses a file outside the data root, a module that returns no scalar loss
// and a file whose hash is not the one the job records, naming each.
// A TorchScript module is code, run by the nodes as their operator: a cluster whose nodes were
// not started with --allow-code-models refuses the job at submission, naming the flag, before
// the module is loaded (issue "21 ·": a module that read the node's cluster key ran at
// submission, as root, and the operator could not turn it off).
TEST_F(DilocoJob, ATorchScriptModelIsRefusedUnlessTheNodesAllowCode) {
  const std::string models = dir_ + "/models";
  const std::string make = std::string(LOCO_PYTHON) + " " + LOCO_SOURCE_DIR +
                           "/tests/diloco/torchscript_models.py " + models + " --context 32";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "no torch in " << LOCO_PYTHON;
  LocalCluster c(one_worker_per_node(1));
  Client client(c.head_address());
  TestJob j = job(1, 1, 1);
  j.torchscript = models + "/gru.pt";
  std::string e = "accepted";
  try {
    JobHandle h = client.submit(JobSpec::from_yaml(j.yaml()));
    e = "accepted: " + to_string(h.wait(Millis(60000)).state);
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("model.torchscript: a TorchScript module is code"), std::string::npos) << e;
  EXPECT_NE(e.find("loco start --allow-code-models"), std::string::npos) << e;
}

TEST_F(DilocoJob, ATorchScriptModelHoldsTheSimulatorsThetaBitForBit) {
  const std::string models = dir_ + "/models";
  const std::string make = std::string(LOCO_PYTHON) + " " + LOCO_SOURCE_DIR +
                           "/tests/diloco/torchscript_models.py " + models + " --context 32";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "no torch in " << LOCO_PYTHON;
  ClusterOptions co = one_worker_per_node(2);
  co.extra_node_args = {"--allow-code-models"};  // the operator's consent: the module is code
  LocalCluster c(co);
  Client client(c.head_address());
  TestJob j = job(2, 2, 3);
  j.torchscript = models + "/gru.pt";
  for (const std::string sync : {"", "{mode: streaming, fragments: 2, overlap_steps: 1}"}) {
    j.sync = sync;
    const std::string name = sync.empty() ? "blocking" : "streaming";
    const std::string file = dir_ + "/" + name + ".yaml";
    std::ofstream(file) << j.yaml();
    ASSERT_TRUE(simulate(dir_, file, 2, name));
    const auto expected = theta_hashes(dir_ + "/" + name + "/metrics.jsonl");
    ASSERT_EQ(expected.size(), 4u);  // rounds 0..3
    JobHandle handle = client.submit(JobSpec::from_yaml_file(file));
    JobInfo end = handle.wait(Millis(300000));
    ASSERT_EQ(end.state, JobState::succeeded) << end.message;
    const std::string folder = dir_ + "/ckpt/" + handle.id();
    const auto got = theta_hashes(folder + "/metrics.jsonl");
    std::printf("%s: θ hash of round 3 distributed %s, simulated %s\n", name.c_str(),
                got.count(3) ? got.at(3).c_str() : "-", expected.at(3).c_str());
    EXPECT_EQ(got, expected);
    const auto written = diloco::JobConfig::from_yaml_file(folder + "/job.yaml");
    EXPECT_EQ(written.model.torchscript, j.torchscript);
    EXPECT_EQ(written.model.torchscript_hash.size(), 16u);
    EXPECT_EQ(written.model.torchscript_parameters, 22976);
  }
  const auto refused = [&](const TestJob& t) -> std::string {
    try {
      client.submit(JobSpec::from_yaml(t.yaml()));
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  TestJob bad = j;
  bad.sync.clear();
  bad.torchscript = "/var/tmp/loco-escape-" + std::to_string(::getpid()) + ".pt";
  std::string e = refused(bad);
  EXPECT_NE(e.find("model.torchscript: '" + bad.torchscript + "' is outside this node's data root"),
            std::string::npos)
      << e;
  bad.torchscript = models + "/per_token.pt";
  e = refused(bad);
  EXPECT_NE(e.find("model.torchscript " + bad.torchscript + ": forward returned a Float tensor"),
            std::string::npos)
      << e;
  bad.torchscript = models + "/gru.pt";
  std::string text = bad.yaml();
  text.replace(text.find("context: 32"), 11, "context: 32, torchscript_hash: 0123456789abcdef");
  try {
    client.submit(JobSpec::from_yaml(text));
    e = "accepted";
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("but the job records model.torchscript_hash 0123456789abcdef"),
            std::string::npos)
      << e;
}

TEST_F(DilocoJob, AWorkerNodeKilledMidJobTheOthersFinishItWithItsShards) {
  LocalCluster c(one_worker_per_node(4));
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(job_yaml(data_, dir_ + "/ckpt", "fp32", 6, 2)));
  std::string victim;
  int last_workers = 0, last_round = 0;
  double first_val = 0, last_val = 0;
  for (const RoundReport& r : job.watch()) {
    if (r.round == 0) first_val = r.val_loss;
    if (r.val_loss > 0) last_val = r.val_loss;
    last_workers = r.workers;
    last_round = r.round;
    if (r.round == 2 && victim.empty()) {
      victim = client.runtime().lookup(job.id() + ".worker-1").address;
      c.node(victim).kill();
    }
  }
  JobInfo end = job.wait(Millis(10000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  EXPECT_EQ(last_round, 6);
  EXPECT_EQ(last_workers, 3);
  EXPECT_TRUE(std::isfinite(last_val));
  EXPECT_LT(last_val, first_val);
  std::string log = log_text(job);
  EXPECT_NE(log.find("lost worker(s) 1; their shards went to the 3 others"), std::string::npos)
      << log;
}

// A checkpoint folder whose name would end a quoted shell word and run a command: the job's
// plot is drawn without a shell (nor any path in gnuplot's script), so nothing runs.
TEST_F(DilocoJob, AQuoteInTheCheckpointFolderRunsNoCommand) {
  const std::string marker = dir_ + "/PWNED";
  TestJob j;
  j.data = data_;
  j.ckpt = "\"" + dir_ + "/ck'; touch " + marker + "; echo '\"";  // YAML double-quoted
  j.rounds = 1;
  j.min = 1;
  j.workers = 1;
  LocalCluster c(one_worker_per_node(1));
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(j.yaml()));
  JobInfo end = job.wait(Millis(60000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  EXPECT_FALSE(fs::exists(marker)) << "the job file ran a command";
  const std::string folder = dir_ + "/ck'; touch " + marker + "; echo '/" + job.id();
  EXPECT_TRUE(fs::exists(folder + "/metrics.jsonl")) << folder;
  // The job runs no program for its plots; `loco plot` draws them from that folder's
  // metrics.jsonl, the folder's name an argument, never a shell's or gnuplot's input.
  EXPECT_FALSE(fs::exists(folder + "/loss.png"));
  Subprocess::Options o;
  o.log_path = dir_ + "/plot.log";
  Subprocess plot(
      {loco_binary(), "plot", "--metrics", folder + "/metrics.jsonl", "--out", dir_ + "/plots"}, o);
  const auto rc = plot.wait(std::chrono::seconds(120));
  ASSERT_TRUE(rc.has_value()) << "loco plot did not finish in 120 s";
  if (fs::exists("/usr/bin/gnuplot")) {
    std::ifstream log(dir_ + "/plot.log");
    EXPECT_EQ(*rc, 0) << log.rdbuf();
    EXPECT_TRUE(fs::exists(dir_ + "/plots/loss.png"));
    EXPECT_TRUE(fs::exists(dir_ + "/plots/steps.png"));
  }
  EXPECT_FALSE(fs::exists(marker)) << "loco plot ran a command";
}

// What anyone who reaches a node sees of a job's worker: the name and signature of one of
// its methods, enough to call it. (The test process does not load the DiLoCo plugin.)
struct WorkerStub {
  std::string save_checkpoint(std::string) { return {}; }
  actors::ReduceResult reduce(actors::ReduceRequest) { return {}; }
};
LOCO_REGISTER(WorkerStub, loco::ActorClass<WorkerStub>("diloco.InnerWorker")
                              .method("save_checkpoint", &WorkerStub::save_checkpoint)
                              .method("reduce", &WorkerStub::reduce));

// Users' files apart (issue "21 ·", finding 5: a client's checkpoint.resume of another user's
// checkpoint was loaded, and data.dir of another user's folder and checkpoint.dir inside
// another user's job folder were accepted). A client's job sees its own folder of each root,
// ROOT/<its key's name>: bob's checkpoints land in ROOT/bob (0700 folders, 0600 files), and
// alice's job naming bob's checkpoint, corpus or folder is refused naming bob.
TEST_F(DilocoJob, AClientsJobReadsAndWritesOnlyItsOwnFolderOfTheRoots) {
  const std::string root = dir_ + "/root";
  ClusterOptions co = one_worker_per_node(1);
  co.path_root = root;
  fs::create_directories(root);
  LocalCluster c(co);
  std::map<std::string, std::unique_ptr<Client>> as;
  for (const std::string who : {"alice", "bob"}) {
    const std::string key = c.log_dir() + "/" + who + ".key";
    const std::string cmd = "timeout 60 " + loco_binary() + " keygen --client --out " + key +
                            " --key " + c.key_path() + " --name " + who + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    ConnectOptions o;
    o.security = security::read_key_file(key);
    as[who] = std::make_unique<Client>(c.head_address(), o);
    fs::create_directories(root + "/" + who);
    fs::copy(data_, root + "/" + who + "/data", fs::copy_options::recursive);
  }
  TestJob j = job(1, 1, 1);
  j.data = "data";
  j.ckpt = "ck";
  JobHandle bobs = as["bob"]->submit(JobSpec::from_yaml(j.yaml()));
  JobInfo end = bobs.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(bobs);
  const std::string folder = root + "/bob/ck/" + bobs.id();
  const std::string ckpt = folder + "/final.pt";
  ASSERT_TRUE(fs::exists(ckpt)) << "bob's checkpoint is not in his folder";
  EXPECT_EQ(fs::status(folder).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(fs::status(ckpt).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);

  auto refusal = [&](const std::string& data, const std::string& ck, const std::string& resume) {
    TestJob a = job(1, 1, 1);
    a.data = data;
    a.ckpt = ck;
    std::string yaml = a.yaml();
    const std::string mapping = "checkpoint: {";
    if (!resume.empty())
      yaml.replace(yaml.find(mapping), mapping.size(), mapping + "resume: " + resume + ", ");
    try {
      JobHandle h = as["alice"]->submit(JobSpec::from_yaml(yaml));
      return "accepted: " + to_string(h.wait(Millis(300000)).state);
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  std::string e = refusal("data", "ck", ckpt);
  EXPECT_NE(e.find("checkpoint.resume: '" + ckpt + "' is in the folder of user 'bob'"),
            std::string::npos)
      << e;
  e = refusal(root + "/bob/data", "ck", "");
  EXPECT_NE(e.find("data.dir: '" + root + "/bob/data' is in the folder of user 'bob'"),
            std::string::npos)
      << e;
  e = refusal("data", folder, "");
  EXPECT_NE(e.find("checkpoint.dir: '" + folder + "' is in the folder of user 'bob'"),
            std::string::npos)
      << e;
  e = refusal("../bob/data", "ck", "");
  EXPECT_NE(e.find("is in the folder of user 'bob'"), std::string::npos) << e;
  // Her own files: accepted, and run.
  EXPECT_EQ(refusal("data", "ck", ""), "accepted: succeeded");
}

// A node's jobs read and write only under its roots (loco start --data-root,
// --checkpoint-root): a job file whose checkpoint.dir or data.dir leaves them, by an
// absolute path, by "..", or through a symbolic link, is refused naming the field, and a
// worker asked to write a checkpoint outside writes nothing.
TEST_F(DilocoJob, PathsOutsideTheNodesRootsAreRefusedNamingTheField) {
  const std::string root = dir_ + "/root";
  fs::create_directories(root);
  fs::copy(data_, root + "/data", fs::copy_options::recursive);
  const std::string outside = "/var/tmp/loco-escape-" + std::to_string(::getpid());
  ClusterOptions co = one_worker_per_node(1);
  co.path_root = root;
  LocalCluster c(co);
  Client client(c.head_address());
  auto refused = [&](const std::string& data, const std::string& ckpt) -> std::string {
    TestJob j = job(1, 1, 1);
    j.data = data;
    j.ckpt = ckpt;
    try {
      client.submit(JobSpec::from_yaml(j.yaml()));
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  for (const std::string& ckpt : {outside, root + "/../escape"}) {
    const std::string e = refused(root + "/data", ckpt);
    EXPECT_NE(e.find("checkpoint.dir: '" + ckpt + "' is outside this node's checkpoint root"),
              std::string::npos)
        << e;
  }
  EXPECT_FALSE(fs::exists(outside));
  EXPECT_FALSE(fs::exists(dir_ + "/escape"));
  fs::create_directory_symlink(data_, root + "/link");
  for (const std::string& data : {data_, root + "/link", std::string("../../") + data_}) {
    const std::string e = refused(data, root + "/ckpt");
    EXPECT_NE(e.find("data.dir: '" + data + "' is outside this node's data root"),
              std::string::npos)
        << e;
  }
  // The tokenizer.json a job names is held to the data root as data.dir is.
  {
    TestJob t = job(1, 1, 1);
    t.data = root + "/data";
    t.ckpt = root + "/ckpt";
    t.tokenizer = outside + "/tokenizer.json";
    t.vocab = 300;
    std::string e = "accepted";
    try {
      client.submit(JobSpec::from_yaml(t.yaml()));
    } catch (const Error& err) {
      e = err.what();
    }
    EXPECT_NE(e.find("data.tokenizer: '" + t.tokenizer + "' is outside this node's data root"),
              std::string::npos)
        << e;
  }

  // Inside both roots (relative paths are taken from the roots) the job runs; its worker
  // writes a checkpoint where asked inside the root, and refuses outside.
  TestJob j = job(1, 1, 200);
  j.data = "data";
  j.ckpt = "ckpt";
  JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
  for (const RoundReport& r : handle.watch())
    if (r.round >= 1) break;
  auto w = client.runtime().get_actor<WorkerStub>(handle.id() + ".worker-0");
  try {
    w.call(&WorkerStub::save_checkpoint, outside + "/w.pt").get(Millis(30000));
    ADD_FAILURE() << "a checkpoint was written at " << outside;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("save_checkpoint: path: '" + outside +
                                         "/w.pt' is outside this node's checkpoint root"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(outside));
  // A reduce whose lists do not match (it once indexed past the endpoints and took the node
  // down with all its actors) is refused, and the worker goes on answering.
  actors::ReduceRequest bad;
  bad.names = {"a", "b"};
  bad.endpoints = {{"tcp://127.0.0.1:1"}};
  bad.rank = 1;
  try {
    w.call(&WorkerStub::reduce, bad).get(Millis(30000));
    ADD_FAILURE() << "a reduce with 2 names and 1 endpoint list was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce with 2 names, 1 endpoint lists and rank 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(w.call(&WorkerStub::save_checkpoint, root + "/ckpt/probe.pt").get(Millis(30000)),
            root + "/ckpt/probe.pt");
  EXPECT_TRUE(fs::exists(root + "/ckpt/probe.pt"));
  // A user's client key may not call a worker's methods at all, even inside the roots.
  const auto user = security::generate_key_pair();
  security::add_client_to_key_file(c.key_path(), user.public_key, "user");
  ConnectOptions as_user;
  as_user.security = security::Settings::for_client(
      user, security::read_key_file(c.key_path()).cluster.public_key);
  Runtime user_rt = Runtime::connect(c.head_address(), as_user);
  auto uw = user_rt.get_actor<WorkerStub>(handle.id() + ".worker-0");
  try {
    uw.call(&WorkerStub::save_checkpoint, root + "/ckpt/user.pt").get(Millis(30000));
    ADD_FAILURE() << "a client called save_checkpoint";
  } catch (const PermissionError& e) {
    EXPECT_NE(std::string(e.what()).find("diloco.InnerWorker.save_checkpoint is internal"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(root + "/ckpt/user.pt"));
  handle.cancel();
}

TEST_F(DilocoJob, BadJobFileFailsTheSubmissionNamingTheField) {
  std::string text = job_yaml(data_, dir_ + "/ckpt", "int4");
  ClusterOptions co;
  co.nodes = 1;
  co.plugins = LOCO_PLUGIN_DIR_STR;
  LocalCluster c(co);
  Client client(c.head_address());
  try {
    client.submit(JobSpec::from_yaml(text));
    FAIL() << "a job with compression int4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compression"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int4"), std::string::npos) << e.what();
  }
  // Streaming with several local ranks per worker is not built: refused, naming the field.
  try {
    TestJob j = job(1, 1, 1);
    j.local_ranks = 2;
    j.sync = "{mode: streaming, fragments: 2}";
    client.submit(JobSpec::from_yaml(j.yaml()));
    FAIL() << "a streaming job with 2 local ranks per worker was accepted by a cluster";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sync.mode: streaming and eager run one local rank"),
              std::string::npos)
        << e.what();
  }
  // A missing corpus is named too.
  try {
    client.submit(JobSpec::from_yaml(job_yaml(dir_ + "/nothing-here", dir_ + "/ckpt", "fp32")));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing-here"), std::string::npos) << e.what();
  }
}

// A job's actors run only inside the job the head created them for (issue 14's probe: a user
// spawned diloco.OuterAggregator with Bob's job id in its arguments, ran as a member of his job,
// rewrote his folder and killed his worker). Even a holder of the cluster key who spawns one
// with a running job's id gets a refusal from its constructor, and the job is untouched.
TEST_F(DilocoJob, AJobsActorsRunOnlyInsideTheJobTheHeadCreatedThemFor) {
  LocalCluster c(one_worker_per_node(1));
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(job_yaml(data_, dir_ + "/ckpt", "fp32", 2, 1)));
  const std::string spec = job_yaml(data_, dir_ + "/ckpt-thief", "fp32", 2, 1);
  auto spawn = [&](const std::string& cls, const std::string& args, const std::string& name) {
    SpawnRequest req;
    req.class_name = cls;
    req.ctor_args = args;
    req.name = name;
    req.resources = {{"cpu", 0}};
    try {
      (void)c.runtime().core()->head_call<ActorInfo>("spawn", Millis(60000), req);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(spawned)");
  };
  auto packed = [](const auto& tuple) {
    msgpack::sbuffer b;
    msgpack::pack(b, tuple);
    return std::string(b.data(), b.size());
  };
  std::string e = spawn("diloco.OuterAggregator", packed(std::make_tuple(job.id(), spec)),
                        "thief-aggregator");
  EXPECT_NE(e.find("diloco.OuterAggregator runs only inside a submitted job"), std::string::npos)
      << e;
  e = spawn("diloco.InnerWorker", packed(std::make_tuple(job.id(), spec, 0)), "thief-worker");
  EXPECT_NE(e.find("diloco.InnerWorker runs only inside a submitted job"), std::string::npos) << e;
  JobInfo end = job.wait(Millis(300000));
  EXPECT_EQ(end.state, JobState::succeeded) << end.message;
  EXPECT_FALSE(fs::exists(dir_ + "/ckpt-thief"));
}

// A learning rate far too large. inner.lr: 1e308 is finite, and passed validation: the first
// inner step could not run at all (torch cannot take lr / (1 - betas[0]) as a float), every
// worker failed its inner steps at once, and the round was redone for ever (tens of thousands
// of "redone" lines a minute). It is refused at submission now, naming the field. inner.lr:
// 1e30 runs, and makes the loss non-finite at the second step; redone from the same state, the
// round gives the same result: the job fails after kMaxRoundRedos redos, naming the cause and
// the fix.
TEST_F(DilocoJob, ALearningRateThatMakesTheLossNonFiniteFailsTheJobAfterBoundedRedos) {
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  TestJob j = job(2, 2, 3);
  j.lr = "1e308";
  try {
    JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
    handle.cancel();
    FAIL() << "a job with inner.lr: 1e308 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inner.lr: must be small enough"), std::string::npos)
        << e.what();
  }
  j.lr = "1e30";
  JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
  JobInfo end;
  try {
    end = handle.wait(Millis(180000));
  } catch (const TimeoutError& e) {
    handle.cancel();
    const std::string log = log_text(handle);
    FAIL() << e.what() << "; " << std::count(log.begin(), log.end(), '\n')
           << " log lines, the last: " << log.substr(log.size() > 2000 ? log.size() - 2000 : 0);
  }
  const std::string log = log_text(handle);
  ASSERT_EQ(end.state, JobState::failed) << end.message << "\n" << log;
  for (const char* part :
       {"round 1: worker 0's inner loss became non-finite (nan) at step 2 of 10",
        "the round was redone 3 times with the same result", "lower inner.lr (1e+30)"})
    EXPECT_NE(end.message.find(part), std::string::npos) << part << " in: " << end.message;
  // Each redo said once, then the failure (before: a line a few milliseconds, for ever).
  size_t redone = 0;
  for (size_t at = log.find("redone"); at != std::string::npos; at = log.find("redone", at + 1))
    ++redone;
  EXPECT_EQ(redone, 4u) << log;
  EXPECT_NE(log.find("it is redone (3 of at most 3)"), std::string::npos) << log;
  EXPECT_NE(log.find("job failed: round 1: worker 0's inner loss"), std::string::npos) << log;
}

// A model that no node can hold is refused at submission, naming the field most responsible
// and the memory it needs against the largest node's (its `memory` resource, in bytes), rather
// than failing later as a worker allocates it.
TEST_F(DilocoJob, AJobNeedingMoreMemoryThanTheLargestNodeIsRefusedNamingTheField) {
  ClusterOptions co = one_worker_per_node(2);
  co.node_resources = "cpu=1,memory=1e9";  // 0.9 GiB
  LocalCluster c(co);
  Client client(c.head_address());
  TestJob j = job(2, 2, 1);
  j.layers = 1024;  // 51 M parameters: about 6 GiB per worker
  try {
    JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
    handle.cancel();
    FAIL() << "a job needing more memory than any node has was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"model.layers (1024) and model.width (64)", "needs about ",
                             " GiB per worker; the largest node has 0.9 GiB"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  }
  // The same cluster takes the job's own size.
  JobHandle ok = client.submit(JobSpec::from_yaml(job(2, 2, 1).yaml()));
  EXPECT_EQ(ok.wait(Millis(120000)).state, JobState::succeeded);
  EXPECT_NE(log_text(ok).find("memory: a worker needs about "), std::string::npos);
}

// Bounded disk (issue "21 ·", finding 8: `checkpoint.every: 1` without `keep` wrote 2.7 GB in
// 21,675 files in 4 minutes). Without `keep` a job keeps its newest 3 round checkpoints; with
// `quota_gib` a checkpoint that would take the job's folder past it is not written, the log
// says why, and the job goes on to succeed.
TEST_F(DilocoJob, CheckpointsAreKeptThreeByDefaultAndWithinTheJobsQuota) {
  LocalCluster c(one_worker_per_node(1));
  Client client(c.head_address());
  TestJob j = job(1, 1, 6);
  j.checkpoint_every = 1;
  JobHandle kept = client.submit(JobSpec::from_yaml(j.yaml()));
  ASSERT_EQ(kept.wait(Millis(300000)).state, JobState::succeeded) << log_text(kept);
  const std::string folder = dir_ + "/ckpt/" + kept.id();
  for (int r = 1; r <= 5; ++r)
    EXPECT_EQ(fs::exists(folder + "/ckpt-round-" + std::to_string(r) + ".pt"), r >= 3) << r;
  EXPECT_TRUE(fs::exists(folder + "/final.pt"));

  // The test model's checkpoint with one worker is about 3.6 MiB (2.3 the aggregator's file,
  // 1.4 the worker's): 10 MiB hold two.
  std::string yaml = j.yaml();
  const std::string mapping = "checkpoint: {";
  yaml.replace(yaml.find(mapping), mapping.size(), mapping + "keep: 0, quota_gib: 0.009765625, ");
  JobHandle quota = client.submit(JobSpec::from_yaml(yaml));
  ASSERT_EQ(quota.wait(Millis(300000)).state, JobState::succeeded) << log_text(quota);
  const std::string log = log_text(quota);
  const std::string qfolder = dir_ + "/ckpt/" + quota.id();
  double bytes = 0;
  for (const auto& e : fs::directory_iterator(qfolder)) bytes += double(e.file_size());
  EXPECT_LE(bytes, 10.0 * (1 << 20));
  EXPECT_TRUE(fs::exists(qfolder + "/ckpt-round-1.pt"));
  EXPECT_TRUE(fs::exists(qfolder + "/ckpt-round-2.pt"));
  EXPECT_FALSE(fs::exists(qfolder + "/ckpt-round-3.pt"));
  EXPECT_FALSE(fs::exists(qfolder + "/final.pt"));
  EXPECT_NE(log.find("the checkpoint of round 3 is not written: the job's folder holds "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("past checkpoint.quota_gib"), std::string::npos) << log;
  EXPECT_NE(log.find("final.pt is not written"), std::string::npos) << log;
}

// checkpoint.keep and checkpoint.resume (`loco submit --resume`): a job keeps only its newest
// round checkpoints; on a new cluster with a new Redis, nothing left of the first, a job started
// from one of them with the `loco` command (no job file: the job.yaml beside the checkpoint)
// holds the first job's θ, round for round, bit for bit.
TEST_F(DilocoJob, ResumedFromACheckpointOnANewClusterTheJobContinuesBitForBit) {
  TestJob j = job(2, 2, 4);
  j.checkpoint_every = 1;
  j.checkpoint_keep = 2;
  std::map<int, std::string> first;
  std::string folder;
  {
    LocalCluster c(one_worker_per_node(2));
    Client client(c.head_address());
    JobHandle handle = client.submit(JobSpec::from_yaml(j.yaml()));
    JobInfo end = handle.wait(Millis(300000));
    ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log_text(handle);
    folder = dir_ + "/ckpt/" + handle.id();
    first = theta_hashes(folder + "/metrics.jsonl");
    ASSERT_EQ(first.size(), 5u);  // rounds 0..4
    // Checkpoints of rounds 1, 2 and 3 were written; the newest 2 stay, with their workers'
    // inner states, and final.pt and the job file.
    EXPECT_FALSE(fs::exists(folder + "/ckpt-round-1.pt"));
    EXPECT_FALSE(fs::exists(folder + "/ckpt-round-1.worker-0.pt"));
    for (const char* f : {"ckpt-round-2.pt", "ckpt-round-2.worker-0.pt", "ckpt-round-2.worker-1.pt",
                          "ckpt-round-3.pt", "ckpt-round-3.worker-1.pt", "final.pt", "job.yaml"})
      EXPECT_TRUE(fs::exists(folder + "/" + f)) << f;
    EXPECT_NE(log_text(handle).find("checkpoint.keep: removed the checkpoint of round 1"),
              std::string::npos);
  }
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  auto loco = [&](std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), {LOCO_BIN_DIR "/loco", "submit", "--address", c.head_address()});
    Subprocess p(args, Subprocess::Options{.log_path = log});
    return p.wait(Millis(300000)).value_or(-1);
  };
  ASSERT_EQ(loco({"--resume", folder + "/ckpt-round-2.pt"}, dir_ + "/resume.log"), 0)
      << "see " << dir_ << "/resume.log";
  const std::vector<JobInfo> jobs = client.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  const std::string second = dir_ + "/ckpt/" + jobs[0].id + "/metrics.jsonl";
  const auto resumed = theta_hashes(second);
  EXPECT_EQ(resumed.count(2), 0u);  // nothing before the checkpoint's round is redone
  for (int r : {3, 4}) EXPECT_EQ(resumed.at(r), first.at(r)) << "round " << r;

  // From final.pt the job has nothing left to do unless it is given more rounds: refused with
  // the reason, then run with --set.
  EXPECT_NE(loco({folder + "/job.yaml", "--resume", folder + "/final.pt"}, dir_ + "/final.log"), 0);
  std::ifstream refused(dir_ + "/final.log");
  const std::string why((std::istreambuf_iterator<char>(refused)), {});
  EXPECT_NE(why.find("is of round 4 and the job ends at round 4"), std::string::npos) << why;
  ASSERT_EQ(loco({"--resume", folder + "/final.pt", "--set", "rounds=6", "--set",
                  "inner.lr=0.001"},
                 dir_ + "/more.log"),
            0)
      << "see " << dir_ << "/more.log";
  std::string more;
  for (const JobInfo& info : client.jobs())
    if (info.state == JobState::succeeded && info.id != jobs[0].id) more = info.id;
  ASSERT_FALSE(more.empty());
  const auto continued = theta_hashes(dir_ + "/ckpt/" + more + "/metrics.jsonl");
  EXPECT_EQ(continued.begin()->first, 5);
  EXPECT_EQ(continued.rbegin()->first, 6);
  // Its job file says what it ran with.
  std::ifstream saved(dir_ + "/ckpt/" + more + "/job.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(saved)), {});
  EXPECT_NE(yaml.find("lr: 0.001"), std::string::npos) << yaml;
}

// Per-step device figures in metrics.jsonl: model TFLOP/s always; MFU where the devices' peak
// is known (here given by $LOCO_PEAK_TFLOPS, which the nodes inherit); memory only on GPUs.
TEST_F(DilocoJob, EachStepRecordsModelFlopsAndMfuAgainstTheDevicesPeak) {
  constexpr double kPeakTflops = 0.5;
  ::setenv("LOCO_PEAK_TFLOPS", std::to_string(kPeakTflops).c_str(), 1);
  struct Unset {
    ~Unset() { ::unsetenv("LOCO_PEAK_TFLOPS"); }
  } unset;
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle handle = client.submit(JobSpec::from_yaml(job(2, 2, 1).yaml()));
  JobInfo end = handle.wait(Millis(300000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  int checked = 0;
  for (const std::string& line : jsonl(dir_ + "/ckpt/" + handle.id() + "/metrics.jsonl")) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("steps")) continue;
    for (const auto& s : j["steps"]) {
      ASSERT_TRUE(s["tflops"].is_number()) << s;
      ASSERT_TRUE(s["mfu"].is_number()) << s;
      EXPECT_TRUE(s["memory_gb"].is_null()) << s;  // CPUs
      const double tflops = s["tflops"], mfu = s["mfu"];
      EXPECT_GT(mfu, 0);
      // Over the slower member's time, both members' FLOPs are at most what their own times
      // give: tflops <= members × peak × mean MFU. (No lower bound: how far below it depends on
      // how unevenly the two got a core, which a loaded machine makes anything; a bound of half
      // failed whenever one member's step took 3× the other's.)
      EXPECT_LE(tflops, 2 * kPeakTflops * mfu * (1 + 1e-9)) << s;
      EXPECT_GT(tflops, 0) << s;
      // And the CPU time the workers' processes used in it (their mean): some, whatever the
      // wait for a core around it.
      ASSERT_TRUE(s["cpu_s"].is_number()) << s;
      EXPECT_GT(s["cpu_s"].get<double>(), 0) << s;
      ++checked;
    }
    for (const auto& m : j["members"]) EXPECT_GT(m["cpu_seconds"].get<double>(), 0) << m;
  }
  EXPECT_EQ(checked, 10);  // one round of 10 steps
}

// device: auto where no node offers `gpu`: the workers ask for none and train on
// the CPU, saying so in the job's log.
TEST_F(DilocoJob, DeviceAutoOnNodesWithoutGpusTrainsOnTheCpu) {
  TestJob j;
  j.data = data_;
  j.ckpt = dir_ + "/ckpt";
  j.workers = j.min = 2;
  j.rounds = 1;
  j.device = "auto";
  LocalCluster c(one_worker_per_node(2));
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(j.yaml()));
  for (const RoundReport& r : job.watch()) EXPECT_EQ(r.workers, 2);
  JobInfo end = job.wait(Millis(10000));
  ASSERT_EQ(end.state, JobState::succeeded) << end.message;
  const std::string log = log_text(job);
  for (int i : {0, 1})
    EXPECT_NE(log.find("worker " + std::to_string(i) +
                       " trains on cpu (device: auto; the worker's node offers no gpu resources)"),
              std::string::npos)
        << log;
}

// device: cuda where no node offers `gpu`: the job fails, naming the resource.
TEST_F(DilocoJob, DeviceCudaWithoutGpuNodesFailsNamingTheGpus) {
  TestJob j;
  j.data = data_;
  j.ckpt = dir_ + "/ckpt";
  j.workers = j.min = 1;
  j.device = "cuda";
  j.wait_s = 1;
  LocalCluster c(one_worker_per_node(1));
  Client client(c.head_address());
  JobHandle job = client.submit(JobSpec::from_yaml(j.yaml()));
  for (const RoundReport& r : job.watch()) (void)r;
  JobInfo end = job.wait(Millis(30000));
  EXPECT_EQ(end.state, JobState::failed);
  EXPECT_NE(end.message.find("1 free gpu"), std::string::npos) << end.message;
}

}  // namespace
}  // namespace loco::testing
