#include "tests/support/redis_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "tests/support/eventually.hpp"

namespace loco::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Polling interval while waiting for the server to start or exit.
constexpr auto kPoll = 5ms;

std::system_error sys_error(const std::string& what) {
  return std::system_error(errno, std::generic_category(), what);
}

std::string find_executable(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("LOCO_REDIS_SERVER"); env && *env) return env;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (dir.empty()) continue;
      const std::string candidate = dir + "/redis-server";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  if (::access("/usr/bin/redis-server", X_OK) == 0) return "/usr/bin/redis-server";
  throw std::runtime_error(
      "RedisServer: redis-server not found on PATH nor at /usr/bin/redis-server "
      "(install it with scripts/setup, or set LOCO_REDIS_SERVER)");
}

std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/loco-redis-XXXXXX";
  if (!::mkdtemp(pattern.data())) throw sys_error("RedisServer: mkdtemp " + pattern);
  return pattern;
}

// One PING over a fresh connection; true on PONG, or on NOAUTH (a server started with
// --requirepass: up, and wanting the password).
bool answers_ping(int port, std::string& why) {
  const timeval tv{0, 200 * 1000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (!c) {
    why = "cannot allocate a connection";
    return false;
  }
  bool ok = false;
  if (c->err) {
    why = c->errstr;
  } else {
    redisSetTimeout(c, timeval{1, 0});
    auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
    if (!r) {
      why = c->errstr;
    } else {
      const std::string reply(r->str ? r->str : "", r->str ? r->len : 0);
      ok = (r->type == REDIS_REPLY_STATUS && reply == "PONG") ||
           (r->type == REDIS_REPLY_ERROR && reply.starts_with("NOAUTH"));
      if (!ok) why = "PING answered '" + reply + "'";  // e.g. LOADING while reading the AOF
      freeReplyObject(r);
    }
  }
  redisFree(c);
  return ok;
}

}  // namespace

RedisServer::RedisServer() : RedisServer(Options{}) {}

RedisServer::RedisServer(Options options)
    : options_(std::move(options)), executable_(find_executable(options_.executable)) {
  if (options_.dir.empty()) {
    dir_ = make_temp_dir();
    own_dir_ = true;
  } else {
    dir_ = options_.dir;
    fs::create_directories(dir_);
  }
  try {
    start();
  } catch (...) {
    kill();
    if (own_dir_) {
      std::error_code ignored;
      fs::remove_all(dir_, ignored);
    }
    throw;
  }
}

RedisServer::~RedisServer() {
  kill();
  if (own_dir_) {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
}

std::string RedisServer::url(int db) const {
  std::string u = "redis://127.0.0.1:" + std::to_string(port_);
  if (db >= 0) u += "/" + std::to_string(db);
  return u;
}

std::string RedisServer::log_path() const { return dir_ + "/redis.log"; }

void RedisServer::start() {
  if (running()) return;
  // A free port may be taken between the check and Redis's bind; when the
  // port was ours to choose, choose again.
  const bool choose_port = options_.port == 0 && port_ == 0;
  const int attempts = choose_port ? 5 : 1;
  std::string why;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (choose_port) port_ = free_tcp_port();
    if (port_ == 0) port_ = options_.port;
    spawn();
    if (wait_ready(why)) return;
    kill();
    if (why.find("Address already in use") == std::string::npos) break;
  }
  const int port = port_;
  if (choose_port) port_ = 0;
  throw std::runtime_error("RedisServer: " + executable_ + " on 127.0.0.1:" + std::to_string(port) +
                           " did not start: " + why + "\n--- " + log_path() + " ---\n" +
                           log_tail());
}

void RedisServer::spawn() {
  std::vector<std::string> args = {executable_, "--port",       std::to_string(port_),
                                   "--bind",    "127.0.0.1",    "--daemonize",
                                   "no",        "--dir",        dir_,
                                   "--logfile", log_path(),     "--save",
                                   "",          "--appendonly", options_.appendonly ? "yes" : "no"};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = log_path();
  const pid_t parent = ::getpid();
  const bool kill_with_parent = options_.kill_with_parent;

  const pid_t pid = ::fork();
  if (pid < 0) throw sys_error("RedisServer: fork");
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
#ifdef __linux__
    if (kill_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
#else
    (void)kill_with_parent;
    (void)parent;
#endif
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
    // Early errors (before Redis opens its log file) go to stdout/stderr.
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
      // The test's own sockets must not live on in the server.
#ifdef SYS_close_range
    if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
#endif
      for (int i = 3; i < 4096; ++i) ::close(i);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
}

bool RedisServer::wait_ready(std::string& why) {
  bool exited = false;
  const bool answered = eventually(
      [&] {
        exited = reap(false);
        return exited || answers_ping(port_, why);
      },
      options_.start_timeout, kPoll);
  if (exited) {
    why = "it exited";
    const std::string tail = log_tail();
    if (tail.find("Address already in use") != std::string::npos)
      why += " (Address already in use)";
    return false;
  }
  if (answered) return true;
  why = "no PONG within " + std::to_string(options_.start_timeout.count()) + " ms (" + why + ")";
  return false;
}

bool RedisServer::reap(bool block) {
  if (pid_ <= 0) return true;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      return true;
    }
    if (r < 0 && errno == EINTR) continue;
    return false;
  }
}

void RedisServer::stop() {
  if (!running()) return;
  ::kill(pid_, SIGTERM);
  ::kill(pid_, SIGCONT);  // a paused server must run to handle SIGTERM
  if (!eventually([&] { return reap(false); }, options_.stop_timeout, kPoll)) kill();
}

void RedisServer::kill() {
  if (!running()) return;
  ::kill(pid_, SIGKILL);
  reap(true);
}

void RedisServer::restart() {
  stop();
  start();
}

void RedisServer::pause() {
  if (running()) ::kill(pid_, SIGSTOP);
}

void RedisServer::resume() {
  if (running()) ::kill(pid_, SIGCONT);
}

std::string RedisServer::log_tail() const {
  std::ifstream in(log_path());
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  constexpr size_t kTail = 2000;
  return text.size() > kTail ? text.substr(text.size() - kTail) : text;
}

}  // namespace loco::testing
