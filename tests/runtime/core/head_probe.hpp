#pragma once
// A client that asks the head something every `period` on a thread of its own and keeps how
// long each answer took: for the tests and bench/head_scale that check that the head goes on
// answering while nodes stop or die. Each ask is bounded by the client's own call timeout.
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/core/errors.hpp"

namespace loco::testing {

class HeadProbe {
 public:
  // `ask` throws loco::Error when the head does not answer; `failed` is told of each.
  HeadProbe(std::function<void()> ask, std::chrono::milliseconds period,
            std::function<void(const Error&)> failed)
      : thread_([this, ask = std::move(ask), period, failed = std::move(failed)] {
          using Clock = std::chrono::steady_clock;
          while (!stop_.load()) {
            const auto t = Clock::now();
            try {
              ask();
            } catch (const Error& e) {
              failed(e);
            }
            waits_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
            std::this_thread::sleep_for(period);
          }
        }) {}
  HeadProbe(const HeadProbe&) = delete;
  HeadProbe& operator=(const HeadProbe&) = delete;
  ~HeadProbe() { stop(); }

  // Stops asking (after the ask in progress); the milliseconds each answer took, in order.
  const std::vector<double>& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return waits_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<double> waits_;
  std::thread thread_;  // last: it starts once the members it uses are made
};

}  // namespace loco::testing
