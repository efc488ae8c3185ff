#include "runtime/security/curve.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace loco::security {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr const char* kDomain = "loco";

std::string z85(const zmq::message_t& raw) {
  if (raw.size() != 32) return {};
  char out[41];
  if (zmq_z85_encode(out, static_cast<const uint8_t*>(raw.data()), 32) == nullptr) return {};
  return out;
}

}  // namespace

void make_server(zmq::socket_t& socket, const Settings& s) {
  if (!s.curve) return;
  socket.set(zmq::sockopt::zap_domain, kDomain);
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey, s.cluster.secret_key);
}

void make_client(zmq::socket_t& socket, const Settings& s) {
  if (!s.curve) return;
  socket.set(zmq::sockopt::curve_serverkey, s.cluster.public_key);
  socket.set(zmq::sockopt::curve_publickey, s.cluster.public_key);
  socket.set(zmq::sockopt::curve_secretkey, s.cluster.secret_key);
}

struct ZapHandler::Impl {
  zmq::context_t& ctx;
  zmq::socket_t rep;
  zmq::socket_t stop_rx, stop_tx;
  std::mutex mu;
  std::set<std::string> allowed;
  std::set<std::string> logged;  // refused keys already logged (at most 64)
  std::atomic<uint64_t> admitted{0}, refused{0};
  std::thread thread;

  explicit Impl(zmq::context_t& c)
      : ctx(c),
        rep(c, zmq::socket_type::rep),
        stop_rx(c, zmq::socket_type::pair),
        stop_tx(c, zmq::socket_type::pair) {
    rep.set(zmq::sockopt::linger, 0);
    stop_rx.set(zmq::sockopt::linger, 0);
    stop_tx.set(zmq::sockopt::linger, 0);
    // Throws EADDRINUSE if something else already answers ZAP in this context.
    rep.bind(kZapEndpoint);
    const std::string stop_ep = "inproc://loco-zap-stop-" + std::to_string(uintptr_t(this));
    stop_rx.bind(stop_ep);
    stop_tx.connect(stop_ep);
  }

  bool admit(const std::string& mechanism, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    return mechanism == "CURVE" && allowed.count(key) > 0;
  }

  void serve() {
    std::vector<zmq::message_t> req;
    zmq::pollitem_t items[] = {{rep.handle(), 0, ZMQ_POLLIN, 0},
                               {stop_rx.handle(), 0, ZMQ_POLLIN, 0}};
    while (true) {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
      if (items[1].revents & ZMQ_POLLIN) return;
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      req.clear();
      do {
        zmq::message_t m;
        if (!rep.recv(m, zmq::recv_flags::none)) break;
        req.push_back(std::move(m));
      } while (req.back().more());
      // version, request id, domain, address, routing id, mechanism, credentials...
      const bool well_formed = req.size() >= 6 && req[0].to_string() == "1.0";
      const std::string mechanism = req.size() >= 6 ? req[5].to_string() : "";
      const std::string key = req.size() >= 7 ? z85(req[6]) : "";
      const bool ok = well_formed && admit(mechanism, key);
      if (ok) {
        admitted.fetch_add(1);
      } else {
        refused.fetch_add(1);
        const std::string address = req.size() >= 4 ? req[3].to_string() : "?";
        std::lock_guard<std::mutex> lock(mu);
        if (logged.size() < 64 && logged.insert(key).second)
          spdlog::warn("refused a connection from {}: {} key {} is not on the cluster's allow-list",
                       address, mechanism, key.empty() ? "(none)" : short_key(key));
      }
      std::vector<zmq::message_t> reply;
      reply.emplace_back(std::string("1.0"));
      reply.emplace_back(req.size() >= 2 ? req[1].to_string() : std::string());
      reply.emplace_back(std::string(ok ? "200" : "400"));
      reply.emplace_back(std::string(ok ? "OK" : "key not on the cluster's allow-list"));
      reply.emplace_back(ok ? key : std::string());  // user id
      reply.emplace_back();                          // metadata
      for (size_t i = 0; i < reply.size(); ++i)
        (void)rep.send(reply[i],
                       i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
};

ZapHandler::ZapHandler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->thread = std::thread([i = impl_.get()] { i->serve(); });
}

ZapHandler::~ZapHandler() {
  (void)impl_->stop_tx.send(zmq::message_t(), zmq::send_flags::none);
  impl_->thread.join();
}

uint64_t ZapHandler::admitted() const { return impl_->admitted.load(); }
uint64_t ZapHandler::refused() const { return impl_->refused.load(); }

void ZapHandler::add(const Settings& s) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& k : s.allow_list()) impl_->allowed.insert(k);
}

namespace {
// One handler per context. A handler being destroyed still holds the ZAP endpoint until its
// deleter has closed it: a new one for the same context waits for that.
std::mutex registry_mu;
std::condition_variable registry_cv;
std::map<void*, std::weak_ptr<ZapHandler>> registry;
}  // namespace

std::shared_ptr<ZapHandler> zap_handler_for(zmq::context_t& ctx, const Settings& s) {
  if (!s.curve) return nullptr;
  void* key = ctx.handle();
  std::unique_lock<std::mutex> lock(registry_mu);
  while (true) {
    auto it = registry.find(key);
    if (it == registry.end()) break;
    if (auto h = it->second.lock()) {
      h->add(s);
      return h;
    }
    registry_cv.wait(lock);  // its deleter erases it
  }
  std::shared_ptr<ZapHandler> h(new ZapHandler(std::make_unique<ZapHandler::Impl>(ctx)),
                                [key](ZapHandler* p) {
                                  delete p;  // closes the ZAP endpoint
                                  std::lock_guard<std::mutex> l(registry_mu);
                                  registry.erase(key);
                                  registry_cv.notify_all();
                                });
  h->add(s);
  registry[key] = h;
  return h;
}

std::string describe_handshake_failure(uint16_t event, int32_t value, bool curve) {
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      return "refused our key (ZAP status " + std::to_string(value) +
             "): this process does not hold the cluster's key";
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      return "failed the handshake (ZMTP protocol error " + std::to_string(value) +
             "): CURVE on one side only (--insecure on one side?)";
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      // The peer closed the connection mid-handshake; which side sees the mechanism mismatch
      // first is a race, so a plain client may see this instead of a protocol error.
      return curve ? "broke off every handshake: it holds another cluster key than ours, or none"
                   : "broke off every handshake: CURVE on one side only (--insecure on one side?)";
    default:
      return {};
  }
}

}  // namespace loco::security
