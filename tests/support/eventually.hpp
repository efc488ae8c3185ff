#pragma once
// Waiting in tests for something another process or thread does: poll a
// condition until it holds, for at most a given time.
#include <algorithm>
#include <chrono>
#include <thread>

namespace loco::testing {

// Calls `pred` until it returns true (then true) or `timeout` has passed
// (then false), sleeping `every` between calls, less near the deadline;
// `pred` is called once more at the deadline. The wait is bounded by
// `timeout` plus the time of one call of `pred`.
//
//   ASSERT_TRUE(eventually([&] { return job.info().finished(); }, 10s)) << "...";
template <class Pred>
bool eventually(Pred&& pred, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = std::chrono::milliseconds(20)) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!pred()) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(every, deadline - now));
  }
  return true;
}

}  // namespace loco::testing
