#include "client/cli/common.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

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
void on_signal(int) { g_stop.store(true); }
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

}  // namespace loco::cli
