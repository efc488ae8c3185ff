#pragma once
// Actors for bench/actor_calls: an Echo on one node, a Pinger on another that
// calls it, so the measured calls go node process to node process.
#include <algorithm>
#include <chrono>
#include <deque>

#include "runtime/core/runtime.hpp"

namespace bench {

class Echo {
 public:
  int ping(int n) { return n; }
  void poke(int) { ++pokes_; }
  int64_t pokes() const { return pokes_; }
  // Sends the blob back: received as a view of the frame, sent from it again.
  loco::Blob bounce(loco::Blob b) { return b; }

 private:
  int64_t pokes_ = 0;
};

struct LatencyResult {
  std::vector<double> rtt_us;
  MSGPACK_DEFINE(rtt_us)
};

class Pinger {
 public:
  // Round trips, one at a time.
  LatencyResult latency(std::string echo_id, int n) {
    auto echo = loco::Runtime::current().actor<Echo>(echo_id);
    LatencyResult r;
    for (int i = 0; i < n + 200; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      (void)echo.call(&Echo::ping, i).get(loco::Millis(10000));
      auto t1 = std::chrono::steady_clock::now();
      if (i >= 200) r.rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    return r;
  }
  // Calls per second with up to `window` calls in flight.
  double throughput(std::string echo_id, int n, int window) {
    auto echo = loco::Runtime::current().actor<Echo>(echo_id);
    std::deque<loco::Future<int>> inflight;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      inflight.push_back(echo.call(&Echo::ping, i));
      if (int(inflight.size()) >= window) {
        (void)inflight.front().get(loco::Millis(30000));
        inflight.pop_front();
      }
    }
    while (!inflight.empty()) {
      (void)inflight.front().get(loco::Millis(30000));
      inflight.pop_front();
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return n / s;
  }
  // One-way calls per second (the last call is a round trip, to count them all in).
  double tells(std::string echo_id, int n) {
    auto echo = loco::Runtime::current().actor<Echo>(echo_id);
    auto t0 = std::chrono::steady_clock::now();
    int64_t before = echo.call(&Echo::pokes).get(loco::Millis(10000));
    for (int i = 0; i < n; ++i) echo.tell(&Echo::poke, i);
    int64_t after = echo.call(&Echo::pokes).get(loco::Millis(60000));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (after - before != n) throw std::runtime_error("tells lost");
    return n / s;
  }
  // Bytes per second of blobs of `bytes` sent to the Echo and back, one call at a
  // time: a copy of the blob on either side would show here.
  double blobs(std::string echo_id, int64_t bytes, int n) {
    auto echo = loco::Runtime::current().actor<Echo>(echo_id);
    loco::Blob blob = loco::Blob::from_vector(std::vector<uint8_t>(size_t(bytes), 7));
    (void)echo.call(&Echo::bounce, blob).get(loco::Millis(10000));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      loco::Blob back = echo.call(&Echo::bounce, blob).get(loco::Millis(30000));
      if (back.size() != blob.size()) throw std::runtime_error("blob came back cut");
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 2.0 * double(bytes) * n / s;
  }
};

}  // namespace bench
