// The dashboard against a real cluster: `loco dashboard` serving a cluster with a finished and
// a running job (API, /metrics, refusals), the dashboard `loco up` has its head serve, and the
// page as headless Chromium renders it.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "client/client.hpp"
#include "client/process.hpp"
#include "runtime/security/keys.hpp"
#include "tests/runtime/core/cluster.hpp"
#include "tests/runtime/core/fake_job.hpp"
#include "tests/support/eventually.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace loco::testing {
namespace {

// Debian's headless Chromium, or its full one; "" when neither is installed.
std::string browser() {
  for (const char* name : {"chromium-headless-shell", "chromium"})
    for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
      const std::string p = std::string(dir) + "/" + name;
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
  return "";
}

// The page at `url` once the browser has run its script: its DOM as HTML (with the browser's
// own log lines around it). Bounded: the browser is killed after 90 s.
std::string render(const std::string& url, const std::string& log_path,
                   const std::string& screenshot = "") {
  const std::string exe = browser();
  if (exe.empty()) {
    ADD_FAILURE() << "no headless Chromium: install chromium-headless-shell (scripts/setup)";
    return "";
  }
  // No sandbox: tests run as root in CI's containers, where Chromium's sandbox cannot start;
  // the page is our own. Virtual time lets the page's fetches and a few polls complete.
  std::vector<std::string> argv = {exe,
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--no-first-run",
                                   "--user-data-dir=" + log_path + ".profile",
                                   "--virtual-time-budget=8000",
                                   "--window-size=1400,2200"};
  if (!screenshot.empty())
    argv.push_back("--screenshot=" + screenshot);
  else
    argv.push_back("--dump-dom");
  argv.push_back(url);
  Subprocess::Options o;
  o.log_path = log_path;
  Subprocess p(argv, o);
  if (!p.wait(90s)) {
    p.kill();
    ADD_FAILURE() << "the browser did not finish within 90 s";
  }
  return read_file(log_path);
}

// Whether `p` printed a line matching `pattern` into its log `log` within `limit` (sooner false
// once it exited); `out` holds the log's text, `m` the match in it.
bool wait_printed(Subprocess& p, const std::string& log, const std::regex& pattern,
                  std::string& out, std::smatch& m, std::chrono::seconds limit) {
  (void)eventually(
      [&] {
        out = read_file(log);
        return std::regex_search(out, m, pattern) || !p.running();
      },
      limit);
  return std::regex_search(out, m, pattern);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A cluster of 2 nodes with one finished job of 5 rounds, and `loco dashboard` serving it.
class DashboardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new LocalCluster(ClusterOptions{.nodes = 2});
    Client client(cluster_->head_address());
    JobHandle job = client.submit(fake_job("rounds 5 with-steps"));
    ASSERT_EQ(job.wait(Millis(20000)).state, JobState::succeeded);
    job_id_ = job.id();
    token_file_ = cluster_->log_dir() + "/dashboard.token";
    std::ofstream(token_file_) << "test-token-0123456789abcdef\n";
    port_ = free_tcp_port();
    Subprocess::Options o;
    o.log_path = cluster_->log_dir() + "/dashboard.log";
    dashboard_ = new Subprocess({loco_binary(), "dashboard", "--address", cluster_->head_address(),
                                 "--port", std::to_string(port_), "--token-file", token_file_},
                                o);
    httplib::Client http("127.0.0.1", port_);
    ASSERT_TRUE(eventually(
        [&] {
          auto r = http.Get("/healthz");
          return r && r->status == 200;
        },
        20s))
        << read_file(o.log_path);
  }
  static void TearDownTestSuite() {
    if (dashboard_) dashboard_->stop(5s);
    delete dashboard_;
    delete cluster_;
    dashboard_ = nullptr;
    cluster_ = nullptr;
  }

  static httplib::Result get(const std::string& path, bool with_token = true,
                             const std::string& host = "") {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(20, 0);
    httplib::Headers h;
    if (with_token) h.emplace("Authorization", "Bearer test-token-0123456789abcdef");
    if (!host.empty()) h.emplace("Host", host);
    return http.Get(path.c_str(), h);
  }
  static std::string url(const std::string& extra = "") {
    return "http://127.0.0.1:" + std::to_string(port_) + "/#token=test-token-0123456789abcdef" +
           extra;
  }

  static inline LocalCluster* cluster_ = nullptr;
  static inline Subprocess* dashboard_ = nullptr;
  static inline std::string job_id_, token_file_;
  static inline int port_ = 0;
};

TEST_F(DashboardTest, PrintsALoopbackUrl) {
  const std::string out = read_file(cluster_->log_dir() + "/dashboard.log");
  EXPECT_NE(out.find("dashboard at http://127.0.0.1:" + std::to_string(port_) +
                     "/#token=test-token-0123456789abcdef"),
            std::string::npos)
      << out;
}

TEST_F(DashboardTest, ApiGivesNodesJobsAndRoundsToTokenHoldersOnly) {
  auto refused = get("/api/cluster", false);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(get("/metrics", false)->status, 401);

  auto c = get("/api/cluster");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  const auto cluster = nlohmann::json::parse(c->body);
  ASSERT_EQ(cluster["nodes"].size(), 2u);
  for (const auto& n : cluster["nodes"]) EXPECT_EQ(n["state"], "alive");
  EXPECT_EQ(cluster["head"], cluster_->head_address());

  const auto jobs = nlohmann::json::parse(get("/api/jobs")->body);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["id"], job_id_);
  EXPECT_EQ(jobs[0]["state"], "succeeded");
  EXPECT_EQ(jobs[0]["round"], 5);

  auto j = get("/api/jobs/" + job_id_);
  ASSERT_EQ(j->status, 200) << j->body;
  const auto job = nlohmann::json::parse(j->body);
  ASSERT_EQ(job["rounds_done"].size(), 5u);
  for (int r = 1; r <= 5; ++r) {
    EXPECT_EQ(job["rounds_done"][r - 1]["round"], r);
    EXPECT_DOUBLE_EQ(job["rounds_done"][r - 1]["loss"].get<double>(), 10.0 / r);
    EXPECT_GT(job["rounds_done"][r - 1]["unix_ms"].get<int64_t>(), 0);
  }
  ASSERT_EQ(job["steps"].size(), 20u);
  EXPECT_EQ(job["steps"][19]["step"], 20);
  EXPECT_EQ(job["steps"][19]["loss"], 2.0);
  ASSERT_EQ(job["timeline"].size(), 1u);
  EXPECT_EQ(job["timeline"][0]["kind"], "fake-record");
  // The job's line, then the head's.
  std::vector<std::string> lines;
  for (const auto& l : job["log"]) lines.push_back(l["line"]);
  EXPECT_EQ(lines, (std::vector<std::string>{"fake job done", "job succeeded"}));
  EXPECT_EQ(get("/api/jobs/job-none")->status, 404);
}

TEST_F(DashboardTest, MetricsInPrometheusTextFormat) {
  auto m = get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200) << m->body;
  EXPECT_EQ(m->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  EXPECT_NE(m->body.find("loco_nodes{state=\"alive\"} 2\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("loco_jobs{state=\"succeeded\"} 1\n"), std::string::npos);
  EXPECT_NE(m->body.find("loco_job_round{job=\"" + job_id_ + "\",name=\"fake\"} 5\n"),
            std::string::npos);
  EXPECT_NE(m->body.find("loco_job_loss{job=\"" + job_id_ + "\",name=\"fake\"} 2\n"),
            std::string::npos);
}

TEST_F(DashboardTest, RefusesWritesAndForeignHostNames) {
  httplib::Client http("127.0.0.1", port_);
  auto post = http.Post("/api/jobs", "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  auto rebound = get("/api/cluster", true, "attacker.example:" + std::to_string(port_));
  ASSERT_TRUE(rebound);
  EXPECT_EQ(rebound->status, 403);
  // The page and Chart.js need no token: they hold no data.
  EXPECT_EQ(get("/", false)->status, 200);
  auto chart = get("/static/chart.js", false);
  EXPECT_EQ(chart->status, 200);
  EXPECT_GT(chart->body.size(), 10000u);
}

TEST_F(DashboardTest, ChromiumRendersTheNodesAndOneLossPointPerRound) {
  const std::string dom = render(url(), cluster_->log_dir() + "/browser.log");
  EXPECT_NE(dom.find("data-loaded=\"yes\""), std::string::npos) << dom;
  EXPECT_EQ(count(dom, "data-node=\""), 2) << dom;
  EXPECT_EQ(count(dom, "data-state=\"alive\""), 2);
  EXPECT_EQ(count(dom, "class=\"reach-direct\""), 2) << dom;  // both nodes listen on loopback
  EXPECT_NE(dom.find("data-job=\"" + job_id_ + "\""), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(id="chart-loss" data-points="(\d+)")re")))
      << dom;
  EXPECT_EQ(m[1], "5");
  // The per-step figures: 4 inner steps a round.
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(id="chart-steps" data-points="(\d+)")re")))
      << dom;
  EXPECT_EQ(m[1], "20");
  EXPECT_TRUE(std::regex_search(
      dom, std::regex(R"re(<pre id="log">fake job done\njob succeeded</pre>)re")));
  // Axes read at a glance: fractions in percent from 0 to 100, bytes in MB from 0, not fitted
  // to the data (a flat line drawn as a trend).
  const auto canvas = [&](const std::string& id) {
    std::smatch c;
    return std::regex_search(dom, c, std::regex("<canvas id=\"" + id + "\"[^>]*>")) ? c.str()
                                                                                    : std::string();
  };
  EXPECT_NE(canvas("chart-util").find(R"x(data-y-title="utilization (%)" data-y-min="0" )x"
                                      R"(data-y-max="100")"),
            std::string::npos)
      << canvas("chart-util");
  EXPECT_NE(canvas("chart-step-device").find(R"x(data-y-title="MFU (%)" data-y-min="0" )x"
                                             R"(data-y-max="100")"),
            std::string::npos)
      << canvas("chart-step-device");
  EXPECT_NE(canvas("chart-bytes").find(R"(data-y-title="MB per worker" data-y-min="0")"),
            std::string::npos)
      << canvas("chart-bytes");
  EXPECT_EQ(canvas("chart-bytes").find("data-y-max"), std::string::npos);
  EXPECT_EQ(canvas("chart-loss").find("data-y-min"), std::string::npos) << canvas("chart-loss");
  // The page got no error back.
  EXPECT_NE(dom.find("<span id=\"error\"></span>"), std::string::npos);
}

TEST_F(DashboardTest, ChromiumWithoutTheTokenShowsTheRefusalAndNoData) {
  const std::string dom = render("http://127.0.0.1:" + std::to_string(port_) + "/",
                                 cluster_->log_dir() + "/browser-no-token.log");
  EXPECT_EQ(count(dom, "data-node=\""), 0) << dom;
  EXPECT_NE(dom.find("401"), std::string::npos) << dom;
}

TEST_F(DashboardTest, ChromiumFollowsARunningJob) {
  Client client(cluster_->head_address());
  JobHandle job = client.submit(fake_job("rounds 100000"));
  ASSERT_TRUE(eventually([&] { return job.updates_so_far().size() >= 3; }, 20s));
  const std::string dom =
      render(url("&job=" + job.id()), cluster_->log_dir() + "/browser-live.log");
  job.cancel();
  EXPECT_NE(dom.find("id=\"job-state\" class=\"state-running\">running<"), std::string::npos)
      << dom;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(id="chart-loss" data-points="(\d+)")re")));
  EXPECT_GE(std::stoi(m[1]), 3);
  EXPECT_EQ(job.wait(Millis(10000)).state, JobState::cancelled);
}

// `loco plot JOB` draws the job's curves from the cluster (its log), here, not in the job.
TEST_F(DashboardTest, LocoPlotDrawsTheJobFromTheCluster) {
  if (!fs::exists("/usr/bin/gnuplot")) GTEST_SKIP() << "gnuplot-nox is not installed";
  const std::string out = cluster_->log_dir() + "/plots";
  Subprocess::Options o;
  o.log_path = cluster_->log_dir() + "/plot.log";
  Subprocess plot(
      {loco_binary(), "plot", job_id_, "--address", cluster_->head_address(), "--out", out}, o);
  const auto rc = plot.wait(120s);
  ASSERT_TRUE(rc.has_value()) << "loco plot did not finish in 120 s";
  EXPECT_EQ(*rc, 0) << read_file(o.log_path);
  EXPECT_GT(fs::file_size(out + "/loss.png"), 1000u);
  EXPECT_GT(fs::file_size(out + "/steps.png"), 1000u);
  // One line per round and per step (after a header line).
  const std::string loss = read_file(out + "/loss.dat"), steps = read_file(out + "/steps.dat");
  EXPECT_EQ(count(loss, "\n"), 1 + 5) << loss;
  EXPECT_EQ(count(steps, "\n"), 1 + 20) << steps;
}

// `loco up` has its head serve the dashboard on loopback with a token, and prints the URL.
// With a client key the dashboard shows that key's jobs: another user's job is left out of
// /api/jobs and /metrics, and asked for by id it is a 403 naming its owner, where before any
// other user's job made every data request a 503 (issue "21 ·", finding 8).
TEST(DashboardKeys, AClientKeysDashboardShowsItsOwnJobsAndNoOneElses) {
  LocalCluster c(ClusterOptions{.nodes = 1, .extra_head_args = {"--job-entry=test.FakeJob"}});
  std::map<std::string, std::string> key;
  for (const std::string who : {"alice", "bob"}) {
    key[who] = c.log_dir() + "/" + who + ".key";
    Subprocess::Options o;
    o.log_path = c.log_dir() + "/keygen-" + who + ".log";
    Subprocess keygen({loco_binary(), "keygen", "--client", "--out", key[who], "--key",
                       c.key_path(), "--name", who},
                      o);
    ASSERT_EQ(keygen.wait(30s).value_or(-1), 0) << read_file(o.log_path);
  }
  auto submit = [&](const std::string& who) {
    ConnectOptions o;
    o.security = security::read_key_file(key[who]);
    Client client(c.head_address(), o);
    JobSpec spec = fake_job("rounds 2 with-steps");
    spec.name = who + "s";
    JobHandle job = client.submit(spec);
    EXPECT_EQ(job.wait(Millis(20000)).state, JobState::succeeded);
    return job.id();
  };
  const std::string alices = submit("alice"), bobs = submit("bob");

  const int port = free_tcp_port();
  Subprocess::Options o;
  o.log_path = c.log_dir() + "/dashboard-bob.log";
  Subprocess dash({loco_binary(), "dashboard", "--address", c.head_address(), "--port",
                   std::to_string(port), "--key", key["bob"]},
                  o);
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(20, 0);
  // No token file: the dashboard makes one and prints its URL; read the token from there.
  std::smatch m;
  std::string out;
  ASSERT_TRUE(wait_printed(dash, o.log_path, std::regex(R"(#token=([0-9a-f]{32}))"), out, m, 20s))
      << out;
  const httplib::Headers auth{{"Authorization", "Bearer " + m[1].str()}};
  auto jobs = http.Get("/api/jobs", auth);
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 200) << jobs->body;
  EXPECT_NE(jobs->body.find(bobs), std::string::npos) << jobs->body;
  EXPECT_EQ(jobs->body.find(alices), std::string::npos) << jobs->body;
  auto metrics = http.Get("/metrics", auth);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200) << metrics->body;
  EXPECT_NE(metrics->body.find(bobs), std::string::npos);
  EXPECT_EQ(metrics->body.find(alices), std::string::npos);
  auto hers = http.Get("/api/jobs/" + alices, auth);
  ASSERT_TRUE(hers);
  EXPECT_EQ(hers->status, 403) << hers->body;
  EXPECT_NE(hers->body.find("belongs to alice"), std::string::npos) << hers->body;
  EXPECT_EQ(http.Get("/api/jobs/" + bobs, auth)->status, 200);
  dash.stop(5s);
}

TEST(DashboardUp, LocoUpPrintsTheUrlOfTheDashboardItsHeadServes) {
  char tmpl[] = "/tmp/loco-dash-up-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  Subprocess::Options o;
  o.log_path = dir + "/up.log";
  o.env["LOCO_STATE_DIR"] = dir;
  o.env["LOCO_KEY"] = dir + "/cluster.key";
  o.env["LOCO_PLUGIN_PATH"] = LOCO_TEST_PLUGIN_DIR_STR "/libloco_test_actors.so";
  Subprocess up({loco_binary(), "up", "--workers", "1"}, o);
  std::smatch m;
  const std::regex printed(R"(dashboard at http://127\.0\.0\.1:(\d+)/#token=([0-9a-f]{32}))");
  std::string out;
  ASSERT_TRUE(wait_printed(up, o.log_path, printed, out, m, 60s)) << out;
  // `loco dashboard` prints it while the cluster runs.
  {
    Subprocess::Options po;
    po.log_path = dir + "/dashboard.out";
    po.env["LOCO_STATE_DIR"] = dir;
    Subprocess print({loco_binary(), "dashboard"}, po);
    const auto rc = print.wait(30s);
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 0);
    const std::string url = "http://127.0.0.1:" + m[1].str() + "/#token=" + m[2].str();
    EXPECT_NE(read_file(po.log_path).find(": " + url + "\n"), std::string::npos)
        << read_file(po.log_path);
  }
  httplib::Client http("127.0.0.1", std::stoi(m[1]));
  http.set_read_timeout(20, 0);
  EXPECT_EQ(http.Get("/api/cluster")->status, 401);
  const std::string token = m[2];
  std::string body;
  ASSERT_TRUE(eventually(
      [&] {
        auto r = http.Get("/api/cluster", {{"Authorization", "Bearer " + token}});
        body = r ? r->body : "no answer";
        return r && r->status == 200 && nlohmann::json::parse(r->body)["nodes"].size() == 1;
      },
      20s))
      << body;
  EXPECT_EQ(up.stop(20s), 0) << read_file(o.log_path);
  EXPECT_FALSE(fs::exists(dir + "/dashboard_url")) << "loco up left its URL behind";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loco::testing
