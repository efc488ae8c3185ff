// CURVE with real processes: a head and nodes started by `loco start`, clients and nodes that
// lack the cluster's key, and the command line without a key.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "runtime/security/keys.hpp"
#include "tests/runtime/core/cluster.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/zmq_probe.hpp"

namespace loco::testing {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// Runs `cmd` through the shell, bounded by timeout(1); returns what it printed.
std::string run(const std::string& cmd, int* rc) {
  const std::string out = "/tmp/loco-security-" + std::to_string(::getpid()) + ".out";
  *rc = WEXITSTATUS(std::system(("timeout 60 " + cmd + " > " + out + " 2>&1").c_str()));
  std::string text = read_file(out);
  std::filesystem::remove(out);
  return text;
}

// A key file of another cluster, in the cluster's log folder.
std::string other_key(const LocalCluster& c) {
  const std::string path = c.log_dir() + "/other.key";
  security::write_key_file(path, security::generate_key_pair(), true);
  return path;
}

TEST(Security, AClientWithoutTheClusterKeyIsRefusedAndSubmitsNothing) {
  LocalCluster c(ClusterOptions{.nodes = 1});
  const std::string loco = loco_binary() + " ", at = " --address " + c.head_address();
  const std::string job = c.log_dir() + "/ok.yaml";
  std::ofstream(job) << "rounds: 2";
  int rc = -1;
  // With the key: served.
  std::string out = run(loco + "status" + at, &rc);
  ASSERT_EQ(rc, 0) << out;
  // Another cluster's key: refused, and said so.
  const std::string other = other_key(c);
  out = run(loco + "submit " + job + " --entry test.FakeJob" + at + " --key " + other, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "another cluster key")) << out;
  // No key at all (plain TCP): refused, and said so.
  out = run(loco + "submit " + job + " --entry test.FakeJob" + at + " --insecure", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "CURVE on one side only")) << out;
  // No key file: the command says how to make one, before touching the network.
  out = run("env LOCO_KEY=" + c.log_dir() + "/none.key " + loco + "status" + at, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "loco keygen")) << out;
  EXPECT_TRUE(c.runtime().list_jobs().empty()) << "a job was submitted without the key";
  // A peer that knows the head's public key but holds another key pair: the head's ZAP
  // handler refuses it, and logs it.
  const auto cluster = security::read_key_file(c.key_path());
  const auto stranger_key = security::generate_key_pair();
  ZmqProbe stranger("tcp://" + c.head_address(), cluster.cluster.public_key,
                    stranger_key.public_key, stranger_key.secret_key);
  stranger.send({"not", "a", "message"});
  EXPECT_EQ(stranger.wait_handshake(Millis(5000)), ZmqProbe::Outcome::refused_auth);
  const std::string head_log = c.log_dir() + "/head.log";
  EXPECT_TRUE(eventually(
      [&] { return contains(read_file(head_log), "refused a connection from 127.0.0.1"); },
      Millis(5000)))
      << read_file(head_log);
  // None of the refused peers' bytes reached the head's decoder: it rejected no message.
  EXPECT_FALSE(contains(read_file(head_log), "rejected a message")) << read_file(head_log);
}

TEST(Security, ANodeWithoutTheClusterKeyCannotJoin) {
  LocalCluster c(ClusterOptions{.nodes = 1});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--key=" + other_key(c), "another cluster key"}, {"--insecure", "CURVE on one side only"}};
  for (const auto& [flag, says] : cases) {
    Subprocess::Options o;
    o.log_path = c.log_dir() + "/intruder.log";
    std::filesystem::remove(o.log_path);
    o.env["LOCO_PLUGIN_PATH"] = LOCO_PLUGIN_DIR_STR "/libloco_test_actors.so";
    Subprocess node({loco_binary(), "start", "--block", "--host=127.0.0.1",
                     "--address=" + c.head_address(), "--resources=cpu=1", flag},
                    o);
    auto rc = node.wait(Millis(20000));
    ASSERT_TRUE(rc) << "the node without the key neither joined nor gave up";
    EXPECT_EQ(*rc, 1);
    const std::string log = read_file(o.log_path);
    EXPECT_TRUE(contains(log, "cannot join the cluster")) << log;
    EXPECT_TRUE(contains(log, says)) << log;
  }
  EXPECT_EQ(c.runtime().status().nodes.size(), 1u);
}

TEST(Security, StartWithoutAKeyRefusesAndKeygenMakesOne) {
  char tmpl[] = "/tmp/loco-keygen-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string key = dir + "/cluster.key", loco = "env LOCO_KEY=" + key + " " + loco_binary();
  int rc = -1;
  std::string out = run(loco + " start --head --block --host 127.0.0.1 --port " +
                            std::to_string(free_tcp_port()) + " --redis redis://127.0.0.1:1",
                        &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "no cluster key at " + key)) << out;
  EXPECT_TRUE(contains(out, "loco keygen")) << out;
  out = run(loco + " keygen", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "wrote cluster key " + key)) << out;
  const auto first = security::read_key_file(key);
  out = run(loco + " keygen", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "exists")) << out;
  EXPECT_EQ(security::read_key_file(key).cluster.public_key, first.cluster.public_key);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loco::testing
