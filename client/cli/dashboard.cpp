// loco dashboard: the URL of the dashboard this machine's head serves, or a dashboard served
// from here for any head this process can reach.
#include "client/cli/dashboard.hpp"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"

namespace loco::cli {

std::unique_ptr<dashboard::Server> make_dashboard(const std::string& head_address,
                                                  const std::string& host, int port,
                                                  const std::string& token_file) {
  dashboard::Options o;
  o.head_address = head_address;
  o.host = host;
  o.port = port;
  o.chart_js_path = dashboard::default_chart_js_path();
  const char* insecure = std::getenv("LOCO_INSECURE");
  if (!token_file.empty())
    o.token = dashboard::load_or_make_token(token_file);
  else if (!(insecure && std::string(insecure) == "1"))
    o.token = dashboard::random_token();
  if (!dashboard::is_loopback_bind(host))
    std::cerr << "warning: the dashboard listens at " << host
              << ", beyond this machine, over plain HTTP: its token crosses the network in "
                 "clear (docs/security.md: prefer an SSH tunnel)"
              << std::endl;
  return std::make_unique<dashboard::Server>(o);
}

std::string dashboard_url_file() { return state_dir() + "/dashboard_url"; }

namespace {

struct DashboardArgs {
  std::string address, host = "127.0.0.1", token_file;
  int port = 8265;
  bool serve = false;
};

int run_dashboard(const DashboardArgs& a) {
  if (!a.serve && a.address.empty()) {
    std::ifstream f(dashboard_url_file());
    std::string url;
    if (f >> url) {
      std::cout << "dashboard (served by the head this machine started): " << url << std::endl;
      return 0;
    }
  }
  install_signal_handlers();
  auto server = make_dashboard(head_address(a.address), a.host, a.port, a.token_file);
  server->start();
  std::cout << "dashboard at " << server->url() << " (head " << head_address(a.address)
            << "; Ctrl-C stops it)" << std::endl;
  while (!stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server->stop();
  return 0;
}

}  // namespace

void add_dashboard_command(CLI::App& app, Commands& out) {
  auto a = std::make_shared<DashboardArgs>();
  auto* cmd = app.add_subcommand(
      "dashboard",
      "print the URL of the dashboard this machine's head serves, or serve one (--serve)");
  cmd->add_option("--address", a->address, "head HOST:PORT (implies --serve)");
  cmd->add_flag("--serve", a->serve, "serve a dashboard from this process until Ctrl-C");
  cmd->add_option("--host", a->host,
                  "interface to listen at (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", a->port, "port to listen at (default 8265; 0: any free)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--token-file", a->token_file,
                  "read-only token for the API and /metrics, made there if missing (default: a "
                  "new random one, printed in the URL)");
  out.push_back({cmd, [a] { return run_dashboard(*a); }});
}

}  // namespace loco::cli
