#include "runtime/collective/zmq_transport.hpp"

#include <algorithm>
#include <cstring>
#include <vector>
#include <zmq.hpp>

namespace loco::collective::detail {
namespace {

void release_owner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// A frame that points into the payload; ZeroMQ drops its reference to the owner (from its I/O
// thread) once the bytes are in the kernel or the message was discarded.
zmq::message_t frame_of(Buffer&& b) {
  if (b.size == 0) return zmq::message_t();
  if (!b.owner) return zmq::message_t(b.data, b.size);
  auto* hint = new std::shared_ptr<const void>(std::move(b.owner));
  return zmq::message_t(const_cast<uint8_t*>(b.data), b.size, &release_owner, hint);
}

// A DEALER whose monitor reports dropped and refused connections.
struct Monitored {
  std::unique_ptr<zmq::socket_t> socket;
  std::unique_ptr<zmq::socket_t> monitor;
};

Monitored open_dealer(zmq::context_t& ctx, const std::string& endpoint, int sndhwm,
                      const std::string& monitor_endpoint) {
  Monitored d;
  d.socket = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  d.socket->set(zmq::sockopt::linger, 0);
  d.socket->set(zmq::sockopt::sndhwm, sndhwm);
  d.socket->set(zmq::sockopt::reconnect_ivl, 50);
  d.socket->set(zmq::sockopt::reconnect_ivl_max, 500);
  if (zmq_socket_monitor(d.socket->handle(), monitor_endpoint.c_str(),
                         ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED) == 0) {
    d.monitor = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
    d.monitor->set(zmq::sockopt::linger, 0);
    d.monitor->connect(monitor_endpoint);
  }
  d.socket->connect(endpoint);
  return d;
}

PeerEvent drain_monitor(zmq::socket_t* monitor) {
  if (!monitor) return PeerEvent::none;
  PeerEvent seen = PeerEvent::none;
  zmq::message_t event, addr;
  while (monitor->recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)monitor->recv(addr, zmq::recv_flags::none);
    uint16_t id = 0;
    if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
    if (id == ZMQ_EVENT_DISCONNECTED) seen = PeerEvent::closed;
    if (id == ZMQ_EVENT_CONNECT_RETRIED && seen == PeerEvent::none) seen = PeerEvent::refused;
  }
  return seen;
}

}  // namespace

struct ZmqTransport::Peer {
  Monitored data;
  Monitored control;
  zmq::socket_t& socket(Channel c) { return *(c == Channel::data ? data : control).socket; }
  void set_linger(std::chrono::milliseconds linger) {
    data.socket->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    control.socket->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
  }
};

ZmqTransport::ZmqTransport(const std::string& bind_endpoint,
                           std::shared_ptr<zmq::context_t> context)
    : ctx_(std::move(context)),
      router_(std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router)) {
  router_->set(zmq::sockopt::linger, 0);
  router_->set(zmq::sockopt::rcvhwm, 4096);
  // The ROUTER only receives; should it ever route, an unknown peer must be an error.
  router_->set(zmq::sockopt::router_mandatory, true);
  std::string ep = bind_endpoint;
  if (ep.starts_with("tcp://") && ep.ends_with(":0")) ep = ep.substr(0, ep.size() - 1) + "*";
  try {
    router_->bind(ep);
  } catch (const zmq::error_t& e) {
    throw CollectiveError("collective: cannot bind the data socket to " + bind_endpoint + ": " +
                          e.what());
  }
  endpoint_ = router_->get(zmq::sockopt::last_endpoint);
}

ZmqTransport::~ZmqTransport() = default;

void ZmqTransport::set_linger_on_close(std::chrono::milliseconds linger) {
  for (auto& [ep, p] : peers_) p->set_linger(linger);
}

bool ZmqTransport::releases_sent_payloads(const std::string& peer) const {
  // Over inproc the receiving socket itself would hold our message until it is read.
  return peer.starts_with("tcp://") || peer.starts_with("ipc://");
}

ZmqTransport::Peer& ZmqTransport::peer(const std::string& endpoint) {
  auto it = peers_.find(endpoint);
  if (it != peers_.end()) return *it->second;
  auto monitor_ep = [&] {
    return "inproc://loco-collective-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(this)) +
           "-" + std::to_string(++monitor_serial_);
  };
  auto p = std::make_unique<Peer>();
  // A short data queue in ZeroMQ (the kernel's socket buffer holds more): what waits, waits
  // in the schedule's outbox, where all-gather results overtake reduce-scatter chunks.
  p->data = open_dealer(*ctx_, endpoint, 4, monitor_ep());
  p->control = open_dealer(*ctx_, endpoint, 64, monitor_ep());
  return *peers_.emplace(endpoint, std::move(p)).first->second;
}

void ZmqTransport::keep_only(std::span<const std::string> keep, std::chrono::milliseconds linger) {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (std::find(keep.begin(), keep.end(), it->first) == keep.end()) {
      it->second->set_linger(linger);
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& ep : keep) (void)peer(ep);
}

bool ZmqTransport::try_send(const std::string& to, Channel channel, const Header& header,
                            const std::string& sender, Buffer payload) {
  zmq::socket_t& s = peer(to).socket(channel);
  // All frames or none: once ZeroMQ took the first frame of a multipart message, it takes the
  // rest without blocking.
  if (!s.send(zmq::buffer(&header, sizeof header),
              zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
    return false;
  }
  (void)s.send(zmq::buffer(sender), zmq::send_flags::sndmore);
  (void)s.send(frame_of(std::move(payload)), zmq::send_flags::none);
  return true;
}

bool ZmqTransport::try_receive(Message& out) {
  while (true) {
    zmq::message_t id;
    if (!router_->recv(id, zmq::recv_flags::dontwait)) return false;
    std::vector<zmq::message_t> frames;
    while (router_->get(zmq::sockopt::rcvmore)) {
      zmq::message_t f;
      (void)router_->recv(f, zmq::recv_flags::none);  // the rest of a multipart is already here
      frames.push_back(std::move(f));
    }
    if (frames.size() != 3) continue;
    auto header = parse_header({static_cast<const uint8_t*>(frames[0].data()), frames[0].size()});
    if (!header) continue;
    out.header = *header;
    out.sender = frames[1].to_string();
    auto body = std::make_shared<zmq::message_t>(std::move(frames[2]));
    out.payload.data = static_cast<const uint8_t*>(body->data());
    out.payload.size = body->size();
    out.payload.owner = std::move(body);
    return true;
  }
}

PeerEvent ZmqTransport::take_event(const std::string& endpoint) {
  auto it = peers_.find(endpoint);
  if (it == peers_.end()) return PeerEvent::none;
  PeerEvent a = drain_monitor(it->second->data.monitor.get());
  PeerEvent b = drain_monitor(it->second->control.monitor.get());
  if (a == PeerEvent::closed || b == PeerEvent::closed) return PeerEvent::closed;
  if (a == PeerEvent::refused || b == PeerEvent::refused) return PeerEvent::refused;
  return PeerEvent::none;
}

void ZmqTransport::wait(std::span<const std::string> writable, std::chrono::milliseconds limit) {
  std::vector<zmq_pollitem_t> items;
  items.push_back({static_cast<void*>(*router_), 0, ZMQ_POLLIN, 0});
  for (auto& [ep, p] : peers_) {
    for (Monitored* d : {&p->data, &p->control})
      if (d->monitor) items.push_back({static_cast<void*>(*d->monitor), 0, ZMQ_POLLIN, 0});
  }
  for (const std::string& ep : writable)
    items.push_back({static_cast<void*>(peer(ep).socket(Channel::data)), 0, ZMQ_POLLOUT, 0});
  zmq::poll(items.data(), items.size(), limit);
}

void ZmqTransport::drop_all() {
  // Linger 0: ZeroMQ drops the queues and the message it was writing within milliseconds,
  // even towards a frozen peer.
  set_linger_on_close(std::chrono::milliseconds(0));
  peers_.clear();
}

}  // namespace loco::collective::detail
