// The job machinery, end to end through the client API, with a fake entry actor.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "client/client.hpp"
#include "tests/runtime/core/cluster.hpp"
#include "tests/runtime/core/fake_job.hpp"
#include "tests/runtime/core/test_actors.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/redis_server.hpp"

namespace loco::testing {
namespace {

TEST(Jobs, SubmitWatchWaitAndList) {
  LocalCluster c(ClusterOptions{.nodes = 2});
  Client client(c.head_address());
  JobHandle job = client.submit(fake_job("rounds 5"));
  std::vector<int> rounds;
  double last_loss = 1e9;
  for (const RoundReport& r : job.watch()) {
    rounds.push_back(r.round);
    EXPECT_EQ(r.rounds, 5);
    EXPECT_LT(r.loss, last_loss);
    last_loss = r.loss;
    EXPECT_EQ(r.workers, 2);
  }
  EXPECT_EQ(rounds, (std::vector<int>{1, 2, 3, 4, 5}));
  JobInfo end = job.wait(Millis(10000));
  EXPECT_EQ(end.state, JobState::succeeded);
  auto jobs = client.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].id, job.id());
  EXPECT_EQ(jobs[0].name, "fake");
}

// A report that does not decode (once, a forged one made `loco submit` exit with bad_cast) is
// a line that says so; the watcher goes on to the job's real reports and its end.
TEST(Jobs, AMalformedReportIsSkippedWithALineNotTheWatchersEnd) {
  LocalCluster c(ClusterOptions{.nodes = 1});
  Client client(c.head_address());
  JobHandle job = client.submit(fake_job("rounds 3 bad-report"));
  auto watch = job.watch();
  std::vector<int> rounds;
  std::string skipped;
  while (auto u = watch.next_update()) {
    if (u->report) rounds.push_back(u->report->round);
    if (u->line.find("skipped a malformed progress report") != std::string::npos) skipped = u->line;
  }
  EXPECT_FALSE(skipped.empty());
  EXPECT_EQ(rounds, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(job.wait(Millis(10000)).state, JobState::succeeded);
}

TEST(Jobs, FailureAndCancelAreReported) {
  LocalCluster c(ClusterOptions{.nodes = 1});
  Client client(c.head_address());
  JobInfo failed = client.submit(fake_job("rounds 2 fail")).wait(Millis(10000));
  EXPECT_EQ(failed.state, JobState::failed);
  EXPECT_EQ(failed.message, "asked to fail");

  JobHandle long_job = client.submit(fake_job("rounds 100000"));
  // Cancel once it is under way.
  for (const RoundReport& r : long_job.watch())
    if (r.round >= 3) break;
  EXPECT_EQ(long_job.cancel().state, JobState::cancelled);
  JobInfo end = long_job.wait(Millis(5000));
  EXPECT_EQ(end.state, JobState::cancelled);
  // Its actors are gone.
  for (auto& a : client.runtime().status().actors) {
    if (a.name.rfind(long_job.id(), 0) == 0) {
      EXPECT_EQ(a.state, ActorState::dead);
    }
  }

  // A bad spec fails at submit with the actor's own message.
  try {
    client.submit(fake_job("laps 3"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 'rounds N'"), std::string::npos) << e.what();
  }
}

// The probe: a 10 MB job name left the head busy with the store and unable to answer hello
// for minutes. Now the head refuses it before it touches the store, naming the field.
TEST(Jobs, OversizedNameOrSpecIsRefusedNamingTheFieldAndTheHeadKeepsAnswering) {
  LocalCluster c(ClusterOptions{.nodes = 1});
  Client client(c.head_address());
  auto refused = [&](JobSpec s, const std::string& text) {
    try {
      client.submit(s);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  JobSpec big_name = fake_job("rounds 1");
  big_name.name = std::string(10 << 20, 'n');
  refused(big_name, "submit: name: 10485760 bytes, more than the limit of 256 bytes");
  refused(fake_job(std::string(2 << 20, 'r')),
          "submit: spec (the job file): 2097152 bytes, more than the limit of 1048576 bytes");
  EXPECT_TRUE(client.jobs().empty());
  EXPECT_EQ(client.submit(fake_job("rounds 1")).wait(Millis(20000)).state, JobState::succeeded);
}

// A listening socket standing in for the relay: the head sees the relay only by whether a
// connection to it opens.
class Listener {
 public:
  explicit Listener(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0)
      throw std::runtime_error("cannot listen on port " + std::to_string(port));
  }
  ~Listener() { ::close(fd_); }

 private:
  int fd_ = -1;
};

// The head tells running jobs what happened to the cluster: its relay going away and coming
// back are lines of the job's log ("cluster: ...") and cluster records of its events.
TEST(Jobs, TheRelaysOutageIsInEveryRunningJob) {
  const int port = free_tcp_port();
  auto relay = std::make_unique<Listener>(port);
  ClusterOptions o;
  o.nodes = 1;
  o.extra_head_args = {"--relay", "tcp://127.0.0.1:" + std::to_string(port),
                       "--relay-public-key", std::string(40, '0')};
  LocalCluster c(o);
  Client client(c.head_address());
  JobHandle job = client.submit(fake_job("rounds 100000"));
  const auto logged = [&](const std::string& text) {
    for (const std::string& line : job.logs())
      if (line.find(text) != std::string::npos) return true;
    return false;
  };
  // Up at first: nothing said.
  ASSERT_TRUE(eventually([&] { return job.info().state == JobState::running; },
                         std::chrono::seconds(20)));
  relay.reset();
  EXPECT_TRUE(eventually([&] { return logged("cluster: the relay at tcp://127.0.0.1:" +
                                             std::to_string(port) +
                                             " does not accept connections from the head"); },
                         std::chrono::seconds(10)));
  relay = std::make_unique<Listener>(port);
  EXPECT_TRUE(eventually([&] { return logged("is reachable again after"); },
                         std::chrono::seconds(10)));
  int records = 0;
  for (const JobEvent& e : client.runtime().job_events(job.id(), "", 1000).events)
    records += e.kind == kClusterRecord;
  EXPECT_EQ(records, 2);
  job.cancel();
}

TEST(Jobs, EntryActorIsRestartedWhenItsNodeDies) {
  LocalCluster c(ClusterOptions{.nodes = 2});
  Client client(c.head_address());
  JobHandle job = client.submit(fake_job("rounds 100000"));  // max_restarts 3 by default
  for (const RoundReport& r : job.watch())
    if (r.round >= 2) break;
  ActorInfo entry = client.runtime().lookup(job.id() + ".entry");
  c.node(entry.address).kill();
  // Reports start again from round 1: the restarted entry actor runs the job anew.
  bool restarted = false;
  for (const RoundReport& r : job.watch()) {
    if (r.round == 1) restarted = true;
    if (restarted && r.round >= 2) break;
  }
  EXPECT_TRUE(restarted);
  ActorInfo again = client.runtime().lookup(job.id() + ".entry");
  EXPECT_EQ(again.restarts, 1);
  EXPECT_NE(again.address, entry.address);
  EXPECT_EQ(job.info().state, JobState::running);
  job.cancel();
}

TEST(Jobs, EntryActorDeathWithoutRestartsFailsTheJob) {
  LocalCluster c(ClusterOptions{.nodes = 2});
  Client client(c.head_address());
  JobSpec spec = fake_job("rounds 100000");
  spec.max_restarts = 0;
  JobHandle job = client.submit(spec);
  for (const RoundReport& r : job.watch())
    if (r.round >= 2) break;
  ActorInfo entry = client.runtime().lookup(job.id() + ".entry");
  c.node(entry.address).kill();
  JobInfo end = job.wait(Millis(15000));
  EXPECT_EQ(end.state, JobState::failed);
  EXPECT_NE(end.message.find("died"), std::string::npos) << end.message;
}

std::string run(const std::string& cmd, int* rc) {
  std::string out = "/tmp/loco-cli-" + std::to_string(::getpid()) + ".out";
  *rc = WEXITSTATUS(std::system((cmd + " > " + out + " 2>&1").c_str()));
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  std::filesystem::remove(out);
  return text;
}

TEST(Jobs, CommandLineSubmitJobsLogsCancel) {
  LocalCluster c(ClusterOptions{.nodes = 1});
  const std::string loco = loco_binary() + " ";
  const std::string at = " --address " + c.head_address();
  char tmpl[] = "/tmp/loco-cli-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::ofstream(dir + "/ok.yaml") << "rounds: 4";
  std::ofstream(dir + "/bad.yaml") << "rounds: 2 # fail";
  int rc = -1;
  std::string out = run(loco + "submit " + dir + "/ok.yaml --entry test.FakeJob" + at, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("round 4/4"), std::string::npos) << out;  // the progress, one line a round
  EXPECT_NE(out.find("job succeeded"), std::string::npos) << out;
  out = run(loco + "submit " + dir + "/bad.yaml --entry test.FakeJob" + at, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("job failed: asked to fail"), std::string::npos) << out;
  out = run(loco + "jobs" + at, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find("failed"), std::string::npos) << out;
  std::string id = out.substr(out.find("job-"), 16);
  out = run(loco + "logs " + id + at, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("fake job done"), std::string::npos) << out;
  // The job's typed record is in its event log, but not among the lines for people.
  EXPECT_EQ(out.find("FAKE-RECORD-DATA"), std::string::npos) << out;
  std::string cursor;
  bool recorded = false;
  for (const JobEvent& e : Client(c.head_address()).job(id).poll(cursor).events)
    recorded = recorded || (e.kind == "fake-record" && e.data == "FAKE-RECORD-DATA");
  EXPECT_TRUE(recorded);
  // A job file that is not YAML is refused before anything is submitted.
  std::ofstream(dir + "/broken.yaml") << "rounds: [1, 2";
  out = run(loco + "submit " + dir + "/broken.yaml" + at, &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("not valid YAML"), std::string::npos) << out;
  // Cancel from the command line.
  std::ofstream(dir + "/long.yaml") << "rounds: 100000";
  out = run(loco + "submit " + dir + "/long.yaml --detach --entry test.FakeJob" + at, &rc);
  ASSERT_EQ(rc, 0) << out;
  std::string long_id = out.substr(out.find("job-"), 16);
  out = run(loco + "cancel " + long_id + at, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("cancelled"), std::string::npos) << out;
  EXPECT_EQ(Client(c.head_address()).job(long_id).info().state, JobState::cancelled);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loco::testing
