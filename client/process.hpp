#pragma once
// Child processes for `loco up` and for multi-process tests: started with
// argv and extra environment, optionally killed with their parent, stopped
// with a bounded wait.
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace loco {

class Subprocess {
 public:
  struct Options {
    std::map<std::string, std::string> env;  // added to (or replacing in) the parent's
    std::string log_path;                    // stdout+stderr go here; "" = inherit
    bool die_with_parent = true;             // SIGTERM when the parent exits
    bool new_session = false;                // setsid(): survive the terminal
    std::string cwd;                         // its working directory; "" = ours
  };

  Subprocess() = default;
  Subprocess(std::vector<std::string> argv, Options opts);
  ~Subprocess();  // kills a still running child
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Exit status once it exited (128+signal when killed by one).
  std::optional<int> exit_code();
  // Waits at most `timeout` for it to exit; the exit code, or nullopt.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  void signal(int sig);
  void kill();  // SIGKILL and reap
  // Forgets the child without stopping it (a daemon that outlives us).
  void release() { pid_ = -1; }
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit code.
  int stop(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

 private:
  bool reap(bool block);
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// A TCP port on 127.0.0.1 that was free when asked (the kernel picks it).
// Another process may take it before it is bound; callers that can retry should.
int free_tcp_port();

// The directory of the running executable ("/work/main/build/bin").
std::string executable_dir();

}  // namespace loco
