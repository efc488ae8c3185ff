#pragma once
// Actor classes for the runtime's tests. Built into a plugin that every test
// node loads, and linked into the test binaries for their typed handles.
#include <atomic>
#include <string>
#include <vector>

#include "runtime/core/actor.hpp"

namespace loco::testing {

class Counter {
 public:
  Counter() = default;
  explicit Counter(int start) : value_(start) {}
  int add(int n);
  int get() const { return value_; }
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

 private:
  int value_ = 0;
  std::vector<int> log_;
  std::atomic<int> running_{0};
};

}  // namespace loco::testing
