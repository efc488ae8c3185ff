// The `loco` command line.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "client/cli_common.hpp"
#include "client/client.hpp"
#include "client/process.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/server.hpp"

namespace fs = std::filesystem;

namespace loco::cli {

std::string state_dir() {
  if (const char* d = std::getenv("LOCO_STATE_DIR")) return d;
  return "/tmp/loco-" + std::to_string(::getuid());
}

std::string head_address(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* a = std::getenv("LOCO_ADDRESS")) return a;
  std::ifstream f(state_dir() + "/head_address");
  std::string addr;
  if (f >> addr) return addr;
  return "127.0.0.1:7070";
}

void setup_logging() {
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  if (const char* lvl = std::getenv("LOCO_LOG_LEVEL"))
    spdlog::set_level(spdlog::level::from_str(lvl));
}

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::string default_plugin_dir() { return executable_dir() + "/../plugins"; }

// ---- loco start ---------------------------------------------------------------

struct StartArgs {
  bool head = false;
  int port = -1;
  std::string host = "0.0.0.0";
  std::string advertise;
  std::string redis;
  std::string address;
  std::string resources;
  std::vector<std::string> plugins;
  int64_t detect_ms = 2000;
  size_t max_message_bytes = size_t(1) << 30;
  bool block = false;
  std::string ready_file;  // internal: written once serving
};

int start_blocking(const StartArgs& a) {
  install_signal_handlers();
  auto ready = [&](const std::string& addr) {
    if (a.ready_file.empty()) return;
    std::string tmp = a.ready_file + ".tmp";
    std::ofstream(tmp) << addr << "\n";
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
    cfg.max_message_bytes = a.max_message_bytes;
    return run_head(cfg, g_stop, ready);
  }
  NodeConfig cfg;
  cfg.head_address = head_address(a.address);
  cfg.bind = "tcp://" + a.host + ":" + std::to_string(a.port < 0 ? 0 : a.port);
  cfg.advertise = advertise;
  try {
    cfg.resources = parse_resources(a.resources);
  } catch (const std::exception& e) {
    spdlog::error("--resources: {}", e.what());
    return 2;
  }
  cfg.plugins = a.plugins;
  // $LOCO_PLUGIN_PATH (colon-separated files or folders) replaces the default
  // folder next to the binary; --plugin adds to either.
  if (const char* p = std::getenv("LOCO_PLUGIN_PATH")) {
    std::stringstream ss(p);
    for (std::string part; std::getline(ss, part, ':');)
      if (!part.empty()) cfg.plugins.push_back(part);
  } else if (fs::is_directory(default_plugin_dir())) {
    cfg.plugins.push_back(default_plugin_dir());
  }
  cfg.max_message_bytes = a.max_message_bytes;
  return run_node(cfg, g_stop, ready);
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
  std::string addr;
  std::ifstream(ready) >> addr;
  fs::remove(ready);
  std::ofstream(dir + "/pids/" + std::to_string(child.pid()))
      << (a.head ? "head " : "node ") << addr << "\n";
  if (a.head) std::ofstream(dir + "/head_address") << addr << "\n";
  std::cout << (a.head ? "head" : "node") << " serving at " << addr << " (pid " << child.pid()
            << ", log " << log << ")\n";
  if (a.head) std::cout << "join more nodes with: loco start --address " << addr << "\n";
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
  return 0;
}

// ---- loco status --------------------------------------------------------------

void print_status(const ClusterStatus& st) {
  std::printf("head %s   redis %s\n\n", st.head_address.c_str(), st.redis_url.c_str());
  std::printf("%-20s %-22s %-6s %-28s %s\n", "NODE", "ADDRESS", "STATE", "RESOURCES (used/total)",
              "HOST");
  for (const NodeStatus& n : st.nodes) {
    std::string res;
    for (auto& [k, total] : n.node.resources) {
      double used = n.used.count(k) ? n.used.at(k) : 0;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s=%g/%g", res.empty() ? "" : ",", k.c_str(), used, total);
      res += buf;
    }
    std::printf("%-20s %-22s %-6s %-28s %s%s\n", n.node.id.c_str(), n.node.address.c_str(),
                n.node.state.c_str(), res.c_str(), n.node.hostname.c_str(),
                n.node.reason.empty() ? "" : ("  (" + n.node.reason + ")").c_str());
  }
  std::printf("\n%-20s %-16s %-14s %-20s %-10s %s\n", "ACTOR", "NAME", "CLASS", "NODE", "STATE",
              "RESTARTS");
  for (const ActorInfo& a : st.actors) {
    std::printf("%-20s %-16s %-14s %-20s %-10s %d/%d%s\n", a.id.c_str(),
                a.name.empty() ? "-" : a.name.c_str(), a.class_name.c_str(), a.node_id.c_str(),
                a.state.c_str(), a.restarts, a.max_restarts,
                a.reason.empty() ? "" : ("  " + a.reason).c_str());
  }
}

// ---- loco up ------------------------------------------------------------------

std::optional<JobInfo> follow(JobHandle& job, bool progress);

struct UpArgs {
  int workers = 2;
  std::string redis;
  int port = 0;
  std::string resources;
  int64_t detect_ms = 2000;
  std::vector<std::string> command;
};

int up(const UpArgs& a) {
  install_signal_handlers();
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
    int port = free_tcp_port();
    Subprocess::Options o;
    o.log_path = dir + "/redis.log";
    redis.emplace(
        std::vector<std::string>{"redis-server", "--port", std::to_string(port), "--bind",
                                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir},
        o);
    redis_url = "redis://127.0.0.1:" + std::to_string(port);
  }
  int head_port = a.port ? a.port : free_tcp_port();
  std::string head_addr = "127.0.0.1:" + std::to_string(head_port);
  std::string detect = "--detect-ms=" + std::to_string(a.detect_ms);
  // The head retries Redis for a few seconds while a fresh redis-server starts.
  auto start = [&](std::vector<std::string> argv, const std::string& log) {
    Subprocess::Options o;
    o.log_path = dir + "/" + log;
    procs.emplace_back(std::move(argv), o);
  };
  bool head_up = false;
  for (int attempt = 0; attempt < 50 && !head_up && !g_stop; ++attempt) {
    start({bin, "start", "--head", "--block", "--host=127.0.0.1",
           "--port=" + std::to_string(head_port), "--redis=" + redis_url, detect},
          "head.log");
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
    start(argv, "node-" + std::to_string(i) + ".log");
  }
  // Wait until every node has joined.
  try {
    Runtime rt = Runtime::connect(head_addr);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (true) {
      int alive = 0;
      for (auto& n : rt.status().nodes) alive += n.node.state == "alive";
      if (alive >= a.workers) break;
      for (auto& p : procs)
        if (!p.running()) throw ClusterError("a cluster process exited early; logs in " + dir);
      if (std::chrono::steady_clock::now() > deadline || g_stop)
        throw ClusterError("nodes did not join within 60 s; logs in " + dir);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    std::cerr << "loco up: " << e.what() << "\n";
    teardown();
    return 1;
  }
  std::cout << "cluster up: head " << head_addr << ", " << a.workers << " nodes, redis "
            << redis_url << " (logs in " << dir << ")" << std::endl;
  int rc = 0;
  auto is_job_file = [](const std::string& f) {
    return f.size() > 5 && (f.ends_with(".yaml") || f.ends_with(".yml"));
  };
  if (a.command.size() == 1 && is_job_file(a.command[0])) {
    // A job file: submit it, follow it to its end, then stop the cluster.
    try {
      JobSpec spec = JobSpec::from_yaml_file(a.command[0]);
      Client client(head_addr);
      JobHandle job = client.submit(spec);
      std::cout << "submitted " << a.command[0] << " as job " << job.id() << std::endl;
      auto end = follow(job, true);
      if (!end) {
        std::cout << "interrupted: cancelling job " << job.id() << std::endl;
        job.cancel();
        rc = 130;
      } else {
        rc = end->state == "succeeded" ? 0 : 1;
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
      if (g_stop) {
        cmd.stop(std::chrono::seconds(5));
        break;
      }
    }
    rc = cmd.exit_code().value_or(1);
  } else {
    std::cout << "press Ctrl-C to stop it" << std::endl;
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cout << "stopping the cluster" << std::endl;
  teardown();
  return rc;
}

// ---- loco submit / jobs / logs / cancel ----------------------------------------

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string progress_line(const RoundReport& r) {
  const int width = 20;
  int filled = r.rounds > 0 ? int(double(r.round) / r.rounds * width + 0.5) : 0;
  std::string bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  std::string extra;
  if (r.failed_attempts > 0)
    extra += "  " + std::to_string(r.failed_attempts) + " failed all-reduce attempt" +
             (r.failed_attempts > 1 ? "s" : "");
  if (r.redo > 0) extra += "  redone (" + std::to_string(r.redo) + ")";
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "%s round %d/%d  step %d  loss %.3f%s  %.1fk tok/s  sent %s/worker  util %.0f%%  workers "
      "%d%s",
      bar.c_str(), r.round, r.rounds, r.inner_step, r.loss,
      r.val_loss > 0 ? ("  val ppl " + std::to_string(r.val_ppl).substr(0, 6)).c_str() : "",
      r.tokens_per_s / 1000, human_bytes(r.bytes_per_worker).c_str(), r.utilization * 100,
      r.workers, extra.c_str());
  return buf;
}

// Follows a job: log lines as they come, reports as a live progress line on a
// terminal (one line per round otherwise). Returns the final record, or nullopt
// when interrupted.
std::optional<JobInfo> follow(JobHandle& job, bool progress) {
  bool tty = ::isatty(1);
  std::string cursor;
  Backoff idle(Millis(50), Millis(500));
  bool bar_shown = false;
  while (!g_stop) {
    JobEvents ev = job.poll(cursor);
    for (const JobEvent& e : ev.events) {
      if (e.kind == "report") {
        if (!progress) continue;
        auto p = msgpack::unpack(e.data.data(), e.data.size()).get().as<JobProgress>();
        std::string line = progress_line(RoundReport::from(p));
        if (tty) {
          std::printf("\r\033[K%s", line.c_str());
          bar_shown = true;
        } else {
          std::printf("%s\n", line.c_str());
        }
      } else {
        if (bar_shown) std::printf("\r\033[K");
        std::printf("%s\n", e.data.c_str());
        bar_shown = false;
      }
      std::fflush(stdout);
    }
    if (ev.events.empty()) {
      if (ev.job.finished()) {
        if (bar_shown) std::printf("\n");
        return ev.job;
      }
      std::this_thread::sleep_for(idle.next());
    } else {
      idle.reset();
    }
  }
  if (bar_shown) std::printf("\n");
  return std::nullopt;
}

int submit(const std::string& address, const std::string& file, bool detach,
           const std::string& entry) {
  install_signal_handlers();
  JobSpec spec = JobSpec::from_yaml_file(file);
  if (!entry.empty()) spec.entry_class = entry;
  Client client(head_address(address));
  JobHandle job = client.submit(spec);
  std::printf("submitted %s as job %s\n", file.c_str(), job.id().c_str());
  std::fflush(stdout);
  if (detach) return 0;
  auto end = follow(job, true);
  if (!end) {
    std::printf("stopped following; job %s keeps running (loco cancel %s stops it)\n",
                job.id().c_str(), job.id().c_str());
    return 130;
  }
  return end->state == "succeeded" ? 0 : 1;
}

void print_jobs(const std::vector<JobInfo>& jobs) {
  std::printf("%-18s %-20s %-10s %s\n", "JOB", "NAME", "STATE", "MESSAGE");
  for (const JobInfo& j : jobs)
    std::printf("%-18s %-20s %-10s %s\n", j.id.c_str(), j.name.c_str(), j.state.c_str(),
                j.message.c_str());
}

int forward_to_trainer(int argc, char** argv) {
  std::string trainer = executable_dir() + "/loco-train";
  if (::access(trainer.c_str(), X_OK) != 0) {
    std::cerr << "loco: " << argv[1] << " needs " << trainer
              << ", which this build does not have (build with LibTorch: scripts/setup)\n";
    return 2;
  }
  std::vector<char*> args{trainer.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(trainer.c_str(), args.data());
  std::perror("loco: exec loco-train");
  return 2;
}

}  // namespace
}  // namespace loco::cli

int main(int argc, char** argv) {
  using namespace loco::cli;
  setup_logging();
  if (argc > 1 && (std::string(argv[1]) == "train" || std::string(argv[1]) == "generate"))
    return forward_to_trainer(argc, argv);

  CLI::App app{"loco: DiLoCo training on a small actor runtime"};
  app.require_subcommand(1);

  StartArgs sa;
  auto* start = app.add_subcommand("start", "start a head or a node on this machine");
  start->add_flag("--head", sa.head, "start the head (scheduler and job table)");
  start->add_option("--port", sa.port, "port to serve at (head default 7070, node: any free)");
  start->add_option("--host", sa.host, "interface to bind (default 0.0.0.0)");
  start->add_option("--advertise", sa.advertise, "host name or IP others reach this process at");
  start->add_option("--redis", sa.redis, "Redis for the head: redis://HOST:PORT");
  start->add_option("--address", sa.address, "head to join, HOST:PORT");
  start->add_option("--resources", sa.resources, "node resources, e.g. cpu=2,gpu=0,ssd=1");
  start->add_option("--plugin", sa.plugins, "shared library (or folder) of actor classes");
  start
      ->add_option(
          "--detect-ms", sa.detect_ms,
          "failure detection time in ms (default 2000; set on the head, nodes take it from there)")
      ->check(CLI::Range(100, 600000));
  start->add_option("--max-message-bytes", sa.max_message_bytes, "largest message accepted");
  start->add_flag("--block", sa.block, "stay in the foreground");
  start->add_option("--ready-file", sa.ready_file)->group("");

  auto* stop = app.add_subcommand("stop", "stop the loco processes started on this machine");
  int grace_ms = 10000;
  stop->add_option("--grace-ms", grace_ms, "wait this long before SIGKILL");

  std::string status_addr;
  auto* status = app.add_subcommand("status", "nodes, resources and actors of a cluster");
  status->add_option("--address", status_addr, "head HOST:PORT");

  UpArgs ua;
  auto* up = app.add_subcommand("up", "a whole local cluster: redis, head and N nodes");
  up->add_option("--workers", ua.workers, "number of worker nodes")->check(CLI::Range(0, 256));
  up->add_option("--redis", ua.redis, "use this Redis instead of starting one");
  up->add_option("--port", ua.port, "head port (default: any free)");
  up->add_option("--resources", ua.resources, "resources of each node");
  up->add_option("--detect-ms", ua.detect_ms, "failure detection time in ms");
  up->add_option(
        "command", ua.command,
        "a job file to run, or a command to run with LOCO_ADDRESS set; then stop the cluster")
      ->allow_extra_args();
  up->positionals_at_end();

  std::string job_addr, job_file, job_id, job_entry;
  bool detach = false, follow_logs = false;
  auto* submit_cmd = app.add_subcommand("submit", "submit a job file and follow its progress");
  submit_cmd->add_option("file", job_file, "job file (YAML)")->required();
  submit_cmd->add_option("--address", job_addr, "head HOST:PORT");
  submit_cmd->add_flag("--detach", detach, "return once submitted");
  submit_cmd->add_option("--entry", job_entry,
                         "actor class that runs the job (default diloco.OuterAggregator)");
  auto* jobs_cmd = app.add_subcommand("jobs", "list the cluster's jobs");
  jobs_cmd->add_option("--address", job_addr, "head HOST:PORT");
  auto* logs_cmd = app.add_subcommand("logs", "print a job's log");
  logs_cmd->add_option("job", job_id, "job id")->required();
  logs_cmd->add_option("--address", job_addr, "head HOST:PORT");
  logs_cmd->add_flag("-f,--follow", follow_logs, "keep following until the job ends");
  auto* cancel_cmd = app.add_subcommand("cancel", "cancel a job");
  cancel_cmd->add_option("job", job_id, "job id")->required();
  cancel_cmd->add_option("--address", job_addr, "head HOST:PORT");

  int scale_workers = 0;
  auto* scale_cmd = app.add_subcommand("scale", "change the number of workers of a running job");
  scale_cmd->add_option("job", job_id, "job id")->required();
  scale_cmd->add_option("--workers", scale_workers, "workers from the next round on")
      ->required()
      ->check(CLI::PositiveNumber);
  scale_cmd->add_option("--address", job_addr, "head HOST:PORT");

  app.add_subcommand("train", "train a job in one process (see loco train --help)");
  app.add_subcommand("generate", "sample text from a checkpoint");

  CLI11_PARSE(app, argc, argv);

  try {
    if (*start) {
      if (sa.head && sa.redis.empty()) {
        std::cerr << "loco start --head: --redis redis://HOST:PORT is required\n";
        return 2;
      }
      if (sa.block) return start_blocking(sa);
      std::vector<std::string> raw(argv + 2, argv + argc);
      return start_daemon(sa, raw);
    }
    if (*stop) return stop_local(grace_ms);
    if (*status) {
      auto rt = loco::Runtime::connect(head_address(status_addr));
      print_status(rt.status());
      return 0;
    }
    if (*up) return loco::cli::up(ua);
    if (*submit_cmd) return submit(job_addr, job_file, detach, job_entry);
    if (*jobs_cmd) {
      loco::Client client(head_address(job_addr));
      print_jobs(client.jobs());
      return 0;
    }
    if (*logs_cmd) {
      loco::Client client(head_address(job_addr));
      loco::JobHandle job = client.job(job_id);
      if (follow_logs) {
        install_signal_handlers();
        auto end = follow(job, false);
        return end && end->state == "succeeded" ? 0 : 1;
      }
      std::string cursor;
      while (true) {
        auto ev = job.poll(cursor);
        for (auto& e : ev.events)
          if (e.kind != "report") std::printf("%s\n", e.data.c_str());
        if (ev.events.empty()) break;
      }
      return 0;
    }
    if (*scale_cmd) {
      loco::Client client(head_address(job_addr));
      loco::JobInfo j = client.job(job_id).scale(scale_workers);
      std::printf("job %s: %d workers requested; they join at the next round\n", j.id.c_str(),
                  j.scale);
      return 0;
    }
    if (*cancel_cmd) {
      loco::Client client(head_address(job_addr));
      loco::JobInfo j = client.job(job_id).cancel();
      std::printf("job %s %s\n", j.id.c_str(), j.state.c_str());
      return 0;
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "loco: " << e.what() << "\n";
    return 2;
  } catch (const loco::Error& e) {
    std::cerr << "loco: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "loco: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
