// The collective's ZeroMQ transport. Internal to the collective.
//
// Each transport binds one ROUTER that only receives, and keeps two DEALERs per peer that
// only send: one for data, one for control (keepalives, aborts). A message is three frames:
// header, sender name, payload. A monitor on each DEALER reports a dropped or refused
// connection: SIGKILL closes a peer's sockets, which is seen long before any timeout.
//
// Members behind NAT (describe()): towards a reachable peer, DEALERs as above. Towards an
// unreachable one, when this member is reachable, the ROUTER sends over the peer's own DEALERs
// (each names itself by a routing id: a channel letter and its endpoint), which then also
// receive. Between two unreachable members, two DEALERs to the group's relay carry messages
// addressed by routing id, each payload sealed end to end (seal.hpp).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/collective/seal.hpp"
#include "runtime/collective/transport.hpp"
#include "runtime/collective/types.hpp"
#include "runtime/security/source_limit.hpp"

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
  // With `outbound_only`, binds nothing: endpoint() is "nat://" and the key-exchange public key,
  // and peers reach it only over its own connections (or the relay).
  ZmqTransport(const std::string& bind_endpoint, std::shared_ptr<zmq::context_t> context,
               security::Settings security = {}, size_t max_frame_bytes = 0,
               bool outbound_only = false);
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

  // How to reach each member of `group` (before an operation; routes and keys are kept for
  // later messages): directly when it is reachable, over its connection to us when only we
  // are, through group.relay when neither is. CollectiveError when a pair has no way (two
  // unreachable members and no relay, a bad key) or this member's description contradicts
  // this transport (reachable though outbound-only).
  void describe(const Group& group);
  // describe()'s work for one peer: its route, and for a relayed one its session keys.
  void describe_peer(const Group& group, const Member& self, const Member& m);
  // Our key-exchange public key, in hex (Member::kx_public).
  std::string kx_public() const { return kx_.public_hex(); }
  // Relayed messages dropped undecoded: they failed to authenticate, or came from a sender
  // with no known key while the pending queue was full.
  uint64_t unauthentic() const { return unauthentic_; }

 private:
  struct Peer;
  struct Relayed;
  enum class Route : uint8_t { direct, reverse, relay };
  struct PeerInfo {
    Route route = Route::direct;
    std::string name;
    std::optional<SessionKeys> keys;  // relay route only
    std::string kx_public;            // what `keys` were derived from
    uint64_t sent[2] = {0, 0};        // sequences sealed, per channel
    uint64_t opened[2] = {0, 0};      // highest sequence opened + 1, per channel
    PeerEvent relay_event = PeerEvent::none;
  };
  Peer& peer(const std::string& endpoint);
  // A fresh inproc endpoint for a DEALER's monitor.
  std::string monitor_endpoint();
  Route route_of(const std::string& endpoint) const;
  Relayed& relay();
  std::string routing_id(Channel c, const std::string& endpoint) const;
  bool take_from(zmq::socket_t& s, bool has_routing_id, bool relayed, Message& out);
  bool open_relayed(std::vector<std::string>& frames, bool queue_if_unknown, Message& out);
  void note_link(const void* frame, Message& out);
  void drain_relay_events();
  std::vector<zmq::socket_t*> receivers();

  std::shared_ptr<zmq::context_t> ctx_;
  security::Settings security_;
  std::shared_ptr<security::ZapHandler> zap_;  // outlives the sockets below
  std::unique_ptr<zmq::socket_t> router_;
  std::optional<security::SourceLimit> source_limit_;  // of router_'s connections
  std::string endpoint_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by endpoint
  uint64_t monitor_serial_ = 0;  // monitor_endpoint()'s, each DEALER's own
  // Remote address of each TCP connection a message came on, by file descriptor.
  std::map<int, std::string> links_;
  bool outbound_only_ = false;
  bool reachable_ = true;  // as the last group described this member
  size_t max_frame_bytes_ = 0;
  int rcvhwm_ = 4096;
  KxKeyPair kx_;
  std::map<std::string, PeerInfo> info_;  // by endpoint
  RelayEndpoint relay_at_;
  std::unique_ptr<Relayed> relay_;
  // Relayed messages from senders whose key is not known yet (a peer may begin an operation
  // before this member is told its group): opened once describe() tells the key. Bounded.
  std::deque<std::vector<std::string>> pending_;
  size_t pending_bytes_ = 0;
  bool pending_dirty_ = false;  // a key became known since pending_ was last looked at
  uint64_t unauthentic_ = 0;
  size_t next_receiver_ = 0;  // round robin over the sockets that receive
};

}  // namespace loco::collective::detail
