#include "runtime/core/util.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace loco {

int64_t now_ms() {
  return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

void limit_malloc_arenas(int arenas) {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) ::mallopt(M_ARENA_MAX, arenas);
#else
  (void)arenas;
#endif
}

void release_free_memory() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long pages = 0, resident = 0;
  const int got = std::fscanf(f, "%lld %lld", &pages, &resident);
  std::fclose(f);
  return got == 2 ? resident * ::sysconf(_SC_PAGESIZE) : 0;
}

int64_t unix_ms() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Backoff::Backoff(Millis initial, Millis max)
    : initial_(initial), max_(max), current_(initial), rng_(std::random_device{}()) {}

Millis Backoff::next() {
  Millis d = current_;
  current_ = std::min(max_, current_ * 2);
  // Up to 25 % jitter so that many nodes retrying at once spread out.
  std::uniform_int_distribution<int64_t> jitter(0, d.count() / 4);
  return d + Millis(jitter(rng_));
}

void Backoff::reset() { current_ = initial_; }

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(now_ms()));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(prefix) + "-" + buf;
}

void log_info(const std::string& line) { spdlog::info("{}", line); }
void log_warn(const std::string& line) { spdlog::warn("{}", line); }
void log_error(const std::string& line) { spdlog::error("{}", line); }

std::string human_ms(int64_t ms) {
  char buf[32];
  if (ms >= 1000)
    std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  else
    std::snprintf(buf, sizeof buf, "%lld ms", static_cast<long long>(ms));
  return buf;
}

}  // namespace loco
