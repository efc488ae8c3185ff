#pragma once
// Connections to a listening socket, bounded per source address. ZeroMQ accepts every TCP
// connection and offers no hook before the handshake, so a single address could hold as many
// descriptors as it can open within the handshake timeout. This watches the listener's
// accepts on its monitor and shuts down, at once, a connection from an address that already
// holds `max_per_source` of them: ZeroMQ then sees the stream end and closes it as it closes
// any connection that fails (issue "21 ·", finding 4). A flood from many addresses is the
// firewall's to bound (docs/security.md). Private to runtime/ (it includes ZeroMQ).
//
// Construct after bind() and destroy before the listener closes, on the thread that owns the
// listener; the events are read on a thread of its own, so the bound holds while the owner is
// busy elsewhere (a worker's collective between rounds).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>

#include "runtime/core/remote_input.hpp"

namespace loco::security {

// The default bound: a whole site behind one NAT address (every node and client of it
// connecting to the head, say) stays well under it.
inline constexpr std::size_t kMaxConnectionsPerSource = 256;

class SourceLimit {
 public:
  // `name` names the listener in the log ("relay tcp://0.0.0.0:7080"). max_per_source 0: no
  // bound (nothing is watched).
  SourceLimit(zmq::context_t& ctx, zmq::socket_t& listener, std::size_t max_per_source,
              std::string name);
  ~SourceLimit();
  SourceLimit(const SourceLimit&) = delete;
  SourceLimit& operator=(const SourceLimit&) = delete;

  // Connections shut down for their source so far.
  uint64_t refused() const { return refused_.load(); }

 private:
  void run();
  void accepted(int fd);
  void disconnected(int fd);

  zmq::socket_t* listener_;
  std::size_t max_;
  std::string name_;
  int port_ = -1;  // the listener's: an accepted connection's local port
  std::optional<zmq::socket_t> events_;  // the monitor's; read by thread_ alone
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // thread_'s alone:
  std::unordered_map<int, std::string> source_of_;  // accepted descriptor -> its address
  std::unordered_map<std::string, std::size_t> open_;
  RateLimit log_limit_;  // one line about refusals per 10 s
  std::atomic<uint64_t> refused_{0};
};

}  // namespace loco::security
