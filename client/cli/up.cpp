// loco up: a whole local cluster (Redis, a head, N nodes), optionally running
// a job file or a command on it and stopping it afterwards.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "client/cli/dashboard.hpp"
#include "client/cli/follow.hpp"
#include "client/client.hpp"
#include "client/dashboard/server.hpp"
#include "client/process.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/membership/store.hpp"
#include "runtime/security/keys.hpp"

namespace fs = std::filesystem;

namespace loco::cli {
namespace {

struct UpArgs {
  int workers = 2;
  std::string redis;
  int port = 0;
  std::string resources;
  int64_t detect_ms = 2000;
  std::string data_root, checkpoint_root;
  bool allow_code_models = false;
  int dashboard_port = 0;  // the head's dashboard: 0 any free port, -1 none
  std::vector<std::string> sets;  // --set PATH=VALUE for the job file
  std::vector<std::string> command;
};

// The cluster's key: the one at --key / $LOCO_KEY / ~/.loco/cluster.key, made there if there is
// none (so that later commands find it), unless --insecure. The processes started below
// inherit $LOCO_KEY.
void ensure_cluster_key() {
  const char* insecure = std::getenv("LOCO_INSECURE");
  if (insecure && std::string(insecure) == "1") {
    std::cout << "warning: --insecure: the cluster speaks plain TCP, without keys" << std::endl;
    return;
  }
  const std::string path = fs::absolute(security::default_key_path()).string();
  if (!fs::exists(path)) {
    try {
      security::write_key_file(path, security::generate_key_pair());
      std::cout << "made a cluster key at " << path << std::endl;
    } catch (const security::KeyError&) {
      // Another `loco up` made it at the same moment (write_key_file never overwrites): use it.
      if (!fs::exists(path)) throw;
    }
  }
  ::setenv("LOCO_KEY", path.c_str(), 1);
  (void)security::resolve("", false);  // a malformed file: stop here, naming it
}

// A password for the Redis that `loco up` starts: 128 random bits, hex.
std::string random_password() {
  std::random_device rd;  // /dev/urandom on Linux
  std::string out;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) out += hex[rd() % 16];
  return out;
}

// The processes of a `loco up` cluster, stopped (nodes, head, then Redis) when it goes.
class UpCluster {
 public:
  explicit UpCluster(const UpArgs& a)
      : a_(a),
        dir_(state_dir() + "/up-" + std::to_string(::getpid())),
        bin_(executable_dir() + "/loco"),
        head_port_(a.port ? a.port : free_tcp_port()),
        head_addr_("127.0.0.1:" + std::to_string(head_port_)),
        detect_("--detect-ms=" + std::to_string(a.detect_ms)) {
    fs::create_directories(dir_);
  }
  ~UpCluster() { teardown(); }

  const std::string& dir() const { return dir_; }
  const std::string& head_address() const { return head_addr_; }
  const std::string& dashboard_url() const { return dashboard_url_; }

  // Redis on loopback with a password (unless --redis names one), handed to the head through
  // its environment ($LOCO_REDIS): argv would show the password in ps.
  std::string start_redis();
  // The head (retrying while a fresh Redis starts), serving the dashboard unless told not to.
  bool start_head();
  void start_nodes();
  // Waits until every node has joined (at most 60 s); throws ClusterError naming the logs.
  void wait_joined();
  void teardown() {
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) it->stop(std::chrono::seconds(10));
    procs_.clear();
    if (redis_) redis_->stop(std::chrono::seconds(5));
    redis_.reset();
  }

 private:
  void start(std::vector<std::string> argv, const std::string& log) {
    Subprocess::Options o;
    o.log_path = dir_ + "/" + log;
    procs_.emplace_back(std::move(argv), o);
  }
  std::vector<std::string> dashboard_args();

  const UpArgs& a_;
  std::string dir_, bin_;
  int head_port_;
  std::string head_addr_, detect_, dashboard_url_;
  std::vector<Subprocess> procs_;
  std::optional<Subprocess> redis_;
};

std::string UpCluster::start_redis() {
  if (!a_.redis.empty()) return a_.redis;
  // The password is in a file only we can read, never on a command line (ps shows those). The
  // append-only file (fsync'd every second) keeps the cluster's state across a Redis restart.
  const int port = free_tcp_port();
  const std::string password = random_password(), conf = dir_ + "/redis.conf";
  {
    mode_t old = ::umask(077);
    std::ofstream(conf) << "requirepass " << password << "\n";
    ::umask(old);
  }
  Subprocess::Options o;
  o.log_path = dir_ + "/redis.log";
  // The redis-server beside this binary (the wheel and the image carry one), else $PATH's.
  const std::string beside = executable_dir() + "/redis-server";
  const std::string redis = ::access(beside.c_str(), X_OK) == 0 ? beside : "redis-server";
  redis_.emplace(
      std::vector<std::string>{redis, conf, "--port", std::to_string(port), "--bind",
                               "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync",
                               "everysec", "--dir", dir_},
      o);
  return "redis://:" + password + "@127.0.0.1:" + std::to_string(port);
}

// The head serves the dashboard on loopback, with a token in a file only we can read (none on
// an --insecure cluster, as for the cluster's own sockets).
std::vector<std::string> UpCluster::dashboard_args() {
  if (a_.dashboard_port < 0) return {};
  const int port = a_.dashboard_port ? a_.dashboard_port : free_tcp_port();
  std::vector<std::string> args = {"--dashboard-port=" + std::to_string(port),
                                   "--dashboard-host=127.0.0.1"};
  dashboard_url_ = "http://127.0.0.1:" + std::to_string(port) + "/";
  const char* insecure = std::getenv("LOCO_INSECURE");
  if (!(insecure && std::string(insecure) == "1")) {
    const std::string token_file = dir_ + "/dashboard.token";
    dashboard_url_ += "#token=" + dashboard::load_or_make_token(token_file);
    args.push_back("--dashboard-token-file=" + token_file);
  }
  return args;
}

bool UpCluster::start_head() {
  const std::vector<std::string> dashboard = dashboard_args();
  for (int attempt = 0; attempt < 50 && !stop_requested(); ++attempt) {
    std::vector<std::string> argv = {bin_,
                                     "start",
                                     "--head",
                                     "--block",
                                     "--host=127.0.0.1",
                                     "--port=" + std::to_string(head_port_),
                                     detect_};
    argv.insert(argv.end(), dashboard.begin(), dashboard.end());
    start(argv, "head.log");
    // The head exits at once when Redis does not answer yet: retry briefly.
    if (!procs_.back().wait(std::chrono::milliseconds(300))) return true;
    procs_.pop_back();
  }
  return false;
}

void UpCluster::start_nodes() {
  for (int i = 0; i < a_.workers; ++i) {
    std::vector<std::string> argv = {
        bin_, "start", "--block", "--host=127.0.0.1", "--address=" + head_addr_, detect_};
    if (!a_.resources.empty()) argv.push_back("--resources=" + a_.resources);
    if (!a_.data_root.empty()) argv.push_back("--data-root=" + a_.data_root);
    if (!a_.checkpoint_root.empty()) argv.push_back("--checkpoint-root=" + a_.checkpoint_root);
    if (a_.allow_code_models) argv.push_back("--allow-code-models");
    start(argv, "node-" + std::to_string(i) + ".log");
  }
}

void UpCluster::wait_joined() {
  Runtime rt = Runtime::connect(head_addr_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    int alive = 0;
    for (auto& n : rt.status().nodes) alive += n.node.state == loco::NodeState::alive;
    if (alive >= a_.workers) return;
    for (auto& p : procs_)
      if (!p.running()) throw ClusterError("a cluster process exited early; logs in " + dir_);
    if (std::chrono::steady_clock::now() > deadline || stop_requested())
      throw ClusterError("nodes did not join within 60 s; logs in " + dir_);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The URL of the dashboard, for `loco dashboard` to print while this cluster runs (0600: the
// URL holds the token); removed when the cluster goes, if it is still this cluster's.
struct UrlFile {
  std::string url;
  explicit UrlFile(std::string u) : url(std::move(u)) {
    if (url.empty()) return;
    const mode_t old = ::umask(077);
    std::ofstream(dashboard_url_file()) << url << "\n";
    ::umask(old);
  }
  ~UrlFile() {
    std::ifstream f(dashboard_url_file());
    std::string now;
    if (!url.empty() && f >> now && now == url) fs::remove(dashboard_url_file());
  }
};

// A job file: submitted, followed to its end (cancelled on Ctrl-C). The exit code.
int run_job_file(const UpArgs& a, const std::string& head_addr) {
  try {
    JobSpec spec = read_job(a.command[0], a.sets, "", "");
    Client client(head_addr);
    JobHandle job = client.submit(spec);
    std::cout << "submitted " << a.command[0] << " as job " << job.id() << std::endl;
    auto end = follow(job, true);
    if (!end) {
      std::cout << "interrupted: cancelling job " << job.id() << std::endl;
      job.cancel();
      return 130;
    }
    return end->state == loco::JobState::succeeded ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "loco up: " << e.what() << "\n";
    return 1;
  }
}

// A command, with $LOCO_ADDRESS set to the cluster's head. Its exit code.
int run_command(const std::vector<std::string>& command, const std::string& head_addr) {
  Subprocess::Options o;
  o.env["LOCO_ADDRESS"] = head_addr;
  Subprocess cmd(command, o);
  while (!cmd.wait(std::chrono::milliseconds(100))) {
    if (stop_requested()) {
      cmd.stop(std::chrono::seconds(5));
      break;
    }
  }
  return cmd.exit_code().value_or(1);
}

int up(const UpArgs& a) {
  install_signal_handlers();
  ensure_cluster_key();
  UpCluster cluster(a);
  const std::string redis_url = cluster.start_redis();
  // The head retries Redis for a few seconds while a fresh redis-server starts.
  ::setenv("LOCO_REDIS", redis_url.c_str(), 1);
  if (!cluster.start_head()) {
    std::cerr << "loco up: the head did not start; see " << cluster.dir() << "/head.log\n";
    return 1;
  }
  cluster.start_nodes();
  try {
    cluster.wait_joined();
  } catch (const std::exception& e) {
    std::cerr << "loco up: " << e.what() << "\n";
    return 1;
  }
  std::cout << "cluster up: head " << cluster.head_address() << ", " << a.workers
            << " nodes, redis " << membership::redact_url(redis_url) << " (logs in "
            << cluster.dir() << ")" << std::endl;
  UrlFile url_file(cluster.dashboard_url());
  if (!cluster.dashboard_url().empty())
    std::cout << "dashboard at " << cluster.dashboard_url() << std::endl;
  int rc = 0;
  const bool job_file = a.command.size() == 1 && a.command[0].size() > 5 &&
                        (a.command[0].ends_with(".yaml") || a.command[0].ends_with(".yml"));
  if (job_file) {
    rc = run_job_file(a, cluster.head_address());
  } else if (!a.command.empty()) {
    rc = run_command(a.command, cluster.head_address());
  } else {
    std::cout << "press Ctrl-C to stop it" << std::endl;
    while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cout << "stopping the cluster" << std::endl;
  cluster.teardown();
  return rc;
}

}  // namespace

void add_up_command(CLI::App& app, Commands& out) {
  auto ua = std::make_shared<UpArgs>();
  auto* cmd = app.add_subcommand("up", "a whole local cluster: redis, head and N nodes");
  cmd->add_option("--workers", ua->workers, "number of worker nodes")->check(CLI::Range(0, 256));
  cmd->add_option("--redis", ua->redis, "use this Redis instead of starting one");
  cmd->add_option("--port", ua->port, "head port (default: any free)");
  cmd->add_option("--resources", ua->resources, "resources of each node");
  cmd->add_option("--detect-ms", ua->detect_ms, "failure detection time in ms");
  cmd->add_option("--data-root", ua->data_root,
                  "the folder jobs' data.dir must be in (default: the working directory)");
  cmd->add_option("--checkpoint-root", ua->checkpoint_root,
                  "the folder jobs' checkpoint.dir must be in (default: the working directory)");
  cmd->add_flag("--allow-code-models", ua->allow_code_models,
                "the nodes run jobs' TorchScript modules (loco start --allow-code-models)");
  cmd->add_option("--dashboard-port", ua->dashboard_port,
                  "the head's dashboard port (default 0: any free; -1: no dashboard)")
      ->check(CLI::Range(-1, 65535));
  // One value a --set (repeatable): else the job file after it would be taken as one more.
  cmd->add_option("--set", ua->sets,
                  "PATH=VALUE: set a field of the job file, e.g. --set rounds=4 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option(
         "command", ua->command,
         "a job file to run, or a command to run with LOCO_ADDRESS set; then stop the cluster")
      ->allow_extra_args();
  cmd->positionals_at_end();
  out.push_back({cmd, [ua] { return up(*ua); }});
}

}  // namespace loco::cli
