#include "runtime/security/curve.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

namespace loco::security {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr const char* kDomain = "loco";
// ZAP user ids: ZeroMQ attaches them to every frame of the connection (identity_of reads them).
constexpr const char* kMemberId = "member";

std::string z85(const zmq::message_t& raw) {
  if (raw.size() != 32) return {};
  char out[41];
  if (zmq_z85_encode(out, static_cast<const uint8_t*>(raw.data()), 32) == nullptr) return {};
  return out;
}

}  // namespace

void make_server(zmq::socket_t& socket, const Settings& s) {
  if (!s.curve) return;
  if (s.is_client() || s.cluster.secret_key.empty())
    throw KeyError("a client key cannot serve" +
                   (s.key_file.empty() ? std::string() : " (" + s.key_file + ")") +
                   ": the head, nodes and their actors need the cluster key (loco keygen)");
  socket.set(zmq::sockopt::zap_domain, kDomain);
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey, s.cluster.secret_key);
}

void make_client(zmq::socket_t& socket, const Settings& s) {
  if (!s.curve) return;
  socket.set(zmq::sockopt::curve_serverkey, s.cluster.public_key);
  socket.set(zmq::sockopt::curve_publickey, s.own().public_key);
  socket.set(zmq::sockopt::curve_secretkey, s.own().secret_key);
}

void make_server_with(zmq::socket_t& socket, const KeyPair& own) {
  if (own.secret_key.empty()) throw KeyError("a CURVE server needs a secret key of its own");
  socket.set(zmq::sockopt::zap_domain, kDomain);
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
}

void make_client_of(zmq::socket_t& socket, const Settings& s,
                    const std::string& server_public_key) {
  if (!s.curve) return;
  socket.set(zmq::sockopt::curve_serverkey, server_public_key);
  socket.set(zmq::sockopt::curve_publickey, s.own().public_key);
  socket.set(zmq::sockopt::curve_secretkey, s.own().secret_key);
}

std::string user_id_of(const Identity& who) {
  if (who.member()) return kMemberId;
  return std::string(who.admin ? "admin:" : "client:") + who.key + ":" + who.name;
}

Identity parse_user_id(const char* id) {
  Identity who;
  who.role = Role::client;
  if (!id) return who;
  const std::string_view s(id);
  if (s == kMemberId) return Identity{};
  const bool admin = s.rfind("admin:", 0) == 0;
  if (!admin && s.rfind("client:", 0) != 0) return who;
  const size_t at = admin ? 6 : 7;
  // The key is 40 Z85 characters, which may include ':'; the name follows the next ':'.
  if (s.size() < at + 41 || s[at + 40] != ':') return who;
  who.key = std::string(s.substr(at, 40));
  who.name = std::string(s.substr(at + 41));
  who.admin = admin;
  return who;
}

Identity identity_of(const zmq::message_t& frame, bool curve) {
  if (!curve) return Identity{};
  return parse_user_id(zmq_msg_gets(frame.handle(), "User-Id"));
}

struct ZapHandler::Impl {
  zmq::context_t& ctx;
  zmq::socket_t rep;
  zmq::socket_t stop_rx, stop_tx;
  Admit admit_roles;
  std::mutex mu;
  std::set<std::string> members, clients, admins;
  std::map<std::string, std::string> names;  // client key -> its name
  // Key files whose `client` and `admin` lines are re-read when they change: path -> (mtime,
  // size, what it listed).
  struct Watched {
    int64_t mtime_ns = 0, size = -1;
    std::vector<std::string> clients, admins;
  };
  std::map<std::string, Watched> files;
  std::set<std::string> logged;  // refused keys already logged (at most 64)
  std::atomic<uint64_t> admitted{0}, refused{0};
  std::thread thread;

  Impl(zmq::context_t& c, Admit a)
      : ctx(c),
        rep(c, zmq::socket_type::rep),
        stop_rx(c, zmq::socket_type::pair),
        stop_tx(c, zmq::socket_type::pair),
        admit_roles(a) {
    rep.set(zmq::sockopt::linger, 0);
    stop_rx.set(zmq::sockopt::linger, 0);
    stop_tx.set(zmq::sockopt::linger, 0);
    // Throws EADDRINUSE if something else already answers ZAP in this context.
    rep.bind(kZapEndpoint);
    const std::string stop_ep = "inproc://loco-zap-stop-" + std::to_string(uintptr_t(this));
    stop_rx.bind(stop_ep);
    stop_tx.connect(stop_ep);
  }

  // Re-reads the `client` lines of a watched key file that changed. Called for every key that
  // is not a member's: a stat per such handshake, far cheaper than the handshake's own crypto. A file
  // that no longer parses keeps the clients it had, with a warning.
  void refresh() {
    for (auto& [path, w] : files) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) continue;
      const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      if (mtime == w.mtime_ns && st.st_size == w.size) continue;
      w.mtime_ns = mtime;
      w.size = st.st_size;
      try {
        Settings fresh = read_key_file(path);
        for (const auto& k : w.clients) clients.erase(k);
        for (const auto& k : w.admins) admins.erase(k);
        w.clients = fresh.clients;
        w.admins = fresh.admins;
        clients.insert(w.clients.begin(), w.clients.end());
        admins.insert(w.admins.begin(), w.admins.end());
        for (const auto& [k, name] : fresh.names) names[k] = name;
        spdlog::info("key file {} lists {} client key(s)", path, w.clients.size());
      } catch (const KeyError& e) {
        spdlog::warn("kept the clients admitted so far: {}", e.what());
      }
    }
  }

  // Who `key` is, or nothing when it may not connect.
  std::optional<Identity> identity(const std::string& mechanism, const std::string& key) {
    if (mechanism != "CURVE") return std::nullopt;
    std::lock_guard<std::mutex> lock(mu);
    if (members.count(key)) return Identity{};
    if (admit_roles == Admit::members) return std::nullopt;
    refresh();  // a line added or deleted since counts for this handshake
    if (!clients.count(key)) return std::nullopt;
    Identity who;
    who.role = Role::client;
    who.key = key;
    auto name = names.find(key);
    who.name = name != names.end() ? name->second : user_name("", key);
    who.admin = admins.count(key) > 0;
    return who;
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
      const std::optional<Identity> who =
          well_formed ? this->identity(mechanism, key) : std::nullopt;
      const bool ok = who.has_value();
      if (ok) {
        admitted.fetch_add(1);
      } else {
        refused.fetch_add(1);
        const std::string address = req.size() >= 4 ? req[3].to_string() : "?";
        std::lock_guard<std::mutex> lock(mu);
        if (logged.size() < 64 && logged.insert(key).second)
          spdlog::warn("refused a connection from {}: {} key {} is not {}", address, mechanism,
                       key.empty() ? "(none)" : short_key(key),
                       admit_roles == Admit::members
                           ? "the cluster's (this socket takes members only)"
                           : "the cluster's or one of its clients'");
      }
      std::vector<zmq::message_t> reply;
      reply.emplace_back(std::string("1.0"));
      reply.emplace_back(req.size() >= 2 ? req[1].to_string() : std::string());
      reply.emplace_back(std::string(ok ? "200" : "400"));
      reply.emplace_back(std::string(ok ? "OK" : "key not on the cluster's allow-list"));
      reply.emplace_back(ok ? user_id_of(*who) : std::string());  // user id
      reply.emplace_back();                                        // metadata
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
  if (!s.is_client()) impl_->members.insert(s.cluster.public_key);
  impl_->clients.insert(s.clients.begin(), s.clients.end());
  impl_->admins.insert(s.admins.begin(), s.admins.end());
  for (const auto& [k, name] : s.names) impl_->names[k] = name;
  if (!s.key_file.empty() && !s.is_client()) {
    Impl::Watched& w = impl_->files[s.key_file];
    w.clients = s.clients;
    w.admins = s.admins;
    struct stat st {};
    if (::stat(s.key_file.c_str(), &st) == 0) {
      w.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      w.size = st.st_size;
    }
  }
}

namespace {
// One handler per context. A handler being destroyed still holds the ZAP endpoint until its
// deleter has closed it: a new one for the same context waits for that.
std::mutex registry_mu;
std::condition_variable registry_cv;
std::map<void*, std::weak_ptr<ZapHandler>> registry;
}  // namespace

std::shared_ptr<ZapHandler> zap_handler_for(zmq::context_t& ctx, const Settings& s, Admit admit) {
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
  std::shared_ptr<ZapHandler> h(new ZapHandler(std::make_unique<ZapHandler::Impl>(ctx, admit)),
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
