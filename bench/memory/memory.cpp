// bench/memory: what one DiLoCo worker holds for a job's model. Prints the parameter
// count, the bytes of the trainer's flat fp32 buffers (parameters, gradients, the two
// AdamW moments, the weight-decay mask and one scratch vector), the resident set after
// the trainer is built, and the peak resident set during `--steps` inner steps (the
// peak is reset after construction, so it is the step's own high-water mark, with the
// buffers above included). One configuration per process:
//   build/bin/bench_memory --job examples/gpt2-small.yaml --batch 1 --checkpointing 1
// Tokens are random (the job's vocabulary size), so no corpus or tokenizer is needed; with
// --tokens DIR the trainer reads token files (data.format: tokens) as worker 0 of 4 does, and
// the resident set is split into RssAnon and RssFile after the steps:
//   build/bin/bench_token_rss --gb 4 --batches 0 --keep --dir /tmp/d4
//   build/bin/bench_memory --job examples/tiny-lm.yaml --batch 16 --steps 300 --tokens /tmp/d4
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "diloco/model/hf_format.hpp"
#include "diloco/round/trainer.hpp"

using namespace loco::diloco;

namespace {

// VmRSS or VmHWM from /proc/self/status, in bytes.
std::int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  throw std::runtime_error("no " + field + " in /proc/self/status");
}

// Resets VmHWM to the current RSS (Linux >= 4.0).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/memory: parameters, optimizer state and peak RSS of one inner step"};
  std::string job, precision = "fp32";
  int batch = 1, steps = 1, threads = 2;
  bool checkpointing = false;
  std::string tokens_dir;
  app.add_option("--job", job, "job file (model, inner settings)")->required();
  app.add_option("--tokens", tokens_dir,
                 "train on these token files (data.format: tokens, 64 shards, the 16 of worker 0 "
                 "of 4; bench_token_rss --keep writes some) instead of random tokens");
  app.add_option("--batch", batch, "sequences per inner step (one micro-batch)");
  app.add_option("--steps", steps, "inner steps measured");
  app.add_option("--threads", threads);
  app.add_option("--checkpointing", checkpointing, "model.activation_checkpointing");
  app.add_option("--precision", precision, "fp32 | bf16");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  at::set_num_interop_threads(1);

  auto cfg = JobConfig::from_yaml_file(job);
  // A model from a Hugging Face folder (model.hf): its shape from config.json; the weights
  // are not read (the trainer starts from the job's seed, which costs the same memory).
  if (!cfg.model.hf.empty()) resolve_hf_model(cfg, cfg.model.hf);
  cfg.inner.batch_size = batch;
  cfg.inner.grad_accum = 1;
  cfg.model.activation_checkpointing = checkpointing;
  if (precision != "fp32" && precision != "bf16")
    throw std::runtime_error("--precision: fp32 or bf16, got " + precision);
  cfg.precision = precision == "bf16" ? Precision::bf16 : Precision::fp32;
  cfg.validate();

  const auto dir =
      std::filesystem::temp_directory_path() / ("loco-bench-memory-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TokenStore store = [&] {
    if (!tokens_dir.empty()) {
      DataConfig d;
      d.dir = tokens_dir;
      d.format = DataFormat::tokens;
      d.shards = 64;
      return TokenStore::open(d, cfg.vocab_size());
    }
    const std::int64_t n_tokens =
        std::max<std::int64_t>(1 << 16, 4LL * batch * (cfg.model.context + 1) * steps);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    auto r = torch::randint(0, cfg.vocab_size(), {n_tokens}, gen, torch::kInt32);
    std::vector<std::uint16_t> tokens(r.data_ptr<std::int32_t>(),
                                      r.data_ptr<std::int32_t>() + n_tokens);
    write_token_file((dir / "tokens.bin").string(), tokens);
    return TokenStore::open_file((dir / "tokens.bin").string(), 0.01, 1);
  }();
  const std::vector<int> shards =
      tokens_dir.empty() ? std::vector<int>{0} : round_robin_shards(64, 0, 4);
  std::size_t data_bytes = 0;
  for (std::size_t f = 0; f < store.file_count(); ++f)
    data_bytes += std::filesystem::file_size(store.file_path(f));

  const std::int64_t rss_start = proc_status_bytes("VmRSS");
  InnerTrainer trainer(cfg, store, shards, 0, 1000);
  const std::int64_t n = trainer.parameter_count();
  const std::int64_t rss_built = proc_status_bytes("VmRSS");
  reset_peak_rss();
  const auto t0 = std::chrono::steady_clock::now();
  const auto stats = trainer.run_inner_steps(steps);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::int64_t peak = proc_status_bytes("VmHWM");
  const std::int64_t rss_after = proc_status_bytes("VmRSS");

  const std::int64_t flat = 4 * n;
  std::printf("memory: %s, %lld parameters (layers %d, width %d, heads %d, context %d, vocab %d)\n",
              cfg.name.c_str(), static_cast<long long>(n), cfg.model.layers, cfg.model.d_model,
              cfg.model.heads, cfg.model.context, cfg.vocab_size());
  std::printf(
      "  precision %s, activation_checkpointing %s, batch %d x %d tokens, %d step(s), "
      "%d thread(s)\n",
      precision.c_str(), checkpointing ? "on" : "off", batch, cfg.model.context, steps, threads);
  std::printf(
      "  fp32 buffers: params %.1f MiB, grads %.1f MiB, AdamW moments %.1f MiB, "
      "mask + scratch %.1f MiB = %.1f MiB (%d bytes/param)\n",
      mib(flat), mib(flat), mib(2 * flat), mib(2 * flat), mib(6 * flat), 24);
  std::printf(
      "  RSS: before the trainer %.1f MiB, after building it %.1f MiB, after the steps "
      "%.1f MiB\n",
      mib(rss_start), mib(rss_built), mib(rss_after));
  std::printf("  peak RSS during the steps %.1f MiB (%.1f MiB above the built trainer)\n",
              mib(peak), mib(peak - rss_built));
  std::printf("  %.2f s per step, last loss %.3f\n", secs / steps, stats.last_loss);
  std::printf("  data %.2f GB in %zu file(s); after the steps RssAnon %.1f MiB, RssFile %.1f MiB\n",
              static_cast<double>(data_bytes) / 1e9, store.file_count(),
              mib(proc_status_bytes("RssAnon")), mib(proc_status_bytes("RssFile")));
  remove_tree(dir.string());
  return 0;
}
