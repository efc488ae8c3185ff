#pragma once
// TCP connections a test opens to one of loco's listening sockets and leaves idle (never a
// byte of a handshake), from a loopback address of its choice (127.0.0.2: another source than
// the cluster's own connections), and how many of them the server closed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

namespace loco::testing {

// `n` TCP connections to `endpoint` (tcp://127.0.0.1:PORT or 127.0.0.1:PORT) from the local
// address `from`; fewer when one cannot be opened.
inline std::vector<int> idle_connections(const std::string& endpoint, int n, const char* from) {
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(uint16_t(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sockaddr_in source{};
  source.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &source.sin_addr);
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    (void)::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof source);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) != 0) {
      ::close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

// How many of `fds` the other end has closed, waiting until `want` are or `limit` has passed
// (those closed before count again: call it twice on the same ones to see whether more closed).
inline size_t closed_by_peer(const std::vector<int>& fds, size_t want,
                             std::chrono::milliseconds limit) {
  const auto t0 = std::chrono::steady_clock::now();
  size_t closed = 0;
  std::vector<bool> done(fds.size(), false);
  while (closed < want && std::chrono::steady_clock::now() - t0 < limit) {
    std::vector<pollfd> items;
    for (int fd : fds) items.push_back({fd, POLLIN, 0});
    ::poll(items.data(), items.size(), 200);
    for (size_t i = 0; i < items.size(); ++i) {
      if (done[i] || !(items[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[256];
      // ZeroMQ's greeting may come first; the end of the stream is the close.
      const ssize_t n = ::recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        done[i] = true;
        ++closed;
      }
    }
  }
  return closed;
}

}  // namespace loco::testing
