#include "client/process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace loco {

Subprocess::Subprocess(std::vector<std::string> argv, Options opts) {
  if (argv.empty()) throw std::invalid_argument("Subprocess: empty argv");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (opts.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
    }
    if (opts.new_session) ::setsid();
    if (!opts.log_path.empty()) {
      int fd = ::open(opts.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    for (auto& [k, v] : opts.env) ::setenv(k.c_str(), v.c_str(), 1);
    if (!opts.cwd.empty() && ::chdir(opts.cwd.c_str()) != 0) ::_exit(127);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  pid_ = pid;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && running()) kill();
}

Subprocess::Subprocess(Subprocess&& o) noexcept : pid_(o.pid_), status_(o.status_) { o.pid_ = -1; }

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && running()) kill();
    pid_ = o.pid_;
    status_ = o.status_;
    o.pid_ = -1;
  }
  return *this;
}

bool Subprocess::reap(bool block) {
  if (pid_ <= 0 || status_) return true;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, block ? 0 : WNOHANG);
  if (r == pid_) {
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }
  return r < 0;  // not our child any more
}

bool Subprocess::running() { return pid_ > 0 && !reap(false); }

std::optional<int> Subprocess::exit_code() {
  reap(false);
  return status_;
}

std::optional<int> Subprocess::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reap(false)) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_;
}

void Subprocess::signal(int sig) {
  if (pid_ > 0 && !status_) ::kill(pid_, sig);
}

void Subprocess::kill() {
  signal(SIGKILL);
  reap(true);
}

int Subprocess::stop(std::chrono::milliseconds grace) {
  signal(SIGTERM);
  if (!wait(grace)) kill();
  return status_.value_or(-1);
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw std::runtime_error(std::string("free_tcp_port: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error =
        std::string("free_tcp_port: bind 127.0.0.1:0: ") + std::strerror(errno);
    ::close(fd);
    throw std::runtime_error(error);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string executable_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  return path.substr(0, path.rfind('/'));
}

}  // namespace loco
