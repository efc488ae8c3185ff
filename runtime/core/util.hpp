#pragma once
// Small shared helpers: the one clock, the one retry/backoff helper, ids.
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace loco {

using Millis = std::chrono::milliseconds;

// Milliseconds on the steady clock. Decisions that depend on time take `now`
// as a parameter (see decisions.hpp); only the loops that drive them call this.
int64_t now_ms();
// Milliseconds since the Unix epoch, on the system clock: for timestamps that
// people read or other hosts compare (a job's submission, a node's start).
// Never for timeouts or durations: it can jump.
int64_t unix_ms();

// Exponential backoff with jitter, for every retry loop in loco
// (heartbeats, reconnecting to Redis or the head, waiting for a restart).
class Backoff {
 public:
  explicit Backoff(Millis initial = Millis(50), Millis max = Millis(2000));
  // The delay to wait before the next attempt; grows until `max`.
  Millis next();
  void reset();

 private:
  Millis initial_, max_, current_;
  std::minstd_rand rng_;
};

// A random id with a prefix: "n-4f1a9c2e07b3d5a1".
std::string random_id(std::string_view prefix);

// The process log, for code that cannot include spdlog (LibTorch ships its own
// fmt, which clashes with the one spdlog uses).
void log_info(const std::string& line);
void log_warn(const std::string& line);
void log_error(const std::string& line);

// "1.5 s", "250 ms": durations as people read them in error messages.
std::string human_ms(int64_t ms);

// Text that came from the network (a peer's name, a method, an error message) made safe for
// a log line or an error message: bytes outside printable ASCII become \xNN, a backslash
// becomes \\, and past `max_bytes` of input the rest is cut and replaced by
// "...(N more bytes)". A remote party cannot forge log lines, fill the disk or hide text.
std::string escape_remote(std::string_view text, size_t max_bytes = 200);

// Lets a repeated warning through at most once per `interval_ms`, counting what it holds back,
// so that a flood of bad input costs one line per interval. The clock is a parameter.
class RateLimit {
 public:
  explicit RateLimit(int64_t interval_ms = 10'000) : interval_ms_(interval_ms) {}
  // True when a line may be logged now; then `*suppressed` (if given) is how many were held
  // back since the last one, and the count starts again.
  bool allow(int64_t now, uint64_t* suppressed = nullptr);

 private:
  int64_t interval_ms_;
  int64_t last_ = 0;
  bool any_ = false;
  uint64_t held_ = 0;
};

}  // namespace loco
