#pragma once
// A real redis-server for tests, owned by one object.
//
//   loco::testing::RedisServer redis;                 // started and answering PING
//   auto store = make_redis_store(redis.url());        // "redis://127.0.0.1:PORT"
//   redis.kill();                                      // SIGKILL: "Redis lost while running"
//   redis.restart();                                   // same port, same dir
//
// Each server listens on 127.0.0.1 only, on a free port chosen at start (or
// the one given), and works in its own temporary directory (removed by the
// destructor unless Options::dir was given). By default it persists nothing
// (--save "" --appendonly no), so a restart after kill() or stop() starts
// empty; with Options::appendonly a graceful stop() + restart() keeps the data.
//
// The constructor (and start/restart) returns only once the server answers
// PING, or throws std::runtime_error with the tail of the server's log after
// Options::start_timeout. The destructor kills the server.
//
// The executable is Options::executable, else $LOCO_REDIS_SERVER, else
// redis-server on $PATH, else /usr/bin/redis-server.
//
// Not thread-safe: drive one RedisServer from one thread at a time. On Linux
// the server is also killed when the thread that started it ends (so that a
// test binary killed by a timeout leaves no server behind): start it from a
// thread that outlives its use, e.g. the test's main thread, or turn
// Options::kill_with_parent off.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "client/process.hpp"

namespace loco::testing {

// loco::free_tcp_port (client/process.hpp), for the tests in this namespace.
using ::loco::free_tcp_port;

class RedisServer {
 public:
  struct Options {
    int port = 0;                         // 0: pick a free port
    bool appendonly = false;              // --appendonly yes, files in dir
    std::string dir;                      // working dir; empty: a fresh temporary one
    std::string executable;               // empty: see above
    std::vector<std::string> extra_args;  // e.g. {"--maxmemory", "10mb"}
    std::chrono::milliseconds start_timeout{10000};
    std::chrono::milliseconds stop_timeout{5000};  // SIGTERM, then SIGKILL
    bool kill_with_parent = true;
  };

  RedisServer();
  explicit RedisServer(Options options);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string host() const { return "127.0.0.1"; }
  // "redis://127.0.0.1:PORT", or ".../DB" for db >= 0.
  std::string url(int db = -1) const;
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }  // -1 when not running
  bool running() const { return pid_ > 0; }
  // The server's log file (in dir()).
  std::string log_path() const;

  // Starts the server if it is not running, on port(), and waits until it answers.
  void start();
  // SIGTERM, waits up to stop_timeout for it to exit (Redis saves what it is
  // configured to save), then SIGKILL. No-op when not running.
  void stop();
  // SIGKILL and reap: the server vanishes as in a crash. No-op when not running.
  void kill();
  // stop() if running, then start() on the same port and dir.
  void restart();
  // SIGSTOP / SIGCONT: the server keeps its connections but answers nothing,
  // as a hung or partitioned server does (for timeout tests).
  void pause();
  void resume();

 private:
  void spawn();
  // Until it answers PING, exits, or start_timeout passes; `why` says which.
  bool wait_ready(std::string& why);
  bool reap(bool block);  // true once the child has exited
  std::string log_tail() const;

  Options options_;
  std::string executable_;
  std::string dir_;
  bool own_dir_ = false;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace loco::testing
