// The job's records (actors/job_records.hpp) without a cluster: rounds once
// each in metrics.jsonl whatever was redone, every all-reduce attempt in
// attempts.jsonl, and totals that count the failed and the undone ones.
#include "actors/job_records.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace loco::actors {
namespace {

std::vector<std::string> lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

int64_t num(const std::string& line, const std::string& key) {
  return std::stoll(json_field(line, key));
}

// round -> how many lines of metrics.jsonl have it
std::map<int64_t, int> round_counts(const JobRecords& rec) {
  std::map<int64_t, int> n;
  for (auto& l : lines(rec.metrics_path())) ++n[num(l, "round")];
  return n;
}

class JobRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loco-records-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static AttemptRecord ok(int64_t round, std::vector<int> members, uint64_t each) {
    AttemptRecord a;
    a.round = round;
    a.members = members;
    a.bytes.assign(members.size(), each);
    a.seconds = 2;
    return a;
  }
  // Member 0 lost, the others failing with it; what member 1 sent is known.
  static AttemptRecord failed(int64_t round, std::vector<int> members) {
    AttemptRecord a;
    a.round = round;
    a.members = members;
    a.seconds = 3;
    for (size_t i = 0; i < members.size(); ++i) {
      if (i == 1) {
        a.bytes.push_back(400);
        continue;
      }
      a.bytes.push_back(std::nullopt);
      a.errors.push_back({members[i], i == 0, i == 0 ? "actor died" : "lost member \"w0\"\nagain"});
    }
    return a;
  }
  static diloco::RoundMetrics round(int r) {
    diloco::RoundMetrics m;
    m.round = r;
    m.inner_steps = 10 * r;
    if (r % 2 == 0) m.val_loss = 3.0 - 0.1 * r;
    return m;
  }
  static RoundFigures figures(double secs) { return RoundFigures{0.9, 3, secs, 100}; }

  std::string dir_;
};

TEST_F(JobRecordsTest, EachRoundOnceEachAttemptRecordedFailedOnesInTheTotals) {
  JobRecords rec(dir_, -1);
  rec.round(round(0), figures(0));
  rec.attempt(ok(1, {0, 1, 2}, 300));
  rec.round(round(1), figures(5));
  rec.attempt(failed(2, {0, 1, 2}));
  rec.attempt(ok(2, {1, 2}, 600));
  const std::string l2 = rec.round(round(2), figures(6));

  EXPECT_EQ(round_counts(rec), (std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(num(l2, "round_bytes"), 600);
  EXPECT_EQ(num(l2, "bytes"), 900);  // the successful all-reduces of rounds 1 and 2
  EXPECT_EQ(std::stod(json_field(l2, "time")), 11.0);
  EXPECT_EQ(std::stod(json_field(l2, "round_time")), 6.0);
  EXPECT_EQ(num(l2, "failed_attempts"), 1);
  EXPECT_EQ(num(l2, "redo"), 0);
  // The failed attempt's known bytes (member 1: 400) over its 3 members count too.
  EXPECT_EQ(num(l2, "job_bytes"), 300 + 133 + 600);
  EXPECT_EQ(std::stod(json_field(l2, "job_time")), 100.0);

  // Per member: its steps, tokens, seconds in inner steps and the rest of the round waited.
  RoundFigures f = figures(6);
  f.members = {{0, 30, 3000, 4.5}, {2, 10, 1000, 6.5}};
  f.late = {1};
  const std::string l3 = rec.round(round(3), f);
  const nlohmann::json j3 = nlohmann::json::parse(l3);
  ASSERT_EQ(j3["members"].size(), 2u) << l3;
  EXPECT_EQ(j3["members"][0]["worker"], 0) << l3;
  EXPECT_EQ(j3["members"][0]["steps"], 30) << l3;
  EXPECT_EQ(j3["members"][0]["tokens"], 3000) << l3;
  EXPECT_DOUBLE_EQ(j3["members"][0]["seconds"].get<double>(), 4.5) << l3;
  EXPECT_DOUBLE_EQ(j3["members"][0]["wait"].get<double>(), 1.5) << l3;
  EXPECT_EQ(j3["members"][1]["worker"], 2) << l3;
  EXPECT_DOUBLE_EQ(j3["members"][1]["wait"].get<double>(), 0.0) << l3;  // longer than the round
  EXPECT_EQ(j3["late"], nlohmann::json::array({1})) << l3;

  auto att = lines(rec.attempts_path());
  ASSERT_EQ(att.size(), 3u);
  EXPECT_EQ(json_field(att[1], "outcome"), "\"failed\"");
  EXPECT_EQ(num(att[1], "round"), 2);
  EXPECT_EQ(num(att[1], "attempt"), 1);
  EXPECT_EQ(num(att[2], "attempt"), 2);
  EXPECT_EQ(num(att[1], "workers"), 3);
  EXPECT_NE(att[1].find("\"bytes\":[null,400,null]"), std::string::npos) << att[1];
  EXPECT_NE(att[1].find(R"({"worker":0,"lost":true,"error":"actor died"})"), std::string::npos)
      << att[1];
  EXPECT_EQ(nlohmann::json::parse(att[1])["errors"][1]["error"], "lost member \"w0\"\nagain")
      << att[1];
  EXPECT_EQ(json_field(att[2], "outcome"), "\"ok\"");
  EXPECT_NE(att[2].find("\"errors\":[]}"), std::string::npos) << att[2];
}

TEST_F(JobRecordsTest, NoMemberBytesKnownIsNullNotZero) {
  JobRecords rec(dir_, -1);
  AttemptRecord a;
  a.round = 1;
  a.members = {0, 1};
  a.bytes = {std::nullopt, std::nullopt};
  a.errors = {{0, true, "gone"}, {1, false, "lost member"}};
  const std::string line = rec.attempt(a);
  EXPECT_EQ(json_field(line, "bytes_per_worker"), "null");
  EXPECT_EQ(rec.job_bytes_per_worker(), 0u);
}

TEST_F(JobRecordsTest, GoingBackRemovesTheUndoneRoundsAndMarksTheRedoneOnes) {
  JobRecords rec(dir_, -1);
  rec.round(round(0), figures(0));
  for (int r = 1; r <= 3; ++r) {
    rec.attempt(ok(r, {0, 1}, 100));
    rec.round(round(r), figures(1));
  }
  rec.go_back(1);  // every worker lost; the checkpoint was of round 1
  EXPECT_EQ(round_counts(rec), (std::map<int64_t, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(rec.redo(), 1);
  EXPECT_EQ(rec.bytes_per_worker(), 100u);
  rec.attempt(ok(2, {0, 1}, 100));
  const std::string l2 = rec.round(round(2), figures(1));
  EXPECT_EQ(num(l2, "redo"), 1);
  EXPECT_EQ(num(l2, "bytes"), 200);      // rounds 1 and 2 of θ's history
  EXPECT_EQ(num(l2, "job_bytes"), 400);  // and the undone rounds 2 and 3
  EXPECT_EQ(std::stod(json_field(l2, "time")), 2.0);
  EXPECT_EQ(round_counts(rec), (std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(num(lines(rec.attempts_path()).back(), "redo"), 1);
  EXPECT_EQ(num(lines(rec.attempts_path()).back(), "attempt"), 1);
}

// What the cluster went through (the head's restart, in round 2's line) is not undone with
// the rounds a go_back removes: it goes into the next line written, before that round's own.
TEST_F(JobRecordsTest, GoingBackKeepsTheClusterNotesOfTheUndoneRoundsInTheNextLine) {
  JobRecords rec(dir_, -1);
  rec.round(round(0), figures(0));
  for (int r = 1; r <= 3; ++r) {
    diloco::RoundMetrics m = round(r);
    if (r == 2)
      m.cluster = std::vector<diloco::schema::ClusterLine>{{1000, "head", "the head started"}};
    rec.attempt(ok(r, {0, 1}, 100));
    rec.round(m, figures(1));
  }
  rec.go_back(1);
  diloco::RoundMetrics again = round(2);
  again.cluster = std::vector<diloco::schema::ClusterLine>{{2000, "redis", "Redis is back"}};
  rec.attempt(ok(2, {0, 1}, 100));
  const std::string l2 = rec.round(again, figures(1));
  const auto head = l2.find("the head started"), redis = l2.find("Redis is back");
  ASSERT_NE(head, std::string::npos) << l2;
  ASSERT_NE(redis, std::string::npos) << l2;
  EXPECT_LT(head, redis) << l2;
  rec.attempt(ok(3, {0, 1}, 100));
  const std::string l3 = rec.round(round(3), figures(1));
  EXPECT_EQ(l3.find("the head started"), std::string::npos) << "carried once: " << l3;
}

TEST_F(JobRecordsTest, ARestartedAggregatorGoesBackAndCarriesTheTotalsOn) {
  {
    JobRecords rec(dir_, -1);
    EXPECT_EQ(rec.redo(), 0);
    rec.round(round(0), figures(0));
    for (int r = 1; r <= 3; ++r) {
      rec.attempt(ok(r, {0, 1}, 100));
      rec.round(round(r), figures(1));
    }
    rec.attempt(failed(4, {0, 1, 2}));
  }
  {
    // Resumed from the checkpoint of round 3: round 4 starts over.
    JobRecords rec(dir_, 3);
    EXPECT_EQ(rec.redo(), 1);
    EXPECT_EQ(rec.failed_attempts(), 0);
    EXPECT_EQ(rec.job_bytes_per_worker(), 300u + 133u);
    EXPECT_EQ(rec.bytes_per_worker(), 300u);
    rec.attempt(ok(4, {0, 1}, 100));
    EXPECT_EQ(num(lines(rec.attempts_path()).back(), "attempt"), 1);
    const std::string l4 = rec.round(round(4), figures(1));
    EXPECT_EQ(num(l4, "bytes"), 400);
    EXPECT_EQ(num(l4, "redo"), 1);
    EXPECT_EQ(num(l4, "job_bytes"), 533);
  }
  {
    // Resumed from the checkpoint of round 2: rounds 3 and 4 are undone.
    JobRecords rec(dir_, 2);
    EXPECT_EQ(rec.redo(), 2);
    EXPECT_EQ(rec.bytes_per_worker(), 200u);
    EXPECT_EQ(round_counts(rec), (std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  }
  {
    // No checkpoint: everything again, round 0 too. The last "redo" written was 1.
    JobRecords rec(dir_, -1);
    EXPECT_EQ(rec.redo(), 2);
    EXPECT_TRUE(lines(rec.metrics_path()).empty());
    EXPECT_EQ(lines(rec.attempts_path()).size(), 5u);  // attempts are never removed
  }
}

// Every line is JSON a JSON library reads back, error messages with quotes and newlines and a
// round's per-step figures included.
TEST_F(JobRecordsTest, LinesAreJsonWithThePerStepFigures) {
  JobRecords rec(dir_, -1);
  rec.attempt(failed(1, {0, 1, 2}));
  rec.attempt(ok(1, {1, 2}, 600));
  RoundFigures f = figures(5);
  f.steps = per_step_means({{{3.0, 0.001, 2.0, 0.5, 100, 4e12, 0.2, 0, 0.25},
                              {2.0, 0.002, 1.0, 0.5, 100, 4e12, 0, 0}},
                             {{5.0, 0.001, 4.0, 1.0, 100, 4e12, 0.4, int64_t(3e9), 0.75}}});
  f.members = {member_figures(0, 2, 200, 1.0,
                              {{.cpu_seconds = 0.25, .step_cpu_seconds = 0.125},
                               {.cpu_seconds = 0.5, .step_cpu_seconds = 0.25}}),
               {1, 1, 100, 1.0, 0.75}};
  const std::string l1 = rec.round(round(1), f);
  const auto j = nlohmann::json::parse(l1);
  EXPECT_DOUBLE_EQ(j["members"][0]["cpu_seconds"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["members"][0]["step_cpu_seconds"].get<double>(), 0.375);  // the steppers'
  EXPECT_DOUBLE_EQ(j["members"][1]["cpu_seconds"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["members"][1]["step_cpu_seconds"].get<double>(), 0.0);  // not reported
  ASSERT_EQ(j["steps"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["steps"][0]["loss"].get<double>(), 4.0);            // the mean of 3 and 5
  EXPECT_DOUBLE_EQ(j["steps"][0]["grad_norm"].get<double>(), 3.0);       // of 2 and 4
  EXPECT_EQ(j["steps"][0]["tokens"], 200);                               // both members
  EXPECT_DOUBLE_EQ(j["steps"][0]["tokens_per_s"].get<double>(), 200.0);  // the slower's 1 s
  EXPECT_DOUBLE_EQ(j["steps"][1]["loss"].get<double>(), 2.0);            // only member 0 did step 2
  EXPECT_DOUBLE_EQ(j["steps"][1]["lr"].get<double>(), 0.002);
  // Model TFLOP/s of both over the slower's second; their model FLOP/s over their devices'
  // peaks (8 + 4 TFLOP/s at 20 % and 40 %: peaks of 40 and 10; 12 / 50); the larger memory.
  EXPECT_DOUBLE_EQ(j["steps"][0]["tflops"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(j["steps"][0]["mfu"].get<double>(), 0.24);
  EXPECT_DOUBLE_EQ(j["steps"][0]["memory_gb"].get<double>(), 3.0);
  EXPECT_TRUE(j["steps"][1]["mfu"].is_null());  // no peak known
  EXPECT_TRUE(j["steps"][1]["memory_gb"].is_null());  // a CPU
  // The members' mean CPU seconds in the step; none reported for step 2.
  EXPECT_DOUBLE_EQ(j["steps"][0]["cpu_s"].get<double>(), 0.5);
  EXPECT_TRUE(j["steps"][1]["cpu_s"].is_null());
  EXPECT_EQ(j["round"], 1);
  EXPECT_TRUE(j["val_loss"].is_null());
  const auto att = nlohmann::json::parse(lines(rec.attempts_path())[0]);
  EXPECT_EQ(att["errors"][1]["error"], "lost member \"w0\"\nagain");
  EXPECT_TRUE(att["bytes"][0].is_null());
  EXPECT_EQ(json_field(l1, "theta_hash"), "\"0\"");
  EXPECT_EQ(json_field(l1, "nothing"), "");
  EXPECT_EQ(json_field("not json", "round"), "");
}

// Workers that share a GPU (workers.share_gpu) each measure their MFU against the whole card;
// the job's is their rates over the card's peak once: four at 5 % are 20 %, not 5 %. Workers on
// GPUs of their own, and CPU workers (no device), keep the mean.
TEST(PerStepMeans, WorkersSharingAGpuCountItsPeakOnce) {
  auto step = [](double mfu, const std::string& device) {
    StepFigures f{.seconds = 1.0, .tokens = 100, .flops = 50e12 * mfu, .mfu = mfu};
    f.device = device;
    return f;
  };
  std::vector<std::vector<StepFigures>> shared, own, cpus;
  for (int w = 0; w < 4; ++w) {
    shared.push_back({step(0.05, "GPU-a,")});
    own.push_back({step(0.05, "GPU-" + std::to_string(w) + ",")});
    cpus.push_back({step(0.05, "")});
  }
  EXPECT_NEAR(per_step_means(shared).at(0).mfu, 0.20, 1e-12);
  EXPECT_NEAR(per_step_means(own).at(0).mfu, 0.05, 1e-12);
  EXPECT_NEAR(per_step_means(cpus).at(0).mfu, 0.05, 1e-12);
  // Two cards, two workers on each: each card at 10 %.
  shared[2].at(0).device = shared[3].at(0).device = "GPU-b,";
  EXPECT_NEAR(per_step_means(shared).at(0).mfu, 0.10, 1e-12);
}

}  // namespace
}  // namespace loco::actors
