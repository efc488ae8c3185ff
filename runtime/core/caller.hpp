#pragma once
// What handles, futures and loco::Runtime need from the process's engine:
// send a call, wait for its reply, call the head. An abstract interface, as
// Ray's C++ API has internal::RayRuntime, so that the public headers (actor.hpp,
// runtime.hpp) carry neither ZeroMQ nor the engine's members; detail::Core
// (core.hpp, private to runtime/) implements it.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cluster_types.hpp"
#include "codec.hpp"
#include "util.hpp"
#include "../security/keys.hpp"

namespace loco::detail {

// Where an actor is; shared by every copy of a handle so that a re-resolved
// location (after a restart) serves them all.
struct ActorRef {
  std::string id;
  std::string name;
  std::string class_name;
  // A system actor at a known address ("@head", or a node's "@node"): never re-resolved.
  bool fixed = false;
  std::mutex mu;
  std::string address;  // "" when unknown or stale
  std::string node_id;

  // "Counter 'c' (a-1f2e)", "the head", "node n-1 (10.0.0.2:7071)".
  std::string describe() const;
};

// One loco::wait() on several calls: each of them that ends tells it.
struct CallWaiter {
  std::mutex mu;
  std::condition_variable cv;
  size_t ended = 0;  // the calls that ended since the wait began (not counting those done then)

  void tell() {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++ended;
    }
    cv.notify_all();
  }
};

// One call in flight.
struct CallState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error_type;  // empty on success
  std::string error_message;
  Payload result;
  // For error messages and failure detection.
  uint64_t corr = 0;
  std::string peer;
  std::string method;
  std::shared_ptr<ActorRef> ref;
  // The loco::wait()s on this call, told when it ends (under mu; taken by whoever sets done).
  std::vector<std::shared_ptr<CallWaiter>> waiters;

  // "add on Counter 'c' (a-1f2e)": built only when an error needs it.
  std::string what() const { return method + " on " + ref->describe(); }
};

// loco::wait (actor.hpp) on the calls' states: the indices of those that ended once
// `num_returns` of them have, `timeout` passed or `stop` was requested. Blocks on one condition
// variable that each call's end signals (Core::finish), never by polling.
std::vector<size_t> wait_calls(const std::vector<CallState*>& calls, size_t num_returns,
                               Millis timeout, std::stop_token stop);

class Caller {
 public:
  virtual ~Caller() = default;

  // Sends `method` with `args` to the actor. Never blocks on the network; may
  // block to resolve an actor whose location is unknown (asks the head).
  virtual std::shared_ptr<CallState> call(const std::shared_ptr<ActorRef>& ref,
                                          const std::string& method, Payload&& args,
                                          bool oneway) = 0;
  // Waits for the reply; throws its error, or TimeoutError.
  virtual void await(CallState& st, Millis timeout) = 0;

  // A call to the head's service, retried while the head is unreachable (it may
  // be restarting), until `timeout`; returns the reply. Throws ClusterError when
  // the head does not answer in time, or the error the head raised.
  virtual Payload call_head(const std::string& method, Payload&& args, Millis timeout) = 0;

  // "HOST:PORT" other processes reach this one at ("" for a driver).
  virtual std::string address() const = 0;
  // What this process's sockets use (the cluster key, or plain TCP).
  virtual const security::Settings& security() const = 0;
  // The node's reachability and the cluster's relay (a driver's: direct, none).
  virtual NodeNetwork network() const { return {}; }

  template <class R, class... A>
  R head_call(const std::string& method, Millis timeout, const A&... args) {
    Payload reply = call_head(method, pack_payload(std::make_tuple(args...)), timeout);
    if constexpr (!std::is_void_v<R>) return unpack_payload<R>(reply, "reply of head.", method);
  }
};

}  // namespace loco::detail
