// loco start, loco stop: the head and nodes of this machine.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "client/cli/dashboard.hpp"
#include "client/process.hpp"
#include "runtime/core/server.hpp"
#include "runtime/security/keys.hpp"

namespace fs = std::filesystem;

namespace loco::cli {
namespace {

// The plugins beside the binary: build/plugins in the tree, lib/loco/plugins installed
// (cmake/install.cmake, the wheel). Empty when neither is there.
std::string default_plugin_dir() {
  for (const char* rel : {"/../plugins", "/../lib/loco/plugins"})
    if (fs::is_directory(executable_dir() + rel)) return executable_dir() + rel;
  return "";
}

// ---- loco start ---------------------------------------------------------------

struct StartArgs {
  bool head = false;
  int port = -1;
  std::string host = "0.0.0.0";
  std::string advertise;
  bool no_listen = false;
  bool allow_code_models = false;
  std::string redis;
  std::string address;
  std::string resources;
  std::vector<std::string> plugins;
  int64_t detect_ms = 2000;
  int64_t tick_ms = 100;
  double retention_s = 600;
  double job_retention_s = 3600;
  int max_jobs_per_key = 16;
  int max_submissions_per_minute = 30;
  int max_job_workers = 1024;
  std::vector<std::string> job_entry_classes;
  std::string spawnable;
  double stop_grace_s = 30;
  double kill_grace_s = 60;
  size_t max_connections_per_source = 256;
  size_t max_message_bytes = size_t(1) << 30;
  std::string data_root, checkpoint_root;
  bool block = false;
  std::string ready_file;  // internal: written once serving
  // The head's dashboard: -1 none.
  int dashboard_port = -1;
  std::string dashboard_host = "127.0.0.1";
  std::string dashboard_token_file;
  std::string relay, relay_public_key;
};

int start_blocking(const StartArgs& a) {
  install_signal_handlers();
  // What a head or a node writes (checkpoints, metrics, token caches, logs, state) is its
  // operator's alone: files 0600, folders 0700. One user's job cannot read another's through
  // the file system (issue "21 ·": checkpoints were 0644 in 0755 folders).
  ::umask(077);
  raise_open_file_limit(a.head ? "loco start --head" : "loco start");
  // The head's dashboard listens before the head serves (a port in use fails the start) and
  // reads the head through a client connection of its own, made at its first request.
  std::unique_ptr<dashboard::Server> dash;
  if (a.head && a.dashboard_port >= 0) {
    const std::string host = a.host == "0.0.0.0" ? "127.0.0.1" : a.host;
    dash = make_dashboard(host + ":" + std::to_string(a.port < 0 ? 7070 : a.port), a.dashboard_host,
                          a.dashboard_port, a.dashboard_token_file);
    try {
      dash->start();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return 1;
    }
  }
  auto ready = [&](const std::string& addr) {
    if (a.ready_file.empty()) return;
    std::string tmp = a.ready_file + ".tmp";
    {
      // The second line, the dashboard's URL, holds its token: only we may read the file.
      const mode_t old = ::umask(077);
      std::ofstream f(tmp);
      f << addr << "\n";
      if (dash) f << dash->url() << "\n";
      ::umask(old);
    }
    fs::rename(tmp, a.ready_file);
  };
  std::string advertise = a.advertise;
  if (advertise.empty() && a.host != "0.0.0.0") advertise = a.host;
  if (advertise.empty()) advertise = "127.0.0.1";
  if (a.head) {
    HeadConfig cfg;
    cfg.bind = "tcp://" + a.host + ":" + std::to_string(a.port < 0 ? 7070 : a.port);
    cfg.advertise = advertise;
    cfg.redis_url = a.redis;
    cfg.detect_ms = a.detect_ms;
    cfg.tick_ms = a.tick_ms;
    cfg.retention_ms = int64_t(a.retention_s * 1000);
    cfg.job_retention_ms = int64_t(a.job_retention_s * 1000);
    cfg.max_jobs_per_key = a.max_jobs_per_key;
    cfg.max_submissions_per_minute = a.max_submissions_per_minute;
    cfg.max_job_workers = a.max_job_workers;
    if (!a.job_entry_classes.empty()) cfg.job_entry_classes = a.job_entry_classes;
    cfg.max_message_bytes = a.max_message_bytes;
    cfg.max_connections_per_source = a.max_connections_per_source;
    cfg.security = security::resolve("", false);
    if (!a.relay.empty() && !a.relay.starts_with("tcp://")) {
      spdlog::error("--relay: expected tcp://HOST:PORT, got '{}'", a.relay);
      return 2;
    }
    if (!a.relay.empty() && cfg.security.curve && a.relay_public_key.size() != 40) {
      spdlog::error("--relay-public-key: the relay's CURVE public key (40 Z85 characters, "
                    "printed by `loco relay`) is needed with --relay, got {} characters",
                    a.relay_public_key.size());
      return 2;
    }
    cfg.relay = RelayInfo{a.relay, a.relay_public_key};
    return run_head(cfg, stop_requested(), ready);
  }
  // Users' code (a job's model.torchscript) runs here only by the operator's consent: the
  // DiLoCo actors read it from the node's environment, which this flag alone sets (one the
  // node's shell passed on does not count). docs/security.md, "Code models".
  if (a.allow_code_models)
    ::setenv("LOCO_ALLOW_CODE_MODELS", "1", 1);
  else
    ::unsetenv("LOCO_ALLOW_CODE_MODELS");
  NodeConfig cfg;
  cfg.head_address = head_address(a.address);
  cfg.bind = "tcp://" + a.host + ":" + std::to_string(a.port < 0 ? 0 : a.port);
  cfg.advertise = advertise;
  cfg.listen = !a.no_listen;
  try {
    cfg.resources = parse_resources(a.resources);
  } catch (const std::exception& e) {
    spdlog::error("--resources: {}", e.what());
    return 2;
  }
  {
    std::stringstream ss(a.spawnable);
    for (std::string part; std::getline(ss, part, ',');)
      if (!part.empty()) cfg.spawnable.push_back(part);
  }
  cfg.plugins = a.plugins;
  // $LOCO_PLUGIN_PATH (colon-separated files or folders) replaces the default
  // folder next to the binary; --plugin adds to either.
  if (const char* p = std::getenv("LOCO_PLUGIN_PATH")) {
    std::stringstream ss(p);
    for (std::string part; std::getline(ss, part, ':');)
      if (!part.empty()) cfg.plugins.push_back(part);
  } else if (std::string dir = default_plugin_dir(); !dir.empty()) {
    cfg.plugins.push_back(dir);
  }
  cfg.max_message_bytes = a.max_message_bytes;
  cfg.stop_grace_ms = int64_t(a.stop_grace_s * 1000);
  cfg.kill_grace_ms = int64_t(a.kill_grace_s * 1000);
  cfg.max_connections_per_source = a.max_connections_per_source;
  cfg.data_root = a.data_root;
  cfg.checkpoint_root = a.checkpoint_root;
  cfg.security = security::resolve("", false);
  return run_node(cfg, stop_requested(), ready);
}

// Runs `loco start ... --block` detached, waits until it serves, records its pid.
int start_daemon(const StartArgs& a, const std::vector<std::string>& raw_args) {
  std::string dir = state_dir();
  fs::create_directories(dir + "/pids");
  fs::create_directories(dir + "/logs");
  std::string tag = (a.head ? "head-" : "node-") + std::to_string(::time(nullptr)) + "-" +
                    std::to_string(::getpid());
  std::string log = dir + "/logs/" + tag + ".log";
  std::string ready = dir + "/" + tag + ".ready";
  std::vector<std::string> argv = {executable_dir() + "/loco", "start"};
  argv.insert(argv.end(), raw_args.begin(), raw_args.end());
  argv.push_back("--block");
  argv.push_back("--ready-file=" + ready);
  Subprocess::Options opts;
  opts.log_path = log;
  opts.die_with_parent = false;
  opts.new_session = true;
  Subprocess child(argv, opts);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (!fs::exists(ready)) {
    if (!child.running() || std::chrono::steady_clock::now() > deadline) {
      std::cerr << "loco start: the " << (a.head ? "head" : "node") << " did not come up; log "
                << log << ":\n";
      std::ifstream f(log);
      std::cerr << f.rdbuf();
      if (child.running()) child.kill();
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string addr, dashboard_url;
  {
    std::ifstream f(ready);
    f >> addr >> dashboard_url;
  }
  fs::remove(ready);
  if (!dashboard_url.empty()) {
    const mode_t old = ::umask(077);
    std::ofstream(dashboard_url_file()) << dashboard_url << "\n";
    ::umask(old);
  }
  std::ofstream(dir + "/pids/" + std::to_string(child.pid()))
      << (a.head ? "head " : "node ") << addr << "\n";
  if (a.head) std::ofstream(dir + "/head_address") << addr << "\n";
  std::cout << (a.head ? "head" : "node") << " serving at " << addr << " (pid " << child.pid()
            << ", log " << log << ")\n";
  if (a.head) std::cout << "join more nodes with: loco start --address " << addr << "\n";
  if (!dashboard_url.empty()) std::cout << "dashboard at " << dashboard_url << "\n";
  child.release();  // leave it running
  return 0;
}

// ---- loco stop ----------------------------------------------------------------

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

int stop_local(int grace_ms) {
  std::string dir = state_dir() + "/pids";
  if (!fs::is_directory(dir)) {
    std::cout << "no loco processes started from this machine\n";
    return 0;
  }
  std::vector<pid_t> pids;
  for (auto& e : fs::directory_iterator(dir)) {
    pid_t pid = std::atoi(e.path().filename().c_str());
    if (pid > 0 && alive(pid)) {
      ::kill(pid, SIGTERM);
      pids.push_back(pid);
    } else {
      fs::remove(e.path());
    }
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  for (pid_t pid : pids) {
    while (alive(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bool forced = alive(pid);
    if (forced) ::kill(pid, SIGKILL);
    std::cout << "stopped pid " << pid << (forced ? " (killed after grace period)" : "") << "\n";
    fs::remove(dir + "/" + std::to_string(pid));
  }
  if (pids.empty()) std::cout << "no loco processes were running\n";
  fs::remove(dashboard_url_file());
  return 0;
}

}  // namespace

void add_daemon_commands(CLI::App& app, Commands& out, const std::vector<std::string>& args) {
  auto sa = std::make_shared<StartArgs>();
  auto* start = app.add_subcommand("start", "start a head or a node on this machine");
  start->add_flag("--head", sa->head, "start the head (scheduler and job table)");
  start->add_option("--port", sa->port, "port to serve at (head default 7070, node: any free)");
  start->add_option("--host", sa->host, "interface to bind (default 0.0.0.0)");
  start->add_option("--advertise", sa->advertise,
                    "host name or IP others reach this process at (a node: HOST:PORT when a NAT "
                    "forwards another port to it)");
  start->add_option("--relay", sa->relay,
                    "head: tcp://HOST:PORT of a `loco relay` through which workers on two nodes "
                    "behind NAT exchange (handed to every node)");
  start->add_option("--relay-public-key", sa->relay_public_key,
                    "head: that relay's public key (Z85, as `loco relay` prints it)");
  start->add_flag("--allow-code-models", sa->allow_code_models,
                  "node: run the TorchScript modules jobs name (model.torchscript): they are "
                  "code, run as this node's user; off by default (docs/security.md)");
  start->add_flag("--no-listen", sa->no_listen,
                  "node: bind no port; reached only over its own connection to the head, which "
                  "forwards the calls to its actors (for a host behind NAT)");
  start
      ->add_option("--redis", sa->redis,
                   "Redis for the head: redis://HOST:PORT, redis://:PASSWORD@HOST:PORT (or "
                   "$LOCO_REDIS, which keeps the password out of ps)")
      ->envname("LOCO_REDIS");
  start->add_option("--address", sa->address, "head to join, HOST:PORT");
  start->add_option("--resources", sa->resources, "node resources, e.g. cpu=2,gpu=0,ssd=1");
  start->add_option("--plugin", sa->plugins, "shared library (or folder) of actor classes");
  start->add_option("--spawnable", sa->spawnable,
                    "node: actor classes clients may spawn here, comma-separated; a name or a "
                    "prefix ending in * (default none: clients only submit jobs)");
  start
      ->add_option("--job-retention-s", sa->job_retention_s,
                   "head: remove a finished job's record and log from Redis this long after it "
                   "ended (default 3600; its folder keeps them)")
      ->check(CLI::Range(0.0, 1e9));
  start
      ->add_option("--max-jobs-per-key", sa->max_jobs_per_key,
                   "head: jobs one key may have running at once (default 16)")
      ->check(CLI::Range(1, 1000000));
  start
      ->add_option("--max-submissions-per-minute", sa->max_submissions_per_minute,
                   "head: submissions one key may make in any minute (default 30)")
      ->check(CLI::Range(1, 1000000));
  start
      ->add_option("--max-job-workers", sa->max_job_workers,
                   "head: the most workers `loco scale` may ask of a job (default 1024)")
      ->check(CLI::Range(1, 1000000));
  start->add_option("--job-entry", sa->job_entry_classes,
                    "head: an entry class clients may submit jobs of (repeatable; default "
                    "diloco.OuterAggregator)");
  start
      ->add_option(
          "--detect-ms", sa->detect_ms,
          "failure detection time in ms (default 2000; set on the head, nodes take it from there)")
      ->check(CLI::Range(100, 600000));
  start
      ->add_option("--tick-ms", sa->tick_ms,
                   "head: how often it reads heartbeats and restarts or places actors, in ms "
                   "(default 100)")
      ->check(CLI::Range(10, 60000));
  start
      ->add_option("--retention-s", sa->retention_s,
                   "head: forget dead actors and dead or departed nodes this long after they "
                   "died (default 600)")
      ->check(CLI::Range(0.1, 1e9));
  start
      ->add_option("--stop-grace", sa->stop_grace_s,
                   "node: on SIGTERM, how long its actors' methods in progress may take to end "
                   "before the node leaves without them (seconds, default 30; a second signal "
                   "ends it at once)")
      ->check(CLI::Range(0.0, 86400.0));
  start
      ->add_option("--kill-grace", sa->kill_grace_s,
                   "node: an actor killed (its job cancelled) still in a method this long after "
                   "(one that ignores its stop hook: a user's model that spins) ends the node, "
                   "which exits with code 3 for its supervisor to start it again (seconds, "
                   "default 60; 0: never)")
      ->check(CLI::Range(0.0, 86400.0));
  start->add_option("--max-message-bytes", sa->max_message_bytes, "largest message accepted");
  start->add_option("--max-connections-per-source", sa->max_connections_per_source,
                    "connections one address may hold to this process's port; past it a new "
                    "one is closed at once (default 256; 0: no bound)");
  start->add_option("--data-root", sa->data_root,
                    "node: the folder jobs' data.dir must be in (default: the working directory)");
  start->add_option("--checkpoint-root", sa->checkpoint_root,
                    "node: the folder jobs' checkpoint.dir must be in (default: the working "
                    "directory)");
  start
      ->add_option("--dashboard-port", sa->dashboard_port,
                   "head: serve the dashboard at this port (0: any free; default: none)")
      ->check(CLI::Range(-1, 65535));
  start->add_option("--dashboard-host", sa->dashboard_host,
                    "head: interface the dashboard listens at (default 127.0.0.1)");
  start->add_option("--dashboard-token-file", sa->dashboard_token_file,
                    "head: the dashboard's read-only token, made there if missing (default: a "
                    "new one, printed in its URL)");
  start->add_flag("--block", sa->block, "stay in the foreground");
  start->add_option("--ready-file", sa->ready_file)->group("");
  out.push_back({start, [sa, args] {
                   if (sa->head && sa->redis.empty()) {
                     std::cerr << "loco start --head: --redis redis://HOST:PORT is required\n";
                     return 2;
                   }
                   // No key and no --insecure: refuse here, before a daemon starts.
                   (void)security::resolve("", false);
                   if (sa->block) return start_blocking(*sa);
                   // What follows "start": the daemon gets the same options.
                   std::vector<std::string> raw(args.begin() + 1, args.end());
                   return start_daemon(*sa, raw);
                 }});

  auto grace_ms = std::make_shared<int>(10000);
  auto* stop = app.add_subcommand("stop", "stop the loco processes started on this machine");
  stop->add_option("--grace-ms", *grace_ms, "wait this long before SIGKILL");
  out.push_back({stop, [grace_ms] { return stop_local(*grace_ms); }});
}

}  // namespace loco::cli
