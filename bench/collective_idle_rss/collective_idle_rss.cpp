// A node's RSS when a member of its worker's group sends the worker's collective socket frames
// for no operation while it is idle (docs/security.md, "Bounded decoding and buffering").
//
//   bench_collective_idle_rss [--frames 16] [--frame-mb 50] [--max-floats 12500000]
//                             [--chunks-mb 600] [--insecure]
//
// Two processes on loopback: this one is the worker (rank 0), a forked child is rank 1. They
// run one all-reduce, as a worker between rounds has; then the child, as member w1, sends
// `frames` frames of `frame-mb` MB for a later round (phase 1), then chunks of the largest
// size an operation sends (512 KiB) totalling `chunks-mb` (phase 2), each until ZeroMQ takes
// them or 5 s pass. The worker prints its VmRSS before and after each phase, the bytes it holds
// for no operation against their bound (Options::max_floats x 8), and the messages dropped.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "runtime/collective/allreduce.hpp"
#include "runtime/collective/butterfly.hpp"
#include "runtime/collective/wire.hpp"
#include "runtime/collective/zmq_transport.hpp"
#include "runtime/security/keys.hpp"

using namespace loco::collective;
using namespace std::chrono_literals;

namespace {

double rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

// A line through a pipe: the child and the parent tell each other endpoints and progress.
void put(int fd, const std::string& s) {
  std::string line = s + "\n";
  if (write(fd, line.data(), line.size()) != ssize_t(line.size())) std::perror("write");
}
std::string get(int fd) {
  std::string s;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

Group pair(const std::string& ep0, const std::string& ep1, int me, uint64_t round) {
  Group g;
  g.members = {{"w0", ep0}, {"w1", ep1}};
  g.rank = me;
  g.round_id = round;
  return g;
}

// Rank 1, and the member that floods rank 0.
int child(int in, int out, Options o, size_t frames, size_t frame_bytes, size_t chunk_total) {
  Communicator b("tcp://127.0.0.1:0", o);
  put(out, b.endpoint());
  const std::string ep0 = get(in);
  std::vector<float> v(1000, 2.0f);
  b.allreduce(pair(ep0, b.endpoint(), 1, 1), v);
  auto ctx = std::make_shared<zmq::context_t>(1);
  const uint64_t fp = detail::fingerprint(pair(ep0, b.endpoint(), 0, 2));
  // A connection of its own per phase: ZeroMQ keeps resending a refused frame on reconnection.
  auto send_all = [&](size_t count, size_t bytes) {
    detail::ZmqTransport x("tcp://127.0.0.1:0", ctx, o.security);
    auto data = std::make_shared<std::vector<uint8_t>>(bytes, 0);
    size_t sent = 0;
    for (size_t i = 0; i < count; ++i) {
      detail::Header h;
      h.type = detail::MsgType::reduce_scatter;
      h.round_id = 2;  // the next round: no operation runs it yet
      h.group_fp = fp;
      h.sender_rank = 1;
      h.total_n = bytes / 4 * count;
      h.offset = bytes / 4 * i;
      h.count = bytes / 4;
      const auto deadline = std::chrono::steady_clock::now() + 5s;
      bool taken = false;
      while (!(taken = x.try_send(ep0, detail::Channel::data, h, "w1",
                                  detail::Buffer{data->data(), data->size(), data})) &&
             std::chrono::steady_clock::now() < deadline)
        x.wait({}, 10ms);
      if (!taken) break;
      ++sent;
    }
    std::this_thread::sleep_for(2s);  // let ZeroMQ and the kernel move what they took
    return sent;
  };
  get(in);
  put(out, std::to_string(send_all(frames, frame_bytes)));
  get(in);
  const size_t chunk = detail::max_payload_bytes(o);
  put(out, std::to_string(send_all(chunk_total / chunk, chunk)));
  get(in);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t frames = 16, frame_mb = 50, chunks_mb = 600;
  Options o;
  o.max_floats = 12'500'000;  // a 50 MB model
  bool curve = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::stoull(argv[++i]); };
    if (a == "--frames")
      frames = next();
    else if (a == "--frame-mb")
      frame_mb = next();
    else if (a == "--max-floats")
      o.max_floats = next();
    else if (a == "--chunks-mb")
      chunks_mb = next();
    else if (a == "--insecure")
      curve = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (curve) o.security = loco::security::Settings::with_key(loco::security::generate_key_pair());
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0)
    _exit(child(to_child[0], to_parent[1], o, frames, frame_mb * 1000 * 1000, chunks_mb << 20));

  Communicator a("tcp://127.0.0.1:0", o);
  put(to_child[1], a.endpoint());
  const std::string ep1 = get(to_parent[0]);
  std::vector<float> v(1000, 1.0f);
  a.allreduce(pair(a.endpoint(), ep1, 0, 1), v);
  const size_t bound = detail::held_bytes_bound(o);
  std::printf("collective_idle_rss: %s, max_floats %zu: held bound %.1f MB, largest frame %zu B\n",
              curve ? "CURVE" : "plain TCP", o.max_floats, bound / 1e6,
              detail::max_payload_bytes(o));
  auto report = [&](const char* phase, double before, const std::string& sent) {
    std::this_thread::sleep_for(500ms);  // the receiving thread takes what arrived every 50 ms
    const size_t held = a.held_bytes();
    std::printf(
        "%s: %s taken by the sender's ZeroMQ; worker RSS %.0f -> %.0f MB; held %.1f MB "
        "= %.3f of the bound; dropped %llu\n",
        phase, sent.c_str(), before, rss_mb(), held / 1e6, double(held) / double(bound),
        static_cast<unsigned long long>(a.dropped_messages()));
  };
  double before = rss_mb();
  put(to_child[1], "go");
  std::string sent = get(to_parent[0]);
  report(("phase 1, " + std::to_string(frames) + " x " + std::to_string(frame_mb) + " MB frames")
             .c_str(),
         before, sent + "/" + std::to_string(frames));
  before = rss_mb();
  put(to_child[1], "go");
  sent = get(to_parent[0]);
  report(("phase 2, " + std::to_string(chunks_mb) + " MiB in 512 KiB chunks").c_str(), before,
         sent + " chunks");
  put(to_child[1], "done");
  int status = 0;
  waitpid(pid, &status, 0);
  return 0;
}
