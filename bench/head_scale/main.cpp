// The head at scale, on loopback, with the test plugin only: N nodes, A small actors with
// max_restarts 1 spawned in batches (the spawn rate of each batch shows whether the cost of a
// spawn grows with the cluster, and the last batch's rate over the first's), the time of a full
// status and of a page of 100, a head killed and started again (until it answers with every
// actor alive, and a spawn after it), then K nodes killed with SIGKILL at once: how long until each is declared dead, until every actor runs
// again, how many were lost, and how long the head took to answer status all along.
//
//   bench_head_scale [--nodes 32] [--actors 2000] [--kill 8] [--detect-ms 2000] [--batch 250]
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "bench/stats.hpp"
#include "tests/runtime/core/cluster.hpp"
#include "tests/runtime/core/head_probe.hpp"
#include "tests/runtime/core/test_actors.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 32, actors = 2000, kill = 8, batch = 250;
  int64_t detect_ms = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--nodes")) nodes = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--actors")) actors = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--kill")) kill = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch")) batch = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--detect-ms")) detect_ms = std::atoll(argv[i + 1]);
  }
  using namespace loco;
  testing::ClusterOptions co;
  co.nodes = nodes;
  co.detect_ms = detect_ms;
  co.node_resources = "cpu=100000";
  auto t_up = Clock::now();
  testing::LocalCluster c(co);
  Runtime& rt = c.runtime();
  std::printf("%d nodes up in %.0f ms (detect %lld ms)\n", nodes, ms_since(t_up),
              static_cast<long long>(detect_ms));

  std::printf("%-14s %-12s\n", "actors", "spawns/s");
  std::vector<double> rates;
  for (int done = 0; done < actors;) {
    int n = std::min(batch, actors - done);
    auto t = Clock::now();
    for (int i = 0; i < n; ++i)
      (void)rt.spawn<testing::Counter>(ActorOptions().with_max_restarts(1), done + i);
    done += n;
    rates.push_back(n * 1000.0 / std::max(1e-3, ms_since(t)));
    std::printf("%-14d %-12.0f\n", done, rates.back());
  }
  std::printf("last batch / first batch: %.2f\n", rates.back() / rates.front());
  std::vector<double> full, page;
  for (int i = 0; i < 20; ++i) {
    auto t = Clock::now();
    (void)rt.status();
    full.push_back(ms_since(t));
    t = Clock::now();
    (void)rt.status(StatusQuery{"alive", "", 0, 100});
    page.push_back(ms_since(t));
  }
  std::printf("status, all %d actors: median %.1f ms; a page of 100: median %.1f ms\n", actors,
              bench::median(full), bench::median(page));

  // The head killed and started again: how long until it answers with every actor alive.
  {
    c.kill_head();
    auto t = Clock::now();
    c.start_head();
    const double started_ms = ms_since(t);
    double answered_ms = -1;
    while (answered_ms < 0 && ms_since(t) < 60000) {
      try {
        int alive = 0;
        for (auto& a : rt.status().actors) alive += a.state == ActorState::alive;
        if (alive == actors) answered_ms = ms_since(t);
      } catch (const Error&) {
      }
      if (answered_ms < 0) std::this_thread::sleep_for(Millis(10));
    }
    auto t_spawn = Clock::now();
    (void)rt.spawn<testing::Counter>(ActorOptions().with_max_restarts(1), 0)
        .call(&testing::Counter::get)
        .get(Millis(10000));
    ++actors;  // the mass failure below moves it too
    std::printf(
        "head restart: up in %.0f ms, status with all %d actors alive after %.0f ms, a spawn "
        "and call after it %.1f ms\n",
        started_ms, actors, answered_ms, ms_since(t_spawn));
  }

  ClusterStatus before = rt.status();
  std::set<std::string> victims;
  std::vector<std::string> addresses;
  for (auto& n : before.nodes)
    if (int(victims.size()) < kill) {
      victims.insert(n.node.id);
      addresses.push_back(n.node.address);
    }
  int moving = 0;
  for (auto& a : before.actors) moving += victims.count(a.node_id);

  Runtime probe = Runtime::connect(c.head_address(), ConnectOptions{Millis(60000), detect_ms});
  int failures = 0;
  testing::HeadProbe prober([&] { (void)probe.status(StatusQuery{"", "", 0, 100}); }, Millis(20),
                            [&](const Error&) { ++failures; });
  auto t0 = Clock::now();
  for (auto& a : addresses) c.node(a).signal(SIGKILL);
  double all_dead_ms = -1, all_running_ms = -1;
  const double give_up_ms = double(detect_ms) + 120000;
  while (ms_since(t0) < give_up_ms && (all_dead_ms < 0 || all_running_ms < 0)) {
    try {
      ClusterStatus st = rt.status();
      int dead_nodes = 0, running = 0;
      for (auto& n : st.nodes)
        dead_nodes += victims.count(n.node.id) && n.node.state == NodeState::dead;
      for (auto& a : st.actors)
        running += a.state == ActorState::alive && !victims.count(a.node_id);
      if (all_dead_ms < 0 && dead_nodes == kill) all_dead_ms = ms_since(t0);
      if (all_running_ms < 0 && running == actors) all_running_ms = ms_since(t0);
    } catch (const Error&) {
    }
    std::this_thread::sleep_for(Millis(50));
  }
  const std::vector<double> waits = prober.stop();
  int lost = 0;
  for (auto& a : rt.status().actors) lost += a.state == ActorState::dead;
  std::printf(
      "killed %d of %d nodes holding %d actors: all declared dead after %.0f ms, all %d running "
      "after %.0f ms (-1: not within %.0f s), %d dead\n",
      kill, nodes, moving, all_dead_ms, actors, all_running_ms, give_up_ms / 1000, lost);
  std::printf(
      "head answers during the failure (status page of 100, %zu probes, %d failed): "
      "p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
      waits.size(), failures, percentile(waits, 0.5), percentile(waits, 0.99),
      percentile(waits, 1.0));
  return lost == 0 && all_running_ms >= 0 ? 0 : 1;
}
