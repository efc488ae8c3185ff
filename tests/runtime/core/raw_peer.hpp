// A member of the cluster (it holds the cluster key) speaking the runtime's wire by hand: raw
// frames to a node's or the head's ROUTER, and the envelopes that come back. For the tests of
// malformed input and of a hostile member.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "runtime/core/wire.hpp"
#include "runtime/security/curve.hpp"

namespace loco::testing {

class RawPeer {
 public:
  explicit RawPeer(const std::string& address) : sock_(ctx_, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    security::make_client(sock_, security::resolve("", false));  // the cluster's key
    sock_.set(zmq::sockopt::rcvtimeo, 5000);
    sock_.connect("tcp://" + address);
  }
  void send(std::vector<zmq::message_t>&& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      sock_.send(frames[i],
                 i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  void send_bytes(const std::string& bytes) {
    std::vector<zmq::message_t> f;
    f.emplace_back(bytes.data(), bytes.size());
    send(std::move(f));
  }
  detail::Envelope reply() {
    std::vector<zmq::message_t> frames;
    zmq::message_t m;
    if (!sock_.recv(m)) throw std::runtime_error("no reply within 5 s");
    frames.push_back(std::move(m));
    while (frames.back().more()) {
      zmq::message_t n;
      (void)sock_.recv(n);
      frames.push_back(std::move(n));
    }
    return detail::decode(std::move(frames), size_t(1) << 30).env;
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t sock_;
};

}  // namespace loco::testing
