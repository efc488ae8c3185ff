#pragma once
#ifndef LOCO_PLUGIN_DIR_STR
#error "LOCO_PLUGIN_DIR_STR must name build/plugins"
#endif
#ifndef LOCO_TEST_PLUGIN_DIR_STR
#error "LOCO_TEST_PLUGIN_DIR_STR must name build/plugins-testing"
#endif
// A real local cluster for multi-process tests: redis-server on a free port,
// a head and N nodes as `loco start --block` processes on loopback. Every wait
// is bounded; the destructor kills whatever is still running.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/process.hpp"
#include "runtime/core/runtime.hpp"
#include "tests/support/redis_server.hpp"

namespace loco::testing {

struct ClusterOptions {
  int nodes = 3;
  int64_t detect_ms = 1000;
  std::string node_resources = "cpu=4";
  bool redis_appendonly = false;
  std::vector<std::string> extra_node_args;
  std::vector<std::string> extra_head_args;
  std::string path_root = "/tmp";  // every node's --data-root and --checkpoint-root
  // Plugins the nodes load ($LOCO_PLUGIN_PATH); default: the test actors only,
  // so that runtime tests do not load LibTorch in every node.
  std::string plugins = LOCO_TEST_PLUGIN_DIR_STR "/libloco_test_actors.so";
  // Plain TCP (--insecure) instead of a cluster key made for this cluster.
  bool insecure = false;
};

class LocalCluster {
 public:
  explicit LocalCluster(ClusterOptions opts = {});
  ~LocalCluster();

  std::string head_address() const { return head_address_; }
  RedisServer& redis() { return *redis_; }
  Runtime& runtime() { return *runtime_; }

  // Starts a node; returns its address.
  std::string add_node(const std::vector<std::string>& extra_args = {});
  // The node process serving at `address`.
  Subprocess& node(const std::string& address) { return nodes_.at(address); }
  std::vector<std::string> node_addresses() const;

  void kill_head();   // SIGKILL
  void start_head();  // on the same port
  Subprocess& head() { return *head_; }

  // Waits until the head reports `n` nodes alive (bounded); false on timeout.
  bool wait_alive_nodes(int n, Millis timeout = Millis(15000));
  std::string log_dir() const { return dir_; }
  // The cluster's key file ("" when insecure). The constructor points $LOCO_KEY at it, so
  // that this process's Runtime::connect and the `loco` commands a test runs hold it.
  std::string key_path() const { return key_path_; }

 private:
  std::string start_process(std::vector<std::string> argv, const std::string& name,
                            std::optional<Subprocess>& out);

  ClusterOptions opts_;
  std::string dir_;
  std::string key_path_;
  std::unique_ptr<RedisServer> redis_;
  int head_port_ = 0;
  std::string head_address_;
  std::optional<Subprocess> head_;
  std::map<std::string, Subprocess> nodes_;
  int node_count_ = 0;
  std::optional<Runtime> runtime_;
};

// `loco` in the build tree.
std::string loco_binary();

// Small helpers the cluster tests share.
inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}
// The whole file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
inline int64_t ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t)
      .count();
}

}  // namespace loco::testing
