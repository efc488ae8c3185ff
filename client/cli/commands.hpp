#pragma once
// The `loco` subcommands by family. Each add_* function adds its subcommands
// to the app, with what each runs once the command line is parsed; main.cpp
// runs the one that was given.
#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace loco::cli {

// A subcommand and its action, which returns the process's exit status.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

// start, stop: the head and nodes of this machine. `args`: the command line
// after the program name ("start --head ..."), which `start` passes on to the
// daemon it leaves running.
void add_daemon_commands(CLI::App& app, Commands& out, const std::vector<std::string>& args);
// keygen: a new cluster key file (CURVE key pair).
void add_keygen_command(CLI::App& app, Commands& out);
// status: nodes, resources and actors.
void add_status_command(CLI::App& app, Commands& out);
// up: a whole local cluster, optionally running a job file or a command on it.
void add_up_command(CLI::App& app, Commands& out);
// submit, jobs, logs, cancel, scale.
void add_job_commands(CLI::App& app, Commands& out);
// dashboard: the web page, JSON API and Prometheus metrics of a cluster.
void add_dashboard_command(CLI::App& app, Commands& out);
// relay: forwards the collective's messages between members behind NAT.
void add_relay_command(CLI::App& app, Commands& out);
// plot: a job's loss curves and per-step figures as PNGs, outside the job's actors.
void add_plot_command(CLI::App& app, Commands& out);
// tokenize: a tokenizer.json tried on a text (ids), or ids decoded.
void add_tokenize_command(CLI::App& app, Commands& out);

// train, generate, export: loco-train's commands. main hands them over before parsing
// (they have options of their own); they are added here for --help.
void add_trainer_commands(CLI::App& app);
bool is_trainer_command(int argc, char** argv);
// Replaces this process with loco-train; returns only on failure.
int forward_to_trainer(int argc, char** argv);

}  // namespace loco::cli
