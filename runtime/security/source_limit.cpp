#include "runtime/security/source_limit.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <spdlog/spdlog.h>

namespace loco::security {

namespace {

std::atomic<uint64_t> g_serial{0};

// A socket's address (peer or local) as text and its port; false when it has none we know.
bool address_of(int fd, bool peer, std::string* host, int* port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    *port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof text);
    *port = ntohs(in->sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

}  // namespace

SourceLimit::SourceLimit(zmq::context_t& ctx, zmq::socket_t& listener, std::size_t max_per_source,
                         std::string name)
    : listener_(&listener), max_(max_per_source), name_(std::move(name)) {
  const std::string bound = listener.get(zmq::sockopt::last_endpoint);
  if (max_ == 0 || !bound.starts_with("tcp://")) return;
  port_ = std::stoi(bound.substr(bound.rfind(':') + 1));
  const std::string ep = "inproc://loco-source-limit-" + std::to_string(++g_serial);
  if (zmq_socket_monitor(listener.handle(), ep.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    spdlog::warn("{}: connections per source are not bounded (no monitor: {})", name_,
                 zmq_strerror(zmq_errno()));
    return;
  }
  events_.emplace(ctx, zmq::socket_type::pair);
  events_->set(zmq::sockopt::linger, 0);
  events_->set(zmq::sockopt::rcvhwm, 0);  // unbounded: ZeroMQ's send of an event blocks
  events_->connect(ep);
  thread_ = std::thread([this] { run(); });
}

SourceLimit::~SourceLimit() {
  if (!events_) return;
  // The monitor first: ZeroMQ's send of an event waits for a reader.
  (void)zmq_socket_monitor(listener_->handle(), nullptr, 0);
  stop_.store(true);
  thread_.join();
  events_.reset();
}

void SourceLimit::run() {
  zmq::message_t event, endpoint;
  while (!stop_.load()) {
    zmq::pollitem_t item{events_->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    while (events_->recv(event, zmq::recv_flags::dontwait)) {
      if (event.more()) (void)events_->recv(endpoint, zmq::recv_flags::none);
      if (event.size() < 6) continue;
      uint16_t id = 0;
      uint32_t value = 0;
      std::memcpy(&id, event.data(), sizeof id);
      std::memcpy(&value, static_cast<const char*>(event.data()) + 2, sizeof value);
      if (id == ZMQ_EVENT_ACCEPTED) accepted(int(value));
      if (id == ZMQ_EVENT_DISCONNECTED) disconnected(int(value));
    }
  }
}

// The event comes after ZeroMQ accepted the descriptor and, for a connection that ends, before
// it closes it (ZeroMQ reports the disconnection first), so a descriptor seen here is the
// accepted connection unless it ended meanwhile and its number went to another socket of the
// process: the local port, the listener's only for an accepted connection, guards against
// shutting down an outgoing one.
void SourceLimit::accepted(int fd) {
  std::string source, local;
  int peer_port = 0, local_port = 0;
  if (!address_of(fd, true, &source, &peer_port) || !address_of(fd, false, &local, &local_port) ||
      local_port != port_)
    return;
  std::size_t& n = open_[source];
  if (n < max_) {
    ++n;
    source_of_[fd] = source;
    return;
  }
  ::shutdown(fd, SHUT_RDWR);
  refused_.fetch_add(1);
  uint64_t held = 0;
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
  if (!log_limit_.allow(now.count(), &held)) return;
  spdlog::warn("{}: refused a connection from {}, which holds {} already, the most one address "
               "may (--max-connections-per-source){}",
               name_, source, n,
               held ? " (" + std::to_string(held) + " more in the last 10 s not logged)" : "");
}

void SourceLimit::disconnected(int fd) {
  auto it = source_of_.find(fd);
  if (it == source_of_.end()) return;
  auto n = open_.find(it->second);
  if (n != open_.end() && --n->second == 0) open_.erase(n);
  source_of_.erase(it);
}

}  // namespace loco::security
