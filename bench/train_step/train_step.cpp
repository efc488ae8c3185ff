// bench/train_step: inner-step tokens per second of loco's InnerTrainer
// against the same model, batch, context, threads and steps in plain eager
// PyTorch (train_step.py, run with the torch of the same virtual
// environment). The two alternate `--repeats` times, so that load from other
// processes hits both alike; medians of the per-step times are compared.
// `--procs N` runs N trainers at once (N processes of this binary, then N of
// Python), as N workers of a job share a machine's cores: each process's
// median, and their median, compared side by side.
//
// `--path worker` runs loco's side as a job's workers run it: N node processes (`loco start`,
// one cpu each, on loopback), an InnerWorker actor on each, built from the job file, init()
// and inner() as the aggregator calls them, all N stepping at once: the job's data path
// (TokenStore::open over a data folder), the actor's thread and the node's runtime threads
// beside the steps. The per-step seconds are the workers' own (metrics.jsonl "steps"), and so
// is their CPU time: "cpu" is the median share of a step's wall time that its process was on a
// CPU (both sides), so that a gap from waiting (for a core, on a lock) shows apart from one in
// the arithmetic.
//
// On a GPU (`--device cuda`, with `--bf16` for autocast to bfloat16 as `inner.precision: bf16`
// runs it): both sides step on the card, each step's time taken after the card is done with
// it; every side also prints its peak memory per step (the most allocated on the card) and its
// MFU (6·N + attention FLOPs per token over the card's peak, diloco::peak_flops). `--compile`
// adds a third side, the same Python loop with the model through `torch.compile`.
// `--fused-side` adds another, eager PyTorch with AdamW(fused=True) (its default is foreach).
// GPT-2 small (124 M) so: `bench_train_step --device cuda --bf16 --compile --layers 12
// --d-model 768 --heads 12 --context 1024 --vocab 50257 --batch 8 --threads 4`.
// `--profile DIR`: after the last repeat, 3 more steps of each side under the PyTorch
// profiler (Kineto: the CPU's ops and the card's kernels), their Chrome traces in DIR
// (loco.json, python.json, ...), which trace_summary.py sums up by kind of kernel.
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <regex>

#include "actors/inner_worker.hpp"
#include "bench/stats.hpp"
#include "diloco/model/device_info.hpp"
#include "diloco/round/trainer.hpp"
#include "runtime/core/util.hpp"
#include "tests/runtime/core/cluster.hpp"

using namespace loco::diloco;

namespace {

using loco::bench::median;

// `n` copies of `cmd` running at once: started by the constructor, their outputs (in order)
// from outputs().
class Running {
 public:
  Running(std::string cmd, int n) : cmd_(std::move(cmd)) {
    for (int i = 0; i < n; ++i) {
      FILE* p = ::popen(cmd_.c_str(), "r");
      if (!p) throw std::runtime_error("cannot run " + cmd_);
      pipes_.push_back(p);
    }
  }
  ~Running() {
    for (FILE* p : pipes_) ::pclose(p);
  }
  std::vector<std::string> outputs() {
    std::vector<std::string> outs;
    for (FILE*& p : pipes_) {
      std::string out;
      char buf[4096];
      while (std::fgets(buf, sizeof buf, p)) out += buf;
      const int rc = ::pclose(p);
      p = nullptr;
      if (rc != 0) throw std::runtime_error("failed: " + cmd_ + "\n" + out);
      outs.push_back(out);
    }
    std::erase(pipes_, nullptr);
    return outs;
  }

 private:
  std::string cmd_;
  std::vector<FILE*> pipes_;
};
std::vector<std::string> run_all(const std::string& cmd, int n) {
  return Running(cmd, n).outputs();
}

double field_of(const std::string& out, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(name + "=([0-9.]+)")))
    throw std::runtime_error("no " + name + " in:\n" + out);
  return std::stod(m[1]);
}
double result_of(const std::string& out) { return field_of(out, "tokens_per_s"); }

// One process's figures over its timed steps: tokens/s at its median step, the median
// share of a step's wall time it was on a CPU, and on a GPU the most memory allocated on it
// in a step (bytes; 0 on the CPU).
struct ProcFigures {
  double tokens_per_s = 0;
  double cpu_share = 0;
  double peak_bytes = 0;
};

// The most bytes allocated on CUDA device 0 since the last call (the caching allocator's
// peak, then reset).
double cuda_peak_bytes() {
  auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
  const double peak = double(allocator->getDeviceStats(0)
                                 .allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)]
                                 .peak);
  allocator->resetPeakStats(0);
  return peak;
}

// --path worker: `procs` nodes of one cpu each and an InnerWorker on each, initialized as a
// job's workers; round() runs one round of inner steps on all of them at once.
class WorkerPath {
 public:
  WorkerPath(const JobConfig& cfg, const std::filesystem::path& dir, int procs) : cfg_(cfg) {
    loco::testing::ClusterOptions co;
    co.nodes = procs;
    co.node_resources = "cpu=1";
    // Nodes busy stepping on shared cores answer heartbeats late: the tests' 1 s would declare
    // them dead (`loco start`'s default is 2 s; this is a benchmark, not a failure test).
    co.detect_ms = 30000;
    co.plugins = LOCO_PLUGIN_DIR_STR "/libloco_diloco_actors.so";
    co.path_root = dir.string();
    cluster_.emplace(co);
    if (!cluster_->wait_alive_nodes(procs))
      throw std::runtime_error("bench: " + std::to_string(procs) +
                               " nodes did not start; logs in " + cluster_->log_dir());
    loco::Runtime& rt = cluster_->runtime();
    std::vector<loco::Future<loco::actors::InitResult>> inits;
    for (int i = 0; i < procs; ++i) {
      workers_.push_back(rt.spawn<loco::actors::InnerWorker>(
          loco::ActorOptions().with_name("bench-worker-" + std::to_string(i)), "bench",
          std::string(cfg.to_yaml()), i));
      loco::actors::WorkerInit wi;
      wi.index = i;
      wi.shards = round_robin_shards(cfg.data.shards, i, procs);
      wi.stream = uint64_t(i);
      wi.total_steps = int64_t(cfg.inner.steps) * cfg.rounds;
      inits.push_back(workers_.back().call(&loco::actors::InnerWorker::init, wi));
    }
    for (auto& f : inits) params_ = f.get(loco::Millis(600000)).parameters;
  }
  std::int64_t parameters() const { return params_; }

  // Round `round` on every worker at once; each worker's figures over its steps from `warmup`.
  std::vector<ProcFigures> round(int64_t round, int warmup) {
    std::vector<loco::Future<loco::actors::InnerResult>> calls;
    for (auto& w : workers_) calls.push_back(w.call(&loco::actors::InnerWorker::inner, round));
    std::vector<ProcFigures> out;
    for (auto& c : calls) {
      const loco::actors::InnerResult r = c.get(loco::Millis(3600000));
      std::vector<double> seconds, shares;
      for (size_t i = size_t(warmup); i < r.per_step.size(); ++i) {
        seconds.push_back(r.per_step[i].seconds);  // in whole milliseconds: not for tiny models
        if (r.per_step[i].seconds > 0)
          shares.push_back(r.per_step[i].cpu_seconds / r.per_step[i].seconds);
      }
      out.push_back({double(cfg_.tokens_per_inner_step()) / median(seconds),
                     shares.empty() ? 0.0 : median(shares)});
    }
    return out;
  }

 private:
  JobConfig cfg_;
  std::optional<loco::testing::LocalCluster> cluster_;
  std::vector<loco::ActorHandle<loco::actors::InnerWorker>> workers_;
  std::int64_t params_ = 0;
};

// One side of the comparison (loco's, eager PyTorch's, torch.compile's) and its processes'
// figures over the repeats.
struct Side {
  std::string name, tag;  // tag: in the ratio's line
  std::vector<ProcFigures> figs;
};

double median_of(const std::vector<ProcFigures>& v, double ProcFigures::*f) {
  std::vector<double> x;
  for (const ProcFigures& p : v) x.push_back(p.*f);
  return median(x);
}

// A line a side (tokens/s at the median over processes and repeats, its CPU share; on a GPU
// (`peak` >= 0: the card's FLOP/s, 0 unknown) its peak memory in a step and MFU), then loco's
// ratio to every other side and, per CPU second, to eager PyTorch's. sides[0] is loco's.
void print_sides(const std::vector<Side>& sides, double flops_per_token, double peak) {
  std::printf(
      "  (tokens/s at each process's median step, the median over processes and repeats; cpu: "
      "the median share of a step's wall time its process was on a CPU)\n");
  for (const Side& s : sides) {
    const double tps = median_of(s.figs, &ProcFigures::tokens_per_s);
    std::printf("  %-36s %10.0f tokens/s  cpu %.2f", s.name.c_str(), tps,
                median_of(s.figs, &ProcFigures::cpu_share));
    if (peak >= 0) {
      double most = 0;
      for (const ProcFigures& f : s.figs) most = std::max(most, f.peak_bytes);
      std::printf("  peak %.0f MiB", most / (1 << 20));
      if (peak > 0) std::printf("  MFU %.1f %%", 100 * tps * flops_per_token / peak);
    }
    std::printf("\n");
  }
  const double ours = median_of(sides[0].figs, &ProcFigures::tokens_per_s);
  for (size_t i = 1; i < sides.size(); ++i)
    std::printf("  %-36s %10.2fx\n", ("ratio loco / " + sides[i].tag).c_str(),
                ours / median_of(sides[i].figs, &ProcFigures::tokens_per_s));
  if (peak == 0)
    std::printf("  (no MFU: this card's peak is not in diloco::peak_flops; LOCO_PEAK_TFLOPS sets it)\n");
  // Tokens per CPU second of each process: the arithmetic's cost whatever the wait for a core.
  auto per_cpu = [](const std::vector<ProcFigures>& v) {
    std::vector<double> x;
    for (const ProcFigures& p : v) x.push_back(p.tokens_per_s / p.cpu_share);
    return median(x);
  };
  std::printf("  %-36s %10.2fx  (%.0f / %.0f tokens per CPU second)\n", "ratio per CPU second",
              per_cpu(sides[0].figs) / per_cpu(sides[1].figs), per_cpu(sides[0].figs),
              per_cpu(sides[1].figs));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/train_step: loco's inner steps vs eager PyTorch, tokens/s"};
  int layers = 4, d_model = 128, heads = 4, context = 128, vocab = 256, batch = 16, threads = 2,
      steps = 30, warmup = 5, repeats = 2, procs = 1;
  bool child = false, together = false, bf16 = false, compile = false, fused_side = false;
  std::string path = "trainer", device_name = "cpu", profile_dir;
  const char* venv = std::getenv("LOCO_VENV");
  std::string python =
      std::string(venv ? venv : std::string(std::getenv("HOME")) + "/.cache/loco-venv") +
      "/bin/python";
  std::string script = LOCO_SOURCE_DIR "/bench/train_step/train_step.py";
  app.add_option("--layers", layers);
  app.add_option("--d-model", d_model);
  app.add_option("--heads", heads);
  app.add_option("--context", context);
  app.add_option("--vocab", vocab)->check(CLI::Range(2, 65536));
  app.add_option("--batch", batch);
  app.add_option("--threads", threads);
  app.add_option("--steps", steps, "timed steps per repeat");
  app.add_option("--warmup-steps", warmup, "untimed steps per repeat");
  app.add_option("--repeats", repeats, "loco and Python runs, alternating");
  app.add_option("--python", python);
  app.add_option("--procs", procs,
                 "trainers at once (processes sharing the cores, as a job's workers)");
  app.add_option("--path", path,
                 "loco's side: trainer (InnerTrainer in this process, or --procs copies of it) or "
                 "worker (--procs InnerWorker actors on as many local nodes: a job's workers)")
      ->check(CLI::IsMember({"trainer", "worker"}));
  app.add_flag("--together", together,
               "run the Python side at the same time as loco's (2 x --procs processes), so that "
               "other load on the machine hits both alike");
  app.add_option("--device", device_name, "where both sides step")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--bf16", bf16, "autocast the forward passes to bfloat16 (both sides)");
  app.add_flag("--compile", compile, "a third side: the Python loop with torch.compile(model)");
  app.add_flag("--fused-side", fused_side, "another: eager PyTorch with AdamW(fused=True)");
  app.add_option("--profile", profile_dir,
                 "after the last repeat, 3 steps of each side under the profiler: Chrome traces "
                 "in this folder");
  app.add_flag("--child", child, "internal: one repeat of the C++ side, prints RESULT");
  CLI11_PARSE(app, argc, argv);
  const bool cuda = device_name == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_train_step: --device cuda, but torch sees no CUDA device\n");
    return 2;
  }
  const bool one_trainer = procs == 1 && path == "trainer" && !together;
  if (!profile_dir.empty() && !one_trainer) {
    std::fprintf(stderr, "bench_train_step: --profile traces one trainer a side\n");
    return 2;
  }
  if (!profile_dir.empty()) std::filesystem::create_directories(profile_dir);
  if (cuda && !one_trainer) {
    std::fprintf(stderr,
                 "bench_train_step: --device cuda runs one trainer a side (no --procs, --path "
                 "worker or --together)\n");
    return 2;
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);

  at::set_num_threads(threads);
  at::set_num_interop_threads(1);
  JobConfig cfg;
  cfg.model = {.layers = layers,
               .d_model = d_model,
               .heads = heads,
               .context = context,
               .vocab = vocab,
               .tied_embeddings = true,
               .mlp_ratio = 4};
  cfg.inner.batch_size = batch;
  cfg.inner.warmup = 10;
  cfg.precision = bf16 ? Precision::bf16 : Precision::fp32;
  cfg.rounds = 1;
  cfg.validate();
  // Random tokens, as the Python side uses.
  const auto dir =
      std::filesystem::temp_directory_path() / ("loco-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "data");
  std::vector<std::uint16_t> tokens(1 << 20);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  auto r = torch::randint(0, vocab, {static_cast<std::int64_t>(tokens.size())}, gen, torch::kInt64);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>(r[static_cast<std::int64_t>(i)].item<std::int64_t>());
  write_token_file((dir / "tokens.bin").string(), tokens);
  const auto store = TokenStore::open_file((dir / "tokens.bin").string(), 0.01, 1);

  const std::string py_cmd = python + " " + script + " --layers " + std::to_string(layers) +
                             " --d-model " + std::to_string(d_model) + " --heads " +
                             std::to_string(heads) + " --context " + std::to_string(context) +
                             " --vocab " + std::to_string(vocab) + " --batch " +
                             std::to_string(batch) + " --threads " + std::to_string(threads) +
                             " --steps " + std::to_string(steps) + " --warmup-steps " +
                             std::to_string(warmup) + " --device " + device_name +
                             (bf16 ? " --bf16" : "");
  std::vector<ProcFigures> loco_figs, py_figs, compiled_figs, fused_figs;
  std::int64_t params = 0;
  const double tokens_per_step = static_cast<double>(batch) * context;
  auto one_repeat = [&](bool trace) {
    InnerTrainer t(cfg, store, {0}, 0, steps + warmup + (trace ? 3 : 0), device);
    params = t.parameter_count();
    std::vector<double> seconds, shares, peaks;
    for (int s = 0; s < warmup + steps; ++s) {
      if (cuda) cuda_peak_bytes();  // the step's own peak from here
      const auto t0 = std::chrono::steady_clock::now();
      const double cpu0 = loco::process_cpu_seconds();
      t.run_inner_steps(1);
      if (cuda) torch::cuda::synchronize();
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < warmup) continue;
      seconds.push_back(dt);
      shares.push_back((loco::process_cpu_seconds() - cpu0) / dt);
      if (cuda) peaks.push_back(cuda_peak_bytes());
    }
    if (trace) {
      namespace prof = torch::autograd::profiler;
      using torch::profiler::impl::ActivityType;
      const torch::profiler::impl::ProfilerConfig config(
          torch::profiler::impl::ProfilerState::KINETO);
      std::set<ActivityType> activities{ActivityType::CPU};
      if (cuda) activities.insert(ActivityType::CUDA);
      prof::prepareProfiler(config, activities);
      prof::enableProfiler(config, activities);
      t.run_inner_steps(3);
      if (cuda) torch::cuda::synchronize();
      prof::disableProfiler()->save(profile_dir + "/loco.json");
    }
    return ProcFigures{tokens_per_step / median(seconds), median(shares),
                       peaks.empty() ? 0.0 : *std::max_element(peaks.begin(), peaks.end())};
  };
  auto figures_of = [](const std::string& out) {
    return ProcFigures{result_of(out), field_of(out, "cpu"), field_of(out, "peak_bytes")};
  };
  if (child) {
    const ProcFigures f = one_repeat(false);
    std::printf("RESULT tokens_per_s=%.1f cpu=%.3f peak_bytes=%.0f\n", f.tokens_per_s,
                f.cpu_share, f.peak_bytes);
    remove_tree(dir.string());
    return 0;
  }
  auto say = [](int rep, const char* who, const ProcFigures& f) {
    std::fprintf(stderr, "repeat %d: %-8s tokens_per_s=%.1f cpu=%.2f peak=%.0f MiB\n", rep, who,
                 f.tokens_per_s, f.cpu_share, f.peak_bytes / (1 << 20));
  };
  std::optional<WorkerPath> workers;
  if (path == "worker") {
    // A job's data folder: the byte tokenizer's token file, which TokenStore::open takes as
    // it finds it; H = warmup + timed steps, one round per repeat.
    std::filesystem::rename(dir / "tokens.bin", dir / "data" / "tokens-byte.bin");
    JobConfig job = cfg;
    job.name = "bench-train-step";
    job.threads = threads;
    job.data.dir = (dir / "data").string();
    job.data.shards = 16;
    job.workers.count = job.workers.min = procs;
    job.inner.steps = warmup + steps;
    job.rounds = repeats;
    job.validate();
    workers.emplace(job, dir, procs);
    params = workers->parameters();
  }
  std::string self_cmd = std::filesystem::read_symlink("/proc/self/exe").string();
  for (int i = 1; i < argc; ++i) self_cmd += std::string(" ") + argv[i];
  self_cmd += " --child";
  for (int rep = 0; rep < repeats; ++rep) {
    // --together: the Python side runs while loco's does (it starts first: Python takes a few
    // seconds to import torch, about the untimed steps of loco's side).
    const bool last = rep == repeats - 1;
    // The Python sides' traces, after the last repeat's timed steps.
    auto traced = [&](const std::string& cmd, const char* name) {
      return last && !profile_dir.empty() ? cmd + " --profile " + profile_dir + "/" + name + ".json"
                                          : cmd;
    };
    std::optional<Running> py;
    if (together) py.emplace(py_cmd, procs);
    if (workers) {
      for (const ProcFigures& f : workers->round(rep, warmup)) {
        loco_figs.push_back(f);
        say(rep, "loco", f);
      }
    } else if (procs == 1 && !together) {
      loco_figs.push_back(one_repeat(last && !profile_dir.empty()));
      say(rep, "loco", loco_figs.back());
    } else {
      for (const std::string& out : run_all(self_cmd, procs)) {
        loco_figs.push_back(figures_of(out));
        say(rep, "loco", loco_figs.back());
      }
    }
    if (!py) py.emplace(traced(py_cmd, "python"), procs);
    for (const std::string& out : py->outputs()) {
      py_figs.push_back(figures_of(out));
      say(rep, "python", py_figs.back());
    }
    if (fused_side) {
      fused_figs.push_back(figures_of(run_all(traced(py_cmd + " --fused", "fused"), 1).front()));
      say(rep, "fused", fused_figs.back());
    }
    if (compile) {
      compiled_figs.push_back(
          figures_of(run_all(traced(py_cmd + " --compile", "compiled"), 1).front()));
      say(rep, "compiled", compiled_figs.back());
    }
  }
  if (procs > 1 && !workers) params = InnerTrainer(cfg, store, {0}, 0, 1).parameter_count();
  std::printf(
      "train_step: model %lld params (layers %d, d_model %d, heads %d, context %d, vocab %d), "
      "batch %d, %s%s, "
      "%d threads, %d timed steps x %d repeats, %d process(es) at once%s, loco's path: %s\n",
      static_cast<long long>(params), layers, d_model, heads, context, vocab, batch,
      cuda ? ("cuda: " + loco::diloco::cuda_device_name(0)).c_str() : "cpu",
      bf16 ? ", bf16 autocast" : "", threads, steps, repeats, procs,
      together ? " a side, both sides together" : "", path.c_str());
  std::vector<Side> sides{
      {workers ? "loco (InnerWorker, a job's worker)" : "loco (C++ InnerTrainer)", "loco",
       loco_figs},
      {std::string("eager PyTorch (") + TORCH_VERSION + ")", "python", py_figs}};
  if (fused_side)
    sides.push_back({"eager PyTorch, AdamW(fused=True)", "python fused", fused_figs});
  if (compile) sides.push_back({"torch.compile (the same loop)", "torch.compile", compiled_figs});
  print_sides(sides, training_flops_per_token(cfg.model, params),
              cuda ? peak_flops(loco::diloco::cuda_device_name(0), cfg.precision) : -1);
  std::fflush(stdout);  // before the nodes go
  workers.reset();
  remove_tree(dir.string());
  return 0;
}
