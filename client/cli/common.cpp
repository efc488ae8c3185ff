#include "client/cli/common.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <yaml-cpp/yaml.h>

#include "diloco/job/config.hpp"

namespace loco::cli {

std::string state_dir() {
  if (const char* d = std::getenv("LOCO_STATE_DIR")) return d;
  return "/tmp/loco-" + std::to_string(::getuid());
}

JobSpec read_job(std::string file, std::vector<std::string> sets, const std::string& resume,
                 const std::string& entry) {
  namespace fs = std::filesystem;
  if (!resume.empty()) {
    // Made absolute here where the file is here (a cluster on this machine, or a shared
    // folder); otherwise as given, and the aggregator's node resolves it under its root.
    std::error_code ec;
    const fs::path ckpt =
        fs::exists(resume, ec) ? fs::absolute(resume).lexically_normal() : fs::path(resume);
    if (file.empty()) {
      file = (ckpt.parent_path() / "job.yaml").string();
      if (!fs::exists(file, ec))
        throw std::invalid_argument("--resume " + resume + ": no job file given and no job.yaml beside the checkpoint (" + file + "); give the job file too");
    }
    YAML::Emitter quoted;
    quoted << YAML::DoubleQuoted << ckpt.string();
    sets.push_back(std::string("checkpoint.resume=") + quoted.c_str());
  }
  if (file.empty()) throw std::invalid_argument("give a job file (or --resume CKPT)");
  JobSpec spec = JobSpec::from_yaml_file(file);
  try {
    if (!sets.empty()) spec = JobSpec::from_yaml(diloco::with_overrides(spec.text, sets));
    if (entry.empty() || entry == JobSpec().entry_class)
      spec.max_workers = diloco::JobConfig::from_yaml(spec.text).workers.max;
  } catch (const diloco::ConfigError& e) {
    throw std::invalid_argument(file + ": " + e.what());
  }
  spec.path = file;
  if (!entry.empty()) spec.entry_class = entry;
  return spec;
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

void add_security_options(CLI::App& app) {
  app.add_option_function<std::string>(
         "--key",
         [](const std::string& path) {
           ::setenv("LOCO_KEY", std::filesystem::absolute(path).c_str(), 1);
         },
         "cluster key file (default $LOCO_KEY, else ~/.loco/cluster.key; `loco keygen` makes one)")
      ->type_name("FILE");
  app.add_flag_callback(
      "--insecure", [] { ::setenv("LOCO_INSECURE", "1", 1); },
      "plain TCP without CURVE: anyone who reaches the ports can join and call (tests only)");
  app.fallthrough();
}

namespace {
std::atomic<bool> g_stop{false};
// The first SIGINT or SIGTERM asks for a clean stop; a second one ends the process at once.
void on_signal(int) {
  if (g_stop.exchange(true)) ::_exit(130);
}
}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

const std::atomic<bool>& stop_requested() { return g_stop; }

void raise_open_file_limit(const std::string& who) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &lim);
    (void)::getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < 4096)
    spdlog::warn("{}: at most {} open files (ulimit -n): each connection holds one", who,
                 static_cast<unsigned long long>(lim.rlim_cur));
}

}  // namespace loco::cli
