// The collective's ZeroMQ transport. Internal to the collective.
//
// Each transport binds one ROUTER that only receives, and keeps two DEALERs per peer that
// only send: one for data, one for control (keepalives, aborts). A message is three frames:
// header, sender name, payload. A monitor on each DEALER reports a dropped or refused
// connection: SIGKILL closes a peer's sockets, which is seen long before any timeout.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "runtime/collective/transport.hpp"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace loco::security {
class ZapHandler;
}  // namespace loco::security

namespace loco::collective::detail {

class ZmqTransport final : public Transport {
 public:
  // Binds (CollectiveError if it cannot). "tcp://HOST:0" picks a free port. With
  // `security.curve`, the ROUTER admits only CURVE peers holding a key on the allow-list (a
  // ZAP handler in `context`), and the DEALERs present the cluster's key. With
  // `max_frame_bytes`, a peer that sends a larger frame has its connection closed before the
  // frame is allocated (ZMQ_MAXMSGSIZE), and ZeroMQ queues at most 64 MiB of such frames per
  // connection for try_receive (its receive high-water mark, 16 to 4,096 messages).
  ZmqTransport(const std::string& bind_endpoint, std::shared_ptr<zmq::context_t> context,
               security::Settings security = {}, size_t max_frame_bytes = 0);
  ~ZmqTransport() override;

  const std::string& endpoint() const override { return endpoint_; }
  bool releases_sent_payloads(const std::string& peer) const override;
  void keep_only(std::span<const std::string> peers, std::chrono::milliseconds linger) override;
  bool try_send(const std::string& peer, Channel channel, const Header& header,
                const std::string& sender, Buffer payload) override;
  bool try_receive(Message& out) override;
  // From the kernel's count of the TCP connection's bytes (TCP_INFO); 0 for ipc and inproc.
  uint64_t link_bytes(uint64_t link) override;
  PeerEvent take_event(const std::string& peer) override;
  bool undelivered(const std::string& peer) override;
  void wait(std::span<const std::string> writable, std::chrono::milliseconds limit) override;
  void drop_all() override;

  // Every open DEALER lingers this long when the transport is destroyed.
  void set_linger_on_close(std::chrono::milliseconds linger);

 private:
  struct Peer;
  Peer& peer(const std::string& endpoint);

  std::shared_ptr<zmq::context_t> ctx_;
  security::Settings security_;
  std::shared_ptr<security::ZapHandler> zap_;  // outlives the sockets below
  std::unique_ptr<zmq::socket_t> router_;
  std::string endpoint_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by endpoint
  uint64_t monitor_serial_ = 0;
  // Remote address of each TCP connection a message came on, by file descriptor.
  std::map<int, std::string> links_;
};

}  // namespace loco::collective::detail
