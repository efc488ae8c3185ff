#pragma once
// A DEALER that a test points at one of loco's server sockets to see whether it is let in:
// plain, or with CURVE keys the test chooses. Its monitor says how the handshake ended.
#include <zmq.h>

#include <chrono>
#include <cstring>
#include <string>
#include <zmq.hpp>

namespace loco::testing {

class ZmqProbe {
 public:
  enum class Outcome { none, succeeded, refused_auth, failed };

  // Plain TCP.
  explicit ZmqProbe(const std::string& endpoint) : ZmqProbe(endpoint, "", "", "") {}
  // CURVE: expects the server to hold `server_public`, presents `public_key`/`secret_key`.
  ZmqProbe(const std::string& endpoint, const std::string& server_public,
           const std::string& public_key, const std::string& secret_key)
      : sock_(ctx_, zmq::socket_type::dealer), mon_(ctx_, zmq::socket_type::pair) {
    sock_.set(zmq::sockopt::linger, 0);
    if (!server_public.empty()) {
      sock_.set(zmq::sockopt::curve_serverkey, server_public);
      sock_.set(zmq::sockopt::curve_publickey, public_key);
      sock_.set(zmq::sockopt::curve_secretkey, secret_key);
    }
    const int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                       ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    zmq_socket_monitor(sock_.handle(), "inproc://probe-monitor", events);
    mon_.set(zmq::sockopt::rcvhwm, 0);
    mon_.connect("inproc://probe-monitor");
    sock_.connect(endpoint);
  }
  ~ZmqProbe() { zmq_socket_monitor(sock_.handle(), nullptr, 0); }

  // Queues `frames`; they leave only if the handshake succeeds.
  void send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      (void)sock_.send(zmq::buffer(frames[i]),
                       i + 1 < frames.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                             : zmq::send_flags::dontwait);
  }

  // The first handshake outcome within `timeout` (none if there was none).
  Outcome wait_handshake(std::chrono::milliseconds timeout) {
    mon_.set(zmq::sockopt::rcvtimeo, static_cast<int>(timeout.count()));
    zmq::message_t event, addr;
    if (!mon_.recv(event)) return Outcome::none;
    if (event.more()) (void)mon_.recv(addr);
    uint16_t id = 0;
    std::memcpy(&id, event.data(), sizeof id);
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) return Outcome::succeeded;
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return Outcome::refused_auth;
    return Outcome::failed;
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  zmq::socket_t mon_;
};

}  // namespace loco::testing
