#include "runtime/collective/relay.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <map>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "runtime/collective/types.hpp"
#include "runtime/security/curve.hpp"
#include "runtime/security/source_limit.hpp"

namespace loco::collective {
namespace {
// A member sends the relay: destination routing id, header, sender, sealed payload; ZeroMQ
// puts the source's routing id in front.
constexpr size_t kFrames = 5;
constexpr size_t kMaxRoutingId = 255;
}  // namespace

struct Relay::Impl {
  RelayOptions options;
  zmq::context_t ctx{1};
  std::shared_ptr<security::ZapHandler> zap;  // outlives the socket
  std::unique_ptr<zmq::socket_t> router;
  std::optional<security::SourceLimit> source_limit;  // of the router's; destroyed before it
  std::string endpoint;
  double rate_bytes = 0;  // per second; 0: unbounded
  double tokens = 0;
  double capacity = 0;
  std::chrono::steady_clock::time_point refilled = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> forwarded{0};
  std::atomic<uint64_t> dropped{0};
  std::thread thread;

  // Waits until the bucket holds `bytes` (a message larger than the bucket waits for a full
  // one), or the relay stops. The wait is the bound: the relay reads nothing meanwhile, so
  // ZeroMQ and TCP push back on the senders.
  void take_tokens(size_t bytes) {
    if (rate_bytes <= 0) return;
    const double need = std::min(static_cast<double>(bytes), capacity);
    while (!stop.load()) {
      const auto now = std::chrono::steady_clock::now();
      tokens = std::min(capacity,
                        tokens + rate_bytes * std::chrono::duration<double>(now - refilled).count());
      refilled = now;
      if (tokens >= need) {
        tokens -= static_cast<double>(bytes);  // may go below 0: the debt delays the next
        return;
      }
      const double wait_s = (need - tokens) / rate_bytes;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait_s, 0.05)));
    }
  }

  void drop(const std::string& why) {
    const uint64_t n = dropped.fetch_add(1) + 1;
    if ((n & (n - 1)) == 0)
      spdlog::warn("relay {}: dropped a message ({}); {} so far", endpoint, why, n);
  }

  // Messages whose destination is not connected yet, or whose queue is full: members enter an
  // operation at different times, and a member's first messages must wait for a peer that has
  // not connected to the relay yet. Per destination, in order; bounded in bytes (the relay
  // reads nothing more while over the bound, so ZeroMQ and TCP push back on the senders) and
  // in time (what waits longer than hold_ttl for a destination not connected is dropped and
  // counted).
  struct Held {
    std::vector<zmq::message_t> frames;
    std::chrono::steady_clock::time_point since;
    size_t bytes;
  };
  std::map<std::string, std::deque<Held>> held;
  size_t held_bytes = 0;
  // When each destination with something held was last seen connected. What waits for a
  // connected one is kept, however long it takes: a member that enters its operation late (a
  // straggler's inner steps) or drains slowly (a site behind a slow link) leaves its queue full
  // meanwhile, and a message dropped from the middle of a member's stream would be noticed
  // only by the members' liveness, a minute on. Only a destination gone for hold_ttl loses it.
  std::map<std::string, std::chrono::steady_clock::time_point> seen;
  enum class Forward { sent, full, absent };

  // Sends [dst, src, rest...] without waiting; nothing is sent when the destination's queue is
  // full or it is not connected.
  Forward try_forward(std::vector<zmq::message_t>& out) {
    try {
      if (!router->send(out[0], zmq::send_flags::dontwait | zmq::send_flags::sndmore))
        return Forward::full;
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return Forward::absent;
      throw;
    }
    for (size_t i = 1; i < out.size(); ++i)
      (void)router->send(out[i], i + 1 < out.size() ? zmq::send_flags::sndmore
                                                     : zmq::send_flags::none);
    forwarded.fetch_add(1);
    return Forward::sent;
  }

  void hold(std::string destination, std::vector<zmq::message_t>&& frames, size_t bytes) {
    held_bytes += bytes;
    held[std::move(destination)].push_back(
        Held{std::move(frames), std::chrono::steady_clock::now(), bytes});
  }

  // Sends what waits, in order per destination; drops what waited past hold_ttl since it was
  // held or since its destination was last seen connected, whichever is later.
  void flush_held() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = held.begin(); it != held.end();) {
      auto& q = it->second;
      while (!q.empty()) {
        Held& h = q.front();
        const auto last = seen.find(it->first);
        const auto since = last == seen.end() ? h.since : std::max(h.since, last->second);
        if (now - since > options.hold_ttl) {
          drop("its destination was not connected for " +
               std::to_string(options.hold_ttl.count()) + " ms");
        } else {
          // Routing ids are kept in their own frame; ZeroMQ may have consumed it on a failed
          // try, so rebuild it from the key.
          h.frames[0] = zmq::message_t(it->first);
          const Forward f = try_forward(h.frames);
          if (f != Forward::absent) seen[it->first] = now;
          if (f != Forward::sent) break;
        }
        held_bytes -= h.bytes;
        q.pop_front();
      }
      it = q.empty() ? held.erase(it) : std::next(it);
    }
    // Only destinations with something held need a time (a bound on the map).
    for (auto t = seen.begin(); t != seen.end();)
      t = held.count(t->first) ? std::next(t) : seen.erase(t);
  }

  void run() {
    zmq::pollitem_t item{static_cast<void*>(*router), 0, ZMQ_POLLIN, 0};
    std::vector<zmq::message_t> frames;
    while (!stop.load()) {
      // Over the bound on held bytes, read nothing: the senders wait in ZeroMQ and TCP.
      const bool room = held_bytes < options.max_held_bytes;
      item.events = room ? ZMQ_POLLIN : 0;
      zmq::poll(&item, 1, std::chrono::milliseconds(held.empty() ? 50 : 5));
      flush_held();
      for (int i = 0; i < 256 && !stop.load() && held_bytes < options.max_held_bytes; ++i) {
        frames.clear();
        frames.emplace_back();
        if (!router->recv(frames[0], zmq::recv_flags::dontwait)) break;
        while (router->get(zmq::sockopt::rcvmore)) {
          zmq::message_t f;
          (void)router->recv(f, zmq::recv_flags::none);
          if (frames.size() <= kFrames) frames.push_back(std::move(f));
        }
        if (frames.size() != kFrames || frames[1].size() < 2 ||
            frames[1].size() > kMaxRoutingId) {
          drop("malformed: not a member's relayed message");
          continue;
        }
        size_t bytes = 0;
        for (const auto& f : frames) bytes += f.size();
        std::swap(frames[0], frames[1]);  // [destination, source, header, sender, payload]
        if (options.tap) {
          std::vector<std::string> copy;
          for (const auto& f : frames) copy.push_back(f.to_string());
          options.tap(copy);
          if (copy.size() != kFrames) {
            drop("the tap removed it");
            continue;
          }
          for (size_t k = 0; k < kFrames; ++k) frames[k] = zmq::message_t(copy[k]);
        }
        take_tokens(bytes);
        std::string destination = frames[0].to_string();
        // Behind what already waits for that destination, in order.
        auto waiting = held.find(destination);
        if (waiting == held.end() || waiting->second.empty()) {
          if (try_forward(frames) == Forward::sent) continue;
          frames[0] = zmq::message_t(destination);
        }
        hold(std::move(destination), std::move(frames), bytes);
      }
    }
  }
};

Relay::Relay(const std::string& bind_endpoint, RelayOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.options = std::move(options);
  r.router = std::make_unique<zmq::socket_t>(r.ctx, zmq::socket_type::router);
  if (r.options.security.curve) {
    if (r.options.security.cluster.public_key.size() != 40)
      throw CollectiveError("relay: CURVE needs the cluster's public key (40 Z85 characters)");
    if (r.options.own.secret_key.empty()) r.options.own = security::generate_key_pair();
    if (r.options.own.public_key == r.options.security.cluster.public_key)
      throw CollectiveError("relay: its key pair must be its own, not the cluster's");
    // Admits exactly the clients that prove the cluster's key; the cluster's secret is neither
    // needed nor kept.
    security::Settings admit = security::Settings::with_key({r.options.security.cluster.public_key, {}});
    r.options.security.cluster.secret_key.clear();
    r.zap = security::zap_handler_for(r.ctx, admit, security::Admit::members);
    security::make_server_with(*r.router, r.options.own);
  } else {
    r.options.own = {};
  }
  r.router->set(zmq::sockopt::linger, 0);
  r.router->set(zmq::sockopt::handshake_ivl,
                 static_cast<int>(std::max<int64_t>(1, r.options.handshake_timeout.count())));
  r.router->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(r.options.max_message_bytes));
  r.router->set(zmq::sockopt::rcvhwm, r.options.hwm);
  r.router->set(zmq::sockopt::sndhwm, r.options.hwm);
  r.router->set(zmq::sockopt::router_mandatory, true);
  r.router->set(zmq::sockopt::router_handover, true);  // a member that reconnects takes its id
  std::string ep = bind_endpoint;
  if (ep.starts_with("tcp://") && ep.ends_with(":0")) ep = ep.substr(0, ep.size() - 1) + "*";
  try {
    r.router->bind(ep);
  } catch (const zmq::error_t& e) {
    throw CollectiveError("relay: cannot bind " + bind_endpoint + ": " + e.what());
  }
  r.endpoint = r.router->get(zmq::sockopt::last_endpoint);
  r.source_limit.emplace(r.ctx, *r.router, r.options.max_connections_per_source,
                         "relay " + r.endpoint);
  r.rate_bytes = r.options.rate_mbit > 0 ? r.options.rate_mbit * 1e6 / 8 : 0;
  // A burst of a tenth of a second, and at least one largest message.
  r.capacity = std::max(r.rate_bytes / 10, static_cast<double>(r.options.max_message_bytes));
  r.tokens = r.capacity;
  spdlog::info("relay {}: forwarding {}{}", r.endpoint, describe_rate(),
               r.options.security.curve ? ", CURVE, members of the cluster only" : ", no CURVE");
  r.thread = std::thread([&r] { r.run(); });
}

Relay::~Relay() {
  impl_->stop.store(true);
  impl_->thread.join();
}

const std::string& Relay::endpoint() const { return impl_->endpoint; }
const std::string& Relay::public_key() const { return impl_->options.own.public_key; }
double Relay::rate() const { return impl_->rate_bytes; }

std::string Relay::describe_rate() const {
  if (impl_->rate_bytes <= 0) return "at an unbounded rate";
  std::ostringstream s;
  s << "at most " << impl_->options.rate_mbit << " Mbit/s";
  return s.str();
}

uint64_t Relay::forwarded() const { return impl_->forwarded.load(); }
uint64_t Relay::dropped() const { return impl_->dropped.load(); }
uint64_t Relay::refused() const { return impl_->zap ? impl_->zap->refused() : 0; }

}  // namespace loco::collective
