// Time to join a running DiLoCo job, for a model of about 100 MB (fp32), on
// loopback: a job runs with 1 worker on a 2-node local cluster, `loco scale`
// asks for a second, and the aggregator's log says how long the new worker took
// (spawn + init, and within it the copy of θ, the outer momentum and the AdamW
// moments from the live worker).
// In the same run, the bound: the same bytes as one ZeroMQ message between two
// sockets over loopback TCP, the transport's own cost.
//
//   bench_join [--layers 6 --width 576] [--repeat 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>
#include <thread>
#include <zmq.hpp>

#include "client/client.hpp"
#include "tests/diloco/test_corpus.hpp"
#include "tests/runtime/core/cluster.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One message of `bytes` over loopback TCP, ZeroMQ PUSH -> PULL; seconds.
double raw_zmq_seconds(size_t bytes) {
  zmq::context_t ctx;
  zmq::socket_t rx(ctx, zmq::socket_type::pull), tx(ctx, zmq::socket_type::push);
  rx.bind("tcp://127.0.0.1:0");
  tx.connect(rx.get(zmq::sockopt::last_endpoint));
  std::vector<char> data(bytes, 1);
  auto t0 = Clock::now();
  tx.send(zmq::message_t(data.data(), data.size(), nullptr, nullptr), zmq::send_flags::none);
  zmq::message_t got;
  (void)rx.recv(got, zmq::recv_flags::none);
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (got.size() != bytes) std::abort();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 6, width = 576, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--width")) width = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
  }
  using namespace loco;
  std::string data = diloco::testing::make_corpus_dir("join", 400000);
  char tmpl[] = "/tmp/loco-join-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  testing::ClusterOptions co;
  co.nodes = 2;
  co.node_resources = "cpu=1";
  co.plugins = LOCO_PLUGIN_DIR_STR;
  const std::string yaml =
      "name: join\nseed: 1\nthreads: 1\n"
      "model: {layers: " +
      std::to_string(layers) + ", width: " + std::to_string(width) +
      ", heads: 8, context: 32}\n"
      "data: {dir: " +
      data +
      ", tokenizer: byte, shards: 8, val_fraction: 0.05}\n"
      "workers: {count: 1, min: 1}\ninner: {steps: 1, batch_size: 2, lr: 0.001, warmup: 1}\n"
      "rounds: 1000\ncheckpoint: {every: 0, dir: " +
      dir + "}\neval: {every: 100000, batches: 1}\n";
  std::regex line_re(
      R"(joined at round \d+ on \S+: ([0-9.]+) MB of state copied from \S+ in ([0-9.]+) s; joined in ([0-9.]+) s)");
  std::vector<double> copy_s, join_s, raw_s;
  double mb = 0;
  for (int rep = 0; rep < repeat; ++rep) {
    testing::LocalCluster c(co);  // a fresh cluster each time
    Client client(c.head_address());
    JobHandle job = client.submit(JobSpec::from_yaml(yaml));
    for (const RoundReport& r : job.watch()) {
      if (r.round >= 1) break;
    }
    job.scale(2);
    std::smatch m;
    std::string found;
    for (auto end = Clock::now() + std::chrono::minutes(10); Clock::now() < end && found.empty();) {
      std::string cursor;
      for (auto& e : job.poll(cursor, 100000).events)
        if (e.kind == "log" && std::regex_search(e.data, m, line_re)) found = e.data;
      if (found.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    job.cancel();
    if (found.empty()) {
      std::fprintf(stderr, "bench_join: the second worker did not join\n");
      return 1;
    }
    std::regex_search(found, m, line_re);
    mb = std::stod(m[1]);
    copy_s.push_back(std::stod(m[2]));
    join_s.push_back(std::stod(m[3]));
    raw_s.push_back(raw_zmq_seconds(size_t(mb * 1e6)));
    std::printf("run %d: %s\n", rep + 1, found.c_str());
  }
  std::printf(
      "join state (theta, outer momentum, AdamW moments; fp32): %.1f MB, i.e. a %.1f MB model\n",
      mb, mb / 4);
  std::printf("join, spawn + init (median of %d): %8.3f s\n", repeat, median(join_s));
  std::printf("  copy of the join state           : %8.3f s  (%.0f MB/s)\n", median(copy_s),
              mb / std::max(1e-9, median(copy_s)));
  std::printf("  raw ZeroMQ, same bytes, loopback : %8.3f s  -> copy / raw = %.2fx\n",
              median(raw_s), median(copy_s) / std::max(1e-9, median(raw_s)));
  diloco::remove_tree(data);
  diloco::remove_tree(dir);
  return 0;
}
