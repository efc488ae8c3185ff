#pragma once
// The per-process engine behind handles, nodes and the head: sends calls,
// matches replies, detects peers that stopped answering, and runs the actors
// this process hosts, each on its own thread, one message at a time.
//
// Private to runtime/ (and white-box tests): handles and loco::Runtime see it
// only as a detail::Caller (caller.hpp), so that a change here, or in the
// ZeroMQ plumbing below it, rebuilds no user code.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include "runtime/core/caller.hpp"
#include "runtime/core/cluster_types.hpp"
#include "runtime/core/registry.hpp"
#include "runtime/core/transport.hpp"
#include "runtime/core/util.hpp"
#include "runtime/core/wire.hpp"

namespace loco::detail {

// In the error of a call the head could not forward to a node behind NAT (no connection from it,
// or a silent one): the call never reached the node.
inline constexpr char kNotForwarded[] = "the head could not forward it: ";

struct CoreOptions {
  std::string bind;            // "tcp://HOST:PORT"; empty for a driver
  std::string advertise;       // host to advertise instead of the bound one ("" = bound host)
  std::string head_address;    // "HOST:PORT"
  std::string self_name;       // "driver", "node n-..", "head": the sender of our messages
  int64_t detect_ms = 2000;    // a peer silent this long while we wait on it is dead
  int64_t heartbeat_ms = 400;  // ping a peer we wait on after this much silence
  // A connection we opened that carried nothing for this long, with no call waiting on it, is
  // closed (the next call opens it again): the peers of a long run come and go, and each one
  // kept would hold its socket and file descriptors for the life of the process.
  int64_t idle_close_ms = 120000;
  size_t max_message_bytes = size_t(1) << 30;
  // Connections its port holds from any one address (security/source_limit.hpp); 0: no bound.
  size_t max_connections_per_source = 256;
  // Calls from the network waiting in one actor's mailbox; past either bound a request is
  // refused with an error and a one-way call is dropped (a message always fits an empty box).
  size_t max_mailbox_messages = size_t(1) << 16;
  size_t max_mailbox_bytes = size_t(2) << 30;
  // Calls of an actor's concurrent methods (ActorClass::concurrent_method) run on a pool of at
  // most this many threads per actor, started as needed and ended after a while idle. Past it
  // a call waits, at most max_waiting_concurrent_calls of them (and max_mailbox_bytes) per
  // actor; past that a request is refused with an error and a one-way call is dropped. The
  // cluster's own concurrent methods answer at once (pokes, cancellations): a few threads
  // serve them, and a flood of them costs a queue, never a thread each.
  int max_concurrent_calls = 8;
  size_t max_waiting_concurrent_calls = 1024;
  int64_t resolve_timeout_ms = 15000;  // how long a handle waits for a restarting actor
  // The head: forwards calls for actors of nodes reached only through it (Reachability::reverse)
  // on the connections those nodes opened to it, at most this many requests at once.
  bool forward = false;
  size_t max_forwarded_calls = size_t(1) << 16;
  security::Settings security;  // CURVE, or plain TCP when security.curve is false
};

class Core final : public Caller, public std::enable_shared_from_this<Core> {
 public:
  explicit Core(CoreOptions opts);
  ~Core() override;

  const CoreOptions& options() const { return opts_; }
  // Adopts the cluster's failure detection times (a node learns them from the head).
  void set_detection(int64_t detect_ms, int64_t heartbeat_ms);

  // Caller
  std::shared_ptr<CallState> call(const std::shared_ptr<ActorRef>& ref, const std::string& method,
                                  Payload&& args, bool oneway) override;
  void await(CallState& st, Millis timeout) override;
  Payload call_head(const std::string& method, Payload&& args, Millis timeout) override;
  // A request whose outcome `done` receives, on the I/O thread (or the one that ends it):
  // never blocks, so the head can call nodes without waiting on them. `done` must not block.
  std::shared_ptr<CallState> call_async(const std::shared_ptr<ActorRef>& ref,
                                        const std::string& method, Payload&& args,
                                        std::function<void(CallState&)> done);
  // Sends the answer to a request taken with defer_reply().
  void answer(zmq::message_t&& routing_id, uint64_t corr, const std::string& error_type,
              const std::string& error_message, Payload&& result);
  std::string address() const override;
  const security::Settings& security() const override { return opts_.security; }
  NodeNetwork network() const override {
    std::lock_guard lock(network_mu_);
    return network_;
  }
  // A node, once it knows its reachability and the head's relay (run_node).
  void set_network(NodeNetwork n) {
    std::lock_guard lock(network_mu_);
    network_ = std::move(n);
  }

  // Messages that reached the decoder, and handshakes the ZAP handler admitted and refused.
  uint64_t inbound_messages() const { return inbound_messages_.load(); }
  uint64_t handshakes_admitted() const { return transport_->handshakes_admitted(); }
  uint64_t handshakes_refused() const { return transport_->handshakes_refused(); }
  // Connections to peers open now (CoreOptions::idle_close_ms closes the idle ones).
  size_t open_connections() const { return transport_->connections(); }

  // Hosting (nodes and the head).
  // Its methods see `context` as this_actor().
  void host(const std::string& actor_id, const ClassEntry& cls, std::shared_ptr<void> instance,
            ActorContext context = {});
  // Stops hosting an actor: calls still queued for it are answered with ActorDiedError at once,
  // its stop hook is asked to end the method in progress, and then either this waits for that
  // method (and its concurrent calls) to end, or (wait = false: a kill, which must not hold
  // up the node's own service) a thread of the Core's waits and lets the instance go.
  bool unhost(const std::string& actor_id, bool wait = true);
  std::vector<std::string> hosted() const;
  // The actors killed without waiting that are still in a method `grace_ms` or more after
  // their kill ("ID (CLASS) of job JOB, killed 61.2 s ago").
  std::vector<std::string> outlived_kills(int64_t grace_ms) const;

  // Queues a one-way call to an actor hosted here, without going through a socket.
  void post(const std::string& actor_id, const std::string& method, Payload&& args);

  std::shared_ptr<ActorRef> head_ref() const { return head_ref_; }
  void shutdown();

  // Where this process sends calls for `address`: itself, or, for "head/<node>" (a node reached
  // only through the head: call_address()), "<its head's address>/<node>", a connection of its
  // own to the head, whose calls name the node (Envelope::via).
  std::string route(const std::string& address) const;
  // A node reached only through the head (no ROUTER, or one the head cannot dial): tells the
  // head now and every heartbeat that the connection to it serves `node_id`, and takes the
  // calls the head forwards on it. Called again when the node joins under a new id.
  void attach_as(const std::string& node_id);
  // Whether the head has confirmed, within `timeout`, that it forwards to the node of the last
  // attach_as: a node joins only then, so that the head never places an actor on it that it
  // cannot reach yet.
  bool wait_attached(Millis timeout);
  // The head, on declaring `node_id` dead: the calls it forwards there fail at once with
  // ActorDiedError saying `why`, and its connection serves it no more.
  void drop_route(const std::string& node_id, const std::string& why);
  // The head, on an actor's death (killed, or its job over): the calls it forwards to that
  // actor fail at once with ActorDiedError saying `why`; the node's answers to them, if any
  // come, are dropped.
  void drop_forwarded_to(const std::string& actor_id, const std::string& why);
  // The head: whether it forwards calls to `node` now (its connection was heard from within
  // half the detection time). An actor of a node it does not forward to is not callable, even
  // before the node is declared dead.
  bool forwards_to(const std::string& node_id) { return route_live(node_id, now_ms()); }

 private:
  struct Inbound {
    zmq::message_t routing_id;
    Envelope env;
    Payload payload;
    security::Identity who;  // posted calls come from this process: a member
    size_t bytes = 0;        // counted in its mailbox's queued_bytes (a call from the network)
  };
  struct Mailbox;
  // A thread that waits for a killed actor's method in progress to end (unhost without waiting).
  struct Reaper {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    std::string actor;  // "ID (CLASS) of job JOB", for the log
    int64_t killed_ms = 0;
  };
  void reap(std::shared_ptr<Mailbox> box, const std::string& actor_id);
  struct PeerState {
    int pending = 0;
    int64_t last_heard = 0;
    int64_t last_ping = 0;
    int64_t last_used = 0;  // a message sent to it or heard from it
  };

  // Decodes, checks the caller's rights (a client may not call an internal method) and queues.
  void on_inbound(zmq::message_t&& rid, std::vector<zmq::message_t>&& frames,
                  security::Identity who);
  // A decoded request, tell or ping for this process (from the ROUTER, or from the head on the
  // DEALER to it): answered, queued in its actor's mailbox, or refused.
  void dispatch(zmq::message_t&& rid, Decoded&& d, const security::Identity& who);
  // The head's part for nodes reached through it. A call for node `d.env.via`: sent on that
  // node's connection under a correlation id of the head's (`forwarded_`), or refused.
  void forward(zmq::message_t&& rid, Decoded&& d, const security::Identity& who);
  // A reply that came on the ROUTER: the answer of a node to a call forwarded on that same
  // connection, sent back to its caller; anything else is dropped.
  void forward_back(zmq::message_t&& rid, Decoded&& d);
  // A node says that the connection `rid` serves it (Kind::Attach).
  void attach(zmq::message_t&& rid, const Envelope& env, const security::Identity& who);
  // Whether the connection of `node` was heard from within half the detection time: the head
  // answers a caller's pings for the node's actors only then.
  bool route_live(const std::string& node, int64_t now);
  // Fails the forwarded calls for `nodes` (their connections lost) with ActorDiedError.
  struct Forwarded;
  void fail_forwarded(std::vector<Forwarded>&& calls, const std::string& why);
  // Takes the calls forwarded to `node` out of the table (routes_mu_ held).
  std::vector<Forwarded> take_forwarded_locked(const std::string& node);
  // Takes the forwarded calls `which` picks out of the table (routes_mu_ held).
  std::vector<Forwarded> take_forwarded_if_locked(
      const std::function<bool(const Forwarded&)>& which);
  // Why the caller may not make this call to an actor of `box` ("" when it may): a client's
  // call to an internal method or to an actor another key owns, an actor's call to an internal
  // method of another job's actor.
  std::string refusal(const Mailbox& box, const Envelope& env, const security::Identity& who,
                      bool internal) const;
  // Whom call `st` went to, for its error: "ACTOR on node N (PEER)", "the head at PEER" or
  // "node N (PEER)".
  static std::string callee(const CallState& st);
  // Takes the calls pending on `peer` out of the table (their caller finishes them).
  std::vector<std::shared_ptr<CallState>> take_pending_on(const std::string& peer);
  // Fails the calls pending on `peer` with ClusterError: retrying will not make it accept us.
  void on_handshake_failed(const std::string& peer, const std::string& why);
  // The head that forwards our calls to a node behind NAT (`peer` "HOST:PORT/NODE") closed its
  // connection: the answers of the calls on their way there are lost with its table. Fails
  // them with ActorDiedError, as if the node had gone silent (a restarted head that re-attached
  // the node answers our heartbeats for it, so they would otherwise wait for ever).
  void on_forwarder_closed(const std::string& peer);
  void on_reply(const std::string& peer, std::vector<zmq::message_t>&& frames);
  // Whether this process declared `peer` dead (its failure detection), as opposed to `peer`
  // answering with an error of its own.
  bool unreachable(const std::string& peer);
  void on_tick(int64_t now);
  void send_error(zmq::message_t&& rid, uint64_t corr, const std::string& type,
                  const std::string& message);
  void run_mailbox(std::shared_ptr<Mailbox> box);
  void handle_call(Mailbox& box, Inbound& in, const std::shared_ptr<Core>& self);
  // A call of a concurrent method (ActorClass::concurrent_method): queued for the actor's pool
  // of concurrent-call threads (started here up to max_concurrent_calls), or refused when
  // that queue is full.
  void run_beside(const std::shared_ptr<Mailbox>& box, Inbound&& in);
  // One thread of that pool: runs queued concurrent calls until idle for a while or the
  // actor stops.
  void serve_beside(const std::shared_ptr<Mailbox>& box, const std::shared_ptr<Core>& self);
  // A warning about malformed or unexpected input from the network, at most one line per
  // 10 s (the count of those held back goes with the next).
  void warn_bad_input(const std::string& line);
  void refuse_queued(Mailbox& box);
  // A line about a one-way call of `box`'s actor (no one waits for its answer), at most one
  // every 10 s per actor.
  void warn_tell(Mailbox& box, const std::string& line);
  // A call the actor has no room for (its mailbox, or its pool of concurrent calls, is full):
  // a request is answered "refused: `why`; try again later", a one-way call dropped with a line
  // that `warnings` (under box.mu) rate-limits.
  void refuse_busy(Mailbox& box, RateLimit& warnings, zmq::message_t&& rid, const Envelope& env,
                   const std::string& why);
  void finish(const std::shared_ptr<CallState>& st, const std::string& error_type,
              const std::string& error_message, Payload&& result);
  void resolve(ActorRef& ref);
  std::shared_ptr<CallState> send_call(std::shared_ptr<CallState> st,
                                       const std::shared_ptr<ActorRef>& ref, Payload&& args,
                                       bool oneway, std::function<void(CallState&)> done = {});

  CoreOptions opts_;
  mutable std::mutex network_mu_;
  NodeNetwork network_;
  std::string address_;
  std::shared_ptr<ActorRef> head_ref_;

  std::mutex bad_input_mu_;
  RateLimit bad_input_;
  std::mutex calls_mu_;
  uint64_t next_corr_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<CallState>> pending_;
  std::map<std::string, PeerState> peers_;
  std::map<std::string, int64_t> dead_peers_;  // address -> when we declared it dead
  // What call_async runs when a call ends, by correlation id (kept here, not in CallState,
  // so that actor code does not recompile for it).
  std::unordered_map<uint64_t, std::function<void(CallState&)>> on_done_;

  mutable std::mutex actors_mu_;
  std::map<std::string, std::shared_ptr<Mailbox>> actors_;

  // The head's forwarding (opts_.forward): each node reached through it, by id, with the routing
  // id of its connection and when it was last heard; the requests forwarded and not answered,
  // by the correlation id the head gave them.
  struct Route {
    std::string rid;
    int64_t last_heard = 0;
  };
  struct Forwarded {
    std::string caller_rid;
    uint64_t caller_corr = 0;
    std::string node, node_rid, target, method;
  };
  mutable std::mutex reapers_mu_;
  std::vector<Reaper> reapers_;
  std::mutex routes_mu_;
  std::map<std::string, Route> routes_;
  std::unordered_map<uint64_t, Forwarded> forwarded_;
  uint64_t next_forward_ = 1;
  // A node reached through the head: the id its connection serves ("" : none), and when it
  // last said so (both under calls_mu_).
  std::string attached_as_;
  int64_t last_attach_ = 0;
  bool attach_confirmed_ = false;
  std::condition_variable attach_cv_;

  std::atomic<uint64_t> inbound_messages_{0};
  std::unique_ptr<Transport> transport_;
};

// Who made the call that the current actor method is answering: who its connection's key proves
// it is (role; a client's key, name and admin flag), and the sender its envelope names (the
// calling actor's id, or "node ..", "driver", ..) with that actor's job and owner. The sender
// is what the caller says: believed of members, who hold the cluster key. Outside a method (a
// posted call, a plain thread): a member with no sender.
struct CallerInfo {
  security::Identity who;
  std::string sender;
  bool from_actor = false;
  std::string sender_job;    // the calling actor's job ("" : none, or no actor)
  std::string sender_owner;  // the calling actor's owner's key ("" : the operator, or no actor)
  bool member() const { return who.member(); }
};
const CallerInfo& current_caller();

// The answer to the request that the current actor method handles, taken to be sent later:
// the method returns at once (its return value is dropped) and whoever holds this answers,
// from any thread, once. Dropped unanswered, it answers with an error. The head uses it to
// answer a spawn when the node has created the actor, without waiting for that.
class DeferredReply {
 public:
  DeferredReply(std::weak_ptr<Core> core, zmq::message_t routing_id, uint64_t corr,
                bool wants_reply, std::string what);
  ~DeferredReply();
  DeferredReply(const DeferredReply&) = delete;
  DeferredReply& operator=(const DeferredReply&) = delete;

  void ok(Payload&& result);
  void error(const std::string& type, const std::string& message);
  const std::string& what() const { return what_; }

 private:
  std::mutex mu_;
  std::weak_ptr<Core> core_;
  zmq::message_t routing_id_;
  uint64_t corr_;
  bool open_;  // a request not yet answered
  std::string what_;
};

// Inside an actor method: takes its answer (nullptr outside one).
std::shared_ptr<DeferredReply> defer_reply();

// The Core of the process that runs the current actor method, or of the
// process's driver runtime. Set by nodes and by Runtime::connect.
std::shared_ptr<Core>& current_core();

// Makes `context` this thread's this_actor() until the scope ends (a node
// constructing an actor; each mailbox thread for its actor's methods).
class ActorContextScope {
 public:
  explicit ActorContextScope(const ActorContext* context);
  ~ActorContextScope();
  ActorContextScope(const ActorContextScope&) = delete;
  ActorContextScope& operator=(const ActorContextScope&) = delete;

 private:
  const ActorContext* previous_;
};

}  // namespace loco::detail
