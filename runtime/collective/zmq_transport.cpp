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
// How long a connection accepted by a member's ROUTER may take to finish its handshake.
constexpr int kAcceptedHandshakeMs = 60000;

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

// How a DEALER of a member behind NAT also receives: it names itself (`routing_id`) so that
// the ROUTER at its other end (a reachable peer's, or the relay's) can address it, and it takes
// frames of at most `max_frame_bytes` (0: no bound), `rcvhwm` of them queued. Empty routing id:
// a DEALER that only sends, as every DEALER of a reachable member.
struct Receiving {
  std::string routing_id;
  size_t max_frame_bytes = 0;
  int rcvhwm = 0;
  const std::string* server_key = nullptr;  // the relay's CURVE key; nullptr: the cluster's
};

// ZeroMQ checks a frame's size as it travels: under CURVE, encrypted in a MESSAGE command, a
// few dozen bytes longer; through a relay, sealed (seal.hpp), 48 bytes longer.
constexpr size_t kFrameSlack = 4096;

Monitored open_dealer(zmq::context_t& ctx, const std::string& endpoint, int sndhwm, bool thin,
                      const std::string& monitor_endpoint, const security::Settings& security,
                      const Receiving& receiving = {}) {
  Monitored d;
  d.thin = thin;
  d.socket = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  if (receiving.server_key)
    security::make_client_of(*d.socket, security, *receiving.server_key);
  else
    security::make_client(*d.socket, security);
  if (!receiving.routing_id.empty()) {
    d.socket->set(zmq::sockopt::routing_id, zmq::buffer(receiving.routing_id));
    if (receiving.max_frame_bytes > 0) {
      d.socket->set(zmq::sockopt::maxmsgsize,
                    static_cast<int64_t>(receiving.max_frame_bytes + kFrameSlack));
    }
    d.socket->set(zmq::sockopt::rcvhwm, receiving.rcvhwm);
  }
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

// The two DEALERs to the group's relay, shared by every relayed peer.
struct ZmqTransport::Relayed {
  Monitored data;
  Monitored control;
  zmq::socket_t& socket(Channel c) { return *(c == Channel::data ? data : control).socket; }
  void set_linger(std::chrono::milliseconds linger) {
    data.socket->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    control.socket->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
  }
};

namespace {
// Bounds on the relayed messages kept until their sender's key is known.
constexpr size_t kMaxPending = 1024;
constexpr size_t kMaxPendingBytes = size_t(64) << 20;
// Routing ids: a letter per channel, then the member's endpoint (ZeroMQ allows 255 bytes).
constexpr size_t kMaxRoutingId = 255;
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
                           size_t max_frame_bytes, bool outbound_only)
    : ctx_(std::move(context)),
      security_(std::move(security)),
      outbound_only_(outbound_only),
      reachable_(!outbound_only),
      max_frame_bytes_(max_frame_bytes),
      kx_(KxKeyPair::generate()) {
  if (max_frame_bytes > 0)
    rcvhwm_ = static_cast<int>(std::clamp<size_t>((size_t(64) << 20) / max_frame_bytes, 16, 4096));
  if (outbound_only_) {
    // Nothing to bind: peers know this member by a name, and reach it over its connections.
    endpoint_ = "nat://" + kx_.public_hex();
    return;
  }
  zap_ = security::zap_handler_for(*ctx_, security_, security::Admit::members);
  router_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router);
  security::make_server(*router_, security_);
  router_->set(zmq::sockopt::linger, 0);
  // Bounded, unlike the DEALERs' (open_dealer): a connection accepted here that has not
  // finished its handshake in 60 s (an idle one of someone without the key) is closed. A
  // member's own that waited that long behind data is dialled again by its DEALER.
  router_->set(zmq::sockopt::handshake_ivl, kAcceptedHandshakeMs);
  if (max_frame_bytes > 0)
    router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_frame_bytes + kFrameSlack));
  router_->set(zmq::sockopt::rcvhwm, rcvhwm_);
  // The ROUTER sends only to members behind NAT, over their connections: an unknown one (not
  // connected yet) must be an error that try_send reports as a full queue, not a silent drop.
  router_->set(zmq::sockopt::router_mandatory, true);
  // Such a member that reconnects (after a failed operation closed its DEALERs) takes its
  // routing id over from the connection it left.
  router_->set(zmq::sockopt::router_handover, true);
  router_->set(zmq::sockopt::sndhwm, 16);
  std::string ep = bind_endpoint;
  if (ep.starts_with("tcp://") && ep.ends_with(":0")) ep = ep.substr(0, ep.size() - 1) + "*";
  try {
    router_->bind(ep);
  } catch (const zmq::error_t& e) {
    throw CollectiveError("collective: cannot bind the data socket to " + bind_endpoint + ": " +
                          e.what());
  }
  endpoint_ = router_->get(zmq::sockopt::last_endpoint);
  source_limit_.emplace(*ctx_, *router_, security::kMaxConnectionsPerSource,
                        "collective " + endpoint_);
}

ZmqTransport::~ZmqTransport() = default;

void ZmqTransport::set_linger_on_close(std::chrono::milliseconds linger) {
  for (auto& [ep, p] : peers_) p->set_linger(linger);
  if (relay_) relay_->set_linger(linger);
}

bool ZmqTransport::releases_sent_payloads(const std::string& peer) const {
  // Behind NAT our connections stay open after a failure (drop_all): nothing may point into
  // the caller's input.
  if (!reachable_) return route_of(peer) == Route::relay;
  switch (route_of(peer)) {
    case Route::relay:
      return true;  // sealed into a copy before try_send returns
    case Route::reverse:
      return false;  // the ROUTER's queue is not dropped with our connections (drop_all)
    case Route::direct:
      break;
  }
  // Over inproc the receiving socket itself would hold our message until it is read.
  return peer.starts_with("tcp://") || peer.starts_with("ipc://");
}

ZmqTransport::Route ZmqTransport::route_of(const std::string& endpoint) const {
  auto it = info_.find(endpoint);
  return it == info_.end() ? Route::direct : it->second.route;
}

std::string ZmqTransport::routing_id(Channel c, const std::string& endpoint) const {
  return (c == Channel::data ? "D" : "C") + endpoint;
}

void ZmqTransport::describe(const Group& group) {
  const int k = static_cast<int>(group.members.size());
  if (group.rank < 0 || group.rank >= k) return;  // the operation's own check names it
  const Member& self = group.members[group.rank];
  if (outbound_only_ && self.reachable) {
    throw CollectiveError("collective: member " + self.name +
                          " is outbound-only (Options::outbound_only) but the group describes it "
                          "as reachable; set Member::reachable = false for it");
  }
  const bool reachable = self.reachable && !outbound_only_;
  if (reachable != reachable_) {
    // Our DEALERs name themselves only when we are unreachable: open them anew.
    set_linger_on_close(std::chrono::milliseconds(0));
    peers_.clear();
    relay_.reset();
    reachable_ = reachable;
  }
  if (!reachable_ && routing_id(Channel::data, endpoint_).size() > kMaxRoutingId) {
    throw CollectiveError("collective: endpoint " + endpoint_ +
                          " is too long to name a member behind NAT (at most 254 bytes)");
  }
  if (group.relay.endpoint != relay_at_.endpoint || group.relay.public_key != relay_at_.public_key) {
    if (relay_) relay_->set_linger(std::chrono::milliseconds(0));
    relay_.reset();
    relay_at_ = group.relay;
  }
  for (int p = 0; p < k; ++p)
    if (p != group.rank) describe_peer(group, self, group.members[p]);
}

void ZmqTransport::describe_peer(const Group& group, const Member& self, const Member& m) {
  const Route route = m.reachable ? Route::direct : reachable_ ? Route::reverse : Route::relay;
  PeerInfo& info = info_[m.endpoint];
  info.name = m.name;
  info.route = route;
  if (route == Route::direct) return;
  if (routing_id(Channel::data, m.endpoint).size() > kMaxRoutingId) {
    throw CollectiveError("collective: member " + m.name + "'s endpoint " + m.endpoint +
                              " is too long to name a member behind NAT (at most 254 bytes)",
                          m.name);
  }
  if (route == Route::reverse) return;
  if (group.relay.endpoint.empty()) {
    throw CollectiveError("collective: members " + self.name + " and " + m.name +
                              " are both unreachable (Member::reachable false) and the group "
                              "names no relay (Group::relay); start one with `loco relay`",
                          m.name);
  }
  if (security_.curve && group.relay.public_key.size() != 40) {
    throw CollectiveError("collective: the group's relay " + group.relay.endpoint +
                          " has no CURVE public key (Group::relay.public_key, 40 Z85 characters)");
  }
  if (info.keys && info.kx_public == m.kx_public) return;
  auto theirs = parse_kx_public(m.kx_public);
  std::optional<SessionKeys> keys;
  if (theirs) keys = session_keys(kx_, *theirs);
  if (!keys) {
    throw CollectiveError("collective: member " + m.name +
                              " has no usable key-exchange key (Member::kx_public, 64 hex "
                              "characters of its Communicator::kx_public()), needed to "
                              "exchange through the relay",
                          m.name);
  }
  info.keys = keys;
  info.kx_public = m.kx_public;
  info.sent[0] = info.sent[1] = 0;
  info.opened[0] = info.opened[1] = 0;
  pending_dirty_ = true;
}

std::string ZmqTransport::monitor_endpoint() {
  return "inproc://loco-collective-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(this)) +
         "-" + std::to_string(++monitor_serial_);
}

ZmqTransport::Relayed& ZmqTransport::relay() {
  if (relay_) return *relay_;
  auto receiving = [&](Channel c) {
    return Receiving{.routing_id = routing_id(c, endpoint_),
                     .max_frame_bytes = max_frame_bytes_,
                     .rcvhwm = rcvhwm_,
                     .server_key = &relay_at_.public_key};
  };
  relay_ = std::make_unique<Relayed>(
      Relayed{.data = open_dealer(*ctx_, relay_at_.endpoint, 4, false, monitor_endpoint(), security_,
                                  receiving(Channel::data)),
              .control = open_dealer(*ctx_, relay_at_.endpoint, 64, true, monitor_endpoint(), security_,
                                     receiving(Channel::control))});
  return *relay_;
}

ZmqTransport::Peer& ZmqTransport::peer(const std::string& endpoint) {
  auto it = peers_.find(endpoint);
  if (it != peers_.end()) return *it->second;
  // Behind NAT, the peer answers over these connections: they name themselves.
  auto receiving = [&](Channel c) {
    if (reachable_) return Receiving{};
    return Receiving{
        .routing_id = routing_id(c, endpoint_), .max_frame_bytes = max_frame_bytes_, .rcvhwm = rcvhwm_};
  };
  // A short data queue in ZeroMQ (the kernel's socket buffer holds more): what waits, waits
  // in the schedule's outbox, where all-gather results overtake reduce-scatter chunks.
  auto p = std::make_unique<Peer>(
      Peer{.data = open_dealer(*ctx_, endpoint, 4, false, monitor_endpoint(), security_,
                               receiving(Channel::data)),
           .control = open_dealer(*ctx_, endpoint, 64, true, monitor_endpoint(), security_,
                                  receiving(Channel::control))});
  return *peers_.emplace(endpoint, std::move(p)).first->second;
}

void ZmqTransport::keep_only(std::span<const std::string> keep, std::chrono::milliseconds linger) {
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (std::find(keep.begin(), keep.end(), it->first) == keep.end() ||
        route_of(it->first) != Route::direct) {
      it->second->set_linger(linger);
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& ep : keep) {
    switch (route_of(ep)) {
      case Route::direct:
        (void)peer(ep);
        break;
      case Route::relay:
        (void)relay();
        break;
      case Route::reverse:
        break;  // the peer connects to us
    }
  }
}

bool ZmqTransport::try_send(const std::string& to, Channel channel, const Header& header,
                            const std::string& sender, Buffer payload) {
  const Route route = route_of(to);
  if (route == Route::reverse) {
    // Over the peer's own connection. Not connected yet (or gone): EHOSTUNREACH, which waits
    // like a full queue; liveness judges a peer that never connects.
    const std::string id = routing_id(channel, to);
    try {
      if (!router_ || !router_->send(zmq::buffer(id), zmq::send_flags::dontwait |
                                                          zmq::send_flags::sndmore)) {
        return false;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return false;
      throw;
    }
    (void)router_->send(zmq::buffer(&header, sizeof header), zmq::send_flags::sndmore);
    (void)router_->send(zmq::buffer(sender), zmq::send_flags::sndmore);
    (void)router_->send(frame_of(std::move(payload)), zmq::send_flags::none);
    return true;
  }
  if (route == Route::relay) {
    PeerInfo& info = info_[to];
    const int c = channel == Channel::data ? 0 : 1;
    std::vector<uint8_t> sealed =
        seal(*info.keys, info.sent[c], static_cast<uint8_t>(c),
             {reinterpret_cast<const uint8_t*>(&header), sizeof header}, sender, payload.bytes());
    zmq::socket_t& s = relay().socket(channel);
    if (!s.send(zmq::buffer(routing_id(channel, to)),
                zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
      return false;
    }
    ++info.sent[c];
    (void)s.send(zmq::buffer(&header, sizeof header), zmq::send_flags::sndmore);
    (void)s.send(zmq::buffer(sender), zmq::send_flags::sndmore);
    (void)s.send(zmq::message_t(sealed.data(), sealed.size()), zmq::send_flags::none);
    return true;
  }
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

void ZmqTransport::note_link(const void* frame, Message& out) {
  // The connection it came on: ZeroMQ tells its file descriptor (-1 for inproc).
  out.link = 0;
  const int fd = zmq_msg_get(const_cast<zmq_msg_t*>(static_cast<const zmq_msg_t*>(frame)),
                             ZMQ_SRCFD);
  if (fd < 0) return;
  auto it = links_.find(fd);
  if (it == links_.end()) {
    std::string a = peer_address(fd);
    if (!a.empty()) it = links_.emplace(fd, std::move(a)).first;
  }
  if (it != links_.end()) out.link = static_cast<uint64_t>(fd) + 1;
}

// One message from `s`: [routing id,] header, sender, payload; through the relay the routing
// id is the sender's, as the relay says, and the payload is sealed. False when none is waiting.
bool ZmqTransport::take_from(zmq::socket_t& s, bool has_routing_id, bool relayed, Message& out) {
  constexpr size_t kMaxFrames = 8;
  const size_t want = has_routing_id ? 4 : 3;
  while (true) {
    std::vector<zmq::message_t> frames(1);
    if (!s.recv(frames[0], zmq::recv_flags::dontwait)) return false;
    while (s.get(zmq::sockopt::rcvmore)) {
      zmq::message_t f;
      (void)s.recv(f, zmq::recv_flags::none);  // the rest of a multipart is already here
      if (frames.size() < kMaxFrames) frames.push_back(std::move(f));
    }
    if (frames.size() != want) continue;
    if (relayed) {
      std::vector<std::string> parts;
      for (auto& f : frames) parts.push_back(f.to_string());
      if (open_relayed(parts, true, out)) return true;
      continue;
    }
    note_link(frames[0].handle(), out);
    const size_t h = has_routing_id ? 1 : 0;
    auto header = parse_header({static_cast<const uint8_t*>(frames[h].data()), frames[h].size()});
    if (!header) continue;
    out.header = *header;
    out.sender = frames[h + 1].to_string();
    out.forged = false;
    auto body = std::make_shared<zmq::message_t>(std::move(frames[h + 2]));
    out.payload.data = static_cast<const uint8_t*>(body->data());
    out.payload.size = body->size();
    out.payload.owner = std::move(body);
    return true;
  }
}

// frames: the sender's routing id (as the relay says), header, sender name, sealed payload.
bool ZmqTransport::open_relayed(std::vector<std::string>& frames, bool queue_if_unknown,
                                Message& out) {
  const std::string& id = frames[0];
  if (id.size() < 2 || (id[0] != 'D' && id[0] != 'C')) {
    ++unauthentic_;
    return false;
  }
  const int c = id[0] == 'D' ? 0 : 1;
  auto it = info_.find(id.substr(1));
  if (it == info_.end() || it->second.route != Route::relay || !it->second.keys) {
    // Perhaps a peer that began an operation we have not been told of yet: kept, bounded.
    size_t bytes = 0;
    for (const auto& f : frames) bytes += f.size();
    if (queue_if_unknown && pending_.size() < kMaxPending &&
        pending_bytes_ + bytes <= kMaxPendingBytes) {
      pending_bytes_ += bytes;
      pending_.push_back(std::move(frames));
    } else {
      ++unauthentic_;
    }
    return false;
  }
  PeerInfo& info = it->second;
  const std::string& hdr = frames[1];
  const std::span<const uint8_t> header_bytes{reinterpret_cast<const uint8_t*>(hdr.data()),
                                              hdr.size()};
  const std::span<const uint8_t> sealed{reinterpret_cast<const uint8_t*>(frames[3].data()),
                                        frames[3].size()};
  auto plain = std::make_shared<std::vector<uint8_t>>();
  uint64_t sequence = 0;
  const bool ok = frames[2] == info.name &&
                  open(*info.keys, static_cast<uint8_t>(c), header_bytes, frames[2], sealed,
                       sequence, *plain) &&
                  sequence >= info.opened[c];
  auto header = parse_header(header_bytes);
  out = Message{};
  out.sender = info.name;
  if (!ok || !header) {
    // Forged, tampered with or replayed on its way: never decoded, and the operation that
    // gets it fails naming the member it claims to come from.
    ++unauthentic_;
    out.forged = true;
    if (header) out.header = *header;
    return true;
  }
  info.opened[c] = sequence + 1;
  out.header = *header;
  out.payload.data = plain->data();
  out.payload.size = plain->size();
  out.payload.owner = std::move(plain);
  return true;
}

bool ZmqTransport::try_receive(Message& out) {
  if (pending_dirty_) {
    // Relayed messages that waited for their sender's key, in their order.
    std::deque<std::vector<std::string>> waiting;
    waiting.swap(pending_);
    pending_bytes_ = 0;
    pending_dirty_ = false;
    bool got = false;
    while (!waiting.empty()) {
      std::vector<std::string> frames = std::move(waiting.front());
      waiting.pop_front();
      if (!got) {
        got = open_relayed(frames, true, out);
      } else {
        size_t bytes = 0;
        for (const auto& f : frames) bytes += f.size();
        pending_bytes_ += bytes;
        pending_.push_back(std::move(frames));
        pending_dirty_ = true;  // more may open now
      }
    }
    if (got) return true;
  }
  // Every socket that receives, taking turns so that none starves the others: the ROUTER, the
  // DEALERs to reachable peers when we are behind NAT, the relay's.
  struct Source {
    zmq::socket_t* s;
    bool has_routing_id;
    bool relayed;
  };
  std::vector<Source> sources;
  if (router_) sources.push_back({router_.get(), true, false});
  if (!reachable_) {
    for (auto& [ep, p] : peers_) {
      sources.push_back({p->data.socket.get(), false, false});
      sources.push_back({p->control.socket.get(), false, false});
    }
  }
  if (relay_) {
    sources.push_back({relay_->data.socket.get(), true, true});
    sources.push_back({relay_->control.socket.get(), true, true});
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    const Source& src = sources[(next_receiver_ + i) % sources.size()];
    if (take_from(*src.s, src.has_routing_id, src.relayed, out)) {
      next_receiver_ = (next_receiver_ + i + 1) % sources.size();
      return true;
    }
  }
  return false;
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

void ZmqTransport::drain_relay_events() {
  if (!relay_) return;
  drain_monitor(relay_->data);
  drain_monitor(relay_->control);
  const PeerEvent a = std::exchange(relay_->data.seen, PeerEvent::none);
  const PeerEvent b = std::exchange(relay_->control.seen, PeerEvent::none);
  // Refused: the relay is down (restarting); what this operation sends waits in our queue until
  // it is back, and the peers' windows judge a relay that stays away. Closed: the relay lost
  // what it held. (Failing on a refusal failed each redo of a round at once while the relay was
  // down for 2 s, using up the round's redos: the soak bench.)
  if (a != PeerEvent::closed && b != PeerEvent::closed) return;
  // The relay's connection carries every relayed peer: what happens to it happens to them all.
  // Not that they are gone: the relay lost what it held for them and from them.
  for (auto& [ep, info] : info_) {
    if (info.route == Route::relay) info.relay_event = PeerEvent::relay_lost;
  }
}

PeerEvent ZmqTransport::take_event(const std::string& endpoint) {
  switch (route_of(endpoint)) {
    case Route::reverse:
      return PeerEvent::none;  // its connections are its own: only its silence tells
    case Route::relay:
      drain_relay_events();
      return std::exchange(info_[endpoint].relay_event, PeerEvent::none);
    case Route::direct:
      break;
  }
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
  if (route_of(endpoint) != Route::direct) return false;  // cannot tell
  auto it = peers_.find(endpoint);
  if (it == peers_.end()) return false;
  Peer& p = *it->second;
  if (p.queued->load() > 0) return true;
  drain_monitor(p.data);
  return unacknowledged(p.data) > 0;
}

void ZmqTransport::wait(std::span<const std::string> writable, std::chrono::milliseconds limit) {
  std::vector<zmq_pollitem_t> items;
  if (router_) items.push_back({static_cast<void*>(*router_), 0, ZMQ_POLLIN, 0});
  for (auto& [ep, p] : peers_) {
    for (Monitored* d : {&p->data, &p->control}) {
      if (d->monitor) items.push_back({static_cast<void*>(*d->monitor), 0, ZMQ_POLLIN, 0});
      if (!reachable_) items.push_back({static_cast<void*>(*d->socket), 0, ZMQ_POLLIN, 0});
    }
  }
  if (relay_) {
    for (Monitored* d : {&relay_->data, &relay_->control}) {
      if (d->monitor) items.push_back({static_cast<void*>(*d->monitor), 0, ZMQ_POLLIN, 0});
      items.push_back({static_cast<void*>(*d->socket), 0, ZMQ_POLLIN, 0});
    }
  }
  for (const std::string& ep : writable) {
    switch (route_of(ep)) {
      case Route::direct:
        items.push_back({static_cast<void*>(peer(ep).socket(Channel::data)), 0, ZMQ_POLLOUT, 0});
        break;
      case Route::relay:
        items.push_back({static_cast<void*>(relay().socket(Channel::data)), 0, ZMQ_POLLOUT, 0});
        break;
      case Route::reverse:
        // A ROUTER cannot say whether one peer's queue has room: look again soon.
        limit = std::min(limit, std::chrono::milliseconds(5));
        break;
    }
  }
  if (pending_dirty_) limit = std::chrono::milliseconds(0);
  zmq::poll(items.data(), items.size(), limit);
}

void ZmqTransport::drop_all() {
  // Linger 0: ZeroMQ drops the queues and the message it was writing within milliseconds,
  // even towards a frozen peer.
  if (!reachable_) {
    // Behind NAT, peers send to us over these connections, by routing id: one closed and
    // opened again would race with what they send meanwhile (a ROUTER may still route to the
    // closing one, and that is lost while keepalives on the new one say all is well). So they
    // stay; what is queued on them are copies (releases_sent_payloads), of an operation that
    // its receivers will drop as past.
    return;
  }
  set_linger_on_close(std::chrono::milliseconds(0));
  peers_.clear();
  relay_.reset();
}

}  // namespace loco::collective::detail
