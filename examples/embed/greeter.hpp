#pragma once
// An actor class of the user's own, nothing to do with training.
#include <cstdint>
#include <string>

namespace embed {

class Greeter {
 public:
  // "hello WHO from HOST pid PID": the node process it lives in.
  std::string hello(std::string who);
  int64_t calls() const { return calls_; }

 private:
  int64_t calls_ = 0;
};

}  // namespace embed
