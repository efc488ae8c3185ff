// bench/train_step: inner-step tokens per second of loco's InnerTrainer
// against the same model, batch, context, threads and steps in plain eager
// PyTorch (train_step.py, run with the torch of the same virtual
// environment). The two alternate `--repeats` times, so that load from other
// processes hits both alike; medians of the per-step times are compared.
// `--procs N` runs N trainers at once (N processes of this binary, then N of
// Python), as N workers of a job share a machine's cores: each process's
// median, and their median, compared side by side.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <regex>

#include "bench/stats.hpp"
#include "diloco/trainer.hpp"

using namespace loco::diloco;

namespace {

using loco::bench::median;

// Runs `n` copies of `cmd` at once; their outputs, in order.
std::vector<std::string> run_all(const std::string& cmd, int n) {
  std::vector<FILE*> pipes;
  for (int i = 0; i < n; ++i) {
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run " + cmd);
    pipes.push_back(p);
  }
  std::vector<std::string> outs;
  for (FILE* p : pipes) {
    std::string out;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    if (::pclose(p) != 0) throw std::runtime_error("failed: " + cmd + "\n" + out);
    outs.push_back(out);
  }
  return outs;
}

double result_of(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("tokens_per_s=([0-9.]+)")))
    throw std::runtime_error("no RESULT in:\n" + out);
  return std::stod(m[1]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/train_step: loco InnerTrainer vs eager PyTorch, inner-step tokens/s"};
  int layers = 4, d_model = 128, heads = 4, context = 128, batch = 16, threads = 2, steps = 30,
      warmup = 5, repeats = 2, procs = 1;
  bool child = false;
  const char* venv = std::getenv("LOCO_VENV");
  std::string python =
      std::string(venv ? venv : std::string(std::getenv("HOME")) + "/.cache/loco-venv") +
      "/bin/python";
  std::string script = LOCO_SOURCE_DIR "/bench/train_step/train_step.py";
  app.add_option("--layers", layers);
  app.add_option("--d-model", d_model);
  app.add_option("--heads", heads);
  app.add_option("--context", context);
  app.add_option("--batch", batch);
  app.add_option("--threads", threads);
  app.add_option("--steps", steps, "timed steps per repeat");
  app.add_option("--warmup-steps", warmup, "untimed steps per repeat");
  app.add_option("--repeats", repeats, "C++ and Python runs, alternating");
  app.add_option("--python", python);
  app.add_option("--procs", procs, "trainers at once (processes sharing the cores, as a job's workers)");
  app.add_flag("--child", child, "internal: one repeat of the C++ side, prints RESULT");
  CLI11_PARSE(app, argc, argv);

  at::set_num_threads(threads);
  at::set_num_interop_threads(1);
  JobConfig cfg;
  cfg.model = {.layers = layers,
               .d_model = d_model,
               .heads = heads,
               .context = context,
               .vocab = 256,
               .tied_embeddings = true,
               .mlp_ratio = 4};
  cfg.inner.batch_size = batch;
  cfg.inner.warmup = 10;
  cfg.rounds = 1;
  cfg.validate();
  // Random tokens, as the Python side uses.
  const auto dir =
      std::filesystem::temp_directory_path() / ("loco-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::uint16_t> tokens(1 << 20);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  auto r = torch::randint(0, 256, {static_cast<std::int64_t>(tokens.size())}, gen, torch::kInt64);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>(r[static_cast<std::int64_t>(i)].item<std::int64_t>());
  write_token_file((dir / "tokens.bin").string(), tokens);
  const auto store = TokenStore::open_file((dir / "tokens.bin").string(), 0.01, 1);

  const std::string py_cmd = python + " " + script + " --layers " + std::to_string(layers) +
                             " --d-model " + std::to_string(d_model) + " --heads " +
                             std::to_string(heads) + " --context " + std::to_string(context) +
                             " --batch " + std::to_string(batch) + " --threads " +
                             std::to_string(threads) + " --steps " + std::to_string(steps) +
                             " --warmup-steps " + std::to_string(warmup);
  std::vector<double> cpp_times, py_rates, cpp_proc_rates;
  std::int64_t params = 0;
  const double tokens_per_step = static_cast<double>(batch) * context;
  auto one_repeat = [&] {
    InnerTrainer t(cfg, store, {0}, 0, steps + warmup);
    params = t.parameter_count();
    std::vector<double> mine;
    for (int s = 0; s < warmup + steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      t.run_inner_steps(1);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) mine.push_back(dt);
    }
    return mine;
  };
  if (child) {
    std::printf("RESULT tokens_per_s=%.1f\n", tokens_per_step / median(one_repeat()));
    remove_tree(dir.string());
    return 0;
  }
  std::string self_cmd = std::filesystem::read_symlink("/proc/self/exe").string();
  for (int i = 1; i < argc; ++i) self_cmd += std::string(" ") + argv[i];
  self_cmd += " --child";
  for (int rep = 0; rep < repeats; ++rep) {
    if (procs == 1) {
      std::vector<double> mine = one_repeat();
      cpp_times.insert(cpp_times.end(), mine.begin(), mine.end());
      std::cerr << "repeat " << rep << ": loco   tokens_per_s=" << tokens_per_step / median(mine)
                << "\n";
      const std::string out = run_all(py_cmd, 1)[0];
      py_rates.push_back(result_of(out));
      std::cerr << "repeat " << rep << ": python " << out;
      continue;
    }
    for (const std::string& out : run_all(self_cmd, procs)) {
      cpp_proc_rates.push_back(result_of(out));
      std::cerr << "repeat " << rep << ": loco   " << out;
    }
    for (const std::string& out : run_all(py_cmd, procs)) {
      py_rates.push_back(result_of(out));
      std::cerr << "repeat " << rep << ": python " << out;
    }
  }
  if (procs > 1) {
    // Model size for the header.
    params = InnerTrainer(cfg, store, {0}, 0, 1).parameter_count();
    cpp_times.push_back(tokens_per_step / median(cpp_proc_rates));
  }
  const double cpp = tokens_per_step / median(cpp_times);
  const double py = median(py_rates);
  std::printf(
      "train_step: model %lld params (layers %d, d_model %d, heads %d, context %d, vocab 256), "
      "batch %d, "
      "%d threads, %d timed steps x %d repeats, %d process(es) at once\n",
      static_cast<long long>(params), layers, d_model, heads, context, batch, threads, steps,
      repeats, procs);
  if (procs > 1) std::printf("  (tokens/s per process: the median over processes and repeats)\n");
  std::printf("  loco (C++ InnerTrainer)  %10.0f tokens/s\n", cpp);
  std::printf("  eager PyTorch (%s) %10.0f tokens/s\n", TORCH_VERSION, py);
  std::printf("  ratio loco / python      %10.2fx\n", cpp / py);
  remove_tree(dir.string());
  return 0;
}
