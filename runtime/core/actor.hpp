#pragma once
// The typed actor API.
//
//   class Counter { public: explicit Counter(int start); int add(int n); int get() const; };
//   LOCO_REGISTER(Counter, loco::ActorClass<Counter>("Counter")
//                              .constructor<int>()
//                              .method("add", &Counter::add)
//                              .method("get", &Counter::get)
//                              .internal_method("reset", &Counter::reset));
//
//   auto counter = runtime->spawn<Counter>(loco::ActorOptions().with_name("c"), 10);
//   int v = counter.call(&Counter::add, 3).get(loco::Millis(1000));   // 13
//   counter.tell(&Counter::add, 1);                                    // one-way
//
// An internal method answers only members of the cluster (its head, nodes and actors, which
// hold the cluster key); a client that holds a client key gets PermissionError.
// A method of another class, or arguments that do not convert to the method's
// parameter types, fail to compile. Arguments and results are any
// msgpack-serializable type; loco::Blob travels as its own frame, uncopied.
#include <memory>
#include <stop_token>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "caller.hpp"
#include "cluster_types.hpp"
#include "registry.hpp"

namespace loco {

struct ActorOptions {
  std::string name;       // unique in the cluster; "" for an anonymous actor
  Resources resources{};  // what the actor needs on its node; default {cpu: 1}
  int max_restarts = 0;   // restarts on another node after its node dies
  // With resources {gpu: G}, the actor gets G of its node's GPU indices to itself
  // (this_actor().gpus). Shared, it may get indices that other sharing actors
  // hold (never one an exclusive actor holds): several on one GPU, for tests.
  bool share_gpus = false;

  ActorOptions& with_name(std::string n) {
    name = std::move(n);
    return *this;
  }
  ActorOptions& with_resources(Resources r) {
    resources = std::move(r);
    return *this;
  }
  ActorOptions& with_max_restarts(int n) {
    max_restarts = n;
    return *this;
  }
  ActorOptions& with_shared_gpus(bool shared = true) {
    share_gpus = shared;
    return *this;
  }
};

// What every Future<R> is, whatever its R: loco::wait takes these to wait on calls of
// different result types together.
class FutureBase {
 public:
  FutureBase(std::shared_ptr<detail::Caller> core, std::shared_ptr<detail::CallState> st)
      : core_(std::move(core)), st_(std::move(st)) {}

  // Whether the call has ended, with a result or an error (get() then returns at once).
  bool ready() const {
    std::lock_guard<std::mutex> lock(st_->mu);
    return st_->done;
  }

 protected:
  std::shared_ptr<detail::Caller> core_;
  std::shared_ptr<detail::CallState> st_;

  friend std::vector<size_t> wait(const std::vector<const FutureBase*>& futures, size_t num_returns,
                                  Millis timeout, std::stop_token stop);
};

// The result of a call. get() waits at most `timeout`, then throws TimeoutError;
// errors raised remotely are rethrown as their own types (ActorDiedError, ...).
template <class R>
class [[nodiscard]] Future : public FutureBase {
 public:
  using FutureBase::FutureBase;

  R get(Millis timeout = Millis(60000)) {
    core_->await(*st_, timeout);
    if constexpr (!std::is_void_v<R>)
      return detail::unpack_payload<R>(st_->result, "reply of ", st_->method);
  }
};

// Waits on several calls at once, as Ray's ray::Wait: returns once `num_returns` of `futures`
// have ended (with a result or an error; more than there are: all of them), or once `timeout`
// has passed, or once `stop` is requested, whichever comes first, and says which have ended:
// their indices in `futures`, in order, every one that has (unlike Ray, possibly more than
// `num_returns`). Nothing is cancelled: the others go on, and a later wait or get() takes them.
// The thread sleeps on a condition variable that the end of any of the calls (or the stop)
// signals, never polling; timeout 0 looks without waiting, Millis::max() has no deadline.
//
//   auto ended = loco::wait(calls, calls.size(), Millis(2000));  // all, or those in 2 s
//   for (size_t i : loco::wait(calls, 1, Millis(500))) use(calls[i].get());
inline std::vector<size_t> wait(const std::vector<const FutureBase*>& futures, size_t num_returns,
                                Millis timeout, std::stop_token stop = {}) {
  std::vector<detail::CallState*> calls;
  calls.reserve(futures.size());
  for (const FutureBase* f : futures) calls.push_back(f->st_.get());
  return detail::wait_calls(calls, num_returns, timeout, std::move(stop));
}
template <class R>
std::vector<size_t> wait(const std::vector<Future<R>>& futures, size_t num_returns, Millis timeout,
                         std::stop_token stop = {}) {
  std::vector<const FutureBase*> all;
  all.reserve(futures.size());
  for (const Future<R>& f : futures) all.push_back(&f);
  return wait(all, num_returns, timeout, std::move(stop));
}

namespace detail {

template <class Params, class Args, class = void>
struct ArgsConvert : std::false_type {};
template <class... Params, class... Args>
struct ArgsConvert<std::tuple<Params...>, std::tuple<Args...>,
                   std::enable_if_t<sizeof...(Params) == sizeof...(Args)>>
    : std::bool_constant<(std::is_convertible_v<Args, std::decay_t<Params>> && ...)> {};
template <class Params, class Args>
constexpr bool args_convert = ArgsConvert<Params, Args>::value;

}  // namespace detail

template <class T>
class ActorHandle {
 public:
  ActorHandle() = default;
  ActorHandle(std::shared_ptr<detail::Caller> core, std::shared_ptr<detail::ActorRef> ref)
      : core_(std::move(core)), ref_(std::move(ref)) {}

  template <class R, class... Params, class... Args>
  Future<R> call(R (T::*method)(Params...), Args&&... args) const {
    static_assert(detail::args_convert<std::tuple<Params...>, std::tuple<Args...>>,
                  "arguments do not match the method's parameters");
    return invoke<R, Params...>(detail::method_name<T>(method), false, std::forward<Args>(args)...);
  }
  template <class R, class... Params, class... Args>
  Future<R> call(R (T::*method)(Params...) const, Args&&... args) const {
    static_assert(detail::args_convert<std::tuple<Params...>, std::tuple<Args...>>,
                  "arguments do not match the method's parameters");
    return invoke<R, Params...>(detail::method_name<T>(method), false, std::forward<Args>(args)...);
  }
  // One-way: no reply, errors are logged by the actor's node.
  template <class R, class... Params, class... Args>
  void tell(R (T::*method)(Params...), Args&&... args) const {
    static_assert(detail::args_convert<std::tuple<Params...>, std::tuple<Args...>>,
                  "arguments do not match the method's parameters");
    (void)invoke<R, Params...>(detail::method_name<T>(method), true, std::forward<Args>(args)...);
  }

  const std::string& id() const { return ref_->id; }
  const std::string& name() const { return ref_->name; }
  // "HOST:PORT" of the node that hosts the actor as far as this handle knows.
  std::string address() const {
    std::lock_guard<std::mutex> lock(ref_->mu);
    return ref_->address;
  }
  explicit operator bool() const { return ref_ != nullptr; }

 private:
  template <class R, class... Params, class... Args>
  Future<R> invoke(const std::string& method, bool oneway, Args&&... args) const {
    // Pack as the method's own parameter types, so the wire matches the callee.
    auto tuple = std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...);
    return Future<R>(core_, core_->call(ref_, method, detail::pack_payload(tuple), oneway));
  }

  std::shared_ptr<detail::Caller> core_;
  std::shared_ptr<detail::ActorRef> ref_;
};

// Registers T as an actor class under `name`. Keep the object at namespace
// scope (LOCO_REGISTER does) so registration happens when the program or the
// plugin that defines it is loaded.
template <class T>
class ActorClass {
 public:
  explicit ActorClass(const std::string& name)
      : entry_(&detail::Registry::instance().entry_for(name, typeid(T))) {
    detail::TypeSlot<T>::entry = entry_;
    if constexpr (std::is_default_constructible_v<T>) constructor<>();
  }

  template <class... A>
  ActorClass& constructor() {
    static_assert(std::is_constructible_v<T, A...>, "T has no such constructor");
    entry_->factory = [](detail::Payload& args) -> std::shared_ptr<void> {
      auto tuple =
          detail::unpack_payload<std::tuple<std::decay_t<A>...>>(args, "constructor arguments");
      return std::apply([](auto&&... a) { return std::make_shared<T>(std::move(a)...); },
                        std::move(tuple));
    };
    return *this;
  }

  template <class R, class... A>
  ActorClass& method(const std::string& name, R (T::*m)(A...)) {
    return add(name, m);
  }
  template <class R, class... A>
  ActorClass& method(const std::string& name, R (T::*m)(A...) const) {
    return add(name, m);
  }
  // Called when the actor is stopped (its node leaving on SIGTERM, kill_actor), on the thread
  // that stops it and possibly while one of its methods runs on the actor's own thread: it
  // must be thread-safe and return at once, asking the method in progress to end soon (by
  // returning or throwing; either way its caller then gets ActorDiedError). Without it the
  // method runs to its end, which the node waits for up to its stop grace time.
  ActorClass& on_stop(void (T::*m)()) {
    entry_->stop = [m](void* self) { (static_cast<T*>(self)->*m)(); };
    return *this;
  }
  // A method that only the cluster's own members may call (see above).
  template <class R, class... A>
  ActorClass& internal_method(const std::string& name, R (T::*m)(A...)) {
    return add(name, m, true);
  }
  template <class R, class... A>
  ActorClass& internal_method(const std::string& name, R (T::*m)(A...) const) {
    return add(name, m, true);
  }
  // A method that does not wait for the actor's mailbox: each call runs at once on a thread
  // of its own, beside the method in progress and other such calls (Ray's threaded
  // concurrency groups). It must be thread-safe against every other method of T, and should
  // end soon when the actor is stopped: the actor goes away only once these calls ended.
  // Only members may call it, as with internal_method: what runs beside a method in progress
  // is the cluster's own protocol, not a user's.
  template <class R, class... A>
  ActorClass& concurrent_method(const std::string& name, R (T::*m)(A...)) {
    add(name, m, true);
    for (detail::MethodEntry& e : entry_->methods)
      if (e.name == name) e.concurrent = true;
    return *this;
  }

 private:
  template <class M>
  ActorClass& add(const std::string& name, M m, bool internal = false) {
    if (entry_->find(name)) return *this;  // a plugin loaded twice registers twice
    detail::MethodEntry e;
    e.name = name;
    e.pointer = m;
    e.internal = internal;
    e.invoke = make_invoker(name, m);
    entry_->methods.push_back(std::move(e));
    return *this;
  }

  template <class R, class... A, class M>
  static auto invoker_for(const std::string& what, M m) {
    return [what, m](void* self, detail::Payload& args) -> detail::Payload {
      auto tuple =
          detail::unpack_payload<std::tuple<std::decay_t<A>...>>(args, "arguments of ", what);
      auto call = [&](auto&&... a) -> R { return (static_cast<T*>(self)->*m)(std::move(a)...); };
      if constexpr (std::is_void_v<R>) {
        std::apply(call, std::move(tuple));
        return detail::pack_payload(msgpack::type::nil_t());
      } else {
        return detail::pack_payload(std::apply(call, std::move(tuple)));
      }
    };
  }
  template <class R, class... A>
  auto make_invoker(const std::string& name, R (T::*m)(A...)) {
    return invoker_for<R, A...>(entry_->name + "." + name, m);
  }
  template <class R, class... A>
  auto make_invoker(const std::string& name, R (T::*m)(A...) const) {
    return invoker_for<R, A...>(entry_->name + "." + name, m);
  }

  detail::ClassEntry* entry_;
};

#define LOCO_CONCAT_INNER(a, b) a##b
#define LOCO_CONCAT(a, b) LOCO_CONCAT_INNER(a, b)
// LOCO_REGISTER(Type, loco::ActorClass<Type>("Name").method(...)...);
#define LOCO_REGISTER(Type, ...)                                                 \
  [[maybe_unused]] static const bool LOCO_CONCAT(loco_registration_, __LINE__) = \
      ((void)(__VA_ARGS__), true)

}  // namespace loco
