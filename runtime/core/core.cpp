#include "runtime/core/core.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "runtime/core/runtime.hpp"
#include "runtime/security/curve.hpp"

namespace loco::detail {

std::string ActorRef::describe() const {
  // A system actor: the head's service, or a node's (at "@node"), named by its node.
  if (fixed)
    return id == "@head" ? "the head"
                         : "node " + (node_id.empty() ? address : node_id + " (" + address + ")");
  std::string out = class_name.empty() ? "actor" : class_name;
  if (!name.empty()) out += " '" + name + "'";
  return out + " (" + id + ")";
}

struct Core::Mailbox {
  std::string id;
  const ClassEntry* cls = nullptr;
  std::shared_ptr<void> instance;
  ActorContext context;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Inbound> queue;
  size_t queued_bytes = 0;  // of the calls in `queue` that came from the network
  RateLimit full_warnings;
  RateLimit tell_warnings;  // one-way calls that failed or named no method
  bool stopping = false;
  std::thread thread;
  // Calls of concurrent methods (run_beside): those waiting for a thread of the actor's pool,
  // the pool's threads alive, and how many of them run a call now.
  std::condition_variable beside_cv;  // wakes the pool's idle threads
  std::deque<Inbound> beside_queue;
  size_t beside_bytes = 0;  // of the calls in beside_queue
  int beside = 0;
  int beside_busy = 0;
  RateLimit beside_warnings;
};

namespace {
thread_local std::shared_ptr<Core>* tl_core = nullptr;
thread_local const ActorContext* tl_actor = nullptr;
thread_local const CallerInfo* tl_caller = nullptr;
// The request the current method handles, and where run_mailbox finds it once deferred.
struct Handling {
  std::weak_ptr<Core> core;
  zmq::message_t* routing_id;
  uint64_t corr;
  bool wants_reply;
  std::string what;
  std::shared_ptr<DeferredReply> deferred;
};
thread_local Handling* tl_handling = nullptr;

size_t payload_bytes(const Payload& p) {
  size_t bytes = p.body.size();
  for (const Blob& b : p.blobs) bytes += b.size();
  return bytes;
}
}  // namespace

std::shared_ptr<DeferredReply> defer_reply() {
  if (!tl_handling) return nullptr;
  Handling& h = *tl_handling;
  if (!h.deferred)
    h.deferred = std::make_shared<DeferredReply>(h.core, std::move(*h.routing_id), h.corr,
                                                 h.wants_reply, h.what);
  return h.deferred;
}

const CallerInfo& current_caller() {
  static const CallerInfo self{};
  return tl_caller ? *tl_caller : self;
}

ActorContextScope::ActorContextScope(const ActorContext* context) : previous_(tl_actor) {
  tl_actor = context;
}
ActorContextScope::~ActorContextScope() { tl_actor = previous_; }

}  // namespace loco::detail

namespace loco {
const ActorContext& this_actor() {
  static const ActorContext none;
  return detail::tl_actor ? *detail::tl_actor : none;
}
}  // namespace loco

namespace loco::detail {

std::shared_ptr<Core>& current_core() {
  static std::shared_ptr<Core> process_core;
  return tl_core ? *tl_core : process_core;
}

Core::Core(CoreOptions opts) : opts_(std::move(opts)) {
  head_ref_ = std::make_shared<ActorRef>();
  head_ref_->id = "@head";
  head_ref_->fixed = true;
  head_ref_->address = opts_.head_address;
  Transport::Options topts;
  topts.bind = opts_.bind;
  // ZeroMQ's own per-frame limit sits above ours so that an oversized message
  // reaches decode() and gets an error reply instead of a silent disconnect.
  topts.max_frame_bytes = opts_.max_message_bytes + (size_t(64) << 20);
  topts.security = opts_.security;
  topts.max_connections_per_source = opts_.max_connections_per_source;
  topts.on_handshake_failed = [this](const std::string& peer, const std::string& why) {
    on_handshake_failed(peer, why);
  };
  topts.on_forwarder_closed = [this](const std::string& peer) { on_forwarder_closed(peer); };
  transport_ = std::make_unique<Transport>(
      topts,
      [this](zmq::message_t&& rid, std::vector<zmq::message_t>&& f, security::Identity who) {
        on_inbound(std::move(rid), std::move(f), std::move(who));
      },
      [this](const std::string& peer, std::vector<zmq::message_t>&& f) {
        on_reply(peer, std::move(f));
      },
      [this](int64_t now) { on_tick(now); });
  address_ = transport_->bound_address();
  // --advertise HOST keeps the bound port; HOST:PORT names both (a port forwarded by a NAT).
  if (!address_.empty() && !opts_.advertise.empty())
    address_ = opts_.advertise.find(':') != std::string::npos
                   ? opts_.advertise
                   : opts_.advertise + address_.substr(address_.rfind(':'));
  if (opts_.forward && opts_.head_address.empty()) {
    // The head's own calls to nodes reached through it go through its ROUTER like anyone's:
    // over loopback when it is bound to every interface.
    std::string local = transport_->bound_address();
    const std::string host = local.substr(0, local.rfind(':'));
    if (host == "0.0.0.0" || host == "*") local = "127.0.0.1" + local.substr(local.rfind(':'));
    opts_.head_address = local;
  }
  if (head_ref_->address.empty()) head_ref_->address = address_;
}

std::string Core::route(const std::string& address) const {
  const std::string node = through_head_node(address);
  return node.empty() ? address : opts_.head_address + "/" + node;
}

namespace {
// The node a routed peer "HOST:PORT/NODE" names ("" for a plain "HOST:PORT").
std::string via_of(const std::string& peer) {
  const size_t slash = peer.find('/');
  return slash == std::string::npos ? std::string() : peer.substr(slash + 1);
}
}  // namespace

void Core::attach_as(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  attached_as_ = node_id;
  attach_confirmed_ = false;
  last_attach_ = 0;  // the I/O thread's next tick says so
}

bool Core::wait_attached(Millis timeout) {
  std::unique_lock<std::mutex> lock(calls_mu_);
  return attach_cv_.wait_for(lock, timeout, [&] { return attach_confirmed_; });
}

Core::~Core() { shutdown(); }

std::string Core::address() const { return address_; }

void Core::set_detection(int64_t detect_ms, int64_t heartbeat_ms) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  opts_.detect_ms = detect_ms;
  opts_.heartbeat_ms = heartbeat_ms;
}

void Core::shutdown() {
  std::map<std::string, std::shared_ptr<Mailbox>> boxes;
  {
    std::lock_guard<std::mutex> lock(actors_mu_);
    boxes.swap(actors_);
  }
  for (auto& [id, box] : boxes) {
    {
      std::lock_guard<std::mutex> lock(box->mu);
      box->stopping = true;
    }
    box->cv.notify_all();
    box->beside_cv.notify_all();
    if (box->thread.joinable()) {
      if (box->thread.get_id() == std::this_thread::get_id())
        box->thread.detach();
      else
        box->thread.join();
    }
  }
  // Actors killed without waiting (unhost(id, false)): those whose method has ended are joined;
  // one still in a method that ignores its stop hook does not hold the process's end (a node's
  // stop would otherwise wait for it forever), and its thread touches only its own mailbox.
  std::vector<Reaper> reapers;
  {
    std::lock_guard<std::mutex> lock(reapers_mu_);
    reapers.swap(reapers_);
  }
  for (Reaper& r : reapers) {
    if (r.done->load() && r.thread.get_id() != std::this_thread::get_id()) {
      r.thread.join();
    } else {
      spdlog::warn("{}: a killed actor is still in a method; not waiting for it",
                   opts_.self_name);
      r.thread.detach();
    }
  }
  if (transport_) transport_->stop();
  // Whoever still waits learns that this process is going away.
  std::unordered_map<uint64_t, std::shared_ptr<CallState>> pending;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    pending.swap(pending_);
  }
  for (auto& [corr, st] : pending)
    finish(st, "ActorDiedError", "the calling process is shutting down", {});
}

void Core::resolve(ActorRef& ref) {
  Backoff backoff(Millis(50), Millis(500));
  int64_t deadline = now_ms() + opts_.resolve_timeout_ms;
  while (true) {
    ActorInfo info = head_call<ActorInfo>("locate", Millis(opts_.resolve_timeout_ms), ref.id);
    if (info.state == ActorState::dead)
      throw ActorDiedError(ref.describe() + " is dead: " + info.reason);
    bool usable = info.state == ActorState::alive;
    const std::string address = route(info.address);
    if (usable) {
      std::lock_guard<std::mutex> lock(calls_mu_);
      auto it = dead_peers_.find(address);
      // The head has not noticed the death we saw yet: wait for it to catch up.
      if (it != dead_peers_.end()) usable = false;
    }
    if (usable) {
      std::lock_guard<std::mutex> lock(ref.mu);
      ref.address = address;
      ref.node_id = info.node_id;
      if (ref.class_name.empty()) ref.class_name = info.class_name;
      return;
    }
    if (now_ms() >= deadline)
      throw ActorDiedError(ref.describe() + " is not reachable: state " + to_string(info.state) +
                           (info.reason.empty() ? "" : " (" + info.reason + ")") + " after " +
                           human_ms(opts_.resolve_timeout_ms));
    std::this_thread::sleep_for(backoff.next());
  }
}

std::shared_ptr<CallState> Core::call(const std::shared_ptr<ActorRef>& ref,
                                      const std::string& method, Payload&& args, bool oneway) {
  auto st = std::make_shared<CallState>();
  st->ref = ref;
  st->method = method;
  return send_call(std::move(st), ref, std::move(args), oneway);
}

std::shared_ptr<CallState> Core::call_async(const std::shared_ptr<ActorRef>& ref,
                                            const std::string& method, Payload&& args,
                                            std::function<void(CallState&)> done) {
  auto st = std::make_shared<CallState>();
  st->ref = ref;
  st->method = method;
  return send_call(std::move(st), ref, std::move(args), false, std::move(done));
}

std::shared_ptr<CallState> Core::send_call(std::shared_ptr<CallState> st,
                                           const std::shared_ptr<ActorRef>& ref, Payload&& args,
                                           bool oneway, std::function<void(CallState&)> done) {
  const std::string& method = st->method;
  std::string addr;
  {
    std::lock_guard<std::mutex> lock(ref->mu);
    addr = ref->address;
  }
  if (addr.empty()) {
    try {
      resolve(*ref);
    } catch (const Error& e) {
      // Not sent: the call ends with the error, raised where its outcome is taken, as a
      // reply's would be. A caller that gathers several calls sees this one fail among them
      // (a worker whose node died, say) instead of the loop that makes them unwinding. A tell
      // has no outcome to take: it throws here.
      if (oneway) throw;
      st->peer = "(unresolved)";
      finish(st, e.type(), e.what(), {});
      if (done) done(*st);  // finish() runs only the callbacks of calls that were sent
      return st;
    }
    std::lock_guard<std::mutex> lock(ref->mu);
    addr = ref->address;
  }
  addr = route(addr);  // a fixed ref of a node reached through the head ("head/<node>")
  st->peer = addr;
  Envelope env;
  env.kind = static_cast<uint8_t>(oneway ? Kind::Tell : Kind::Request);
  env.sender = tl_actor && !tl_actor->actor_id.empty() ? tl_actor->actor_id : opts_.self_name;
  if (tl_actor && !tl_actor->actor_id.empty()) {
    env.from_actor = true;
    env.sender_job = tl_actor->job;
    env.sender_owner = tl_actor->owner;
  }
  env.target = ref->id;
  env.method = method;
  env.via = via_of(addr);
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    PeerState& ps = peers_[addr];
    ps.last_used = now_ms();
    if (!oneway) {
      env.corr = st->corr = next_corr_++;
      pending_.emplace(env.corr, st);
      if (done) on_done_.emplace(env.corr, std::move(done));
      // Silence is measured from the moment we start waiting on a peer.
      if (ps.pending++ == 0) ps.last_heard = ps.last_ping = ps.last_used;
    } else {
      st->done = true;
    }
    // Queued before the lock is let go: on_tick closes an idle connection under it, so the
    // close is queued before this message (which opens it again) or not at all.
    transport_->send_to_peer(addr, encode(env, std::move(args)));
  }
  return st;
}

Payload Core::call_head(const std::string& method, Payload&& args, Millis timeout) {
  int64_t deadline = now_ms() + timeout.count();
  Backoff backoff(Millis(100), Millis(1000));
  while (true) {
    // Every attempt sends the same payload: a copy shares its buffers.
    auto st = call(head_ref_, method, Payload(args), false);
    try {
      await(*st, Millis(std::max<int64_t>(1, deadline - now_ms())));
      return std::move(st->result);
    } catch (const ActorDiedError& e) {
      // An answer of the head's (an actor it started died, say) is its outcome: retrying would
      // do the request twice (a second job for one `loco submit`).
      if (!unreachable(st->peer)) throw;
      // The head is unreachable: it may be restarting. Retry until the deadline.
      if (now_ms() + 100 >= deadline)
        throw ClusterError("head at " + opts_.head_address + " unreachable: " + e.what());
      std::this_thread::sleep_for(std::min(backoff.next(), Millis(deadline - now_ms())));
    } catch (const TimeoutError&) {
      throw ClusterError("head at " + opts_.head_address + " did not answer " + method +
                         " within " + human_ms(timeout.count()));
    }
  }
}

bool Core::unreachable(const std::string& peer) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  return dead_peers_.count(peer) > 0;
}

void Core::await(CallState& st, Millis timeout) {
  {
    std::unique_lock<std::mutex> lock(st.mu);
    if (!st.cv.wait_for(lock, timeout, [&] { return st.done; })) {
      lock.unlock();
      bool removed = false;
      {
        std::lock_guard<std::mutex> l(calls_mu_);
        if (pending_.erase(st.corr)) {
          removed = true;
          auto it = peers_.find(st.peer);
          if (it != peers_.end() && it->second.pending > 0) --it->second.pending;
        }
      }
      if (removed)
        throw TimeoutError(st.what() + " got no reply within " + human_ms(timeout.count()));
      lock.lock();
      st.cv.wait(lock, [&] { return st.done; });  // finished concurrently: take its outcome
    }
  }
  if (st.error_type.empty()) return;
  if ((st.error_type == "ActorDiedError" || st.error_type == "ActorNotFoundError") && st.ref &&
      !st.ref->fixed) {
    // Next call through any copy of the handle asks the head where the actor is now.
    std::lock_guard<std::mutex> lock(st.ref->mu);
    if (route(st.ref->address) == st.peer) st.ref->address.clear();
  }
  throw_error(st.error_type, st.error_message);
}

std::vector<size_t> wait_calls(const std::vector<CallState*>& calls, size_t num_returns,
                               Millis timeout, std::stop_token stop) {
  num_returns = std::min(num_returns, calls.size());
  auto waiter = std::make_shared<CallWaiter>();
  size_t done_before = 0;
  for (CallState* st : calls) {
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->done)
      ++done_before;
    else
      st->waiters.push_back(waiter);  // told by Core::finish when it ends
  }
  if (done_before < num_returns && timeout.count() > 0) {
    // Runs at once when stop was requested before; takes the lock so that the wait below
    // either sees the request or is woken by it.
    std::stop_callback on_stop(stop, [&] {
      { std::lock_guard<std::mutex> lock(waiter->mu); }
      waiter->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(waiter->mu);
    auto enough = [&] {
      return done_before + waiter->ended >= num_returns || stop.stop_requested();
    };
    const auto now = std::chrono::steady_clock::now();
    // A deadline past the clock's end (Millis::max()) waits without one.
    if (timeout >=
        std::chrono::duration_cast<Millis>(std::chrono::steady_clock::time_point::max() - now))
      waiter->cv.wait(lock, enough);
    else
      waiter->cv.wait_until(lock, now + timeout, enough);
  }
  std::vector<size_t> ended;
  for (size_t i = 0; i < calls.size(); ++i) {
    std::lock_guard<std::mutex> lock(calls[i]->mu);
    if (calls[i]->done)
      ended.push_back(i);
    else
      std::erase(calls[i]->waiters, waiter);
  }
  return ended;
}

void Core::finish(const std::shared_ptr<CallState>& st, const std::string& error_type,
                  const std::string& error_message, Payload&& result) {
  std::vector<std::shared_ptr<CallWaiter>> waiters;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->done) return;
    st->error_type = error_type;
    st->error_message = error_message;
    st->result = std::move(result);
    st->done = true;
    waiters.swap(st->waiters);
  }
  st->cv.notify_all();
  for (const auto& w : waiters) w->tell();
  std::function<void(CallState&)> done;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    auto it = on_done_.find(st->corr);
    if (it == on_done_.end()) return;
    done = std::move(it->second);
    on_done_.erase(it);
  }
  done(*st);
}

void Core::answer(zmq::message_t&& routing_id, uint64_t corr, const std::string& error_type,
                  const std::string& error_message, Payload&& result) {
  if (!error_type.empty()) {
    send_error(std::move(routing_id), corr, error_type, error_message);
    return;
  }
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Reply);
  env.corr = corr;
  transport_->reply(std::move(routing_id), encode(env, std::move(result)));
}

DeferredReply::DeferredReply(std::weak_ptr<Core> core, zmq::message_t routing_id, uint64_t corr,
                             bool wants_reply, std::string what)
    : core_(std::move(core)),
      routing_id_(std::move(routing_id)),
      corr_(corr),
      open_(wants_reply),
      what_(std::move(what)) {}

DeferredReply::~DeferredReply() { error("RemoteError", what_ + " was dropped unanswered"); }

void DeferredReply::ok(Payload&& result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return;
  open_ = false;
  if (auto core = core_.lock())
    core->answer(std::move(routing_id_), corr_, "", "", std::move(result));
}

void DeferredReply::error(const std::string& type, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return;
  open_ = false;
  if (auto core = core_.lock()) core->answer(std::move(routing_id_), corr_, type, message, {});
}

void Core::on_reply(const std::string& peer, std::vector<zmq::message_t>&& frames) {
  int64_t now = now_ms();
  Decoded d;
  try {
    d = decode(std::move(frames), opts_.max_message_bytes + (size_t(1) << 20));
  } catch (const ProtocolError& e) {
    warn_bad_input("dropped a malformed reply from " + escape_remote(peer) + ": " +
                   escape_remote(e.what(), 400));
    return;
  }
  const bool call =
      d.env.k() == Kind::Request || d.env.k() == Kind::Tell || d.env.k() == Kind::Ping;
  std::shared_ptr<CallState> st;
  bool takes_calls = false;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    PeerState& ps = peers_[peer];
    ps.last_heard = ps.last_used = now;
    dead_peers_.erase(peer);
    if (d.env.k() == Kind::Pong) {
      // The head's answer to an attach names the node it forwards to now.
      if (!d.env.via.empty() && d.env.via == attached_as_ && peer == opts_.head_address &&
          !attach_confirmed_) {
        attach_confirmed_ = true;
        attach_cv_.notify_all();
      }
      return;
    }
    // A node reached through the head takes calls from it on this connection, and only from it.
    if (call) {
      takes_calls = !attached_as_.empty() && peer == opts_.head_address;
    } else {
      auto it = pending_.find(d.env.corr);
      if (it == pending_.end()) return;  // timed out earlier, or a stale duplicate
      st = std::move(it->second);
      pending_.erase(it);
      if (ps.pending > 0) --ps.pending;
    }
  }
  if (call) {
    if (!takes_calls) {
      warn_bad_input("dropped a call that came on the connection to " + escape_remote(peer) +
                     ": only a node reached through its head takes calls, from its head");
      return;
    }
    // The head names who the original caller's key proved it is; without that, the least.
    security::Identity who;
    if (d.env.origin.empty())
      who.role = security::Role::client;
    else
      who = security::parse_user_id(d.env.origin.c_str());
    if (!opts_.security.curve) who = security::Identity{};  // plain TCP: as the ROUTER does
    dispatch(Transport::on_dealer(peer), std::move(d), who);
    return;
  }
  if (d.env.k() == Kind::Error) {
    std::string type = d.env.error_type.empty() ? "RemoteError" : d.env.error_type;
    finish(st, type, d.env.error_message, {});
  } else {
    finish(st, "", "", std::move(d.payload));
  }
}

void Core::on_tick(int64_t now) {
  std::vector<std::pair<std::shared_ptr<CallState>, int64_t>> died;
  std::vector<std::string> dead, to_ping;
  std::string attach;  // a node reached through the head: says so again
  if (opts_.forward) {
    // Nodes whose connection went silent for the detection time: the calls forwarded to them
    // fail now, as a direct caller's would.
    std::vector<std::pair<std::string, int64_t>> silent;
    {
      std::lock_guard<std::mutex> lock(routes_mu_);
      for (auto& [node, r] : routes_)
        if (now - r.last_heard >= opts_.detect_ms) silent.emplace_back(node, now - r.last_heard);
    }
    for (auto& [node, quiet] : silent)
      drop_route(node, "node " + node +
                           " is reached only through the head, and its connection "
                           "to the head has been silent for " +
                           human_ms(quiet));
  }
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    if (!attached_as_.empty() && now - last_attach_ >= opts_.heartbeat_ms) {
      attach = attached_as_;
      last_attach_ = now;
    }
    for (auto& [peer, ps] : peers_) {
      if (ps.pending == 0) continue;
      int64_t silent = now - ps.last_heard;
      if (silent >= opts_.detect_ms) {
        dead.push_back(peer);
        dead_peers_[peer] = now;
        ps.pending = 0;
      } else if (silent >= opts_.heartbeat_ms && now - ps.last_ping >= opts_.heartbeat_ms) {
        ps.last_ping = now;
        to_ping.push_back(peer);
      }
    }
    if (!dead.empty()) {
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (std::find(dead.begin(), dead.end(), it->second->peer) != dead.end()) {
          died.emplace_back(it->second, now - peers_[it->second->peer].last_heard);
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto it = dead_peers_.begin(); it != dead_peers_.end();)
      it = now - it->second > 60000 ? dead_peers_.erase(it) : std::next(it);
    // Connections idle for idle_close_ms are closed while the lock is held (see call()). The
    // head's is kept: it carries our attach and, behind NAT, the calls the head forwards.
    for (auto it = peers_.begin(); it != peers_.end();) {
      const PeerState& ps = it->second;
      if (ps.pending == 0 && now - ps.last_used >= opts_.idle_close_ms &&
          it->first != opts_.head_address) {
        transport_->drop_peer(it->first);
        it = peers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [st, silent] : died) {
    finish(st, "ActorDiedError",
           callee(*st) + " died or is unreachable: no answer to heartbeats for " +
               human_ms(silent) + " (call " + st->what() + ")",
           {});
  }
  for (const std::string& peer : dead) transport_->drop_peer(peer);
  if (!attach.empty()) {
    Envelope env;
    env.kind = static_cast<uint8_t>(Kind::Attach);
    env.sender = opts_.self_name;
    env.via = attach;
    transport_->send_to_peer(opts_.head_address, encode(env));
  }
  for (const std::string& peer : to_ping) {
    Envelope ping;
    ping.kind = static_cast<uint8_t>(Kind::Ping);
    ping.sender = opts_.self_name;
    ping.via = via_of(peer);
    transport_->send_to_peer(peer, encode(ping));
  }
}

void Core::send_error(zmq::message_t&& rid, uint64_t corr, const std::string& type,
                      const std::string& message) {
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Error);
  env.corr = corr;
  env.sender = opts_.self_name;
  env.error_type = type;
  env.error_message = message;
  transport_->reply(std::move(rid), encode(env));
}

void Core::warn_bad_input(const std::string& line) {
  uint64_t held = 0;
  {
    std::lock_guard<std::mutex> lock(bad_input_mu_);
    if (!bad_input_.allow(now_ms(), &held)) return;
  }
  if (held > 0)
    spdlog::warn("{} ({} more warnings about bad input in the last 10 s not logged)", line, held);
  else
    spdlog::warn("{}", line);
}

std::vector<std::shared_ptr<CallState>> Core::take_pending_on(const std::string& peer) {
  std::vector<std::shared_ptr<CallState>> out;
  std::lock_guard<std::mutex> lock(calls_mu_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second->peer == peer) {
      out.push_back(it->second);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  auto ps = peers_.find(peer);
  if (ps != peers_.end()) ps->second.pending = 0;
  return out;
}

void Core::on_handshake_failed(const std::string& peer, const std::string& why) {
  std::vector<std::shared_ptr<CallState>> refused = take_pending_on(peer);
  if (refused.empty()) spdlog::warn("cannot talk to {}: {}", peer, why);
  for (auto& st : refused) {
    finish(st, "ClusterError",
           "cannot call " + st->what() + ": " + peer + " " + why +
               ". Give every member the same key file (--key FILE or $LOCO_KEY; `loco keygen` "
               "makes one)",
           {});
  }
  transport_->drop_peer(peer);
}

std::string Core::callee(const CallState& st) {
  std::string node;
  {
    std::lock_guard<std::mutex> lock(st.ref->mu);
    node = st.ref->node_id.empty() ? st.peer : st.ref->node_id + " (" + st.peer + ")";
  }
  return !st.ref->fixed          ? st.ref->describe() + " on node " + node
         : st.ref->id == "@head" ? "the head at " + st.peer
                                 : "node " + node;
}

void Core::on_forwarder_closed(const std::string& peer) {
  // Not in dead_peers_: the node may well be alive, and the next call's resolve must not wait
  // for the head to declare it dead.
  std::vector<std::shared_ptr<CallState>> lost = take_pending_on(peer);
  const std::string head = peer.substr(0, peer.find('/'));
  for (auto& st : lost) {
    finish(st, "ActorDiedError",
           callee(*st) + " is unreachable: the head at " + head +
               " that forwarded the call closed its connection (it died or restarted), and "
               "the answer is lost with it (call " +
               st->what() + ")",
           {});
  }
}

std::string Core::refusal(const Mailbox& box, const Envelope& env, const security::Identity& who,
                          bool internal) const {
  // Built only for a refusal: every call passes here.
  auto what = [&] { return box.cls->name + "." + env.method; };
  if (!who.member()) {
    if (internal)
      return what() +
             " is internal: only the cluster's head, nodes and actors (holders of the cluster "
             "key) may call it, not a client";
    // The runtime's own services check their callers themselves (the head: per job); an actor
    // the operator started (no owner) serves every user, as a shared service.
    if (box.id.empty() || box.id[0] == '@' || box.context.owner.empty()) return {};
    if (!who.may_act_on(box.context.owner))
      return what() + ": actor " + box.id +
             (box.context.job.empty() ? "" : " of job " + box.context.job) + " belongs to " +
             box.context.owner_name + "; only its owner or an admin may call it, not " + who.name;
    return {};
  }
  // A member's actor (whose code a user may have asked for) reaches another job's internals
  // only from inside that job; the operator's own processes (no actor) are not held to it.
  if (internal && env.from_actor && !box.context.job.empty() && env.sender_job != box.context.job)
    return what() + " is internal to job " + box.context.job + ": actor " +
           escape_remote(env.sender, 64) + " of " +
           (env.sender_job.empty() ? std::string("no job")
                                   : "job " + escape_remote(env.sender_job, 64)) +
           " may not call it";
  if (env.from_actor && !box.context.owner.empty() && !env.sender_owner.empty() &&
      env.sender_owner != box.context.owner)
    return what() + ": actor " + box.id + " belongs to " + box.context.owner_name +
           "; an actor of another user (" + escape_remote(env.sender, 64) + ") may not call it";
  return {};
}

void Core::on_inbound(zmq::message_t&& rid, std::vector<zmq::message_t>&& frames,
                      security::Identity who) {
  inbound_messages_.fetch_add(1, std::memory_order_relaxed);
  if (frames.empty()) {
    spdlog::warn("dropped an empty message");
    return;
  }
  Decoded d;
  try {
    d = decode(std::move(frames), opts_.max_message_bytes);
  } catch (const ProtocolError& e) {
    uint64_t corr = salvage_corr(frames[0]);
    warn_bad_input("rejected a message (corr " + std::to_string(corr) +
                   "): " + escape_remote(e.what(), 400));
    send_error(std::move(rid), corr, "ProtocolError", e.what());
    return;
  }
  switch (d.env.k()) {
    case Kind::Attach:
      attach(std::move(rid), d.env, who);
      return;
    case Kind::Reply:
    case Kind::Error:
      if (opts_.forward) {
        forward_back(std::move(rid), std::move(d));
        return;
      }
      break;
    case Kind::Request:
    case Kind::Tell:
    case Kind::Ping:
      if (!d.env.via.empty()) {
        forward(std::move(rid), std::move(d), who);
        return;
      }
      break;
    default:
      break;
  }
  dispatch(std::move(rid), std::move(d), who);
}

void Core::dispatch(zmq::message_t&& rid, Decoded&& d, const security::Identity& who) {
  switch (d.env.k()) {
    case Kind::Ping: {
      Envelope pong;
      pong.kind = static_cast<uint8_t>(Kind::Pong);
      pong.corr = d.env.corr;
      transport_->reply(std::move(rid), encode(pong));
      return;
    }
    case Kind::Request:
    case Kind::Tell:
      break;
    default:
      warn_bad_input("dropped an unexpected " + std::to_string(int(d.env.kind)) + " message from " +
                     escape_remote(d.env.sender));
      return;
  }
  std::shared_ptr<Mailbox> box;
  {
    std::lock_guard<std::mutex> lock(actors_mu_);
    auto it = actors_.find(d.env.target);
    if (it != actors_.end()) box = it->second;
  }
  if (!box) {
    std::string msg = "no actor '" + escape_remote(d.env.target) + "' on " + opts_.self_name +
                      (address_.empty() ? "" : " (" + address_ + ")");
    if (d.env.k() == Kind::Request)
      send_error(std::move(rid), d.env.corr, "ActorNotFoundError", msg);
    else
      warn_bad_input("dropped a one-way call " + escape_remote(d.env.method) + ": " + msg);
    return;
  }
  // Rights, before the call takes room in the mailbox. An unknown method goes through to get
  // its MethodNotFoundError, which names the methods there are.
  const MethodEntry* m = box->cls->find(d.env.method);
  if (const std::string msg = refusal(*box, d.env, who, m && m->internal); !msg.empty()) {
    if (d.env.k() == Kind::Request)
      send_error(std::move(rid), d.env.corr, "PermissionError", msg);
    else
      warn_bad_input("dropped a one-way call: " + msg);
    return;
  }
  // A concurrent method runs beside the mailbox, on a thread of its own, at once.
  if (m && m->concurrent) {
    run_beside(box, Inbound{std::move(rid), std::move(d.env), std::move(d.payload), who});
    return;
  }
  const size_t bytes = payload_bytes(d.payload);
  bool was_empty, full;
  size_t queued, queued_bytes;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    was_empty = box->queue.empty();
    queued = box->queue.size();
    queued_bytes = box->queued_bytes;
    full = !was_empty &&
           (queued >= opts_.max_mailbox_messages || queued_bytes + bytes > opts_.max_mailbox_bytes);
    if (!full) {
      box->queued_bytes += bytes;
      box->queue.push_back(
          Inbound{std::move(rid), std::move(d.env), std::move(d.payload), who, bytes});
    }
  }
  if (full) {
    const std::string why = "the mailbox of actor " + box->id + " holds " + std::to_string(queued) +
                            " calls of " + std::to_string(queued_bytes) + " bytes (limits " +
                            std::to_string(opts_.max_mailbox_messages) + " calls, " +
                            std::to_string(opts_.max_mailbox_bytes) + " bytes)";
    refuse_busy(*box, box->full_warnings, std::move(rid), d.env, why);
    return;
  }
  if (was_empty) box->cv.notify_one();
}

void Core::post(const std::string& actor_id, const std::string& method, Payload&& args) {
  std::shared_ptr<Mailbox> box;
  {
    std::lock_guard<std::mutex> lock(actors_mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end()) return;
    box = it->second;
  }
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Tell);
  env.sender = opts_.self_name;
  env.target = actor_id;
  env.method = method;
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    was_empty = box->queue.empty();
    box->queue.push_back(Inbound{zmq::message_t(), std::move(env), std::move(args)});
  }
  if (was_empty) box->cv.notify_one();
}

void Core::host(const std::string& actor_id, const ClassEntry& cls, std::shared_ptr<void> instance,
                ActorContext context) {
  auto box = std::make_shared<Mailbox>();
  box->id = actor_id;
  box->cls = &cls;
  box->instance = std::move(instance);
  box->context = std::move(context);
  if (box->context.actor_id.empty()) box->context.actor_id = actor_id;
  {
    std::lock_guard<std::mutex> lock(actors_mu_);
    if (actors_.count(actor_id))
      throw std::logic_error("actor " + actor_id + " is already hosted here");
    actors_[actor_id] = box;
  }
  box->thread = std::thread([this, box] { run_mailbox(box); });
}

bool Core::unhost(const std::string& actor_id, bool wait) {
  std::shared_ptr<Mailbox> box;
  {
    std::lock_guard<std::mutex> lock(actors_mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end()) return false;
    box = it->second;
    actors_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(box->mu);
    box->stopping = true;
  }
  box->cv.notify_all();
  box->beside_cv.notify_all();
  // The calls still queued are answered now, not after the method in progress.
  refuse_queued(*box);
  // Ask the method in progress, if any, to end soon (ActorClass::on_stop).
  if (box->cls->stop && box->instance) {
    try {
      box->cls->stop(box->instance.get());
    } catch (const std::exception& e) {
      spdlog::warn("actor {} ({}): its stop hook raised: {}", actor_id, box->cls->name, e.what());
    }
  }
  if (!wait) {
    reap(std::move(box), actor_id);
    return true;
  }
  if (box->thread.get_id() == std::this_thread::get_id())
    box->thread.detach();
  else if (box->thread.joinable())
    box->thread.join();
  // Calls of concurrent methods end too (the stop hook asked them to) before the actor goes.
  std::unique_lock<std::mutex> lock(box->mu);
  box->cv.wait(lock, [&] { return box->beside == 0; });
  return true;
}

void Core::reap(std::shared_ptr<Mailbox> box, const std::string& actor_id) {
  const std::string who = actor_id + " (" + box->cls->name + ")" +
                          (box->context.job.empty() ? "" : " of job " + box->context.job);
  std::lock_guard<std::mutex> lock(reapers_mu_);
  std::erase_if(reapers_, [](Reaper& r) {
    if (!r.done->load()) return false;
    r.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<Core> weak = weak_from_this();
  std::thread t([weak, box = std::move(box), done]() mutable {
    if (box->thread.joinable()) box->thread.join();
    {
      std::unique_lock<std::mutex> l(box->mu);
      box->cv.wait(l, [&] { return box->beside == 0; });
    }
    // The instance goes here, with this process's Core current, as on the thread that killed it.
    if (std::shared_ptr<Core> self = weak.lock()) {
      tl_core = &self;
      box.reset();
      tl_core = nullptr;
    } else {
      box.reset();
    }
    done->store(true);
  });
  reapers_.push_back(Reaper{std::move(t), std::move(done), who, now_ms()});
}

std::vector<std::string> Core::outlived_kills(int64_t grace_ms) const {
  const int64_t now = now_ms();
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(reapers_mu_);
  for (const Reaper& r : reapers_)
    if (!r.done->load() && now - r.killed_ms >= grace_ms)
      out.push_back(r.actor + ", killed " + human_ms(now - r.killed_ms) + " ago");
  return out;
}

std::vector<std::string> Core::hosted() const {
  std::lock_guard<std::mutex> lock(actors_mu_);
  std::vector<std::string> out;
  for (auto& [id, _] : actors_)
    if (id[0] != '@') out.push_back(id);
  return out;
}

void Core::refuse_busy(Mailbox& box, RateLimit& warnings, zmq::message_t&& rid,
                       const Envelope& env, const std::string& why) {
  if (env.k() == Kind::Request) {
    send_error(std::move(rid), env.corr, "RemoteError",
               "call " + escape_remote(env.method) + " refused: " + why + "; try again later");
    return;
  }
  uint64_t held = 0;
  std::lock_guard<std::mutex> lock(box.mu);
  if (warnings.allow(now_ms(), &held))
    spdlog::warn("dropped a one-way call {}: {}{}", escape_remote(env.method), why,
                 held ? " (" + std::to_string(held) + " more not logged)" : std::string());
}

void Core::warn_tell(Mailbox& box, const std::string& line) {
  uint64_t held = 0;
  {
    std::lock_guard<std::mutex> lock(box.mu);
    if (!box.tell_warnings.allow(now_ms(), &held)) return;
  }
  if (held > 0)
    spdlog::warn("actor {}: {} ({} more such lines in the last 10 s not logged)", box.id, line,
                 held);
  else
    spdlog::warn("actor {}: {}", box.id, line);
}

// Requests still queued for an actor that is going away get an answer now,
// instead of leaving their callers to time out.
void Core::refuse_queued(Mailbox& box) {
  std::deque<Inbound> left;
  {
    std::lock_guard<std::mutex> lock(box.mu);
    left.swap(box.queue);
    box.queued_bytes = 0;
  }
  for (Inbound& in : left)
    if (in.env.k() == Kind::Request)
      send_error(std::move(in.routing_id), in.env.corr, "ActorDiedError",
                 "actor " + box.id + " (" + box.cls->name + ") was stopped on " + opts_.self_name +
                     " before it handled " + in.env.method);
}

// One call to an actor of `box`: decodes its arguments, runs the method, sends the answer (or
// leaves it to whoever took it with defer_reply).
void Core::handle_call(Mailbox& box, Inbound& in, const std::shared_ptr<Core>& self) {
  bool wants_reply = in.env.k() == Kind::Request;
  const MethodEntry* m = box.cls->find(in.env.method);
  if (!m) {
    std::string msg = "actor class " + box.cls->name + " has no method '" + in.env.method +
                      "' (it has: " + box.cls->method_list() + ")";
    if (wants_reply)
      send_error(std::move(in.routing_id), in.env.corr, "MethodNotFoundError", msg);
    else
      warn_tell(box, "dropped a one-way call: " + msg);
    return;
  }
  std::string err_type, err_msg;
  Payload result;
  const CallerInfo caller{in.who, in.env.sender, in.env.from_actor, in.env.sender_job,
                          in.env.sender_owner};
  tl_caller = &caller;
  Handling handling{
      self, &in.routing_id, in.env.corr, wants_reply, box.cls->name + "." + in.env.method, nullptr};
  tl_handling = &handling;
  try {
    result = m->invoke(box.instance.get(), in.payload);
  } catch (const Error& e) {
    err_type = e.type();
    err_msg = box.cls->name + "." + in.env.method + ": " + e.what();
  } catch (const std::exception& e) {
    err_type = "RemoteError";
    err_msg = box.cls->name + "." + in.env.method + " raised: " + e.what();
  }
  tl_handling = nullptr;
  tl_caller = nullptr;
  if (!err_type.empty()) {
    // A method that failed because its actor is being stopped: to its caller the actor is
    // gone, whatever the method raised on the way out.
    std::lock_guard<std::mutex> lock(box.mu);
    if (box.stopping) {
      err_type = "ActorDiedError";
      err_msg = "actor " + box.id + " (" + box.cls->name + ") was stopped on " + opts_.self_name +
                " during " + in.env.method + ": " + err_msg;
    }
  }
  if (handling.deferred) {
    // The method took its answer: it is sent by whoever holds it, or now if it threw.
    if (!err_type.empty()) handling.deferred->error(err_type, err_msg);
    return;
  }
  if (!wants_reply) {
    if (!err_type.empty()) warn_tell(box, "one-way call failed: " + err_msg);
    return;
  }
  if (!err_type.empty()) {
    send_error(std::move(in.routing_id), in.env.corr, err_type, err_msg);
    return;
  }
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Reply);
  env.corr = in.env.corr;
  transport_->reply(std::move(in.routing_id), encode(env, std::move(result)));
}

void Core::run_beside(const std::shared_ptr<Mailbox>& box, Inbound&& in) {
  const size_t bytes = payload_bytes(in.payload);
  const int threads = std::max(1, opts_.max_concurrent_calls);
  bool stopping = false, start_thread = false;
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(box->mu);
    stopping = box->stopping;
    // Calls that a thread of the pool (running or still to start) takes at once do not wait.
    const size_t free = size_t(threads - box->beside_busy);
    const size_t queued = box->beside_queue.size();
    const size_t waiting = queued > free ? queued - free : 0;
    const bool waits = queued >= free;
    if (!stopping && waits &&
        (waiting >= opts_.max_waiting_concurrent_calls ||
         (queued > 0 && box->beside_bytes + bytes > opts_.max_mailbox_bytes))) {
      refused = std::to_string(box->beside_busy) + " concurrent calls of actor " + box->id + " (" +
                box->cls->name + ") are running and " + std::to_string(waiting) + " wait with " +
                std::to_string(box->beside_bytes) + " bytes (limits " + std::to_string(threads) +
                " running, " + std::to_string(opts_.max_waiting_concurrent_calls) + " waiting, " +
                std::to_string(opts_.max_mailbox_bytes) + " bytes)";
    } else if (!stopping) {
      box->beside_bytes += bytes;
      box->beside_queue.push_back(std::move(in));
      if (box->beside - box->beside_busy < int(box->beside_queue.size()) && box->beside < threads) {
        ++box->beside;
        start_thread = true;
      }
    }
  }
  if (stopping) {
    if (in.env.k() == Kind::Request)
      send_error(std::move(in.routing_id), in.env.corr, "ActorDiedError",
                 "actor " + box->id + " (" + box->cls->name + ") was stopped on " +
                     opts_.self_name + " before it handled " + in.env.method);
    return;
  }
  if (!refused.empty()) {
    refuse_busy(*box, box->beside_warnings, std::move(in.routing_id), in.env, refused);
    return;
  }
  box->beside_cv.notify_one();
  if (!start_thread) return;
  try {
    std::thread([self = shared_from_this(), box] { self->serve_beside(box, self); }).detach();
  } catch (const std::system_error& e) {
    // Without a thread of the pool, what waits would never run: refuse it.
    std::deque<Inbound> left;
    {
      std::lock_guard<std::mutex> lock(box->mu);
      if (--box->beside == 0) {
        left.swap(box->beside_queue);
        box->beside_bytes = 0;
        box->cv.notify_all();
      }
    }
    spdlog::warn("actor {} ({}): cannot start a thread for its concurrent calls: {}", box->id,
                 box->cls->name, e.what());
    for (Inbound& l : left)
      if (l.env.k() == Kind::Request)
        send_error(std::move(l.routing_id), l.env.corr, "RemoteError",
                   "call " + escape_remote(l.env.method) + " of actor " + box->id +
                       " refused: no thread to run it (" + e.what() + "); try again later");
  }
}

void Core::serve_beside(const std::shared_ptr<Mailbox>& box, const std::shared_ptr<Core>& self) {
  // A thread idle this long ends; the next call starts another.
  constexpr auto kIdle = std::chrono::seconds(10);
  std::shared_ptr<Core> core = self;
  tl_core = &core;
  std::deque<Inbound> left;  // queued when the actor stopped: refused, not run
  {
    ActorContextScope actor(&box->context);
    std::unique_lock<std::mutex> lock(box->mu);
    while (true) {
      if (!box->stopping && box->beside_queue.empty())
        box->beside_cv.wait_for(lock, kIdle,
                                [&] { return box->stopping || !box->beside_queue.empty(); });
      if (box->stopping) {
        left.swap(box->beside_queue);
        box->beside_bytes = 0;
        break;
      }
      if (box->beside_queue.empty()) break;
      Inbound in = std::move(box->beside_queue.front());
      box->beside_queue.pop_front();
      box->beside_bytes -= std::min(box->beside_bytes, payload_bytes(in.payload));
      ++box->beside_busy;
      lock.unlock();
      handle_call(*box, in, core);
      lock.lock();
      --box->beside_busy;
    }
  }
  for (Inbound& in : left)
    if (in.env.k() == Kind::Request)
      send_error(std::move(in.routing_id), in.env.corr, "ActorDiedError",
                 "actor " + box->id + " (" + box->cls->name + ") was stopped on " +
                     opts_.self_name + " before it handled " + in.env.method);
  tl_core = nullptr;
  std::lock_guard<std::mutex> lock(box->mu);
  if (--box->beside == 0) box->cv.notify_all();
}

void Core::run_mailbox(std::shared_ptr<Mailbox> box) {
  std::shared_ptr<Core> self = shared_from_this();
  tl_core = &self;
  ActorContextScope actor(&box->context);
  while (true) {
    Inbound in;
    {
      // One call at a time: a kill (unhost) answers every call still queued at once, and none
      // of them runs after it.
      std::unique_lock<std::mutex> lock(box->mu);
      box->cv.wait(lock, [&] { return box->stopping || !box->queue.empty(); });
      if (box->stopping) break;
      in = std::move(box->queue.front());
      box->queue.pop_front();
      box->queued_bytes -= std::min(box->queued_bytes, in.bytes);
    }
    handle_call(*box, in, self);
  }
  refuse_queued(*box);
  tl_core = nullptr;
}

// ---- The head's forwarding to nodes reached only through it ----------------------------------

namespace {
std::string bytes_of(const zmq::message_t& m) { return std::string(m.data<char>(), m.size()); }
zmq::message_t message_of(const std::string& s) { return zmq::message_t(s.data(), s.size()); }
// Node ids are short ("n-" and hex); anything longer is not one.
constexpr size_t kMaxNodeIdBytes = 64;
// Nodes the head forwards to at most (a bound on what attaches may make it hold).
constexpr size_t kMaxRoutes = size_t(1) << 16;
}  // namespace

bool Core::route_live(const std::string& node, int64_t now) {
  std::lock_guard<std::mutex> lock(routes_mu_);
  auto r = routes_.find(node);
  return r != routes_.end() &&
         now - r->second.last_heard < std::max<int64_t>(1, opts_.detect_ms / 2);
}

void Core::forward(zmq::message_t&& rid, Decoded&& d, const security::Identity& who) {
  const int64_t now = now_ms();
  const Kind kind = d.env.k();
  const std::string& node = d.env.via;
  if (kind == Kind::Ping) {
    // A caller waits on an actor of `node`: it hears from the node's connection only while that
    // is alive, so it learns of the node's death as it would of a node it calls directly.
    if (opts_.forward && route_live(node, now)) {
      Envelope pong;
      pong.kind = static_cast<uint8_t>(Kind::Pong);
      pong.corr = d.env.corr;
      transport_->reply(std::move(rid), encode(pong));
    }
    return;
  }
  const bool request = kind == Kind::Request;
  const std::string what = escape_remote(d.env.method, 64) + " on actor " +
                           escape_remote(d.env.target, 64) + " of node " +
                           escape_remote(node, kMaxNodeIdBytes);
  auto refuse = [&](const std::string& type, const std::string& message) {
    if (request)
      send_error(std::move(rid), d.env.corr, type, message);
    else
      warn_bad_input("dropped a one-way call " + message);
  };
  if (!opts_.forward) {
    refuse("ClusterError", "call " + what + ": " + opts_.self_name +
                               " forwards no calls; only the head reaches nodes behind NAT");
    return;
  }
  std::string node_rid;
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    auto r = routes_.find(node);
    if (r == routes_.end() || now - r->second.last_heard >= opts_.detect_ms) {
      const std::string why =
          r == routes_.end()
              ? "it is reached only through the head and has no connection to the head now"
              : "its connection to the head has been silent for " +
                    human_ms(now - r->second.last_heard);
      refuse("ActorDiedError", "actor " + escape_remote(d.env.target, 64) + " on node " +
                                   escape_remote(node, kMaxNodeIdBytes) +
                                   " died or is unreachable: " + kNotForwarded + why + " (call " +
                                   escape_remote(d.env.method, 64) + ")");
      return;
    }
    if (request) {
      if (forwarded_.size() >= opts_.max_forwarded_calls) {
        refuse("RemoteError", "call " + what + " refused: the head forwards at most " +
                                  std::to_string(opts_.max_forwarded_calls) +
                                  " calls at once to nodes behind NAT; try again later");
        return;
      }
      const uint64_t corr = next_forward_++;
      forwarded_.emplace(corr, Forwarded{bytes_of(rid), d.env.corr, node, r->second.rid,
                                         d.env.target, d.env.method});
      d.env.corr = corr;
    }
    node_rid = r->second.rid;
  }
  d.env.via.clear();
  d.env.origin = security::user_id_of(who);
  transport_->reply(message_of(node_rid), encode(d.env, std::move(d.payload)));
}

void Core::forward_back(zmq::message_t&& rid, Decoded&& d) {
  Forwarded f;
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    auto it = forwarded_.find(d.env.corr);
    // Only the connection a call was forwarded on may answer it: a node cannot answer (or
    // forge the answers of) calls it was not given.
    if (it == forwarded_.end())
      refused = "to no call the head forwarded";
    else if (it->second.node_rid != bytes_of(rid))
      refused = "that came on another connection than the call went out on";
    if (refused.empty()) {
      f = std::move(it->second);
      forwarded_.erase(it);
      auto r = routes_.find(f.node);
      if (r != routes_.end() && r->second.rid == f.node_rid) r->second.last_heard = now_ms();
    }
  }
  if (!refused.empty()) {
    warn_bad_input("dropped a reply (corr " + std::to_string(d.env.corr) + ", from " +
                   escape_remote(d.env.sender, 64) + ") " + refused);
    return;
  }
  d.env.corr = f.caller_corr;
  d.env.via.clear();
  d.env.origin.clear();
  if (d.env.k() == Kind::Error)
    transport_->reply(message_of(f.caller_rid), encode(d.env));
  else
    transport_->reply(message_of(f.caller_rid), encode(d.env, std::move(d.payload)));
}

void Core::attach(zmq::message_t&& rid, const Envelope& env, const security::Identity& who) {
  const std::string& node = env.via;
  if (!opts_.forward) {
    warn_bad_input("dropped an attach from " + escape_remote(env.sender, 64) + ": " +
                   opts_.self_name + " forwards no calls");
    return;
  }
  if (!who.member()) {
    warn_bad_input("refused an attach from client " + escape_remote(who.name, 64) +
                   ": only nodes (holders of the cluster key) are reached through the head");
    return;
  }
  if (node.empty() || node.size() > kMaxNodeIdBytes || node.find('/') != std::string::npos) {
    warn_bad_input("refused an attach naming node '" + escape_remote(node, 80) +
                   "': not a node id");
    return;
  }
  const std::string id = bytes_of(rid);
  std::vector<Forwarded> lost;  // calls that went out on the connection this one replaces
  bool fresh = false, full = false;
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    if (!routes_.count(node) && routes_.size() >= kMaxRoutes) {
      full = true;
    } else {
      Route& route = routes_[node];
      fresh = route.rid != id;
      if (fresh && !route.rid.empty()) lost = take_forwarded_locked(node);
      route.rid = id;
      route.last_heard = now_ms();
    }
  }
  if (full) {
    warn_bad_input("refused an attach of node " + escape_remote(node) + ": the head forwards to " +
                   std::to_string(kMaxRoutes) + " nodes at most");
    return;
  }
  if (fresh)
    spdlog::info(
        "{}: node {} is reached over the connection it opened (it is behind NAT or not "
        "listening): calls to its actors go through here",
        opts_.self_name, escape_remote(node));
  fail_forwarded(std::move(lost),
                 "its connection to the head was replaced while the call was in "
                 "flight");
  Envelope pong;
  pong.kind = static_cast<uint8_t>(Kind::Pong);
  pong.via = node;  // the node learns that the head forwards to it now
  transport_->reply(std::move(rid), encode(pong));
}

void Core::fail_forwarded(std::vector<Forwarded>&& calls, const std::string& why) {
  for (Forwarded& f : calls)
    send_error(message_of(f.caller_rid), f.caller_corr, "ActorDiedError",
               "actor " + escape_remote(f.target, 64) + " on node " + f.node +
                   " died or is unreachable: " + why + " (call " + escape_remote(f.method, 64) +
                   ", forwarded by the head)");
}

std::vector<Core::Forwarded> Core::take_forwarded_locked(const std::string& node) {
  return take_forwarded_if_locked([&](const Forwarded& f) { return f.node == node; });
}

std::vector<Core::Forwarded> Core::take_forwarded_if_locked(
    const std::function<bool(const Forwarded&)>& which) {
  std::vector<Forwarded> taken;
  for (auto it = forwarded_.begin(); it != forwarded_.end();) {
    if (which(it->second)) {
      taken.push_back(std::move(it->second));
      it = forwarded_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

void Core::drop_forwarded_to(const std::string& actor_id, const std::string& why) {
  std::vector<Forwarded> lost;
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    lost = take_forwarded_if_locked([&](const Forwarded& f) { return f.target == actor_id; });
  }
  fail_forwarded(std::move(lost), why);
}

void Core::drop_route(const std::string& node_id, const std::string& why) {
  std::vector<Forwarded> lost;
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    routes_.erase(node_id);
    lost = take_forwarded_locked(node_id);
  }
  fail_forwarded(std::move(lost), why);
}

}  // namespace loco::detail
