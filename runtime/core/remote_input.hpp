#pragma once
// Helpers for handling input that came from the network, header-only so that the collective
// (which does not link the rest of runtime/core) uses the same ones.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace loco {

// Text that came from the network (a peer's name, a method, an error message) made safe for
// a log line or an error message: bytes outside printable ASCII become \xNN, a backslash
// becomes \\, and past `max_bytes` of input the rest is cut and replaced by
// "...(N more bytes)". A remote party cannot forge log lines, fill the disk or hide text.
inline std::string escape_remote(std::string_view text, size_t max_bytes = 200) {
  const std::string_view shown = text.substr(0, std::min(text.size(), max_bytes));
  std::string out;
  out.reserve(shown.size() + 16);
  for (unsigned char ch : shown) {
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch >= 0x20 && ch < 0x7f) {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    }
  }
  if (shown.size() < text.size())
    out += "...(" + std::to_string(text.size() - shown.size()) + " more bytes)";
  return out;
}

// Lets a repeated warning through at most once per `interval_ms`, counting what it holds back,
// so that a flood of bad input costs one line per interval. The clock is a parameter; not
// thread-safe.
class RateLimit {
 public:
  explicit RateLimit(int64_t interval_ms = 10'000) : interval_ms_(interval_ms) {}
  // True when a line may be logged now; then `*suppressed` (if given) is how many were held
  // back since the last one, and the count starts again.
  bool allow(int64_t now_ms, uint64_t* suppressed = nullptr) {
    if (any_ && now_ms - last_ < interval_ms_) {
      ++held_;
      return false;
    }
    if (suppressed) *suppressed = held_;
    held_ = 0;
    any_ = true;
    last_ = now_ms;
    return true;
  }

 private:
  int64_t interval_ms_;
  int64_t last_ = 0;
  bool any_ = false;
  uint64_t held_ = 0;
};

}  // namespace loco
