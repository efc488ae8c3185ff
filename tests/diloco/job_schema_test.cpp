// diloco/job/job_schema.hpp: each struct's one list of fields gives its metrics map and its JSON,
// both ways, and the keys the readers look up.
#include "diloco/job/job_schema.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string_view>

namespace loco::diloco::schema {
namespace {

using nlohmann::json;

Report full_report() {
  Report r;
  r.inner_step = 40;
  r.loss = 2.5;
  r.val_loss = 2.75;
  r.val_ppl = std::exp(2.75);
  r.tokens_per_s = 1234.5;
  r.bytes_per_worker = 7578263;
  r.job_bytes_per_worker = 9000000;
  r.failed_attempts = 2;
  r.redo = 1;
  r.utilization = 0.9683;
  r.workers = 4;
  r.late = 1;
  r.left_out = 1;
  r.left_out_total = 3;
  r.round_tokens = 4096;
  r.round_time = 2.25;
  r.job_time = 12.5;
  r.allreduce_seconds_total = 1.25;
  return r;
}

TEST(JobSchema, AReportRoundTripsThroughItsMetricsMap) {
  const Report r = full_report();
  const Metrics m = to_metrics(r);
  EXPECT_EQ(m.size(), keys<Report>().size());
  EXPECT_EQ(m.at("inner_step"), 40.0);
  EXPECT_EQ(m.at("bytes_per_worker"), 7578263.0);
  EXPECT_EQ(m.at("late"), 1.0);
  EXPECT_EQ(m.at("allreduce_seconds_total"), 1.25);
  EXPECT_EQ(from_metrics<Report>(m), r);
}

TEST(JobSchema, AMissingOptionalFieldIsAbsentFromTheMapAndNullInJson) {
  Report r = full_report();
  r.val_loss.reset();
  r.val_ppl.reset();
  r.late.reset();
  const Metrics m = to_metrics(r);
  EXPECT_EQ(m.count("val_loss"), 0u);
  EXPECT_EQ(m.count("val_ppl"), 0u);
  EXPECT_EQ(m.count("late"), 0u);
  EXPECT_EQ(m.size(), keys<Report>().size() - 3);
  const Report back = from_metrics<Report>(m);
  EXPECT_FALSE(back.val_loss);
  EXPECT_FALSE(back.late);
  EXPECT_EQ(back, r);

  const json j = to_json(r);
  ASSERT_TRUE(j.contains("val_loss"));
  EXPECT_TRUE(j["val_loss"].is_null());
  EXPECT_EQ(from_json<Report>(j), r);
  // Absent altogether reads the same as null.
  json without = j;
  without.erase("val_loss");
  without.erase("late");
  EXPECT_EQ(from_json<Report>(without), r);
}

TEST(JobSchema, AReportRoundTripsThroughJson) {
  const Report r = full_report();
  const json j = to_json(r);
  EXPECT_EQ(j.size(), keys<Report>().size());
  EXPECT_TRUE(j["inner_step"].is_number_integer());  // its C++ type: no "40.0"
  EXPECT_EQ(j["loss"], 2.5);
  EXPECT_EQ(from_json<Report>(j), r);
  EXPECT_EQ(from_json<Report>(json::parse(j.dump())), r);
}

// Another entry actor's report, with a few of the fields: the rest at their defaults.
TEST(JobSchema, AReportWithSomeFieldsReadsTheOthersAsDefaults) {
  const Report r = from_metrics<Report>({{"loss", 10.0}, {"workers", 2}, {"other", 7}});
  EXPECT_EQ(r.loss, 10.0);
  EXPECT_EQ(r.workers, 2);
  EXPECT_EQ(r.inner_step, 0);
  EXPECT_FALSE(r.val_loss);
  EXPECT_EQ(find(Metrics{{"loss", 10.0}}, &Report::loss), 10.0);
  EXPECT_FALSE(find(Metrics{{"loss", 10.0}}, &Report::round_tokens));
}

// What comes from the network is bounded: an integer field saturates, NaN reads as 0.
TEST(JobSchema, IntegersFromAMapSaturateAndNanIsZero) {
  const Report r = from_metrics<Report>({{"workers", std::nan("")},
                                         {"failed_attempts", 1e30},
                                         {"bytes_per_worker", -5},
                                         {"inner_step", 7.9}});
  EXPECT_EQ(r.workers, 0);
  EXPECT_EQ(r.failed_attempts, std::numeric_limits<int>::max());
  EXPECT_EQ(r.bytes_per_worker, 0u);
  EXPECT_EQ(r.inner_step, 7);
}

Step full_step() {
  Step s;
  s.loss = 4.0;
  s.lr = 0.001;
  s.grad_norm = 3.0;
  s.tokens = 200;
  s.tokens_per_s = 200.0;
  s.tflops = 8.0;
  s.mfu = 0.3;
  s.memory_gb = 3.0;
  s.cpu_s = 0.5;
  return s;
}

TEST(JobSchema, AStepRoundTripsThroughJsonAndItsMetricsMap) {
  const Step s = full_step();
  const nlohmann::ordered_json j = to_json<nlohmann::ordered_json>(s);
  EXPECT_EQ(j.dump(), R"({"loss":4.0,"lr":0.001,"grad_norm":3.0,"tokens":200,"tokens_per_s":200.0,)"
                      R"("tflops":8.0,"mfu":0.3,"memory_gb":3.0,"cpu_s":0.5})");
  EXPECT_EQ(from_json<Step>(j), s);
  EXPECT_EQ(from_metrics<Step>(to_metrics(s)), s);

  // A step without the figures only some workers measure: null in metrics.jsonl, absent from
  // a "steps" record's map.
  Step bare{.loss = 2.0, .lr = 0.002, .grad_norm = 1.0};
  EXPECT_EQ(to_json(bare).dump(),
            R"({"cpu_s":null,"grad_norm":1.0,"loss":2.0,"lr":0.002,"memory_gb":null,"mfu":null,)"
            R"("tflops":null,"tokens":null,"tokens_per_s":null})");
  EXPECT_EQ(to_metrics(bare), (Metrics{{"loss", 2.0}, {"lr", 0.002}, {"grad_norm", 1.0}}));
  EXPECT_EQ(from_json<Step>(to_json(bare)), bare);
  EXPECT_EQ(from_metrics<Step>(to_metrics(bare)), bare);
}

// A non-finite figure is written as null, and a plain number read from null is NaN again;
// an optional read from null has no value.
TEST(JobSchema, NonFiniteNumbersAreNullAndReadBackAsNan) {
  Step s = full_step();
  s.loss = std::nan("");
  s.tokens_per_s = std::numeric_limits<double>::infinity();
  const json j = json::parse(to_json(s).dump());
  EXPECT_TRUE(j["loss"].is_null());
  EXPECT_TRUE(j["tokens_per_s"].is_null());
  const Step back = from_json<Step>(j);
  EXPECT_TRUE(std::isnan(back.loss));
  EXPECT_FALSE(back.tokens_per_s);
}

TEST(JobSchema, TheSimulatorsLineIsItsFieldsInOrderWithTheHashInHex) {
  MetricsLine m;
  m.round = 3;
  m.inner_steps = 30;
  m.tokens_per_worker = 300;
  m.tokens_total = 1200;
  m.train_loss = 2.5;
  m.bytes_per_worker = 99;
  m.seconds = 1.5;
  m.theta_hash = 0xdeadbeef12345678ull;
  EXPECT_EQ(m.to_json(),
            R"({"round":3,"inner_steps":30,"tokens":300,"tokens_total":1200,"train_loss":2.5,)"
            R"("val_loss":null,"bytes":99,"time":1.5,"theta_hash":"deadbeef12345678"})");
  EXPECT_EQ(from_json<MetricsLine>(json::parse(m.to_json())), m);
  m.val_loss = 2.75;
  m.theta_hash = 0;
  EXPECT_EQ(json::parse(m.to_json())["theta_hash"], "0");
  EXPECT_EQ(from_json<MetricsLine>(json::parse(m.to_json())), m);
  // A hash that is not hex is not read.
  EXPECT_EQ(from_json<MetricsLine>(json{{"theta_hash", "xyz"}}).theta_hash, 0u);
}

TEST(JobSchema, AJobsLineRoundTripsAndRoundZeroHasNoMembersLateOrSteps) {
  JobMetricsLine l;
  l.round = 0;
  l.val_loss = 3.0;
  l.utilization = 0.9;
  l.workers = 3;
  l.job_time = 100;
  const std::string zero = to_json<nlohmann::ordered_json>(l).dump();
  EXPECT_EQ(zero, R"({"round":0,"inner_steps":0,"tokens":0,"tokens_total":0,"train_loss":0.0,)"
                  R"("val_loss":3.0,"bytes":0,"time":0.0,"theta_hash":"0","utilization":0.9,)"
                  R"("workers":3,"round_bytes":0,"round_time":0.0,"failed_attempts":0,"redo":0,)"
                  R"("job_bytes":0,"job_time":100.0})");
  EXPECT_EQ(from_json<JobMetricsLine>(json::parse(zero)), l);

  l.round = 1;
  l.members = std::vector<Member>{{0, 2, 200, 1.0, 0.25, 4.0}, {1, 1, 100, 1.0, 0.75, 4.0}};
  l.late = std::vector<int>{2};
  l.steps = std::vector<Step>{full_step(), Step{.loss = 2.0}};
  const json j = json::parse(to_json(l).dump());
  ASSERT_EQ(j["members"].size(), 2u);
  EXPECT_EQ(j["members"][1]["cpu_seconds"], 0.75);
  EXPECT_EQ(j["late"], json::array({2}));
  EXPECT_TRUE(j["steps"][1]["mfu"].is_null());
  EXPECT_EQ(from_json<JobMetricsLine>(j), l);
  // The guard's left-outs and its exchange time, when there are any.
  EXPECT_FALSE(j.contains("left_out"));
  l.left_out = std::vector<LeftOutLine>{{1, 0, "norm", "its norm 41 is 96 x the median"}};
  l.guard_time = 0.25;
  const json g = json::parse(to_json(l).dump());
  EXPECT_EQ(g["left_out"][0]["rule"], "norm");
  EXPECT_EQ(g["left_out"][0]["worker"], 1);
  EXPECT_EQ(g["guard_time"], 0.25);
  EXPECT_EQ(from_json<JobMetricsLine>(g), l);
  // A line of the simulator's read as a job's: the job's fields at their defaults.
  const JobMetricsLine sim = from_json<JobMetricsLine>(json::parse(MetricsLine{}.to_json()));
  EXPECT_EQ(sim, JobMetricsLine{});
  EXPECT_FALSE(sim.steps);
}

// What is not JSON of its kind is not read: the reader's defaults stay.
TEST(JobSchema, FieldsOfTheWrongKindAreNotRead) {
  const json j = {{"loss", "abc"}, {"lr", json::array()}, {"tokens", "x"}, {"mfu", "y"}};
  Step s{.loss = -1, .lr = -2};
  read_json(j, s);
  EXPECT_EQ(s.loss, -1);
  EXPECT_EQ(s.lr, -2);
  EXPECT_FALSE(s.tokens);
  EXPECT_FALSE(s.mfu);
  EXPECT_EQ(from_json<Step>(json("not an object")), Step{});
  EXPECT_FALSE(from_json<JobMetricsLine>(json{{"steps", 5}}).steps);
  // Elements keep their places: the step index is the position.
  const auto l = from_json<JobMetricsLine>(json::parse(R"({"steps":[{"loss":1},7,{"loss":3}]})"));
  ASSERT_TRUE(l.steps);
  ASSERT_EQ(l.steps->size(), 3u);
  EXPECT_EQ((*l.steps)[1], Step{});
  EXPECT_EQ((*l.steps)[2].loss, 3);
}

TEST(JobSchema, EachKeyIsListedOnceAndKeyFindsItsField) {
  static_assert(std::string_view(key(&Report::loss)) == "loss");
  static_assert(std::string_view(key(&MetricsLine::tokens_per_worker)) == "tokens");
  static_assert(std::string_view(key(&JobMetricsLine::round)) == "round");  // the base's
  static_assert(std::string_view(key(&JobMetricsLine::redo)) == "redo");
  EXPECT_STREQ(key(&Step::memory_gb), "memory_gb");
  for (const auto& ks : {keys<Report>(), keys<Step>(), keys<JobMetricsLine>(), keys<Member>()})
    EXPECT_EQ(std::set<std::string>(ks.begin(), ks.end()).size(), ks.size());
  EXPECT_EQ(keys<Report>().size(), 18u);
  EXPECT_EQ(keys<JobMetricsLine>().front(), "round");
  EXPECT_EQ(keys<JobMetricsLine>().back(), "guard_time");
}

}  // namespace
}  // namespace loco::diloco::schema
