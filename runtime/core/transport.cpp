#include "runtime/core/transport.hpp"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include "runtime/core/errors.hpp"
#include "runtime/core/util.hpp"

namespace loco::detail {
namespace {

constexpr int kHighWaterMark = 200000;

void send_frames(zmq::socket_t& s, std::vector<zmq::message_t>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    auto flags = zmq::send_flags::dontwait;
    if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
    if (!s.send(frames[i], flags)) throw zmq::error_t();  // EAGAIN: queue full
  }
}

bool recv_frames(zmq::socket_t& s, std::vector<zmq::message_t>& frames) {
  frames.clear();
  while (true) {
    zmq::message_t m;
    if (!s.recv(m, zmq::recv_flags::dontwait)) return !frames.empty();
    bool more = m.more();
    frames.push_back(std::move(m));
    if (!more) return true;
  }
}

std::string strip_tcp(const std::string& endpoint) {
  const std::string prefix = "tcp://";
  return endpoint.rfind(prefix, 0) == 0 ? endpoint.substr(prefix.size()) : endpoint;
}

}  // namespace

Transport::Transport(Options opts, InboundFn inbound, ReplyFn reply, TickFn tick)
    : opts_(std::move(opts)),
      inbound_(std::move(inbound)),
      reply_(std::move(reply)),
      tick_(std::move(tick)),
      ctx_(1) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  zap_ = security::zap_handler_for(ctx_, opts_.security);
  if (!opts_.bind.empty()) {
    router_.emplace(ctx_, zmq::socket_type::router);
    security::make_server(*router_, opts_.security);
    router_->set(zmq::sockopt::router_mandatory, 1);
    router_->set(zmq::sockopt::linger, 0);
    router_->set(zmq::sockopt::sndhwm, kHighWaterMark);
    router_->set(zmq::sockopt::rcvhwm, kHighWaterMark);
    router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(opts_.max_frame_bytes));
    try {
      router_->bind(opts_.bind);
    } catch (const zmq::error_t& e) {
      throw ClusterError("cannot bind " + opts_.bind + ": " + e.what());
    }
    bound_address_ = strip_tcp(router_->get(zmq::sockopt::last_endpoint));
    source_limit_.emplace(ctx_, *router_, opts_.max_connections_per_source,
                          "port " + bound_address_);
  }
  thread_ = std::thread([this] { run(); });
}

Transport::~Transport() { stop(); }

void Transport::stop() {
  if (stop_.exchange(true)) return;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  dealers_.clear();
  connections_ = 0;
  source_limit_.reset();
  router_.reset();
  zap_.reset();
  ::close(wake_fd_);
}

void Transport::enqueue(Outgoing&& out) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = queue_.empty();
    queue_.push_back(std::move(out));
  }
  if (was_empty) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
}

void Transport::send_to_peer(const std::string& peer, std::vector<zmq::message_t>&& frames) {
  enqueue(Outgoing{Outgoing::Op::Peer, peer, zmq::message_t(), std::move(frames)});
}

void Transport::reply(zmq::message_t&& routing_id, std::vector<zmq::message_t>&& frames) {
  enqueue(Outgoing{Outgoing::Op::Reply, {}, std::move(routing_id), std::move(frames)});
}

void Transport::drop_peer(const std::string& peer) {
  enqueue(Outgoing{Outgoing::Op::Drop, peer, zmq::message_t(), {}});
}

namespace {
constexpr std::string_view kOnDealer{"\0loco-dealer:", 13};
}  // namespace

zmq::message_t Transport::on_dealer(const std::string& peer) {
  std::string id(kOnDealer);
  id += peer;
  return zmq::message_t(id.data(), id.size());
}

std::string Transport::dealer_of(const zmq::message_t& routing_id) {
  std::string_view id(static_cast<const char*>(routing_id.data()), routing_id.size());
  if (id.size() <= kOnDealer.size() || id.substr(0, kOnDealer.size()) != kOnDealer) return {};
  return std::string(id.substr(kOnDealer.size()));
}

Transport::Dealer::~Dealer() {
  // ZeroMQ stops reporting before the reader closes (see runtime/collective/zmq_transport.cpp).
  if (monitor) (void)zmq_socket_monitor(socket.handle(), nullptr, 0);
}

zmq::socket_t& Transport::dealer_for(const std::string& peer) {
  auto it = dealers_.find(peer);
  if (it != dealers_.end()) return it->second->socket;
  auto d = std::make_unique<Dealer>(ctx_);
  zmq::socket_t& s = d->socket;
  security::make_client(s, opts_.security);
  {  // with or without CURVE: a plain caller learns that the peer wants CURVE
    const std::string ep = "inproc://loco-transport-monitor-" +
                           std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                           std::to_string(++monitor_serial_);
    const bool forwarded = peer.find('/') != std::string::npos;
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                       (forwarded ? ZMQ_EVENT_DISCONNECTED : 0);
    if (zmq_socket_monitor(s.handle(), ep.c_str(), events) == 0) {
      d->monitor.emplace(ctx_, zmq::socket_type::pair);
      d->monitor->set(zmq::sockopt::linger, 0);
      d->monitor->set(zmq::sockopt::rcvhwm, 0);  // unbounded: ZeroMQ's send to it blocks
      d->monitor->connect(ep);
    }
  }
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, kHighWaterMark);
  s.set(zmq::sockopt::rcvhwm, kHighWaterMark);
  s.set(zmq::sockopt::reconnect_ivl, 100);
  s.set(zmq::sockopt::reconnect_ivl_max, 1000);
  s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(opts_.max_frame_bytes));
  // "HOST:PORT/NODE": a connection of its own to HOST:PORT, the head that forwards to NODE.
  s.connect("tcp://" + peer.substr(0, peer.find('/')));
  dealers_changed_ = true;
  zmq::socket_t& made = dealers_.emplace(peer, std::move(d)).first->second->socket;
  connections_ = dealers_.size();
  return made;
}

void Transport::drain_monitor(const std::string& peer, Dealer& d) {
  zmq::message_t event, addr;
  while (d.monitor->recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)d.monitor->recv(addr, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    uint16_t id;
    int32_t value;
    std::memcpy(&id, event.data(), sizeof id);
    std::memcpy(&value, static_cast<const uint8_t*>(event.data()) + sizeof id, sizeof value);
    if (id == ZMQ_EVENT_DISCONNECTED) {
      if (opts_.on_forwarder_closed) opts_.on_forwarder_closed(peer);
      continue;
    }
    std::string why = security::describe_handshake_failure(id, value, opts_.security.curve);
    if (why.empty()) continue;
    // A failure without detail may be a peer that died mid-handshake: definitive only when it
    // repeats and the peer never answered.
    const bool definitive =
        id != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || (!d.answered && ++d.failures >= 3);
    if (definitive && opts_.on_handshake_failed) opts_.on_handshake_failed(peer, why);
  }
}

void Transport::flush_outgoing() {
  std::deque<Outgoing> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
  }
  for (Outgoing& out : batch) {
    try {
      switch (out.op) {
        case Outgoing::Op::Peer:
          send_frames(dealer_for(out.peer), out.frames);
          break;
        case Outgoing::Op::Reply: {
          if (std::string peer = dealer_of(out.routing_id); !peer.empty()) {
            out.peer = peer;
            send_frames(dealer_for(peer), out.frames);
            break;
          }
          if (!router_) break;
          // ROUTER_MANDATORY: an unknown routing id raises EHOSTUNREACH here.
          if (!router_->send(out.routing_id, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
            throw zmq::error_t();
          send_frames(*router_, out.frames);
          break;
        }
        case Outgoing::Op::Drop:
          if (dealers_.erase(out.peer)) dealers_changed_ = true;
          connections_ = dealers_.size();
          break;
      }
    } catch (const zmq::error_t& e) {
      const bool reply = out.op == Outgoing::Op::Reply;
      uint64_t held = 0;
      if (!(reply ? gone_caller_lines_ : undelivered_lines_).allow(now_ms(), &held)) continue;
      const std::string more =
          held ? " (" + std::to_string(held) + " more in the last 10 s not logged)" : "";
      if (reply)
        spdlog::warn("dropped a reply: its caller is gone ({}){}", e.what(), more);
      else
        spdlog::warn("dropped a message to {}: {}{}", out.peer, e.what(), more);
    }
  }
}

void Transport::run() {
  std::vector<zmq::pollitem_t> items;
  std::vector<std::string> item_peers;  // peer of items[i], "" for non-dealers
  std::vector<zmq::message_t> frames;
  int64_t last_tick = now_ms();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (dealers_changed_) {
      items.clear();
      item_peers.clear();
      items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
      item_peers.emplace_back();
      if (router_) {
        items.push_back({router_->handle(), 0, ZMQ_POLLIN, 0});
        item_peers.emplace_back();
      }
      for (auto& [peer, d] : dealers_) {
        items.push_back({d->socket.handle(), 0, ZMQ_POLLIN, 0});
        item_peers.push_back(peer);
        if (d->monitor) {
          items.push_back({d->monitor->handle(), 0, ZMQ_POLLIN, 0});
          item_peers.push_back(peer);
        }
      }
      dealers_changed_ = false;
    }
    int64_t now = now_ms();
    int64_t wait = std::max<int64_t>(0, last_tick + opts_.tick_ms - now);
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait));
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      [[maybe_unused]] auto n = ::read(wake_fd_, &v, sizeof v);
    }
    flush_outgoing();
    if (dealers_changed_) {
      // Poll items point at sockets that may have been closed: rebuild first.
      continue;
    }
    size_t first_dealer = 1;
    if (router_) {
      first_dealer = 2;
      if (items[1].revents & ZMQ_POLLIN) {
        // Bounded batch so that one busy caller cannot starve the others.
        for (int i = 0; i < 4096; ++i) {
          zmq::message_t rid;
          if (!router_->recv(rid, zmq::recv_flags::dontwait)) break;
          if (!rid.more()) continue;
          recv_frames(*router_, frames);
          security::Identity who;
          if (frames.empty())
            who.role = security::Role::client;
          else
            who = security::identity_of(frames[0], opts_.security.curve);
          inbound_(std::move(rid), std::move(frames), std::move(who));
          frames.clear();
        }
      }
    }
    for (size_t i = first_dealer; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      auto it = dealers_.find(item_peers[i]);
      if (it == dealers_.end()) continue;
      Dealer& d = *it->second;
      if (d.monitor && items[i].socket == d.monitor->handle()) {
        drain_monitor(item_peers[i], d);
        continue;
      }
      for (int n = 0; n < 4096 && recv_frames(d.socket, frames); ++n) {
        d.answered = true;
        reply_(item_peers[i], std::move(frames));
        frames.clear();
      }
    }
    now = now_ms();
    if (now - last_tick >= opts_.tick_ms) {
      last_tick = now;
      tick_(now);
    }
  }
}

}  // namespace loco::detail
