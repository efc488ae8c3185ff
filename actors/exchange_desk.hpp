// sync.mode streaming: the desk where a worker's fragment operations leave their time on the
// wire, and its inner steps their time, for the round's figures (StreamResult::
// exchange_seconds) and compression auto's plan (FragmentCodecs). Private to actors/; torch-free,
// so that it is tested alone.
#pragma once
#include <mutex>
#include <utility>

namespace loco::actors {

class ExchangeDesk {
 public:
  // A stream() call begins: its inner steps are counted afresh (the mean of the call before
  // stays for step_seconds until the new one has taken a step).
  void open();
  // The call's inner steps so far.
  void add_steps(double seconds, int n);
  // A fragment operation ended, ok or not, after `seconds` from its start on the communicator.
  void put(double seconds);
  // The mean inner step of the call so far (none yet: of the call before; 0: none ever).
  double step_seconds();
  // The seconds of the operations that ended since the last take (StreamResult::
  // exchange_seconds: those that ended during a stream() call), and a new count.
  double take_seconds();

 private:
  std::mutex mu_;
  double step_seconds_ = 0;
  int steps_ = 0;
  double last_step_seconds_ = 0;  // the mean of the last call that took steps
  double ended_seconds_ = 0;      // of the operations put since the last take_seconds
};

inline void ExchangeDesk::open() {
  std::lock_guard<std::mutex> lock(mu_);
  if (steps_ > 0) last_step_seconds_ = step_seconds_ / steps_;
  step_seconds_ = 0;
  steps_ = 0;
}

inline void ExchangeDesk::add_steps(double seconds, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  step_seconds_ += seconds;
  steps_ += n;
}

inline void ExchangeDesk::put(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ended_seconds_ += seconds;
}

inline double ExchangeDesk::step_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_ > 0 ? step_seconds_ / steps_ : last_step_seconds_;
}

inline double ExchangeDesk::take_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(ended_seconds_, 0.0);
}

}  // namespace loco::actors
