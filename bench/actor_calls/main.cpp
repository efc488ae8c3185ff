// bench/actor_calls: latency and throughput of actor calls between two node
// processes on loopback, against raw ZeroMQ DEALER/ROUTER ping-pong between
// two processes (the bound: loco sends over the same socket types).
//
//   build/bin/bench_actor_calls [--n 20000] [--calls 300000] [--window 2000] [--repeats 3]
//                               [--blob-kb 4096] [--blob-calls 200] [--insecure 1]
//                               [--as-client 1]
// --as-client 1: a user's client key spawns both actors (nodes --spawnable 'bench.*'), so that
// every call is one between two actors of that owner, checked as such (docs/security.md).
// The cluster uses CURVE with a key made for it (as every cluster does) unless --insecure 1:
// run both to see what CURVE costs a call.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <zmq.hpp>

#include "bench/actor_calls/bench_actors.hpp"
#include "runtime/security/keys.hpp"
#include "tests/runtime/core/cluster.hpp"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(p * v.size()))];
}

// Raw ZeroMQ: a ROUTER echo server in a child process, a DEALER client here.
struct RawResult {
  std::vector<double> rtt_us;
  double msgs_per_s = 0;
};

RawResult raw_zmq(int n, int calls, int window) {
  int port = loco::testing::free_tcp_port();
  std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  pid_t child = fork();
  if (child == 0) {
    zmq::context_t ctx(1);
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.set(zmq::sockopt::router_mandatory, 1);
    router.set(zmq::sockopt::sndhwm, 200000);
    router.set(zmq::sockopt::rcvhwm, 200000);
    router.bind(ep);
    while (true) {
      zmq::message_t id, body;
      if (!router.recv(id)) continue;
      (void)router.recv(body);
      if (body.size() == 4 && std::memcmp(body.data(), "quit", 4) == 0) break;
      router.send(id, zmq::send_flags::sndmore);
      router.send(body, zmq::send_flags::none);
    }
    _exit(0);
  }
  zmq::context_t ctx(1);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::sndhwm, 200000);
  dealer.set(zmq::sockopt::rcvhwm, 200000);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(ep);
  RawResult r;
  // A message of the size of a loco call (envelope + args), for fairness.
  std::string payload(48, 'x');
  for (int i = 0; i < n + 200; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    dealer.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::message_t m;
    if (!dealer.recv(m)) throw std::runtime_error("raw echo timed out");
    auto t1 = std::chrono::steady_clock::now();
    if (i >= 200) r.rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  auto t0 = std::chrono::steady_clock::now();
  int sent = 0, got = 0;
  while (got < calls) {
    while (sent < calls && sent - got < window) {
      dealer.send(zmq::buffer(payload), zmq::send_flags::none);
      ++sent;
    }
    zmq::message_t m;
    if (!dealer.recv(m)) throw std::runtime_error("raw echo timed out");
    ++got;
  }
  r.msgs_per_s =
      calls / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  dealer.send(zmq::str_buffer("quit"), zmq::send_flags::none);
  int st;
  waitpid(child, &st, 0);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 20000, calls = 300000, window = 2000, repeats = 3, blob_kb = 4096, blob_calls = 200;
  bool insecure = false, as_client = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (k == "--n")
      n = v;
    else if (k == "--calls")
      calls = v;
    else if (k == "--window")
      window = v;
    else if (k == "--repeats")
      repeats = v;
    else if (k == "--blob-kb")
      blob_kb = v;
    else if (k == "--blob-calls")
      blob_calls = v;
    else if (k == "--insecure")
      insecure = v != 0;
    else if (k == "--as-client")
      as_client = v != 0;
  }
  using namespace loco;
  testing::ClusterOptions co;
  co.nodes = 0;
  co.insecure = insecure;
  co.plugins = LOCO_TEST_PLUGIN_DIR_STR "/libloco_bench_actors.so";
  testing::LocalCluster cluster(co);
  cluster.add_node({"--resources=pinger=1", "--spawnable=bench.*"});
  cluster.add_node({"--resources=echo=1", "--spawnable=bench.*"});
  cluster.wait_alive_nodes(2);
  std::optional<Runtime> user;
  if (as_client) {
    if (insecure) throw std::runtime_error("--as-client needs CURVE (no --insecure)");
    const auto pair = security::generate_key_pair();
    security::add_client_to_key_file(cluster.key_path(), pair.public_key, "user");
    ConnectOptions o;
    o.security = security::Settings::for_client(
        pair, security::read_key_file(cluster.key_path()).cluster.public_key);
    user = Runtime::connect(cluster.head_address(), o);
  }
  Runtime& rt = user ? *user : cluster.runtime();
  auto echo = rt.spawn<bench::Echo>(ActorOptions().with_resources({{"echo", 1}}));
  auto pinger = rt.spawn<bench::Pinger>(ActorOptions().with_resources({{"pinger", 1}}));
  if (echo.address() == pinger.address()) throw std::runtime_error("actors share a node");

  std::vector<double> raw_med, loco_med, loco_p99, raw_tput, loco_tput, loco_tell, loco_blob;
  for (int rep = 0; rep < repeats; ++rep) {
    RawResult raw = raw_zmq(n, calls, window);
    auto lat = pinger.call(&bench::Pinger::latency, echo.id(), n).get(Millis(600000));
    double tput =
        pinger.call(&bench::Pinger::throughput, echo.id(), calls, window).get(Millis(600000));
    double tells = pinger.call(&bench::Pinger::tells, echo.id(), calls).get(Millis(600000));
    double blob_bps =
        pinger.call(&bench::Pinger::blobs, echo.id(), int64_t(blob_kb) * 1024, blob_calls)
            .get(Millis(600000));
    raw_med.push_back(median(raw.rtt_us));
    raw_tput.push_back(raw.msgs_per_s);
    loco_med.push_back(median(lat.rtt_us));
    loco_p99.push_back(pct(lat.rtt_us, 0.99));
    loco_tput.push_back(tput);
    loco_tell.push_back(tells);
    loco_blob.push_back(blob_bps);
    std::printf(
        "run %d: raw zmq rtt %.1f us, loco rtt %.1f us (p99 %.1f), raw %.0f msg/s, loco "
        "%.0f calls/s, %.0f tells/s, blobs %.2f GB/s\n",
        rep + 1, raw_med.back(), loco_med.back(), loco_p99.back(), raw_tput.back(),
        loco_tput.back(), loco_tell.back(), loco_blob.back() / 1e9);
  }
  double rm = median(raw_med), lm = median(loco_med);
  std::printf(
      "\nactor_calls (median of %d runs, %d round trips, %d pipelined calls, window %d; %s)\n",
      repeats, n, calls, window,
      insecure ? "plain TCP" : as_client ? "CURVE, a client's actors" : "CURVE");
  std::printf("  raw ZeroMQ DEALER/ROUTER RTT : %8.1f us\n", rm);
  std::printf(
      "  loco actor call RTT          : %8.1f us   ratio %.2fx the raw RTT (target <= 2x)\n", lm,
      lm / rm);
  std::printf("  loco call RTT p99            : %8.1f us\n", median(loco_p99));
  std::printf("  raw ZeroMQ pipelined         : %8.0f msg/s\n", median(raw_tput));
  std::printf("  loco async calls             : %8.0f calls/s  (target >= 100000), %.2fx raw\n",
              median(loco_tput), median(loco_tput) / median(raw_tput));
  std::printf("  loco one-way tells           : %8.0f calls/s\n", median(loco_tell));
  std::printf("  loco blob calls              : %8.2f GB/s     (%d KiB there and back)\n",
              median(loco_blob) / 1e9, blob_kb);
  return 0;
}
