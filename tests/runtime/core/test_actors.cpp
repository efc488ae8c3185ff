#include "tests/runtime/core/test_actors.hpp"

#include <unistd.h>

#include <numeric>
#include <stdexcept>
#include <thread>

namespace loco::testing {

int Counter::add(int n) { return value_ += n; }

int Counter::busy(int ms) {
  int at_once = ++running_;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  --running_;
  return at_once;
}

int Counter::sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return ms;
}

double Counter::sum(Blob b) {
  auto f = b.as<float>();
  return std::accumulate(f.begin(), f.end(), 0.0);
}

int Counter::fail(std::string message) { throw std::runtime_error(message); }

std::string Counter::whoami() const { return std::to_string(::getpid()); }

LOCO_REGISTER(Counter, loco::ActorClass<Counter>("test.Counter")
                           .constructor<int>()
                           .method("add", &Counter::add)
                           .method("get", &Counter::get)
                           .method("record", &Counter::record)
                           .method("log", &Counter::log)
                           .method("busy", &Counter::busy)
                           .method("sleep_ms", &Counter::sleep_ms)
                           .method("echo", &Counter::echo)
                           .method("sum", &Counter::sum)
                           .method("fail", &Counter::fail)
                           .method("whoami", &Counter::whoami));

}  // namespace loco::testing
