// The `loco` command line: the subcommand families of client/cli/ on CLI11.
#include <CLI/CLI.hpp>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "runtime/core/errors.hpp"

int main(int argc, char** argv) {
  using namespace loco::cli;
  setup_logging();
  if (is_trainer_command(argc, argv)) return forward_to_trainer(argc, argv);

  CLI::App app{"loco: DiLoCo training on a small actor runtime"};
  app.require_subcommand(1);
  add_security_options(app);
  Commands commands;
  add_keygen_command(app, commands);
  add_daemon_commands(app, commands, std::vector<std::string>(argv + 1, argv + argc));
  add_status_command(app, commands);
  add_up_command(app, commands);
  add_job_commands(app, commands);
  add_dashboard_command(app, commands);
  add_plot_command(app, commands);
  add_relay_command(app, commands);
  add_tokenize_command(app, commands);
  add_trainer_commands(app);

  CLI11_PARSE(app, argc, argv);

  try {
    for (const Command& c : commands)
      if (*c.app) return c.run();
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
