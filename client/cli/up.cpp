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
    security::write_key_file(path, security::generate_key_pair());
    std::cout << "made a cluster key at " << path << std::endl;
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

int up(const UpArgs& a) {
  install_signal_handlers();
  ensure_cluster_key();
  std::string dir = state_dir() + "/up-" + std::to_string(::getpid());
  fs::create_directories(dir);
  std::string bin = executable_dir() + "/loco";
  std::vector<Subprocess> procs;
  std::optional<Subprocess> redis;
  auto teardown = [&] {
    for (auto it = procs.rbegin(); it != procs.rend(); ++it) it->stop(std::chrono::seconds(10));
    if (redis) redis->stop(std::chrono::seconds(5));
  };
  std::string redis_url = a.redis;
  if (redis_url.empty()) {
    // On loopback only, with a password; the password is in a file only we can read, never
    // on a command line (ps shows those).
    int port = free_tcp_port();
    const std::string password = random_password(), conf = dir + "/redis.conf";
    {
      mode_t old = ::umask(077);
      std::ofstream(conf) << "requirepass " << password << "\n";
      ::umask(old);
    }
    Subprocess::Options o;
    o.log_path = dir + "/redis.log";
    redis.emplace(
        std::vector<std::string>{"redis-server", conf, "--port", std::to_string(port), "--bind",
                                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir},
        o);
    redis_url = "redis://:" + password + "@127.0.0.1:" + std::to_string(port);
  }
  // The head gets the URL through its environment: argv would show the password in ps.
  ::setenv("LOCO_REDIS", redis_url.c_str(), 1);
  int head_port = a.port ? a.port : free_tcp_port();
  std::string head_addr = "127.0.0.1:" + std::to_string(head_port);
  std::string detect = "--detect-ms=" + std::to_string(a.detect_ms);
  // The head retries Redis for a few seconds while a fresh redis-server starts.
  auto start = [&](std::vector<std::string> argv, const std::string& log) {
    Subprocess::Options o;
    o.log_path = dir + "/" + log;
    procs.emplace_back(std::move(argv), o);
  };
  // The head serves the dashboard on loopback, with a token in a file only we can read
  // (none on an --insecure cluster, as for the cluster's own sockets).
  std::vector<std::string> dashboard_args;
  std::string dashboard_url;
  if (a.dashboard_port >= 0) {
    const int port = a.dashboard_port ? a.dashboard_port : free_tcp_port();
    dashboard_args = {"--dashboard-port=" + std::to_string(port), "--dashboard-host=127.0.0.1"};
    dashboard_url = "http://127.0.0.1:" + std::to_string(port) + "/";
    const char* insecure = std::getenv("LOCO_INSECURE");
    if (!(insecure && std::string(insecure) == "1")) {
      const std::string token_file = dir + "/dashboard.token";
      dashboard_url += "#token=" + dashboard::load_or_make_token(token_file);
      dashboard_args.push_back("--dashboard-token-file=" + token_file);
    }
  }
  bool head_up = false;
  for (int attempt = 0; attempt < 50 && !head_up && !stop_requested(); ++attempt) {
    std::vector<std::string> head_argv = {bin,
                                          "start",
                                          "--head",
                                          "--block",
                                          "--host=127.0.0.1",
                                          "--port=" + std::to_string(head_port),
                                          detect};
    head_argv.insert(head_argv.end(), dashboard_args.begin(), dashboard_args.end());
    start(head_argv, "head.log");
    // The head exits at once when Redis does not answer yet: retry briefly.
    if (procs.back().wait(std::chrono::milliseconds(300))) {
      procs.pop_back();
      continue;
    }
    head_up = true;
  }
  if (!head_up) {
    std::cerr << "loco up: the head did not start; see " << dir << "/head.log\n";
    teardown();
    return 1;
  }
  for (int i = 0; i < a.workers; ++i) {
    std::vector<std::string> argv = {
        bin, "start", "--block", "--host=127.0.0.1", "--address=" + head_addr, detect};
    if (!a.resources.empty()) argv.push_back("--resources=" + a.resources);
    if (!a.data_root.empty()) argv.push_back("--data-root=" + a.data_root);
    if (!a.checkpoint_root.empty()) argv.push_back("--checkpoint-root=" + a.checkpoint_root);
    if (a.allow_code_models) argv.push_back("--allow-code-models");
    start(argv, "node-" + std::to_string(i) + ".log");
  }
  // Wait until every node has joined.
  try {
    Runtime rt = Runtime::connect(head_addr);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (true) {
      int alive = 0;
      for (auto& n : rt.status().nodes) alive += n.node.state == loco::NodeState::alive;
      if (alive >= a.workers) break;
      for (auto& p : procs)
        if (!p.running()) throw ClusterError("a cluster process exited early; logs in " + dir);
      if (std::chrono::steady_clock::now() > deadline || stop_requested())
        throw ClusterError("nodes did not join within 60 s; logs in " + dir);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    std::cerr << "loco up: " << e.what() << "\n";
    teardown();
    return 1;
  }
  std::cout << "cluster up: head " << head_addr << ", " << a.workers << " nodes, redis "
            << membership::redact_url(redis_url) << " (logs in " << dir << ")" << std::endl;
  // For `loco dashboard` to print while this cluster runs (0600: the URL holds the token).
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
  } url_file(dashboard_url);
  if (!dashboard_url.empty()) std::cout << "dashboard at " << dashboard_url << std::endl;
  int rc = 0;
  auto is_job_file = [](const std::string& f) {
    return f.size() > 5 && (f.ends_with(".yaml") || f.ends_with(".yml"));
  };
  if (a.command.size() == 1 && is_job_file(a.command[0])) {
    // A job file: submit it, follow it to its end, then stop the cluster.
    try {
      JobSpec spec = read_job(a.command[0], a.sets, "", "");
      Client client(head_addr);
      JobHandle job = client.submit(spec);
      std::cout << "submitted " << a.command[0] << " as job " << job.id() << std::endl;
      auto end = follow(job, true);
      if (!end) {
        std::cout << "interrupted: cancelling job " << job.id() << std::endl;
        job.cancel();
        rc = 130;
      } else {
        rc = end->state == loco::JobState::succeeded ? 0 : 1;
      }
    } catch (const std::exception& e) {
      std::cerr << "loco up: " << e.what() << "\n";
      rc = 1;
    }
  } else if (!a.command.empty()) {
    Subprocess::Options o;
    o.env["LOCO_ADDRESS"] = head_addr;
    Subprocess cmd(a.command, o);
    while (!cmd.wait(std::chrono::milliseconds(100))) {
      if (stop_requested()) {
        cmd.stop(std::chrono::seconds(5));
        break;
      }
    }
    rc = cmd.exit_code().value_or(1);
  } else {
    std::cout << "press Ctrl-C to stop it" << std::endl;
    while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cout << "stopping the cluster" << std::endl;
  teardown();
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
