#pragma once
// Pieces shared by the `loco` subcommands.
#include <atomic>
#include <string>
#include <vector>

#include "client/client.hpp"

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

// The job that `loco submit` and `loco up` send: `file` with each --set applied (PATH=VALUE,
// diloco::with_overrides), and with `resume` (a checkpoint) as its checkpoint.resume. Without a
// file, the job.yaml beside the checkpoint that every job writes into its folder. A job for
// DiLoCo's aggregator (the default `entry`) is validated here as the aggregator would, so a
// bad field fails before anything is submitted. Throws std::invalid_argument naming the file
// and the field.
JobSpec read_job(std::string file, std::vector<std::string> sets, const std::string& resume,
                 const std::string& entry);

// SIGINT and SIGTERM set stop_requested() instead of ending the process;
// SIGPIPE is ignored. For the commands that run until stopped.
void install_signal_handlers();
// Raises this process's limit on open files to the hard limit (a head, a node or a relay
// holds a descriptor per connection), and says so in the log when that is still low.
void raise_open_file_limit(const std::string& who);
const std::atomic<bool>& stop_requested();

}  // namespace loco::cli
