// The time in a job event's id (JobEvent::id, a Redis stream id "<unix ms>-<sequence>"):
// header-only, for the dashboard and the job's aggregator alike.
#pragma once
#include <cstdint>
#include <string_view>

namespace loco {

// Milliseconds since the epoch in a stream id "MS-SEQ"; 0 when it has none.
inline int64_t event_unix_ms(std::string_view id) {
  int64_t ms = 0;
  size_t i = 0;
  for (; i < id.size() && i < 19 && id[i] >= '0' && id[i] <= '9'; ++i) ms = ms * 10 + (id[i] - '0');
  return i > 0 && i < id.size() && id[i] == '-' ? ms : 0;
}

}  // namespace loco
