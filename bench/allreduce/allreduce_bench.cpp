// loco's butterfly all-reduce against Gloo's ring all-reduce, same number of processes.
//
//   allreduce_bench [--procs 2,4,8] [--sizes-mb 1,16,128] [--impls ours,gloo]
//                   [--codecs fp32] [--netns PREFIX --ips IP0,IP1,...] [--link-gbit R]
//                   [--rounds 3] [--iters N] [--chunk-bytes 524288] [--io-threads 2]
//
// The launcher starts K worker processes of this same binary per configuration (in network
// namespaces PREFIX0.. when --netns is given), rendezvous through files in a temporary
// folder, and prints rank 0's median time per operation (median over `rounds` alternating
// runs; rounds_ms is their range), the bus bandwidth
// 2(K-1)/K x bytes / time (of the fp32 bytes, also for compressed codecs), its ratio to the
// link bound (with --link-gbit) and Gloo's median time over ours (> 1: we are faster).
// Impl "ours-curve" is ours with every socket under CURVE (a cluster key made for the run).
// Impl "ours-auto" is ours with parts sized by measured bandwidth: the members measure their
// sending rates in the warm-up, share them, and cut the parts with part_weights_for_rates().
// cpu_ms is the CPU time (user + system, all threads of all K processes) per operation, and
// cpu_gloo Gloo's over ours: on a loaded machine with fewer cores than processes, the wall
// time follows the CPU time, and the CPU time is the steadier of the two.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collective/allreduce.hpp"
#include "runtime/collective/local.hpp"
#include "runtime/security/keys.hpp"

extern char** environ;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using loco::collective::Codec;

namespace {

std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

struct WorkerArgs {
  int rank = 0, size = 1;
  std::string dir, impl = "ours", codec = "fp32", host = "127.0.0.1";
  size_t bytes = 1 << 20;
  int iters = 5, warmup = 1;
  size_t chunk_bytes = 512 * 1024;
  int io_threads = 2;
};

// Waits (bounded) until every rank wrote its file `name`.RANK; returns their contents.
std::vector<std::string> gather_files(const std::string& dir, const std::string& name, int size) {
  std::vector<std::string> out(size);
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < size; ++r) {
    fs::path p = fs::path(dir) / (name + "." + std::to_string(r));
    while (!fs::exists(p)) {
      if (Clock::now() > deadline)
        throw std::runtime_error("rendezvous timed out on " + p.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream in(p);
    std::getline(in, out[r]);
  }
  return out;
}

// CPU seconds this process (all its threads) has used so far, user and system.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

void write_file(const std::string& dir, const std::string& name, const std::string& text) {
  fs::path tmp = fs::path(dir) / (name + ".tmp" + std::to_string(getpid()));
  {
    std::ofstream out(tmp);
    out << text << "\n";
  }
  fs::rename(tmp, fs::path(dir) / name);
}

int run_worker(const WorkerArgs& a) {
  const size_t n = a.bytes / sizeof(float);
  std::vector<float> data(n), out(a.impl == "gloo" ? 0 : n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>((i * 7 + a.rank) % 1000) * 1e-3f;
  std::vector<double> times;
  double cpu_start = 0;  // from the first timed iteration on (its barrier included)
  if (a.impl == "ours" || a.impl == "ours-auto" || a.impl == "ours-curve") {
    loco::collective::Options opts;
    // ours-curve: ours over CURVE with a cluster key the launcher made for this run.
    if (a.impl == "ours-curve") opts.security = loco::security::read_key_file(a.dir + "/cluster.key");
    opts.codec = loco::collective::parse_codec(a.codec).value();
    opts.chunk_bytes = a.chunk_bytes;
    opts.io_threads = a.io_threads;
    opts.peer_timeout = std::chrono::milliseconds(30000);
    loco::collective::Communicator comm("tcp://" + a.host + ":0", opts);
    write_file(a.dir, "ep." + std::to_string(a.rank), comm.endpoint());
    auto eps = gather_files(a.dir, "ep", a.size);
    loco::collective::Group g;
    for (int r = 0; r < a.size; ++r) g.members.push_back({"w" + std::to_string(r), eps[r]});
    g.rank = a.rank;
    // A small exact all-reduce beside the measured ones: the barrier, ours-auto's rates.
    auto exchange = [&](std::span<float> v) {
      comm.options().codec = Codec::fp32;
      comm.allreduce(g, v);
      comm.options().codec = opts.codec;
    };
    std::vector<float> one(1, 1.0f);
    for (int it = 0; it < a.warmup + a.iters; ++it) {
      if (it == a.warmup) cpu_start = cpu_seconds();
      g.round_id = 3 * static_cast<uint64_t>(it);  // barrier, operation, ours-auto's rates
      exchange(one);                               // barrier
      g.round_id += 1;
      auto t0 = Clock::now();
      // Out of place, as a DiLoCo worker uses it (the mean lands next to its own delta).
      comm.allreduce(g, std::span<const float>(data), std::span<float>(out));
      if (it >= a.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (a.impl == "ours-auto" && it + 1 == a.warmup) {
        // Parts sized by measured bandwidth: each member's sending rate in the warm-up (equal
        // parts), shared through the all-reduce itself, then part_weights_for_rates().
        const auto& st = comm.last_stats();
        std::vector<float> rates(static_cast<size_t>(a.size), 0.0f);
        rates[static_cast<size_t>(a.rank)] =
            static_cast<float>(static_cast<double>(st.rate_bytes) / st.rate_seconds / 1e6);
        g.round_id += 1;
        exchange(rates);
        std::vector<double> mb_s;
        for (float r : rates) mb_s.push_back(static_cast<double>(r) * a.size);
        g.part_weights = loco::collective::part_weights_for_rates(mb_s);
        if (a.rank == 0) {
          std::ostringstream s;
          s << "# ours-auto: sending rates (MB/s)";
          for (double r : mb_s) s << " " << static_cast<int>(r);
          s << ", part weights";
          for (double w : g.part_weights) s << " " << std::round(w * 1000) / 1000;
          write_file(a.dir, "note", s.str());
        }
      }
    }
  } else {
    gloo::transport::tcp::attr attr(a.host.c_str());
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    fs::create_directories(fs::path(a.dir) / "gloo");
    gloo::rendezvous::FileStore store((fs::path(a.dir) / "gloo").string());
    auto ctx = std::make_shared<gloo::rendezvous::Context>(a.rank, a.size);
    ctx->setTimeout(std::chrono::seconds(60));
    ctx->connectFullMesh(store, dev);
    const float inv = 1.0f / static_cast<float>(a.size);
    for (int it = 0; it < a.warmup + a.iters; ++it) {
      if (it == a.warmup) cpu_start = cpu_seconds();
      gloo::BarrierOptions bo(ctx);
      gloo::barrier(bo);
      auto t0 = Clock::now();
      gloo::AllreduceOptions opts(ctx);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setOutput(data.data(), n);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(opts);
      for (float& x : data) x *= inv;  // a mean, like ours
      if (it >= a.warmup) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  write_file(a.dir, "cpu." + std::to_string(a.rank),
             std::to_string((cpu_seconds() - cpu_start) / a.iters));
  if (a.rank == 0) {
    std::ostringstream s;
    for (double t : times) s << t << " ";
    write_file(a.dir, "result", s.str());
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct ConfigResult {
  std::vector<double> times;  // rank 0's, one per timed operation; empty on failure
  double cpu = 0;             // CPU seconds per operation, all ranks together
  std::string note;           // what rank 0 wants printed (ours-auto: rates and weights)
};

// Starts the K workers of one configuration and returns what they measured.
ConfigResult run_config(const std::string& self, const WorkerArgs& base, const std::string& netns,
                        const std::vector<std::string>& ips) {
  char tmpl[] = "/tmp/loco-allreduce-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  if (base.impl == "ours-curve")
    loco::security::write_key_file(dir + "/cluster.key", loco::security::generate_key_pair());
  std::vector<pid_t> pids;
  for (int r = 0; r < base.size; ++r) {
    std::vector<std::string> args;
    if (!netns.empty()) args = {"/usr/sbin/ip", "netns", "exec", netns + std::to_string(r)};
    std::string host = ips.empty() ? "127.0.0.1" : ips.at(r);
    for (const std::string& x : std::vector<std::string>{self,
                                                         std::string("--worker"),
                                                         "--rank",
                                                         std::to_string(r),
                                                         "--size",
                                                         std::to_string(base.size),
                                                         "--dir",
                                                         dir,
                                                         "--impl",
                                                         base.impl,
                                                         "--codec",
                                                         base.codec,
                                                         "--host",
                                                         host,
                                                         "--bytes",
                                                         std::to_string(base.bytes),
                                                         "--iters",
                                                         std::to_string(base.iters),
                                                         "--warmup",
                                                         std::to_string(base.warmup),
                                                         "--chunk-bytes",
                                                         std::to_string(base.chunk_bytes),
                                                         "--io-threads",
                                                         std::to_string(base.io_threads)})
      args.push_back(x);
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0)
      pids.push_back(pid);
  }
  // Bounded wait: a stuck configuration is killed, reported, and the run goes on.
  auto deadline = Clock::now() + std::chrono::seconds(240);
  bool ok = pids.size() == static_cast<size_t>(base.size);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        ok = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
  }
  ConfigResult result;
  std::ifstream in(fs::path(dir) / "result");
  double t;
  while (ok && in >> t) result.times.push_back(t);
  for (int r = 0; ok && r < base.size; ++r) {
    std::ifstream cpu(fs::path(dir) / ("cpu." + std::to_string(r)));
    if (cpu >> t) result.cpu += t;
  }
  std::ifstream note(fs::path(dir) / "note");
  std::getline(note, result.note);
  fs::remove_all(dir);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {{"procs", "2,4,8"},     {"sizes-mb", "1,16,128"},
                                            {"impls", "ours,gloo"}, {"codecs", "fp32"},
                                            {"netns", ""},          {"ips", ""},
                                            {"link-gbit", "0"},     {"chunk-bytes", "524288"},
                                            {"iters", ""},          {"rounds", "3"}};
  bool worker = false;
  WorkerArgs w;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value for " + a);
      return argv[++i];
    };
    if (a == "--worker")
      worker = true;
    else if (a == "--rank")
      w.rank = std::stoi(next());
    else if (a == "--size")
      w.size = std::stoi(next());
    else if (a == "--dir")
      w.dir = next();
    else if (a == "--impl")
      w.impl = next();
    else if (a == "--codec")
      w.codec = next();
    else if (a == "--host")
      w.host = next();
    else if (a == "--bytes")
      w.bytes = std::stoull(next());
    else if (a == "--warmup")
      w.warmup = std::stoi(next());
    else if (a == "--io-threads")
      w.io_threads = std::stoi(next());
    else if (a == "--chunk-bytes")
      opt["chunk-bytes"] = next();
    else if (a.rfind("--", 0) == 0 && opt.count(a.substr(2)))
      opt[a.substr(2)] = next();
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  w.chunk_bytes = std::stoull(opt["chunk-bytes"]);
  if (worker) {
    if (!opt["iters"].empty()) w.iters = std::stoi(opt["iters"]);
    try {
      return run_worker(w);
    } catch (const std::exception& e) {
      std::cerr << "worker " << w.rank << ": " << e.what() << "\n";
      return 1;
    }
  }

  const std::string self = fs::canonical("/proc/self/exe").string();
  const double link = std::stod(opt["link-gbit"]) * 1e9 / 8;  // bytes/s
  const auto ips = split(opt["ips"]);
  std::printf("%-5s %-5s %2s %8s %11s %15s %12s %9s %9s %9s %9s\n", "impl", "codec", "K", "MB",
              "median_ms", "rounds_ms", "busbw_GB/s", "vs_link", "vs_gloo", "cpu_ms", "cpu_gloo");
  for (const auto& ks : split(opt["procs"])) {
    for (const auto& mbs : split(opt["sizes-mb"])) {
      const int k = std::stoi(ks);
      const size_t bytes = static_cast<size_t>(std::stod(mbs) * (1 << 20));
      std::vector<std::pair<std::string, std::string>> runs;
      for (const auto& impl : split(opt["impls"])) {
        if (impl == "gloo")
          runs.insert(runs.begin(), {impl, "fp32"});
        else
          for (const auto& c : split(opt["codecs"])) runs.push_back({impl, c});
      }
      // The machine is shared: run the configurations in alternation, `rounds` times, so that
      // Gloo and ours see the same background load. Times are medians over rounds; ratios to
      // Gloo are medians of each round's ratio (Gloo and ours back to back), which cancels
      // most of the drift in background load between rounds.
      const int rounds = std::stoi(opt["rounds"]);
      const double failed = std::numeric_limits<double>::quiet_NaN();
      std::vector<std::vector<double>> times(runs.size()), cpus(runs.size());
      for (int round = 0; round < rounds; ++round) {
        for (size_t i = 0; i < runs.size(); ++i) {
          WorkerArgs base = w;
          base.size = k;
          base.impl = runs[i].first;
          base.codec = runs[i].second;
          base.bytes = bytes;
          base.iters = !opt["iters"].empty()  ? std::stoi(opt["iters"])
                       : bytes <= (2u << 20)  ? 20
                       : bytes <= (32u << 20) ? 8
                                              : 4;
          base.warmup = bytes <= (2u << 20) ? 3 : 1;
          auto result = run_config(self, base, opt["netns"], ips);
          if (!result.note.empty()) std::printf("%s\n", result.note.c_str());
          times[i].push_back(result.times.empty() ? failed : median(result.times));
          cpus[i].push_back(result.times.empty() ? failed : result.cpu);
        }
      }
      auto finite = [](const std::vector<double>& v) {
        std::vector<double> out;
        for (double x : v)
          if (std::isfinite(x)) out.push_back(x);
        return out;
      };
      // Median over rounds of a[round] / b[round].
      auto paired = [&](const std::vector<double>& a, const std::vector<double>& b) {
        std::vector<double> r;
        for (size_t j = 0; j < a.size(); ++j) r.push_back(a[j] / b[j]);
        return median(finite(r));
      };
      const bool with_gloo = !runs.empty() && runs[0].first == "gloo";
      for (size_t i = 0; i < runs.size(); ++i) {
        const auto& [impl, codec] = runs[i];
        const auto ok = finite(times[i]);
        if (ok.empty()) {
          std::printf("%-5s %-5s %2d %8s   FAILED\n", impl.c_str(), codec.c_str(), k, mbs.c_str());
          continue;
        }
        const double t = median(ok);
        const double lo = *std::min_element(ok.begin(), ok.end());
        const double hi = *std::max_element(ok.begin(), ok.end());
        const double cpu = median(finite(cpus[i]));
        double busbw = 2.0 * (k - 1) / k * static_cast<double>(bytes) / t;
        char vs_link[32] = "-", vs_gloo[32] = "-", cpu_gloo[32] = "-", range[48];
        if (link > 0) std::snprintf(vs_link, sizeof vs_link, "%.2f", busbw / link);
        if (with_gloo && impl != "gloo") {
          std::snprintf(vs_gloo, sizeof vs_gloo, "%.2f", paired(times[0], times[i]));
          std::snprintf(cpu_gloo, sizeof cpu_gloo, "%.2f", paired(cpus[0], cpus[i]));
        }
        std::snprintf(range, sizeof range, "%.1f-%.1f", lo * 1e3, hi * 1e3);
        std::printf("%-5s %-5s %2d %8s %11.1f %15s %12.3f %9s %9s %9.1f %9s\n", impl.c_str(),
                    codec.c_str(), k, mbs.c_str(), t * 1e3, range, busbw / 1e9, vs_link, vs_gloo,
                    cpu * 1e3, cpu_gloo);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
