#pragma once
// The process's ZeroMQ plumbing. One I/O thread owns every socket:
//   * an optional bound ROUTER that receives requests (ZMQ_ROUTER_MANDATORY on,
//     so a reply to a vanished caller is an error we log, never a silent drop);
//   * one DEALER per peer address for the calls this process makes; replies
//     come back on the same connection.
// Other threads hand frames over through a locked queue and an eventfd; ZeroMQ
// moves the frames without copying them.
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "runtime/core/remote_input.hpp"
#include "runtime/security/curve.hpp"
#include "runtime/security/source_limit.hpp"

namespace loco::detail {

class Transport {
 public:
  // A message that arrived on the ROUTER; `routing_id` addresses the reply, `who` is who the
  // key of its connection proves the sender is (security::identity_of).
  using InboundFn = std::function<void(zmq::message_t&& routing_id, std::vector<zmq::message_t>&&,
                                       security::Identity who)>;
  // A message that arrived on the DEALER connected to `peer`.
  using ReplyFn = std::function<void(const std::string& peer, std::vector<zmq::message_t>&&)>;
  // Called on the I/O thread about every `tick_ms`.
  using TickFn = std::function<void(int64_t now_ms)>;

  struct Options {
    std::string bind;  // "tcp://HOST:PORT" (port 0: any free one); empty: no ROUTER
    size_t max_frame_bytes = size_t(4) << 30;
    int tick_ms = 50;
    // CURVE on the ROUTER and every DEALER, with a ZAP handler in this transport's context;
    // plain TCP when `security.curve` is false.
    security::Settings security;
    // Called on the I/O thread when the handshakes of a DEALER with `peer` fail for a reason
    // that retrying will not cure: the peer refused our key, CURVE on one side only, or three
    // failures in a row before `peer` ever answered (it holds another cluster key). `why` says
    // which.
    std::function<void(const std::string& peer, const std::string& why)> on_handshake_failed;
    // Called on the I/O thread when the connection of a DEALER for "HOST:PORT/NODE" (calls the
    // head at HOST:PORT forwards to NODE) closes: the head died or restarted, and with it the
    // table that would have sent the answers of the calls it was forwarding back here.
    std::function<void(const std::string& peer)> on_forwarder_closed;
    // Connections the ROUTER holds from any one address (security/source_limit.hpp); 0: no
    // bound.
    size_t max_connections_per_source = security::kMaxConnectionsPerSource;
  };

  Transport(Options opts, InboundFn inbound, ReplyFn reply, TickFn tick);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // "HOST:PORT" the ROUTER is bound to (the real port when 0 was asked for).
  std::string bound_address() const { return bound_address_; }

  // Thread-safe. Sends on the DEALER for "HOST:PORT" (connecting it if needed). A peer
  // "HOST:PORT/NODE" has a DEALER of its own to HOST:PORT (calls the head forwards to NODE).
  void send_to_peer(const std::string& peer, std::vector<zmq::message_t>&& frames);
  // Thread-safe. Sends on the ROUTER to the caller `routing_id`, or, for a routing id made by
  // on_dealer(peer), on the DEALER to `peer` (a request that came on it: a node behind NAT
  // answers its head over the connection it opened).
  void reply(zmq::message_t&& routing_id, std::vector<zmq::message_t>&& frames);
  // Thread-safe. Closes the DEALER to `peer`, discarding what it still queues.
  void drop_peer(const std::string& peer);
  // Thread-safe. The DEALERs open now (one per peer we sent to and did not drop).
  size_t connections() const { return connections_.load(); }

  void stop();

  // A routing id that reply() sends on the DEALER to `peer`. ZeroMQ's routing ids are 5 bytes
  // starting with a zero byte, or chosen by the peer and never starting with one: this one
  // starts with a zero byte and is longer, so it is never a ROUTER's.
  static zmq::message_t on_dealer(const std::string& peer);

  // Handshakes the ZAP handler admitted and refused (0 without CURVE).
  uint64_t handshakes_admitted() const { return zap_ ? zap_->admitted() : 0; }
  uint64_t handshakes_refused() const { return zap_ ? zap_->refused() : 0; }

 private:
  struct Outgoing {
    enum class Op { Peer, Reply, Drop } op;
    std::string peer;
    zmq::message_t routing_id;
    std::vector<zmq::message_t> frames;
  };

  void enqueue(Outgoing&& out);
  // The peer of a routing id made by on_dealer ("" for a ROUTER's).
  static std::string dealer_of(const zmq::message_t& routing_id);
  void run();
  void flush_outgoing();
  struct Dealer {
    explicit Dealer(zmq::context_t& ctx) : socket(ctx, zmq::socket_type::dealer) {}
    zmq::socket_t socket;
    std::optional<zmq::socket_t> monitor;  // handshake failures; a forwarder's disconnection
    bool answered = false;                 // a message came from the peer
    int failures = 0;                      // handshakes that failed without detail
    ~Dealer();
  };
  zmq::socket_t& dealer_for(const std::string& peer);
  void drain_monitor(const std::string& peer, Dealer& d);

  Options opts_;
  InboundFn inbound_;
  ReplyFn reply_;
  TickFn tick_;
  zmq::context_t ctx_;
  std::shared_ptr<security::ZapHandler> zap_;  // outlives the sockets below
  std::optional<zmq::socket_t> router_;
  std::optional<security::SourceLimit> source_limit_;  // of the ROUTER's connections
  std::map<std::string, std::unique_ptr<Dealer>> dealers_;
  uint64_t monitor_serial_ = 0;
  bool dealers_changed_ = true;
  // Lines about messages it could not deliver, at most one per cause every 10 s (a killed
  // node's answers to callers that gave up can come by the ten thousand).
  RateLimit gone_caller_lines_, undelivered_lines_;
  std::string bound_address_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::deque<Outgoing> queue_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> connections_{0};  // dealers_.size(), for other threads
  std::thread thread_;
};

}  // namespace loco::detail
