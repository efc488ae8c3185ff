#include "tests/runtime/core/cluster.hpp"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "runtime/security/keys.hpp"
#include "tests/support/eventually.hpp"

namespace fs = std::filesystem;

namespace loco::testing {

std::string loco_binary() { return LOCO_BIN_DIR "/loco"; }

LocalCluster::LocalCluster(ClusterOptions opts) : opts_(std::move(opts)) {
  char tmpl[] = "/tmp/loco-cluster-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  if (opts_.insecure) {
    ::setenv("LOCO_INSECURE", "1", 1);
  } else {
    ::unsetenv("LOCO_INSECURE");
    key_path_ = dir_ + "/cluster.key";
    security::write_key_file(key_path_, security::generate_key_pair());
    ::setenv("LOCO_KEY", key_path_.c_str(), 1);
  }
  RedisServer::Options ro;
  if (opts_.redis_appendonly) {
    ro.appendonly = true;
    ro.extra_args = {"--appendfsync", "always"};
  }
  redis_ = std::make_unique<RedisServer>(ro);
  head_port_ = free_tcp_port();
  head_address_ = "127.0.0.1:" + std::to_string(head_port_);
  start_head();
  runtime_.emplace(Runtime::connect(head_address_, ConnectOptions{Millis(10000), opts_.detect_ms}));
  for (int i = 0; i < opts_.nodes; ++i) add_node(opts_.extra_node_args);
  if (!wait_alive_nodes(opts_.nodes))
    throw std::runtime_error("nodes did not join; logs in " + dir_);
}

LocalCluster::~LocalCluster() {
  runtime_.reset();
  for (auto& [addr, p] : nodes_) p.signal(SIGKILL);
  for (auto& [addr, p] : nodes_) p.kill();
  if (head_) head_->kill();
  redis_.reset();
  if (!::getenv("LOCO_KEEP_LOGS")) fs::remove_all(dir_);
}

std::string LocalCluster::start_process(std::vector<std::string> argv, const std::string& name,
                                        std::optional<Subprocess>& out) {
  std::string ready = dir_ + "/" + name + ".ready";
  fs::remove(ready);
  argv.push_back("--ready-file=" + ready);
  Subprocess::Options o;
  o.log_path = dir_ + "/" + name + ".log";
  if (!opts_.plugins.empty()) o.env["LOCO_PLUGIN_PATH"] = opts_.plugins;
  out.emplace(argv, o);
  auto ready_or_exited = [&] {
    if (fs::exists(ready)) return true;
    if (!out->running()) throw std::runtime_error(name + " exited early; see " + o.log_path);
    return false;
  };
  if (!eventually(ready_or_exited, std::chrono::seconds(20), std::chrono::milliseconds(10)))
    throw std::runtime_error(name + " did not become ready in 20 s; see " + o.log_path);
  std::string addr;
  std::ifstream(ready) >> addr;
  return addr;
}

void LocalCluster::start_head() {
  std::vector<std::string> argv = {loco_binary(),
                                   "start",
                                   "--head",
                                   "--block",
                                   "--host=127.0.0.1",
                                   "--port=" + std::to_string(head_port_),
                                   "--redis=" + redis_->url(),
                                   "--detect-ms=" + std::to_string(opts_.detect_ms)};
  argv.insert(argv.end(), opts_.extra_head_args.begin(), opts_.extra_head_args.end());
  start_process(argv, "head", head_);
}

void LocalCluster::kill_head() { head_->kill(); }

std::string LocalCluster::add_node(const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv = {loco_binary(), "start", "--block", "--host=127.0.0.1",
                                   "--address=" + head_address_};
  bool own_resources = std::any_of(extra_args.begin(), extra_args.end(), [](const std::string& a) {
    return a.rfind("--resources", 0) == 0;
  });
  if (!own_resources) argv.push_back("--resources=" + opts_.node_resources);
  // The tests' corpora and job folders are under /tmp.
  argv.push_back("--data-root=" + opts_.path_root);
  argv.push_back("--checkpoint-root=" + opts_.path_root);
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  std::optional<Subprocess> p;
  std::string addr = start_process(argv, "node-" + std::to_string(node_count_++), p);
  nodes_.emplace(addr, std::move(*p));
  return addr;
}

std::vector<std::string> LocalCluster::node_addresses() const {
  std::vector<std::string> out;
  for (auto& [a, _] : nodes_) out.push_back(a);
  return out;
}

bool LocalCluster::wait_alive_nodes(int n, Millis timeout) {
  return eventually(
      [&] {
        try {
          int alive = 0;
          for (auto& ns : runtime_->status().nodes) alive += ns.node.state == NodeState::alive;
          return alive == n;
        } catch (const ClusterError&) {
          return false;
        }
      },
      timeout);
}

}  // namespace loco::testing
