// sync.mode streaming: the desk through which a worker's fragment operations say when they
// ended (InnerWorker::exchanged). Private to actors/; torch-free, so that it is tested alone.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "actors/messages.hpp"

namespace loco::actors {

// sync.mode streaming: each fragment operation's exchange as it ends, by operation id (the
// newest 16), for InnerWorker::exchanged: compression auto decides the next round's codec from
// this round's first fragment rather than from the round before.
class ExchangeDesk {
 public:
  // A stream() call whose operations end at `last_op` begins; as the returned guard goes, it
  // has ended, and a wait for one of its operations that never ended (the round failed before
  // it) ends too.
  struct Open {
    ExchangeDesk& d;
    uint64_t last_op;
    ~Open();
  };
  [[nodiscard]] Open open(uint64_t last_op);
  // The call's inner steps so far (their mean goes with each operation's figures).
  void add_steps(double seconds, int n);
  void put(uint64_t op, ExchangeFigures f);
  // The mean inner step of the call so far (none yet: of the call before; 0: none ever).
  double step_seconds();
  // The seconds of the operations that ended since the last take (StreamResult::
  // exchange_seconds: those that ended during a stream() call), and a new count.
  double take_seconds();
  // Op's figures once it has ended; `done` false when it has not within `hold`, or when the
  // stream() call it belonged to ended without it, or once the worker stops.
  ExchangeFigures wait(uint64_t op, std::chrono::milliseconds hold);
  // The worker stops (InnerWorker::stop): every wait ends now, and later ones at once, so that
  // no concurrent call holds the actor's end back (the node ends itself for a killed actor
  // still in a call after --kill-grace).
  void stop();

 private:
  bool stopped_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, ExchangeFigures> ended_;
  uint64_t closed_upto_ = 0;  // the last operation of the stream() calls that ended
  double step_seconds_ = 0;
  int steps_ = 0;
  double last_step_seconds_ = 0;  // the mean of the last call that took steps
  double ended_seconds_ = 0;  // of the operations put since the last take_seconds
};

inline ExchangeDesk::Open ExchangeDesk::open(uint64_t last_op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (steps_ > 0) last_step_seconds_ = step_seconds_ / steps_;
  step_seconds_ = 0;
  steps_ = 0;
  return Open{*this, last_op};
}

inline ExchangeDesk::Open::~Open() {
  std::lock_guard<std::mutex> lock(d.mu_);
  d.closed_upto_ = std::max(d.closed_upto_, last_op);
  d.cv_.notify_all();
}

inline void ExchangeDesk::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

inline void ExchangeDesk::add_steps(double seconds, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  step_seconds_ += seconds;
  steps_ += n;
}

inline double ExchangeDesk::step_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_ > 0 ? step_seconds_ / steps_ : last_step_seconds_;
}

inline double ExchangeDesk::take_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(ended_seconds_, 0.0);
}

inline void ExchangeDesk::put(uint64_t op, ExchangeFigures f) {
  std::lock_guard<std::mutex> lock(mu_);
  f.done = true;
  f.step_seconds = steps_ > 0 ? step_seconds_ / steps_ : 0.0;
  ended_seconds_ += f.seconds;
  ended_[op] = f;
  while (ended_.size() > 16) ended_.erase(ended_.begin());
  cv_.notify_all();
}

inline ExchangeFigures ExchangeDesk::wait(uint64_t op, std::chrono::milliseconds hold) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, hold, [&] { return stopped_ || ended_.count(op) > 0 || op <= closed_upto_; });
  const auto it = ended_.find(op);
  return it == ended_.end() ? ExchangeFigures{} : it->second;
}

}  // namespace loco::actors
