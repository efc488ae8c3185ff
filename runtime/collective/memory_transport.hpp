// A Transport without sockets: members in one process exchange messages through a MemoryHub.
// For the schedule's tests (and anything else that wants a group in one process): no ports,
// no I/O threads, and a peer's death is one call (close()).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "runtime/collective/liveness.hpp"
#include "runtime/collective/transport.hpp"

namespace loco::collective::detail {

class MemoryHub {
 public:
  // data_queue: messages a sender may have queued for one receiver on the data channel before
  // try_send says the queue is full (the control channel takes 64). data_latency: a slow link:
  // each data message with a payload arrives this long after the one before it (or after it
  // was sent), its bytes coming in evenly over that time (link_bytes); one without a payload
  // arrives right after the one before it. control_latency: each
  // control message arrives this long after it was sent (keepalives that TCP holds back while it
  // recovers a loss).
  explicit MemoryHub(size_t data_queue = 8, Clock::duration data_latency = Clock::duration::zero(),
                     Clock::duration control_latency = Clock::duration::zero())
      : data_queue_(data_queue), data_latency_(data_latency), control_latency_(control_latency) {}

 private:
  friend class MemoryTransport;
  struct Queued {
    Message message;
    std::string from;  // the sender's endpoint
    Channel channel;
    Clock::time_point begins_at;   // when its first byte arrives
    Clock::time_point visible_at;  // when its last byte has arrived and the receiver may have it
    size_t bytes;
  };
  struct Link {
    std::string to, from;  // endpoints
    Channel channel;
    uint64_t read = 0;  // bytes of the messages the receiver has taken
  };
  struct Inbox {
    std::deque<Queued> messages;
    std::map<std::pair<std::string, Channel>, size_t> queued;  // by (sender endpoint, channel)
    std::set<std::string> connected;                           // endpoints this member sends to
    std::map<std::string, PeerEvent> events;  // closed ones; a refusal is derived (take_event)
    std::map<std::string, Clock::time_point> data_free_at;  // by sender: when its link is free
    std::map<std::pair<std::string, Channel>, uint64_t> links;  // (sender, channel) -> link id
  };
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, Inbox> members_;  // by endpoint, while open
  size_t data_queue_;
  Clock::duration data_latency_;
  Clock::duration control_latency_;
  std::map<uint64_t, Link> links_;  // by id (from 1)
};

class MemoryTransport final : public Transport {
 public:
  // Joins the hub as `endpoint` (CollectiveError if it is taken).
  MemoryTransport(std::shared_ptr<MemoryHub> hub, std::string endpoint);
  ~MemoryTransport() override;
  // Leaves the hub as a crashed process would: peers that send to it see it closed, and what
  // it had not read is gone.
  void close();

  const std::string& endpoint() const override { return endpoint_; }
  bool releases_sent_payloads(const std::string&) const override { return false; }
  void keep_only(std::span<const std::string> peers, std::chrono::milliseconds linger) override;
  bool try_send(const std::string& peer, Channel channel, const Header& header,
                const std::string& sender, Buffer payload) override;
  bool try_receive(Message& out) override;
  uint64_t link_bytes(uint64_t link) override;
  PeerEvent take_event(const std::string& peer) override;
  bool undelivered(const std::string&) override { return false; }  // in the peer's queue at once
  void wait(std::span<const std::string> writable, std::chrono::milliseconds limit) override;
  void drop_all() override;

 private:
  bool room_locked(const std::string& peer, Channel channel);
  std::shared_ptr<MemoryHub> hub_;
  std::string endpoint_;
  bool open_ = true;
};

}  // namespace loco::collective::detail
