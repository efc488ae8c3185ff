// The dashboard's pure parts: a job's history folded from its log, the JSON, the Prometheus
// text, the token and Host checks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "client/dashboard/page.hpp"
#include "client/dashboard/server.hpp"
#include "client/dashboard/views.hpp"

namespace loco::dashboard {
namespace {

JobEvent report(int64_t ms, int64_t round, std::map<std::string, double> metrics) {
  JobProgress p;
  p.step = round;
  p.total = 10;
  p.metrics = std::move(metrics);
  msgpack::sbuffer buf;
  msgpack::pack(buf, p);
  return {std::to_string(ms) + "-0", "report", std::string(buf.data(), buf.size())};
}

TEST(DashboardViews, EventIdsGiveTheirTime) {
  EXPECT_EQ(event_unix_ms("1700000000123-7"), 1700000000123);
  EXPECT_EQ(event_unix_ms("abc"), 0);
  EXPECT_EQ(event_unix_ms("123"), 0);
  EXPECT_EQ(event_unix_ms(""), 0);
}

TEST(DashboardViews, HistoryTellsJoinsLossesRetriesAndRedoneRounds) {
  JobHistory h;
  h.add(report(1000, 1, {{"loss", 5}, {"workers", 4}, {"bytes_per_worker", 100}}));
  h.add(report(2000, 2,
               {{"loss", 4}, {"workers", 3}, {"bytes_per_worker", 250}, {"failed_attempts", 1}}));
  h.add({"2500-0", "log", "worker 3 lost"});
  h.add(report(3000, 3, {{"loss", 3}, {"workers", 4}, {"bytes_per_worker", 450}}));
  ASSERT_EQ(h.rounds().size(), 3u);
  std::vector<std::string> kinds;
  for (const TimelineEntry& t : h.timeline()) kinds.push_back(t.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"left", "retry", "join"}));
  EXPECT_EQ(h.timeline().front().round, 2);
  EXPECT_EQ(h.timeline().front().unix_ms, 2000);
  ASSERT_EQ(h.lines().size(), 1u);
  EXPECT_EQ(h.lines().front().second, "worker 3 lost");
  EXPECT_EQ(h.cursor, "3000-0");

  // The job went back to round 1 and redid round 2: round 3 goes, round 2 is the new one.
  h.add(report(4000, 2, {{"loss", 3.9}, {"workers", 4}, {"bytes_per_worker", 260}, {"redo", 1}}));
  ASSERT_EQ(h.rounds().size(), 2u);
  EXPECT_DOUBLE_EQ(h.last()->progress.metrics.at("loss"), 3.9);
  EXPECT_EQ(h.timeline().back().kind, "redo");
}

TEST(DashboardViews, ACheckpointRecordIsOnTheTimelineWithItsRound) {
  JobHistory h;
  msgpack::sbuffer buf;
  msgpack::pack(buf, std::make_tuple(std::string("ck/ckpt-round-4.pt"), int64_t(4)));
  h.add({"10-0", "checkpoint", std::string(buf.data(), buf.size())});
  h.add({"11-0", "other", "\xc1 not msgpack"});
  ASSERT_EQ(h.timeline().size(), 2u);
  EXPECT_EQ(h.timeline()[0].kind, "checkpoint");
  EXPECT_EQ(h.timeline()[0].round, 4);
  EXPECT_EQ(h.timeline()[0].text, "round 4: ck/ckpt-round-4.pt");
  EXPECT_EQ(h.timeline()[1].kind, "other");
  EXPECT_EQ(h.timeline()[1].text, "");
}

// A worker lost and back on another node as the job went back to a checkpoint: the rounds'
// worker counts do not change, and the aggregator's left and join records are what put it on the
// timeline. A record and a change in the count for the same worker are one entry, the record's,
// that names it.
TEST(DashboardViews, JoinAndLeftRecordsAreOnTheTimelineOnceWhetherOrNotTheCountChanges) {
  auto record = [](int64_t ms, const std::string& kind, const std::string& text, int64_t round) {
    msgpack::sbuffer buf;
    msgpack::pack(buf, std::make_tuple(text, round));
    return JobEvent{std::to_string(ms) + "-0", kind, std::string(buf.data(), buf.size())};
  };
  JobHistory h;
  h.add(report(1000, 5, {{"loss", 5}, {"workers", 4}}));
  h.add(record(1200, "left", "worker 3 left: lost", 6));
  h.add(record(1500, "join", "worker 3 joined at round 5 on h10", 5));
  h.add(report(2000, 5, {{"loss", 4.9}, {"workers", 4}, {"redo", 1}}));
  h.add(report(3000, 6, {{"loss", 4.8}, {"workers", 3}}));
  h.add(record(3500, "join", "worker 2 joined at round 7 on h11", 7));
  h.add(report(4000, 7, {{"loss", 4.7}, {"workers", 4}}));
  h.add(report(5000, 8, {{"loss", 4.6}, {"workers", 5}}));
  h.add(record(5500, "left", "worker 4 left: scaled down to 4", 9));
  h.add(report(6000, 9, {{"loss", 4.5}, {"workers", 4}}));
  std::vector<std::pair<std::string, std::string>> got;
  for (const TimelineEntry& t : h.timeline()) got.emplace_back(t.kind, t.text);
  EXPECT_EQ(got, (std::vector<std::pair<std::string, std::string>>{
                     {"left", "round 6: worker 3 left: lost"},
                     {"join", "round 5: worker 3 joined at round 5 on h10"},
                     {"left", "1 left: 4 -> 3"},
                     {"join", "round 7: worker 2 joined at round 7 on h11"},
                     {"join", "1 joined: 4 -> 5"},
                     {"left", "round 9: worker 4 left: scaled down to 4"}}));
}

JobEvent steps_record(int64_t ms, int64_t first, int n) {
  std::vector<JobProgress> steps;
  for (int i = 0; i < n; ++i) {
    JobProgress p;
    p.step = first + i;
    p.metrics = {{"loss", 3.0 - 0.1 * i}, {"lr", 0.001}, {"grad_norm", 1.5}};
    steps.push_back(p);
  }
  msgpack::sbuffer buf;
  msgpack::pack(buf, steps);
  return {std::to_string(ms) + "-0", "steps", std::string(buf.data(), buf.size())};
}

TEST(DashboardViews, StepFiguresArePerInnerStepAndGoWithTheRoundsTheyBelongTo) {
  JobHistory h;
  h.add(steps_record(900, 1, 4));
  h.add(report(1000, 1, {{"loss", 2.9}, {"inner_step", 4}}));
  h.add(steps_record(1900, 5, 4));
  h.add(report(2000, 2, {{"loss", 2.8}, {"inner_step", 8}}));
  ASSERT_EQ(h.steps().size(), 8u);
  EXPECT_TRUE(h.timeline().empty());  // not an event
  JobInfo j;
  const nlohmann::json out = job_json(j, h);
  ASSERT_EQ(out["steps"].size(), 8u);
  EXPECT_EQ(out["steps"][4]["step"], 5);
  EXPECT_DOUBLE_EQ(out["steps"][4]["loss"].get<double>(), 3.0);
  EXPECT_EQ(out["steps"][4]["grad_norm"], 1.5);
  // Round 2 redone after going back to round 1: its old steps go.
  h.add(report(3000, 2, {{"loss", 2.7}, {"inner_step", 8}, {"redo", 1}}));
  EXPECT_EQ(h.steps().size(), 4u);
  EXPECT_EQ(h.steps().rbegin()->first, 4);
  // A malformed record is a line, not a crash.
  h.add({"3100-0", "steps", "\xc1 nope"});
  EXPECT_EQ(h.steps().size(), 4u);
  EXPECT_NE(h.lines().back().second.find("malformed step figures"), std::string::npos);
}

TEST(DashboardViews, AMalformedReportIsALineNotARound) {
  JobHistory h;
  h.add({"5-0", "report", "\xc1 not msgpack"});
  EXPECT_TRUE(h.rounds().empty());
  ASSERT_EQ(h.lines().size(), 1u);
  EXPECT_NE(h.lines().front().second.find("malformed"), std::string::npos);
}

TEST(DashboardViews, AJobsTextKeepsItsUtf8AndEscapesTheRest) {
  JobHistory h;
  h.add({"5-0", "log", "round 3: fp32 \xe2\x86\x92 int8"});
  // Not UTF-8: a lone continuation byte, an overlong '/', a surrogate, a cut sequence; and a
  // newline that would forge a second line.
  h.add({"6-0", "log",
         "a\x80"
         "b\xc0\xaf"
         "c\xed\xa0\x80"
         "d\nforged\xe2\x86"});
  // A cut at the limit falls before a character, never inside it.
  h.add({"7-0", "log", std::string(1999, 'x') + "\xe2\x86\x92"});
  msgpack::sbuffer buf;
  msgpack::pack(buf, std::make_tuple(std::string("bf16 \xe2\x86\x92 int8: \xff"), int64_t(3)));
  h.add({"8-0", "codec", std::string(buf.data(), buf.size())});
  ASSERT_EQ(h.lines().size(), 3u);
  EXPECT_EQ(h.lines()[0].second, "round 3: fp32 \xe2\x86\x92 int8");
  EXPECT_EQ(h.lines()[1].second, "a\\x80b\\xc0\\xafc\\xed\\xa0\\x80d\\x0aforged\\xe2\\x86");
  EXPECT_EQ(h.lines()[2].second, std::string(1999, 'x') + "...(3 more bytes)");
  ASSERT_EQ(h.timeline().size(), 1u);
  EXPECT_EQ(h.timeline()[0].text, "round 3: bf16 \xe2\x86\x92 int8: \\xff");
  JobInfo j;
  j.id = "job-1";
  const nlohmann::json out = job_json(j, h);
  EXPECT_EQ(nlohmann::json::parse(out.dump()), out);  // dump() throws on bytes that are not UTF-8
}

TEST(DashboardViews, JobJsonHasBytesPerRoundAndNullsForMissingOrNonFiniteFigures) {
  JobHistory h;
  h.add(report(1000, 1,
               {{"loss", 5}, {"bytes_per_worker", 100}, {"val_loss", 4.5}, {"round_tokens", 30}}));
  h.add(report(2000, 2, {{"loss", std::nan("")}, {"bytes_per_worker", 250}, {"round_tokens", 20}}));
  JobInfo j;
  j.id = "job-1";
  j.name = "t";
  const nlohmann::json out = job_json(j, h);
  ASSERT_EQ(out["rounds_done"].size(), 2u);
  EXPECT_EQ(out["rounds_done"][0]["round_bytes"], 100.0);
  EXPECT_EQ(out["rounds_done"][1]["round_bytes"], 150.0);
  // Tokens add up over the rounds (a report carries its round's).
  EXPECT_EQ(out["rounds_done"][0]["tokens"], 30.0);
  EXPECT_EQ(out["rounds_done"][1]["tokens"], 50.0);
  EXPECT_EQ(out["rounds_done"][0]["val_loss"], 4.5);
  EXPECT_TRUE(out["rounds_done"][1]["val_loss"].is_null());
  EXPECT_TRUE(out["rounds_done"][1]["loss"].is_null());
  EXPECT_EQ(out["round"], 2);
  EXPECT_EQ(out["rounds"], 10);
  EXPECT_EQ(nlohmann::json::parse(out.dump()), out);
}

// A poller that sends back its cursor gets only what is new: the soak's head grew by the
// dashboard's answer, the job's whole history rebuilt on every poll (10 MB an hour with a
// 72-round job; 300 MB after 7,000 short rounds). A redo makes the next answer whole again.
TEST(DashboardViews, AnAnswerSinceACursorHoldsOnlyWhatCameAfterIt) {
  JobHistory h;
  JobInfo j;
  j.id = "job-1";
  for (int r = 1; r <= 1000; ++r) {
    h.add(
        report(1000 * r, r, {{"loss", 5}, {"bytes_per_worker", 100.0 * r}, {"round_tokens", 30}}));
    h.add({std::to_string(1000 * r + 1) + "-0", "log", "round " + std::to_string(r)});
  }
  const nlohmann::json whole = job_json(j, h);
  EXPECT_TRUE(whole["full"]);
  EXPECT_EQ(whole["rounds_done"].size(), 1000u);
  const std::string cursor = whole["cursor"];
  EXPECT_EQ(cursor, "0:1000:-1:1000:0");

  h.add(report(2000000, 1001, {{"loss", 4}, {"bytes_per_worker", 100100}, {"round_tokens", 30}}));
  h.add({"2000001-0", "log", "round 1001"});
  const nlohmann::json next = job_json(j, h, Since::parse(cursor));
  EXPECT_FALSE(next["full"]);
  ASSERT_EQ(next["rounds_done"].size(), 1u);
  EXPECT_EQ(next["rounds_done"][0]["round"], 1001);
  // Figures derived from the rounds before come out as in a whole answer.
  EXPECT_EQ(next["rounds_done"][0]["round_bytes"], 100.0);
  EXPECT_EQ(next["rounds_done"][0]["tokens"], 30.0 * 1001);
  ASSERT_EQ(next["log"].size(), 1u);
  EXPECT_EQ(next["log"][0]["line"], "round 1001");
  EXPECT_LT(next.dump().size(), 2000u);
  // Nothing new: nothing but the job's record and the same cursor.
  const nlohmann::json idle = job_json(j, h, Since::parse(std::string(next["cursor"])));
  EXPECT_TRUE(idle["rounds_done"].empty() && idle["log"].empty() && idle["timeline"].empty());
  EXPECT_EQ(idle["cursor"], next["cursor"]);

  // The job went back and redid round 1000: an answer since the old cursor is whole.
  h.add(report(3000000, 1000, {{"loss", 4.5}, {"bytes_per_worker", 99950}, {"redo", 1}}));
  const nlohmann::json redone = job_json(j, h, Since::parse(std::string(next["cursor"])));
  EXPECT_TRUE(redone["full"]);
  EXPECT_EQ(redone["rounds_done"].size(), 1000u);
  EXPECT_EQ(redone["rounds_done"].back()["loss"], 4.5);
}

TEST(DashboardViews, ACursorThatIsNotOneIsRefused) {
  EXPECT_TRUE(Since::parse("0:-1:-1:0:0"));
  for (const char* bad : {"", "1:2:3:4", "1:2:3:4:5:6", "a:1:2:3:4", "-1:0:0:0:0", "0:0:0:-1:0",
                          "0:0:0:0:1x", "0:0:0:0:99999999999999999999"})
    EXPECT_FALSE(Since::parse(bad)) << bad;
  EXPECT_FALSE(Since::parse(std::string(101, '1')));
}

TEST(DashboardViews, RoundZeroHasOnlyItsValidation) {
  JobHistory h;
  h.add(report(1000, 0, {{"loss", 0}, {"val_loss", 5.5}, {"utilization", 0}, {"workers", 3}}));
  JobInfo j;
  const nlohmann::json out = job_json(j, h);
  ASSERT_EQ(out["rounds_done"].size(), 1u);
  EXPECT_TRUE(out["rounds_done"][0]["loss"].is_null());
  EXPECT_TRUE(out["rounds_done"][0]["utilization"].is_null());
  EXPECT_EQ(out["rounds_done"][0]["val_loss"], 5.5);
  EXPECT_EQ(out["rounds_done"][0]["workers"], 3);
}

ClusterStatus two_nodes() {
  ClusterStatus st;
  st.head_address = "127.0.0.1:7070";
  NodeStatus a, b;
  a.node.id = "n-a";
  a.node.address = "127.0.0.1:1";
  a.node.resources = {{"cpu", 4}, {"gpu", 2}};
  a.used = {{"cpu", 1}};
  a.heartbeat_silent_ms = 250;
  a.heartbeat_late = 3;
  a.heartbeat_longest_ms = 1500;
  b.node.id = "n-\"b\"";
  b.node.state = NodeState::dead;
  b.node.reason = "missed heartbeats";
  b.node.resources = {{"cpu", 2}};
  st.nodes = {a, b};
  ActorInfo x;
  x.id = "a-1";
  x.node_id = "n-a";
  x.state = ActorState::alive;
  x.restarts = 2;
  st.actors = {x};
  return st;
}

TEST(DashboardViews, ClusterJsonHasResourcesLoadAndLiveness) {
  const nlohmann::json c = cluster_json(two_nodes());
  ASSERT_EQ(c["nodes"].size(), 2u);
  EXPECT_EQ(c["nodes"][0]["resources"]["cpu"]["used"], 1.0);
  EXPECT_EQ(c["nodes"][0]["resources"]["gpu"]["used"], 0.0);
  EXPECT_DOUBLE_EQ(c["nodes"][0]["load"].get<double>(), 0.25);
  EXPECT_EQ(c["nodes"][0]["actors"], 1);
  EXPECT_DOUBLE_EQ(c["nodes"][0]["heartbeat"]["silent_s"].get<double>(), 0.25);
  EXPECT_EQ(c["nodes"][0]["heartbeat"]["late"], 3);
  EXPECT_DOUBLE_EQ(c["nodes"][0]["heartbeat"]["longest_silence_s"].get<double>(), 1.5);
  EXPECT_TRUE(c["nodes"][1]["heartbeat"].is_null());  // a dead node is not watched
  EXPECT_EQ(c["nodes"][1]["alive"], false);
  EXPECT_EQ(c["nodes"][1]["reason"], "missed heartbeats");
  EXPECT_EQ(c["actors"][0]["state"], "alive");
}

TEST(DashboardViews, PrometheusTextIsWellFormedAndCarriesTheFigures) {
  JobInfo j;
  j.id = "job-1";
  j.name = "tiny";
  std::map<std::string, JobHistory> hs;
  hs["job-1"].add(report(1000, 3, {{"loss", 2.5}, {"bytes_per_worker", 1e6}, {"workers", 4}}));
  const std::string text = prometheus_text(two_nodes(), {j}, hs);
  EXPECT_NE(text.find("loco_nodes{state=\"alive\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("loco_nodes{state=\"dead\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("loco_node_heartbeat_misses 1\n"), std::string::npos);
  EXPECT_NE(text.find("loco_node_heartbeat_late_total{node=\"n-a\"} 3\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("loco_node_heartbeat_silence_seconds{node=\"n-a\"} 0.25\n"),
            std::string::npos);
  EXPECT_NE(text.find("loco_node_heartbeat_longest_silence_seconds{node=\"n-a\"} 1.5\n"),
            std::string::npos);
  EXPECT_EQ(text.find("loco_node_heartbeat_late_total{node=\"n-\\\"b\\\"\"}"), std::string::npos);
  EXPECT_NE(text.find("loco_node_up{node=\"n-\\\"b\\\"\",address=\"\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("loco_actor_restarts 2\n"), std::string::npos);
  EXPECT_NE(text.find("loco_job_round{job=\"job-1\",name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("loco_job_loss{job=\"job-1\",name=\"tiny\"} 2.5\n"), std::string::npos);
  EXPECT_NE(text.find("loco_job_allreduce_bytes_per_worker_total{job=\"job-1\",name=\"tiny\"} "
                      "1000000\n"),
            std::string::npos);
  // No family the job does not report (no validation yet).
  EXPECT_EQ(text.find("loco_job_val_loss"), std::string::npos);
  // Every line: a comment, or NAME{LABELS} VALUE, and every sample's family was declared.
  const std::regex sample(
      R"(([a-z_]+)(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? ([-+0-9.eE]+|NaN|[+-]Inf))");
  std::istringstream in(text);
  std::set<std::string> declared;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      declared.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    EXPECT_TRUE(declared.count(m[1])) << line;
  }
}

// Debian's promtool (package prometheus); "" when it is not installed.
std::string promtool() {
  for (const char* p : {"/usr/bin/promtool", "/usr/local/bin/promtool"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// `promtool check metrics` on `text`: its exit status and what it printed.
std::pair<int, std::string> promtool_check(const std::string& text) {
  char path[] = "/tmp/loco-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  ::close(fd);
  std::ofstream(path) << text;
  std::string out;
  FILE* p = ::popen((promtool() + " check metrics < " + path + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  std::remove(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// /metrics of a cluster with every family present (nodes alive and dead, heartbeats, actors,
// jobs in every state, a job's every figure, a diverged loss) passes Prometheus' own linter.
TEST(DashboardViews, PrometheusTextPassesPromtoolCheckMetrics) {
  if (promtool().empty()) GTEST_SKIP() << "promtool is not installed (Debian's prometheus)";
  ClusterStatus st = two_nodes();
  std::vector<JobInfo> jobs(3);
  jobs[0].id = "job-1";
  jobs[0].name = "tiny";
  jobs[1].id = "job-2";
  jobs[1].name = "diverged";
  jobs[1].state = JobState::failed;
  jobs[2].id = "job-3";
  jobs[2].name = "no report yet";
  jobs[2].state = JobState::cancelled;
  std::map<std::string, JobHistory> hs;
  hs["job-1"].add(report(1000, 3,
                         {{"loss", 2.5},
                          {"val_loss", 2.6},
                          {"val_ppl", 13.4},
                          {"tokens_per_s", 5e4},
                          {"bytes_per_worker", 7578263},
                          {"job_bytes_per_worker", 9e6},
                          {"failed_attempts", 1},
                          {"redo", 1},
                          {"utilization", 0.9683},
                          {"workers", 4},
                          {"late", 1},
                          {"round_tokens", 1e5},
                          {"round_time", 2.5},
                          {"job_time", 8},
                          {"allreduce_seconds_total", 1.25}}));
  hs["job-2"].add(report(1000, 1, {{"loss", std::nan("")}, {"workers", 2}}));
  const std::string text = prometheus_text(st, jobs, hs);
  ASSERT_NE(text.find("loco_job_utilization"), std::string::npos) << text;
  const auto [rc, out] = promtool_check(text);
  EXPECT_EQ(rc, 0) << out << "\n" << text;
  EXPECT_EQ(out, "") << text;
}

// The page's script reads the rows' fields by the keys the server lists (FIELDS, from the C++
// tables), as R.x (a report's), S.x (a step's), D.x (derived by the views): every x it names is
// listed, so renaming a field in diloco/job/job_schema.hpp cannot leave the page reading the old
// key.
TEST(DashboardViews, ThePageNamesOnlyListedFields) {
  const std::string& js = page_js();
  const nlohmann::json keys = field_keys();
  EXPECT_EQ(js.rfind("'use strict';\nconst FIELDS = " + keys.dump() + ";\n", 0), 0u)
      << js.substr(0, 200);
  EXPECT_NE(keys["report"].size(), 0u);
  EXPECT_NE(keys["step"].size(), 0u);
  EXPECT_EQ(keys["derived"], nlohmann::json({kRoundBytes, kTokens}));
  const std::map<std::string, const nlohmann::json*> groups = {
      {"R", &keys["report"]}, {"S", &keys["step"]}, {"D", &keys["derived"]}};
  const std::regex use(R"((^|[^\w.])([RSD])\.([A-Za-z_]\w*))");
  int uses = 0;
  for (auto it = std::sregex_iterator(js.begin(), js.end(), use); it != std::sregex_iterator();
       ++it) {
    const nlohmann::json& listed = *groups.at((*it)[2]);
    const std::string name = (*it)[3];
    EXPECT_TRUE(std::find(listed.begin(), listed.end(), name) != listed.end())
        << (*it)[2] << "." << name << " is not a listed field";
    ++uses;
  }
  EXPECT_GE(uses, 20);  // the charts, the summary, the jobs' table, the x axis
}

TEST(DashboardChecks, TokenMustMatchExactly) {
  EXPECT_TRUE(token_matches("Bearer 0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("Bearer 0123456789abcdee", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("Bearer 0123456789abcdef0", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("Bearer 0123456789abcde", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("Basic 0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("Bearer ", ""));
  EXPECT_EQ(random_token().size(), 32u);
  EXPECT_NE(random_token(), random_token());
}

TEST(DashboardChecks, OnlyLoopbackHostHeadersOnALoopbackDashboard) {
  EXPECT_TRUE(is_loopback_host_header("127.0.0.1:8265"));
  EXPECT_TRUE(is_loopback_host_header("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host_header("localhost:8265"));
  EXPECT_TRUE(is_loopback_host_header("[::1]:8265"));
  EXPECT_FALSE(is_loopback_host_header("evil.example:8265"));
  EXPECT_FALSE(is_loopback_host_header("127.0.0.1.evil.example:8265"));
  EXPECT_FALSE(is_loopback_host_header(""));
  EXPECT_TRUE(is_loopback_bind("127.0.0.1"));
  EXPECT_FALSE(is_loopback_bind("0.0.0.0"));
  EXPECT_FALSE(is_loopback_bind("127.evil"));
}

TEST(DashboardChecks, DefaultsListenOnLoopback) {
  Options o;
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_TRUE(is_loopback_bind(o.host));
}

}  // namespace
}  // namespace loco::dashboard
