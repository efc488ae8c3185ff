// loco-train: the simulator and text generation. `loco train ...` and
// `loco generate ...` forward here.
//   loco-train train --simulate K job.yaml [--baseline single|ddp] [--rounds N] [--out DIR]
//                    [--local-ranks G] [--init CKPT|hf:DIR | --resume CKPT]
//   loco-train generate --checkpoint PATH --prompt "..." [--tokens N]
//   loco-train export CKPT --format hf --out DIR [--dtype fp32|bf16] [--force]
//   loco-train logits --checkpoint PATH --tokens 1,2,3 --out FILE.json
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "diloco/model/hf_format.hpp"
#include "diloco/round/simulator.hpp"

namespace fs = std::filesystem;
using namespace loco::diloco;

namespace {

// The job file with `sets` applied (`--set`), its model.hf read from the folder (here, the
// simulator's node).
JobConfig load_job(const std::string& job, const std::vector<std::string>& sets) {
  JobConfig cfg;
  std::ifstream f(job);
  std::stringstream text;
  text << f.rdbuf();
  try {
    cfg = JobConfig::from_yaml(sets.empty() ? text.str() : with_overrides(text.str(), sets));
    if (!cfg.model.hf.empty()) resolve_hf_model(cfg, cfg.model.hf);
  } catch (const ConfigError& e) {
    throw ConfigError(job + ": " + e.what());
  }
  return cfg;
}

int train(const std::string& job, int k, const std::string& baseline, int rounds, std::string out,
          int threads, const std::string& resume, std::string init, int local_ranks,
          const std::vector<std::string>& sets, const std::vector<std::string>& fresh_feedback,
          const std::vector<std::string>& corrupt, const std::string& codec_trace, int parallel) {
  // --fresh-feedback R:K: worker K's error feedback zeroed after round R.
  std::vector<std::pair<int, int>> fresh;
  for (const std::string& f : fresh_feedback) {
    const auto colon = f.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument(f);
      fresh.emplace_back(std::stoi(f.substr(0, colon)), std::stoi(f.substr(colon + 1)));
    } catch (const std::exception&) {
      throw std::invalid_argument("--fresh-feedback: expected ROUND:WORKER, got '" + f + "'");
    }
  }
  // --corrupt R:K:KIND: worker K's Δ corrupted (guard::corrupt) from round R on.
  std::vector<SimulateOptions::Corruption> corruptions;
  for (const std::string& c : corrupt) {
    const auto a = c.find(':'), b = a == std::string::npos ? a : c.find(':', a + 1);
    try {
      if (b == std::string::npos) throw std::invalid_argument(c);
      corruptions.push_back({std::stoi(c.substr(0, a)), std::stoi(c.substr(a + 1, b - a - 1)),
                             guard::parse_fault(c.substr(b + 1))});
    } catch (const std::exception&) {
      throw std::invalid_argument("--corrupt: expected ROUND:WORKER:nan|scale|flip|noise, got '" +
                                  c + "'");
    }
  }
  JobConfig cfg = load_job(job, sets);
  // The job file's `init`, unless --init says otherwise (a resumed run has its own θ).
  if (init.empty() && resume.empty()) init = cfg.init;
  if (threads > 0) cfg.threads = threads;
  if (cfg.threads > 0) at::set_num_threads(cfg.threads);
  at::set_num_interop_threads(1);
  SimulateOptions opt;
  opt.workers = k;
  opt.rounds = rounds;
  opt.corrupt = corruptions;
  opt.parallel = parallel;
  if (!codec_trace.empty()) {
    std::ifstream f(codec_trace, std::ios::binary);
    std::string text(16u << 20, '\0');  // a trace, or a job's metrics.jsonl: at most 16 MiB
    f.read(text.data(), std::streamsize(text.size()));
    if (f.gcount() == std::streamsize(text.size()))
      throw std::invalid_argument("--codec-trace: " + codec_trace + " is larger than 16 MiB");
    text.resize(size_t(f.gcount()));
    opt.codec_trace = read_codec_trace(text);
    opt.fragment_codec_trace = read_fragment_codec_trace(text);
  }
  opt.mode = baseline.empty() ? Mode::diloco : baseline == "single" ? Mode::single : Mode::ddp;
  // The job file's workers.local_ranks, as a cluster runs it, unless --local-ranks says.
  opt.local_ranks = local_ranks > 0            ? local_ranks
                    : opt.mode == Mode::diloco ? cfg.ranks_per_worker(false)
                                               : 1;
  if (out.empty()) out = "runs/" + cfg.name;
  fs::create_directories(out);
  Simulator sim(cfg, opt);
  if (!init.empty()) sim.init_parameters(init);
  std::cerr << "loco-train: " << cfg.name << ": model of " << sim.parameter_count()
            << " parameters, " << (baseline.empty() ? "diloco" : baseline) << " with K=" << k
            << (opt.local_ranks > 1 ? " of " + std::to_string(opt.local_ranks) + " local ranks"
                                    : "")
            << ", H=" << cfg.inner.steps << ", " << sim.rounds() << " rounds, compression "
            << cfg.compression_name() << ", " << at::get_num_threads() << " threads"
            << (opt.parallel > 1 && opt.local_ranks == 1
                    ? " a worker, " + std::to_string(opt.parallel) + " workers at once"
                    : "")
            << (init.empty() ? "" : ", from " + init) << " -> " << out << "/metrics.jsonl\n";
  const fs::path ckpt_dir = fs::path(cfg.checkpoint.dir).is_absolute()
                                ? fs::path(cfg.checkpoint.dir)
                                : fs::path(out) / cfg.checkpoint.dir;
  const std::string ckpt = (ckpt_dir / "latest.pt").string();
  std::ofstream metrics;
  if (!resume.empty()) {
    sim.load_checkpoint(resume);
    metrics.open(fs::path(out) / "metrics.jsonl", std::ios::app);
    std::cerr << "loco-train: resumed from " << resume << " at round " << sim.round() << "\n";
  } else {
    metrics.open(fs::path(out) / "metrics.jsonl", std::ios::trunc);
    metrics << sim.initial_metrics().to_json() << "\n" << std::flush;
  }
  while (!sim.done()) {
    const auto m = sim.run_round();
    metrics << m.to_json() << "\n" << std::flush;
    if (m.val_loss)
      std::cerr << "round " << m.round << " steps " << m.inner_steps << " train " << m.train_loss
                << " val " << *m.val_loss << " bytes " << m.bytes_per_worker << " " << m.seconds
                << " s\n";
    if (cfg.checkpoint.every > 0 && m.round % cfg.checkpoint.every == 0) sim.save_checkpoint(ckpt);
    for (const auto& [r, w] : fresh)
      if (r == m.round) {
        sim.clear_feedback(w);
        std::cerr << "loco-train: worker " << w << "'s error feedback zeroed after round " << r
                  << "\n";
      }
  }
  sim.save_checkpoint(ckpt);
  std::cerr << "loco-train: checkpoint " << ckpt << "\n";
  return 0;
}

int generate(const std::string& checkpoint, const std::string& prompt, int tokens,
             double temperature, int top_k, std::uint64_t seed) {
  JobConfig cfg;
  Gpt model = load_model_from_checkpoint(checkpoint, &cfg);
  model->eval();
  const auto tok = make_tokenizer(cfg.data);
  auto ids = tok->encode(prompt);
  if (ids.empty()) ids.push_back(static_cast<std::uint32_t>('\n'));
  for (auto id : ids)
    if (id >= static_cast<std::uint32_t>(cfg.vocab_size()))
      throw std::runtime_error("generate: the tokenizer gives the prompt id " + std::to_string(id) +
                               ", outside the model's vocabulary (model.vocab " +
                               std::to_string(cfg.vocab_size()) + ")");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  std::vector<std::uint32_t> out;
  for (int i = 0; i < tokens; ++i) {
    const std::size_t start = ids.size() > static_cast<std::size_t>(cfg.model.context)
                                  ? ids.size() - cfg.model.context
                                  : 0;
    std::vector<std::int64_t> window(ids.begin() + static_cast<std::ptrdiff_t>(start), ids.end());
    auto x = torch::tensor(window, torch::kInt64).unsqueeze(0);
    auto logits =
        model->forward(x).select(1, x.size(1) - 1).squeeze(0) / std::max(temperature, 1e-6);
    if (top_k > 0 && top_k < logits.size(0)) {
      auto kth = std::get<0>(logits.topk(top_k)).select(0, top_k - 1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    const auto next =
        torch::multinomial(torch::softmax(logits, 0), 1, false, gen).item<std::int64_t>();
    ids.push_back(static_cast<std::uint32_t>(next));
    out.push_back(static_cast<std::uint32_t>(next));
  }
  std::cout << prompt << tok->decode(out) << "\n";
  return 0;
}

int export_model(const std::string& checkpoint, const std::string& out, const std::string& dtype,
                 bool force) {
  const JobConfig cfg = checkpoint_config(checkpoint);
  refuse_torchscript(cfg, "export " + checkpoint);
  const torch::Tensor theta = checkpoint_theta(checkpoint);
  export_hf(cfg.model, cfg.vocab_size(), theta.data_ptr<float>(),
            static_cast<std::size_t>(theta.numel()), out,
            dtype == "bf16" ? StDtype::bf16 : StDtype::f32, force);
  std::cerr << "loco-train: exported " << checkpoint << " (" << to_string(cfg.model.arch) << ", "
            << theta.numel() << " parameters, " << dtype << ") -> " << out
            << "/{config.json,model.safetensors}\n";
  return 0;
}

// The model's logits [T, vocab] (fp32, eval, no autocast) for one sequence, as JSON: for
// comparing with another implementation (tests/diloco/hf_export_test.py). The model is a
// checkpoint's, or the job file `job`'s started from `init` (hf:DIR or a checkpoint).
int logits(const std::string& checkpoint, const std::string& job, const std::string& init,
           const std::vector<std::int64_t>& tokens, const std::string& out) {
  JobConfig cfg;
  Gpt model{nullptr};
  if (!checkpoint.empty()) {
    model = load_model_from_checkpoint(checkpoint, &cfg);
  } else {
    cfg = load_job(job, {});
    refuse_torchscript(cfg, "logits --job " + job);
    model = Gpt(cfg.model, cfg.vocab_size());
    const std::string from = init.empty() ? cfg.init : init;
    if (from.empty())
      throw std::invalid_argument("logits: --job " + job +
                                  " has no init or model.hf; give --init hf:DIR or CKPT");
    const torch::Tensor theta = initial_theta(from, cfg);
    torch::NoGradGuard no_grad;
    std::int64_t off = 0;
    for (auto& p : model->parameters()) {
      p.copy_(theta.slice(0, off, off + p.numel()).view(p.sizes()));
      off += p.numel();
    }
  }
  model->eval();
  for (auto t : tokens)
    if (t < 0 || t >= cfg.vocab_size())
      throw std::invalid_argument("--tokens: " + std::to_string(t) +
                                  " is outside the vocabulary [0, " +
                                  std::to_string(cfg.vocab_size()) + ")");
  torch::NoGradGuard no_grad;
  const auto y = model->forward(torch::tensor(tokens, torch::kInt64).unsqueeze(0)).squeeze(0);
  nlohmann::json j;
  j["arch"] = to_string(cfg.model.arch);
  j["tokens"] = tokens;
  j["shape"] = {y.size(0), y.size(1)};
  const auto c = y.contiguous();
  j["logits"] = std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  std::ofstream f(out, std::ios::trunc);
  f << j.dump() << "\n";
  if (!f.flush()) throw std::runtime_error("cannot write " + out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loco-train: DiLoCo simulator and sampler"};
  app.require_subcommand(1);
  auto* tr =
      app.add_subcommand("train", "train a job; --simulate K runs K workers in this process");
  std::string job, baseline, out, resume, init, codec_trace;
  std::vector<std::string> sets, fresh_feedback, corrupt;
  int k = 0, rounds = 0, threads = 0, local_ranks = 0, parallel = 1;
  tr->add_option("job", job, "job file (YAML)")->required()->check(CLI::ExistingFile);
  tr->add_option("--simulate", k, "number of simulated workers K")
      ->required()
      ->check(CLI::Range(1, 1024));
  tr->add_option("--baseline", baseline, "single: one worker; ddp: data-parallel with K x batch")
      ->check(CLI::IsMember({"single", "ddp"}));
  tr->add_option("--rounds", rounds, "rounds to run (default: from the job file)");
  tr->add_option("--out", out, "output folder (default runs/NAME)");
  tr->add_option("--set", sets,
                 "PATH=VALUE: set a field of the job file, e.g. --set inner.lr=3e-4 (repeatable)")
      ->allow_extra_args(false);  // one value a --set: the job file after it stays the job file
  tr->add_option("--threads", threads, "torch threads (default: the job's `threads`)");
  tr->add_option("--parallel", parallel,
                 "P: the simulated workers' inner steps P at a time, each on --threads torch "
                 "threads (default 1: one after another; the same result either way)")
      ->check(CLI::Range(1, 256));
  tr->add_option("--fresh-feedback", fresh_feedback,
                 "ROUND:WORKER: compression topk: that worker's error feedback set to zero after "
                 "that round, as a worker that joins starts it (repeatable)")
      ->allow_extra_args(false);
  tr->add_option("--corrupt", corrupt,
                 "ROUND:WORKER:KIND: that worker's pseudo-gradient corrupted from that round on "
                 "(KIND: nan, scale (x100), flip (sign), noise (of its norm)), to see what the "
                 "job's guard does (repeatable)")
      ->allow_extra_args(false);
  tr->add_option("--codec-trace", codec_trace,
                 "each round's codec from a file: a job's metrics.jsonl (its \"codec\"s, "
                 "compression auto) or one name a line (fp32, bf16, int8, topk:K): replays a "
                 "distributed job's codec decisions")
      ->check(CLI::ExistingFile);
  tr->add_option("--local-ranks", local_ranks,
                 "G: each worker's inner steps data-parallel over G CPU ranks (threads over "
                 "Gloo), each rank averaging and stepping 1/G of the pseudo-gradient "
                 "(default: the job's workers.local_ranks)")
      ->check(CLI::Range(1, 64));
  auto* resume_opt =
      tr->add_option("--resume", resume, "checkpoint to continue from")->check(CLI::ExistingFile);
  tr->add_option("--init", init,
                 "start from this checkpoint's parameters, or hf:DIR a Hugging Face folder "
                 "(config.json, model.safetensors) of the job's model (e.g. a pretrained one); "
                 "optimizer state and schedule start fresh")
      ->check([](const std::string& v) -> std::string {
        const std::string dir = hf_init_dir(v);
        if (!dir.empty()) return fs::is_directory(dir) ? "" : "no folder " + dir;
        return fs::is_regular_file(v) ? "" : "no file " + v + " (hf:DIR for a Hugging Face folder)";
      })
      ->excludes(resume_opt);

  auto* ge = app.add_subcommand("generate", "sample text from a checkpoint");
  std::string checkpoint, prompt;
  int tokens = 200, top_k = 0;
  double temperature = 0.8;
  std::uint64_t seed = 0;
  ge->add_option("--checkpoint", checkpoint, "checkpoint file")
      ->required()
      ->check(CLI::ExistingFile);
  ge->add_option("--prompt", prompt, "text to continue");
  ge->add_option("--tokens", tokens, "tokens to sample");
  ge->add_option("--temperature", temperature, "sampling temperature");
  ge->add_option("--top-k", top_k, "sample among the k most likely tokens (0: all)");
  ge->add_option("--seed", seed, "sampling seed");

  auto* ex = app.add_subcommand("export", "write a checkpoint's model in another format");
  std::string ex_checkpoint, ex_format = "hf", ex_out, ex_dtype = "fp32";
  bool ex_force = false;
  ex->add_option("checkpoint", ex_checkpoint, "checkpoint file")
      ->required()
      ->check(CLI::ExistingFile);
  ex->add_option("--format", ex_format,
                 "hf: Hugging Face transformers (config.json, "
                 "model.safetensors)")
      ->check(CLI::IsMember({"hf"}));
  ex->add_option("--out", ex_out, "folder to write")->required();
  ex->add_option("--dtype", ex_dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  ex->add_flag("--force", ex_force, "replace --out if it exists and is not empty");

  auto* lo = app.add_subcommand("logits", "a checkpoint's logits for given tokens, as JSON");
  std::string lo_checkpoint, lo_out, lo_job, lo_init;
  std::vector<std::int64_t> lo_tokens;
  auto* lo_ck =
      lo->add_option("--checkpoint", lo_checkpoint, "checkpoint file")->check(CLI::ExistingFile);
  auto* lo_jb =
      lo->add_option("--job", lo_job,
                     "job file: the model's shape (and θ from its init, model.hf or --init)")
          ->check(CLI::ExistingFile)
          ->excludes(lo_ck);
  lo->add_option("--init", lo_init,
                 "hf:DIR or a checkpoint: the job's starting θ (default: the job's init, or "
                 "its model.hf)")
      ->needs(lo_jb);
  lo->add_option("--tokens", lo_tokens, "token ids, comma-separated")->required()->delimiter(',');
  lo->add_option("--out", lo_out, "JSON file: {arch, tokens, shape [T, vocab], logits}")
      ->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (tr->parsed())
      return train(job, k, baseline, rounds, out, threads, resume, init, local_ranks, sets,
                   fresh_feedback, corrupt, codec_trace, parallel);
    if (ex->parsed()) return export_model(ex_checkpoint, ex_out, ex_dtype, ex_force);
    if (lo->parsed()) {
      if (lo_checkpoint.empty() && lo_job.empty())
        throw std::invalid_argument("logits: --checkpoint, or --job with --init");
      return logits(lo_checkpoint, lo_job, lo_init, lo_tokens, lo_out);
    }
    return generate(checkpoint, prompt, tokens, temperature, top_k, seed);
  } catch (const std::exception& e) {
    std::cerr << "loco-train: " << e.what() << "\n";
    return 1;
  }
}
