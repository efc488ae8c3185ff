// The guard (diloco/round/guard.hpp) in a job on a cluster: a worker that sends a broken or hostile
// pseudo-gradient (the fault-injection plugin's corrupt=KIND) is left out of the average by
// every member alike (θ stays the same everywhere: the aggregator checks its hash every
// round), recorded in metrics.jsonl, the log and the reports, and removed from the job after
// guard.evict_after rounds in a row.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/actors/job_util.hpp"
#include "tests/support/eventually.hpp"

namespace loco::testing {
namespace {

// metrics.jsonl's lines by round (the last line of each).
std::map<int, nlohmann::json> metrics_by_round(const std::string& folder) {
  std::map<int, nlohmann::json> out;
  for (const std::string& l : jsonl(folder + "/metrics.jsonl")) {
    auto j = nlohmann::json::parse(l);
    out[j["round"].get<int>()] = j;
  }
  return out;
}

// The (worker, rule) pairs of a metrics line's "left_out" (none: empty).
std::set<std::pair<int, std::string>> left_out(const nlohmann::json& line) {
  std::set<std::pair<int, std::string>> out;
  if (!line.contains("left_out")) return out;
  for (const auto& e : line["left_out"]) out.emplace(e["worker"].get<int>(), e["rule"].get<std::string>());
  return out;
}

// How many left-outs a metrics line records (its "left_out" entries).
size_t left_out_count(const nlohmann::json& line) {
  return line.contains("left_out") ? line["left_out"].size() : 0;
}

// A job `t` on 3 one-worker nodes that load the fault plugin with $LOCO_FAULT = `fault`, run to
// its end (bounded): whether it succeeded (with why not), its log and its metrics by round.
struct Finished {
  bool succeeded = false;
  std::string why, log;
  std::map<int, nlohmann::json> metrics;
};
Finished run_with_fault(const std::string& fault, const TestJob& t) {
  ScopedEnv env("LOCO_FAULT", fault);
  LocalCluster c(with_fault_injection(one_worker_per_node(3)));
  Client client(c.head_address());
  JobHandle j = client.submit(JobSpec::from_yaml(t.yaml()));
  const JobInfo end = j.wait(Millis(300000));
  Finished f;
  f.succeeded = end.state == JobState::succeeded;
  f.log = log_text(j);
  f.why = end.message + "\n" + f.log;
  f.metrics = metrics_by_round(t.ckpt + "/" + j.id());
  return f;
}

using Guard = DilocoJob;

// Worker 1 of 3 sends Δ × 100 from round 2 on. Rounds 2 and 3 leave it out (rule norm); after
// guard.evict_after = 2 it is removed, named with the round and the rule, and the other two
// finish the job; the job's loss falls as a healthy one's does.
TEST_F(Guard, AScaledUpdateIsLeftOutAndItsWorkerRemoved) {
  TestJob t = job(3, 1, 5);
  t.guard = "{evict_after: 2}";
  const Finished f = run_with_fault("worker=1,round=2,corrupt=scale", t);
  ASSERT_TRUE(f.succeeded) << f.why;
  const std::string& log = f.log;
  EXPECT_TRUE(contains(log, "the guard left worker 1 out of the average (norm)")) << log;
  EXPECT_TRUE(contains(log, "worker 1 removed from the job: the guard left it out of 2 rounds "
                            "in a row, the last round 3 (rule norm")) << log;
  EXPECT_FALSE(contains(log, "holds a different")) << log;
  const auto& m = f.metrics;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_TRUE(left_out(m.at(1)).empty()) << m.at(1);
  for (int r : {2, 3})
    EXPECT_EQ(left_out(m.at(r)), (std::set<std::pair<int, std::string>>{{1, "norm"}})) << m.at(r);
  for (int r : {4, 5}) {
    EXPECT_TRUE(left_out(m.at(r)).empty()) << m.at(r);
    EXPECT_EQ(m.at(r)["workers"], 2) << m.at(r);
  }
  const double v0 = m.at(0)["val_loss"].get<double>(), v5 = m.at(5)["val_loss"].get<double>();
  EXPECT_TRUE(std::isfinite(v5));
  EXPECT_LT(v5, v0 - 0.3) << "the job trained on without the broken update";
}

// The soak bench's hang: the guard removed a streaming worker as a round ended whose members
// had been asked for a checkpoint and θ's evaluation, and the aggregator then asked the removed
// slot for its part through the handle it had just dropped (a freed handle: an 11-minute wait on
// a freed mutex, then a corrupted heap). The checkpoint of that round is recorded from the
// others' parts and θ is evaluated later; the job ends with the two healthy workers.
TEST_F(Guard, AWorkerRemovedAsACheckpointAndAnEvaluationAreDueIsNotAskedForItsPart) {
  TestJob t = job(3, 1, 5);
  t.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  t.guard = "{evict_after: 2}";
  t.checkpoint_every = 3;  // round 3, the round the guard removes worker 1 at
  const Finished f = run_with_fault("worker=1,round=2,corrupt=scale", t);
  ASSERT_TRUE(f.succeeded) << f.why;
  EXPECT_TRUE(contains(f.log,
                       "worker 1 removed from the job: the guard left it out of 2 rounds "
                       "in a row, the last round 3"))
      << f.log;
  EXPECT_TRUE(contains(f.log, "ckpt-round-3.pt (round 3)")) << f.log;
  EXPECT_FALSE(contains(f.log, "has no actor")) << f.log;
  // A removed worker never comes back, not even at a fragment boundary mid-round (the soak
  // bench's log: "worker 1 does not join round N mid-round" every round after the removal).
  EXPECT_FALSE(contains(f.log, "worker 1 does not join")) << f.log;
  EXPECT_FALSE(contains(f.log, "worker 1 joined")) << f.log;
  ASSERT_EQ(f.metrics.size(), 6u);
  EXPECT_EQ(f.metrics.at(4)["workers"], 2) << f.metrics.at(4);
  EXPECT_EQ(f.metrics.at(5)["workers"], 2) << f.metrics.at(5);
  EXPECT_TRUE(std::isfinite(f.metrics.at(5)["val_loss"].get<double>())) << f.metrics.at(5);
}

// A streaming job whose guard removed a worker sends its rounds ahead again: the removed slot
// is never filled, so the two left are the whole job. Before, the removed slot still counted in
// the job's target, and every later round waited at its start for members that could not come
// ("round N: not sent ahead: the members may change"): the soak's record of 2026-11-30 ran its
// last 60 rounds so.
TEST_F(Guard, AfterTheGuardRemovedAWorkerTheRoundsAreSentAheadAgain) {
  TestJob t = job(3, 1, 7);
  t.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  t.guard = "{evict_after: 2}";
  t.eval_every = 1000;  // an evaluation due also keeps a round from being sent ahead
  const Finished f = run_with_fault("worker=1,round=2,corrupt=scale", t);
  ASSERT_TRUE(f.succeeded) << f.why;
  const size_t removed = f.log.find("worker 1 removed from the job");
  ASSERT_NE(removed, std::string::npos) << f.log;
  // Said when it changes: sent ahead from round 2 on, and never held back after the removal.
  EXPECT_NE(f.log.find("round 2: sent right behind round 1"), std::string::npos) << f.log;
  EXPECT_EQ(f.log.find("not sent ahead: the members may change", removed), std::string::npos)
      << f.log;
  ASSERT_EQ(f.metrics.size(), 8u);
  EXPECT_EQ(f.metrics.at(7)["workers"], 2) << f.metrics.at(7);
}

// A worker the guard removed stays removed when the job's aggregator is restarted (its node
// killed): the restarted aggregator resumes from its checkpoint and reads the removal from the
// job's departure records. Before, it filled the removed slot again (the soak's smoke,
// 2026-11-30: "worker 1 joined at round 49", 39 rounds after the guard had removed it).
TEST_F(Guard, AWorkerTheGuardRemovedStaysRemovedWhenTheAggregatorIsRestarted) {
  TestJob t = job(3, 1, 10);
  t.guard = "{evict_after: 2}";
  t.checkpoint_every = 2;
  ScopedEnv env("LOCO_FAULT", "worker=1,round=2,corrupt=scale");
  LocalCluster c(with_fault_injection(one_worker_per_node(4)));
  Client client(c.head_address());
  JobHandle j = client.submit(JobSpec::from_yaml(t.yaml()));
  const std::string folder = t.ckpt + "/" + j.id();
  ASSERT_TRUE(eventually([&] { return metrics_by_round(folder).count(5) || j.info().finished(); },
                         Millis(120000), Millis(50)));
  ASSERT_FALSE(j.info().finished()) << log_text(j);
  ASSERT_TRUE(contains(log_text(j), "worker 1 removed from the job")) << log_text(j);
  c.node(client.runtime().lookup(j.id() + ".entry").address).kill();
  const JobInfo end = j.wait(Millis(300000));
  const std::string log = log_text(j);
  ASSERT_EQ(end.state, JobState::succeeded) << end.message << "\n" << log;
  const size_t resumed = log.find("resuming from ");
  ASSERT_NE(resumed, std::string::npos) << log;
  // Said by the restarted aggregator as it starts, before "resuming from".
  EXPECT_NE(log.find("worker 1 stays removed from the job: the guard left it out of 2 rounds"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("worker 1 joined", resumed), std::string::npos) << log;
  EXPECT_EQ(log.find("worker 1 cannot join", resumed), std::string::npos) << log;
  EXPECT_EQ(metrics_by_round(folder).at(10)["workers"], 2) << metrics_by_round(folder).at(10);
}

// Streaming (2 fragments): worker 2 of 3 flips the sign of its Δ from round 2 on. The
// fragments' averages leave it out (rule direction) where the honest workers' updates agree
// (docs/decisions/0039-robust-averaging.md), nobody else is ever left out, it is never removed
// (evict_after 0), and the job is the simulator's with the same fault bit for bit: θ's hash
// every round, and the same left-outs (`loco-train --corrupt 1:2:flip`).
TEST_F(Guard, AFlippedUpdateIsLeftOutInStreamingModeAsTheSimulatorLeavesItOut) {
  TestJob t = job(3, 3, 4);
  t.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  t.guard = "{evict_after: 0}";
  const std::string file = dir_ + "/guard.yaml";
  std::ofstream(file) << t.yaml();
  Subprocess sim({LOCO_BIN_DIR "/loco-train", "train", "--simulate", "3", file, "--out",
                  dir_ + "/sim", "--corrupt", "1:2:flip"},
                 Subprocess::Options{.log_path = dir_ + "/sim.log"});
  ASSERT_EQ(sim.wait(Millis(300000)).value_or(-1), 0) << "see " << dir_ << "/sim.log";
  const Finished f = run_with_fault("worker=2,round=2,corrupt=flip", t);
  ASSERT_TRUE(f.succeeded) << f.why;
  EXPECT_TRUE(contains(f.log, "the guard left worker 2 out of the average of fragment")) << f.log;
  EXPECT_FALSE(contains(f.log, "removed from the job")) << f.log;
  const auto& m = f.metrics;
  const auto s = metrics_by_round(dir_ + "/sim");
  ASSERT_EQ(m.size(), 5u);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_TRUE(left_out(m.at(1)).empty()) << m.at(1);
  // Over rounds 2 to 4 (a fragment's average is reported with the round it landed in, which
  // may be the next one): the job's left-outs are the simulator's, all worker 2's.
  size_t job_notes = 0, sim_notes = 0;
  for (int r = 1; r <= 4; ++r) {
    EXPECT_EQ(m.at(r)["theta_hash"], s.at(r)["theta_hash"]) << "round " << r;
    for (const auto& [worker, rule] : left_out(m.at(r))) {
      EXPECT_EQ(worker, 2) << m.at(r);
      EXPECT_EQ(rule, "direction") << m.at(r);
    }
    job_notes += left_out_count(m.at(r));
    sim_notes += left_out_count(s.at(r));
    EXPECT_EQ(m.at(r)["workers"], 3) << m.at(r);
  }
  EXPECT_EQ(job_notes, sim_notes);
  // Of the 6 fragment averages of rounds 2 to 4, most leave it out.
  EXPECT_GE(job_notes, 4u);
  std::printf("worker 2 (flipped) left out of %zu of 6 fragment averages\n", job_notes);
}

// A worker whose inner loss turns NaN (the fault plugin's at=diverge, round 2, step 5 of 10)
// stops its round there and sends nothing: in a blocking round the aggregator leaves it out of
// the round (recorded as `abstained`), the others average without it, and it comes back with
// the outer state for round 3; nothing is redone and nobody is removed (one round only).
TEST_F(Guard, AWorkerWhoseLossTurnsNaNStopsItsRoundAndSendsNothing) {
  const Finished f = run_with_fault("worker=1,round=2,at=diverge", job(3, 1, 4));
  ASSERT_TRUE(f.succeeded) << f.why;
  EXPECT_TRUE(contains(f.log, "worker 1's inner loss became non-finite (nan) at step 5 of 10"))
      << f.log;
  EXPECT_FALSE(contains(f.log, "redone")) << f.log;
  EXPECT_FALSE(contains(f.log, "removed from the job")) << f.log;
  const auto& m = f.metrics;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(left_out(m.at(2)), (std::set<std::pair<int, std::string>>{{1, "abstained"}}))
      << m.at(2);
  EXPECT_EQ(m.at(2)["workers"], 2) << m.at(2);
  for (int r : {1, 3, 4}) {
    EXPECT_TRUE(left_out(m.at(r)).empty()) << m.at(r);
    EXPECT_EQ(m.at(r)["workers"], 3) << m.at(r);
  }
  EXPECT_TRUE(std::isfinite(m.at(4)["val_loss"].get<double>()));
}

// Streaming: the diverging worker stops its steps at step 5 of round 2 and abstains from the
// round's two fragment averages (rule `abstained`), which the others finish; θ stays the same
// on every member.
TEST_F(Guard, AStreamingWorkerWhoseLossTurnsNaNAbstainsFromTheRestOfItsRound) {
  TestJob t = job(3, 3, 4);
  t.sync = "{mode: streaming, fragments: 2, overlap_steps: 1, mix: 0.5}";
  const Finished f = run_with_fault("worker=2,round=2,at=diverge", t);
  ASSERT_TRUE(f.succeeded) << f.why;
  EXPECT_TRUE(contains(f.log, "it stopped its steps and sent nothing more in round 2")) << f.log;
  EXPECT_FALSE(contains(f.log, "holds a different")) << f.log;
  const auto& m = f.metrics;
  ASSERT_EQ(m.size(), 5u);
  size_t notes = 0;
  for (int r = 1; r <= 4; ++r) {
    for (const auto& [worker, rule] : left_out(m.at(r))) {
      EXPECT_EQ(worker, 2) << m.at(r);
      EXPECT_EQ(rule, "abstained") << m.at(r);
    }
    notes += left_out_count(m.at(r));
  }
  EXPECT_EQ(notes, 2u) << "round 2's two fragments";
}

}  // namespace
}  // namespace loco::testing
