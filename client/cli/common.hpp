#pragma once
// Pieces shared by the `loco` subcommands.
#include <atomic>
#include <string>

namespace CLI {
class App;
}

namespace loco::cli {

// Where `loco start` keeps pid files, logs and the last head address:
// $LOCO_STATE_DIR, else /tmp/loco-<uid>.
std::string state_dir();
// The head to talk to: the flag if given, else $LOCO_ADDRESS, else the head
// this machine started last, else 127.0.0.1:7070.
std::string head_address(const std::string& flag);
void setup_logging();

// --key FILE and --insecure, accepted before or after any subcommand. They set $LOCO_KEY and
// $LOCO_INSECURE, which security::resolve() reads: in this process (Runtime::connect, the
// head and node) and in the processes it starts (`loco start`'s daemon, `loco up`'s cluster).
void add_security_options(CLI::App& app);

// SIGINT and SIGTERM set stop_requested() instead of ending the process;
// SIGPIPE is ignored. For the commands that run until stopped.
void install_signal_handlers();
const std::atomic<bool>& stop_requested();

}  // namespace loco::cli
