#pragma once
// Actor classes for the runtime's tests. Built into a plugin that every test
// node loads, and linked into the test binaries for their typed handles.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/core/actor.hpp"
#include "runtime/core/runtime.hpp"

namespace loco::testing {

class Counter {
 public:
  Counter() : gpus_at_construction_(this_actor().gpus) {}
  explicit Counter(int start) : value_(start), gpus_at_construction_(this_actor().gpus) {}
  int add(int n);
  int get() const { return value_; }
  // Registered as an internal method: only members of the cluster may call it. Returns the
  // value it held.
  int reset() { return std::exchange(value_, 0); }
  // Appends to a log, to check that messages are handled in order.
  void record(int n) { log_.push_back(n); }
  std::vector<int> log() const { return log_; }
  // Returns how many calls ran at once (must stay 1) after sleeping `ms`.
  int busy(int ms);
  int sleep_ms(int ms);
  Blob echo(Blob b) { return b; }
  // Sum of the floats in a blob, to check that large tensors arrive intact.
  double sum(Blob b);
  int fail(std::string message);
  std::string whoami() const;
  // The GPU indices the head gave it: as its constructor saw them, then as a method does.
  std::vector<int> gpus() const;
  // Creates the file `marker` (so that a test knows the call is running), then waits up to
  // `max_ms` for its stop hook, raising "asked to stop" when that came first; with `listen`
  // false it sleeps the whole `max_ms`, stop or not.
  int wait_for_stop(std::string marker, int max_ms, bool listen);
  // The stop hook (ActorClass::on_stop).
  void stop();
  // Waits up to `max_ms` for poke(); true when it came. poke is a concurrent method: it runs
  // beside wait_for_poke, which holds the mailbox.
  bool wait_for_poke(int max_ms);
  int poke();
  // Calls the actor named `name` from this actor: tells it add(n), asks it add(n) and echoes a
  // blob of `blob_floats` floats through it; returns the value add returned, or -1 when the
  // blob came back changed.
  int add_to(std::string name, int n, int blob_floats);

 private:
  int value_ = 0;
  std::vector<int> log_;
  std::atomic<int> running_{0};
  std::vector<int> gpus_at_construction_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
  int pokes_ = 0;
};

}  // namespace loco::testing

namespace loco::testing {

// A job's entry actor for the job machinery's tests. Its spec is
// "rounds N [fail]": it reports N rounds from its own thread, then finishes
// (or fails). It stops early when its actor is killed (job cancelled).
class FakeJob {
 public:
  FakeJob(std::string job_id, std::string spec);
  ~FakeJob();
  int rounds_done() const { return done_; }

 private:
  std::string job_id_;
  int rounds_ = 0;
  bool fail_ = false;
  bool bad_report_ = false;  // spec has "bad-report": a report that does not decode comes first
  bool with_steps_ = false;  // spec has "with-steps": a "steps" record before each report
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace loco::testing
