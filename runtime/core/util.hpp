#pragma once
// Small shared helpers: the one clock, the one retry/backoff helper, ids.
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "remote_input.hpp"

namespace loco {

using Millis = std::chrono::milliseconds;

// Milliseconds on the steady clock. Decisions that depend on time take `now`
// as a parameter (see decisions.hpp); only the loops that drive them call this.
int64_t now_ms();
// Milliseconds since the Unix epoch, on the system clock: for timestamps that
// people read or other hosts compare (a job's submission, a node's start).
// Never for timeouts or durations: it can jump.
int64_t unix_ms();
// CPU seconds this process has used so far, all its threads (user and system). Beside a
// duration on the steady clock it tells work from waiting: on a shared machine a step that
// took 2 s of wall time and 0.6 s of CPU waited for a core (or on something) the rest.
double process_cpu_seconds();
// The calling thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_seconds();

// glibc's malloc keeps what a thread frees in that thread's arena (up to 8 per core) and gives
// little of it back: a node whose actors allocate large buffers on many threads (fragment
// all-reduces, checkpoint writers, evaluations) grows arena by arena (the soak bench: a node at
// 16 arenas of about 50 MB each after 20 minutes). limit_malloc_arenas caps their number (not
// when MALLOC_ARENA_MAX is set: the user's word); release_free_memory hands the free pages of
// every arena back to the system (malloc_trim). Neither does anything without glibc.
void limit_malloc_arenas(int arenas);
void release_free_memory();
// What the head and the nodes do: four arenas (the actors' threads do not all contend on one
// lock), their free pages handed back every 30 s (a trim of a node's heap takes milliseconds).
inline constexpr int kMallocArenas = 4;
inline constexpr int64_t kReleaseMemoryMs = 30'000;
// This process's resident memory in bytes (/proc/self/statm; 0 where there is none).
int64_t resident_bytes();

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

}  // namespace loco
