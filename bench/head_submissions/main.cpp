// A flood of failing submissions against the head (issue 14's probe: 15,000 of them took an
// idle head from 0.6 % to 37 % of a core and Redis from 18 to 103 MB). Each mode starts a fresh
// cluster on loopback (redis, a head, one node with the test plugin), measures the head's CPU
// over an idle window and Redis' used_memory, submits N jobs whose entry class no node offers
// (each fails at its node, as a bad job does), and measures again:
//   limits    the head's defaults: 30 submissions a minute per key, the rest refused unstored;
//   unlimited the limits lifted: every submission stored and failed, kept for the default
//             retention (3600 s): what the tick costs with N finished jobs in the table;
//   expiring  lifted, with --job-retention-s 2 and --retention-s 2: the same jobs, then gone
//             from Redis with their dead entry actors.
//
//   bench_head_submissions [--submissions 15000] [--idle-s 10] [--modes limits,unlimited,expiring]
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/runtime/core/cluster.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// utime + stime of `pid`, in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), {});
  auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

// The head's share of one core over `seconds` of idling.
double idle_cpu_percent(pid_t pid, double seconds) {
  const double before = cpu_seconds(pid);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));  // the window measured
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return 100.0 * (cpu_seconds(pid) - before) / wall;
}

double redis_used_mb(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (!c || c->err) return -1;
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO memory"));
  double mb = -1;
  if (r && r->type == REDIS_REPLY_STRING) {
    const char* at = std::strstr(r->str, "used_memory:");
    if (at) mb = std::atof(at + 12) / 1e6;
  }
  if (r) freeReplyObject(r);
  redisFree(c);
  return mb;
}

long redis_hlen(int port, const char* key) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (!c || c->err) return -1;
  auto* r = static_cast<redisReply*>(redisCommand(c, "HLEN %s", key));
  long n = r && r->type == REDIS_REPLY_INTEGER ? long(r->integer) : -1;
  if (r) freeReplyObject(r);
  redisFree(c);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  int submissions = 15000;
  double idle_s = 10;
  std::string modes = "limits,unlimited,expiring";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--submissions")) submissions = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--idle-s")) idle_s = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--modes")) modes = argv[i + 1];
  }
  using namespace loco;
  std::printf("mode       submitted stored refused  head_idle_%%_before after  redis_MB_before after  "
              "jobs,actors_in_redis  flood_s\n");
  std::stringstream list(modes);
  for (std::string mode; std::getline(list, mode, ',');) {
    testing::ClusterOptions co;
    co.nodes = 1;
    if (mode != "limits")
      co.extra_head_args = {"--max-submissions-per-minute=1000000", "--max-jobs-per-key=1000000"};
    if (mode == "expiring") {
      co.extra_head_args.push_back("--job-retention-s=2");
      co.extra_head_args.push_back("--retention-s=2");
    }
    testing::LocalCluster c(co);
    const pid_t head = c.head().pid();
    const int port = c.redis().port();
    const double cpu_before = idle_cpu_percent(head, idle_s);
    const double mem_before = redis_used_mb(port);
    int refused = 0, failed = 0;
    JobSubmission sub{"flood", "test.Nobody", "rounds: 1", {{"cpu", 0}}};
    const auto t0 = Clock::now();
    for (int i = 0; i < submissions; ++i) {
      try {
        (void)c.runtime().submit_job(sub);
      } catch (const std::exception& e) {
        if (std::strstr(e.what(), "in the last minute")) ++refused;
        else ++failed;
      }
    }
    const double flood_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (mode == "expiring") {  // bounded wait for the retention time to pass
      for (int i = 0; i < 150 && redis_hlen(port, "loco:jobs") + redis_hlen(port, "loco:actors") > 0;
           ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const double cpu_after = idle_cpu_percent(head, idle_s);
    const double mem_after = redis_used_mb(port);
    std::printf("%-10s %9d %6d %7d  %18.2f %6.2f  %15.1f %6.1f  %9ld,%-10ld  %7.1f\n",
                mode.c_str(), submissions, failed, refused, cpu_before, cpu_after, mem_before,
                mem_after, redis_hlen(port, "loco:jobs"), redis_hlen(port, "loco:actors"),
                flood_s);
    std::fflush(stdout);
  }
  return 0;
}
