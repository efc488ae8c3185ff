// loco's all-gather of byte blobs (Communicator::allgather) against the raw bound, on loopback.
//
//   bench_allgather [--members 4] [--blob-mb 1] [--runs 21] [--chunk-bytes 524288] [--curve]
//
// K members in this process, each on a thread of its own with its own ZeroMQ context (2 I/O
// threads), over tcp://127.0.0.1. A run: a barrier, every member's operation, a barrier; its
// time is rank 0's, barrier to barrier. Three ways to move the same bytes, one run of each in
// turn (so that a machine whose load changes slows all three alike), `runs` times; the median:
//   ours:      allgather() of a blob of blob-mb MB per member (each sends (K-1) b);
//   raw:       the same bytes through raw ZeroMQ PUSH/PULL: each member pushes its blob, as one
//              message without a copy, to each of the K-1 others, and pulls theirs into vectors
//              (what allgather returns): no pieces, framing, hellos, keepalives or checks (with
//              --curve, under CURVE too);
//   allreduce: the butterfly all-reduce (fp32) of a vector of K b / 8 floats, whose bytes sent
//              per member, 2 (K-1)/K x 4n, are the all-gather's (K-1) b.
// Prints each median and ours over raw and over the all-reduce (> 1: ours is slower).
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/stats.hpp"
#include "runtime/collective/allreduce.hpp"
#include "runtime/security/keys.hpp"

using namespace loco::collective;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int members = 4;
  double blob_mb = 1;
  int runs = 21;
  size_t chunk_bytes = 512 * 1024;
  bool curve = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_allgather: %s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--members") {
      a.members = std::atoi(next());
    } else if (f == "--blob-mb") {
      a.blob_mb = std::atof(next());
    } else if (f == "--runs") {
      a.runs = std::atoi(next());
    } else if (f == "--chunk-bytes") {
      a.chunk_bytes = std::strtoull(next(), nullptr, 10);
    } else if (f == "--curve") {
      a.curve = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_allgather [--members 4] [--blob-mb 1] [--runs 21] "
                   "[--chunk-bytes 524288] [--curve]\n");
      std::exit(2);
    }
  }
  return a;
}

// K members' ZeroMQ PUSH/PULL mesh: each binds a PULL and connects a PUSH to every other's;
// under CURVE with `key` when it is not empty (every socket holds it, as cluster members do).
struct RawMesh {
  RawMesh(int k, const loco::security::KeyPair& key) {
    for (int r = 0; r < k; ++r) {
      ctx.push_back(std::make_unique<zmq::context_t>(2));
      pull.emplace_back(*ctx[r], zmq::socket_type::pull);
      if (!key.secret_key.empty()) {
        pull[r].set(zmq::sockopt::curve_server, true);
        pull[r].set(zmq::sockopt::curve_secretkey, key.secret_key);
      }
      pull[r].bind("tcp://127.0.0.1:*");
    }
    push.resize(k);
    for (int r = 0; r < k; ++r) {
      for (int q = 0; q < k; ++q) {
        if (q == r) continue;
        push[r].emplace_back(*ctx[r], zmq::socket_type::push);
        if (!key.secret_key.empty()) {
          push[r].back().set(zmq::sockopt::curve_serverkey, key.public_key);
          push[r].back().set(zmq::sockopt::curve_publickey, key.public_key);
          push[r].back().set(zmq::sockopt::curve_secretkey, key.secret_key);
        }
        push[r].back().connect(pull[q].get(zmq::sockopt::last_endpoint));
      }
    }
  }
  // Member r's operation: its blob to every other, theirs into `out`.
  void run(int r, const std::vector<uint8_t>& mine, std::vector<std::vector<uint8_t>>& out) {
    for (auto& s : push[r])
      (void)s.send(zmq::message_t(const_cast<uint8_t*>(mine.data()), mine.size(), nullptr),
                   zmq::send_flags::none);
    out.resize(push[r].size());
    for (auto& o : out) {
      zmq::message_t m;
      (void)pull[r].recv(m, zmq::recv_flags::none);
      o.assign(static_cast<const uint8_t*>(m.data()),
               static_cast<const uint8_t*>(m.data()) + m.size());
    }
  }
  std::vector<std::unique_ptr<zmq::context_t>> ctx;  // declared first: destroyed last
  std::vector<zmq::socket_t> pull;
  std::vector<std::vector<zmq::socket_t>> push;
};

std::vector<std::unique_ptr<Communicator>> communicators(int k, const Options& o) {
  std::vector<std::unique_ptr<Communicator>> c;
  for (int r = 0; r < k; ++r) c.push_back(std::make_unique<Communicator>("tcp://127.0.0.1:0", o));
  return c;
}

Group group_of(const std::vector<std::unique_ptr<Communicator>>& comms, int me, uint64_t round) {
  Group g;
  for (size_t r = 0; r < comms.size(); ++r)
    g.members.push_back({"w" + std::to_string(r), comms[r]->endpoint()});
  g.rank = me;
  g.round_id = round;
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const int k = a.members;
  const size_t b = static_cast<size_t>(a.blob_mb * 1e6);
  const size_t n = static_cast<size_t>(k) * b / 8;  // the all-reduce's floats: equal bytes sent
  Options o;
  o.chunk_bytes = a.chunk_bytes;
  o.peer_timeout = std::chrono::milliseconds(30000);
  if (a.curve) o.security = loco::security::Settings::with_key(loco::security::generate_key_pair());
  auto gather_comms = communicators(k, o);
  auto reduce_comms = communicators(k, o);
  RawMesh raw(k, o.security.cluster);

  std::vector<std::vector<uint8_t>> blobs;
  for (int r = 0; r < k; ++r) {
    blobs.emplace_back(b);
    for (size_t i = 0; i < b; ++i) blobs[r][i] = static_cast<uint8_t>(i * 131 + r);
  }
  std::vector<std::vector<float>> vectors(k, std::vector<float>(n));
  for (int r = 0; r < k; ++r)
    for (size_t i = 0; i < n; ++i) vectors[r][i] = static_cast<float>((i * 7 + r) % 1000) * 1e-3f;

  enum Impl { ours, raw_zmq, allreduce, impls };
  const char* names[impls] = {"ours (allgather)", "raw ZeroMQ PUSH/PULL", "allreduce, equal bytes"};
  std::vector<double> times[impls];
  std::barrier sync(k);
  bool wrong = false;
  const int warmup = 2;
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::vector<uint8_t>> got;
      for (int run = 0; run < warmup + a.runs; ++run) {
        for (int impl = 0; impl < impls; ++impl) {
          sync.arrive_and_wait();
          const auto t0 = Clock::now();
          const uint64_t round = static_cast<uint64_t>(run) + 1;
          if (impl == ours) {
            got = gather_comms[r]->allgather(group_of(gather_comms, r, round), blobs[r], b);
          } else if (impl == raw_zmq) {
            raw.run(r, blobs[r], got);
          } else {
            reduce_comms[r]->allreduce(group_of(reduce_comms, r, round),
                                       std::span<float>(vectors[r]));
          }
          sync.arrive_and_wait();
          if (r != 0 || run < warmup) continue;
          times[impl].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          if (impl == ours && got != blobs) wrong = true;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (wrong) {
    std::fprintf(stderr, "bench_allgather: a member got other blobs than were sent\n");
    return 1;
  }
  double med[impls];
  std::printf(
      "allgather: %d members x %.2f MB blobs over tcp loopback%s, chunks of %zu bytes, "
      "median of %d runs (%u hardware threads)\n",
      k, static_cast<double>(b) / 1e6, a.curve ? " under CURVE" : "", a.chunk_bytes, a.runs,
      std::thread::hardware_concurrency());
  for (int impl = 0; impl < impls; ++impl) {
    med[impl] = loco::bench::median(times[impl]);
    std::printf("  %-24s %8.2f ms  %6.2f GB/s received per member\n", names[impl], med[impl] * 1e3,
                static_cast<double>((k - 1) * b) / med[impl] / 1e9);
  }
  const Stats& s = gather_comms[0]->last_stats();
  std::printf("  ours sent %.2f MB in %lu messages (payload %.2f MB = (K-1) b)\n",
              static_cast<double>(s.bytes_sent) / 1e6, static_cast<unsigned long>(s.messages_sent),
              static_cast<double>(s.payload_bytes_sent) / 1e6);
  std::printf("  ratio ours/raw %.2f, ours/allreduce %.2f\n", med[ours] / med[raw_zmq],
              med[ours] / med[allreduce]);
  return 0;
}
