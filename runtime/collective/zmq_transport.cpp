#include "runtime/collective/zmq_transport.hpp"

#include <linux/sockios.h>  // SIOCOUTQ
#include <linux/tcp.h>      // struct tcp_info with tcpi_bytes_received (glibc's lacks it)
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "runtime/security/curve.hpp"

namespace loco::collective::detail {
namespace {

// Who is at the other end of TCP connection `fd` ("" if it is none).
std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return {};
  if (a.ss_family != AF_INET && a.ss_family != AF_INET6) return {};
  return std::string(reinterpret_cast<const char*>(&a), len);
}

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

// A DEALER whose monitor reports dropped and refused connections, and for a thin one (the
// control channel: keepalives, aborts) new ones too.
//
// ZeroMQ's I/O thread sends monitor events with a blocking send: to a monitor whose reader is
// gone, or whose queue is full, it would block that thread for good, and with it every
// connection of this communicator (nothing sent, nothing accepted; seen as a member that all
// its peers lose, attempt after attempt). So the reader's queue is unbounded (an event is a
// few bytes; a dead peer's reconnects make two a second), and ZeroMQ stops monitoring before
// the reader closes.
struct Monitored {
  std::unique_ptr<zmq::socket_t> socket;
  std::unique_ptr<zmq::socket_t> monitor;
  bool thin = false;
  PeerEvent seen = PeerEvent::none;  // since take_event() last looked
  int fd = -1;                       // the connection, as its CONNECTED event said
  std::string fd_peer;               // who was at its other end then

  Monitored() = default;
  Monitored(Monitored&&) = default;  // the moved-from one has no socket: its stop is a no-op
  Monitored& operator=(Monitored&&) = delete;
  ~Monitored() { stop_monitor(); }

  void stop_monitor() {
    if (socket && monitor) (void)zmq_socket_monitor(socket->handle(), nullptr, 0);
    monitor.reset();
  }
};

Monitored open_dealer(zmq::context_t& ctx, const std::string& endpoint, int sndhwm, bool thin,
                      const std::string& monitor_endpoint, const security::Settings& security) {
  Monitored d;
  d.thin = thin;
  d.socket = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  security::make_client(*d.socket, security);
  d.socket->set(zmq::sockopt::linger, 0);
  // No limit on ZeroMQ's handshake: on a saturated link of 1 Mbit/s the few bytes of a new
  // connection's handshake can wait behind data for more than its default 30 s, and ZeroMQ
  // then closes a connection to a live peer. Liveness (liveness.hpp) judges a peer that never
  // answers.
  d.socket->set(zmq::sockopt::handshake_ivl, 0);
  d.socket->set(zmq::sockopt::sndhwm, sndhwm);
  d.socket->set(zmq::sockopt::reconnect_ivl, 50);
  d.socket->set(zmq::sockopt::reconnect_ivl_max, 500);
  const int events = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_CONNECTED;
  if (zmq_socket_monitor(d.socket->handle(), monitor_endpoint.c_str(), events) == 0) {
    d.monitor = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
    d.monitor->set(zmq::sockopt::linger, 0);
    d.monitor->set(zmq::sockopt::rcvhwm, 0);  // with it 0, the inproc pipe has no limit
    d.monitor->connect(monitor_endpoint);
  }
  d.socket->connect(endpoint);
  return d;
}

// Reads the monitor's events into `d`. A connection reported connected is remembered by its
// descriptor (the number is ZeroMQ's: the remote address, checked when it is used, says
// whether it still names that connection). A thin DEALER's connections resend a lost segment
// after one retransmission timeout each time instead of exponentially later (Linux's linear
// timeouts for thin streams), so that a saturated, lossy link does not hold keepalives back
// for many seconds.
void drain_monitor(Monitored& d) {
  zmq::socket_t* monitor = d.monitor.get();
  if (!monitor) return;
  zmq::message_t event, addr;
  while (monitor->recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)monitor->recv(addr, zmq::recv_flags::none);
    uint16_t id = 0;
    if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
    if (id == ZMQ_EVENT_CONNECTED && event.size() >= sizeof id + sizeof(int32_t)) {
      int32_t fd = -1;
      std::memcpy(&fd, static_cast<const uint8_t*>(event.data()) + sizeof id, sizeof fd);
      std::string who = fd >= 0 ? peer_address(fd) : std::string();
      if (!who.empty()) {
        d.fd = fd;
        d.fd_peer = std::move(who);
        const int on = 1;
        if (d.thin) (void)setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &on, sizeof on);
      }
    }
    if (id == ZMQ_EVENT_DISCONNECTED) {
      d.seen = PeerEvent::closed;
      d.fd = -1;
    }
    if (id == ZMQ_EVENT_CONNECT_RETRIED && d.seen == PeerEvent::none) d.seen = PeerEvent::refused;
  }
}

// Bytes in the kernel's send queue of `d`'s connection not yet acknowledged by the peer; 0
// when the connection is not known.
int unacknowledged(const Monitored& d) {
  if (d.fd < 0 || peer_address(d.fd) != d.fd_peer) return 0;
  int n = 0;
  if (ioctl(d.fd, SIOCOUTQ, &n) != 0) return 0;
  return n;
}

}  // namespace

struct ZmqTransport::Peer {
  Monitored data;
  Monitored control;
  // Data payloads handed to ZeroMQ and not yet released by it (written to the kernel or
  // dropped); shared with the release callbacks, which may run after the peer is closed.
  std::shared_ptr<std::atomic<int>> queued = std::make_shared<std::atomic<int>>(0);
  zmq::socket_t& socket(Channel c) { return *(c == Channel::data ? data : control).socket; }
  void set_linger(std::chrono::milliseconds linger) {
    data.socket->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    control.socket->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
  }
};

ZmqTransport::ZmqTransport(const std::string& bind_endpoint,
                           std::shared_ptr<zmq::context_t> context, security::Settings security,
                           size_t max_frame_bytes)
    : ctx_(std::move(context)),
      security_(std::move(security)),
      zap_(security::zap_handler_for(*ctx_, security_, security::Admit::members)),
      router_(std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router)) {
  security::make_server(*router_, security_);
  router_->set(zmq::sockopt::linger, 0);
  router_->set(zmq::sockopt::handshake_ivl, 0);  // as for the DEALERs (open_dealer)
  int rcvhwm = 4096;
  if (max_frame_bytes > 0) {
    // ZeroMQ checks the frame as it travels: under CURVE, encrypted in a MESSAGE command, a
    // few dozen bytes longer.
    constexpr size_t kCurveOverhead = 4096;
    router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_frame_bytes + kCurveOverhead));
    rcvhwm = static_cast<int>(std::clamp<size_t>((size_t(64) << 20) / max_frame_bytes, 16, 4096));
  }
  router_->set(zmq::sockopt::rcvhwm, rcvhwm);
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
  // A short data queue in ZeroMQ (the kernel's socket buffer holds more): what waits, waits
  // in the schedule's outbox, where all-gather results overtake reduce-scatter chunks.
  auto p = std::make_unique<Peer>(
      Peer{.data = open_dealer(*ctx_, endpoint, 4, false, monitor_ep(), security_),
           .control = open_dealer(*ctx_, endpoint, 64, true, monitor_ep(), security_)});
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
  Peer& p = peer(to);
  zmq::socket_t& s = p.socket(channel);
  // All frames or none: once ZeroMQ took the first frame of a multipart message, it takes the
  // rest without blocking.
  if (!s.send(zmq::buffer(&header, sizeof header),
              zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
    return false;
  }
  (void)s.send(zmq::buffer(sender), zmq::send_flags::sndmore);
  if (channel == Channel::data && payload.owner) {
    // Counted until ZeroMQ lets go of it (undelivered()).
    p.queued->fetch_add(1);
    const void* held = payload.owner.get();
    payload.owner =
        std::shared_ptr<const void>(held, [owner = std::move(payload.owner), queued = p.queued](
                                              const void*) { queued->fetch_sub(1); });
  }
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
    // The connection it came on: ZeroMQ tells its file descriptor (-1 for inproc).
    out.link = 0;
    const int fd = zmq_msg_get(id.handle(), ZMQ_SRCFD);  // -1 (EINVAL) for inproc
    if (fd >= 0) {
      auto it = links_.find(fd);
      if (it == links_.end()) {
        std::string a = peer_address(fd);
        if (!a.empty()) it = links_.emplace(fd, std::move(a)).first;
      }
      if (it != links_.end()) out.link = static_cast<uint64_t>(fd) + 1;
    }
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

uint64_t ZmqTransport::link_bytes(uint64_t link) {
  if (link == 0) return 0;
  const int fd = static_cast<int>(link - 1);
  auto it = links_.find(fd);
  if (it == links_.end()) return 0;
  // The descriptor belongs to ZeroMQ's I/O thread: once the connection closes, the number may
  // name another socket. The same remote address says it is still ours.
  tcp_info info{};
  socklen_t len = sizeof info;
  if (peer_address(fd) != it->second || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received) {
    links_.erase(it);
    return 0;
  }
  return info.tcpi_bytes_received;
}

PeerEvent ZmqTransport::take_event(const std::string& endpoint) {
  auto it = peers_.find(endpoint);
  if (it == peers_.end()) return PeerEvent::none;
  Monitored& data = it->second->data;
  Monitored& control = it->second->control;
  drain_monitor(data);
  drain_monitor(control);
  const PeerEvent a = std::exchange(data.seen, PeerEvent::none);
  const PeerEvent b = std::exchange(control.seen, PeerEvent::none);
  if (a == PeerEvent::closed || b == PeerEvent::closed) return PeerEvent::closed;
  if (a == PeerEvent::refused || b == PeerEvent::refused) return PeerEvent::refused;
  return PeerEvent::none;
}

bool ZmqTransport::undelivered(const std::string& endpoint) {
  auto it = peers_.find(endpoint);
  if (it == peers_.end()) return false;
  Peer& p = *it->second;
  if (p.queued->load() > 0) return true;
  drain_monitor(p.data);
  return unacknowledged(p.data) > 0;
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
