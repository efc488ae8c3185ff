// bench/adamw: the inner AdamW step over the flat fp32 buffer, as InnerTrainer runs it
// (adamw_flat_step: a few vectorised passes), against LibTorch's own AdamW kernels over
// the same buffers, for the parameter layout of a given model:
//   fused       at::_fused_adamw_ (one pass) over per-parameter views, two groups
//               (weight decay on 2-D+ tensors only, as the trainer)
//   fused-flat  at::_fused_adamw_ over the one flat buffer, weight decay 0, after the
//               trainer's masked decay pass
//   foreach     the at::_foreach_* sequence of torch.optim.AdamW(foreach=True), over the views
//   optim       torch::optim::AdamW with two parameter groups over the views
// Variants alternate step by step, so that load from other processes hits all alike;
// prints the median time per step, the ratio to ours, and whether each variant computes
// the same floats as ours (after 3 steps from the same state).
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>

#include "bench/stats.hpp"
#include "diloco/round/trainer.hpp"

using namespace loco::diloco;

namespace {

using loco::bench::median;

struct State {
  torch::Tensor params, grads, exp_avg, exp_avg_sq, denom;
  std::vector<torch::Tensor> p[2], g[2], m[2], v[2], steps[2];  // [0]: no decay, [1]: decay
  torch::Tensor flat_step = torch::zeros({}, torch::kFloat32);
  std::unique_ptr<torch::optim::AdamW> optim;
  std::int64_t step = 0;
};

// Flat buffers with `params` and `grads` from the seed, and views in the model's layout.
State make_state(const std::vector<std::vector<std::int64_t>>& shapes, std::int64_t n,
                 std::uint64_t seed) {
  State s;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  s.params = torch::empty({n}).normal_(0, 0.02, gen);
  s.grads = torch::empty({n}).normal_(0, 1e-3, gen);
  s.exp_avg = torch::zeros({n});
  s.exp_avg_sq = torch::zeros({n});
  s.denom = torch::empty({n});
  std::int64_t off = 0;
  for (const auto& shape : shapes) {
    std::int64_t k = 1;
    for (auto d : shape) k *= d;
    const int group = shape.size() >= 2 ? 1 : 0;
    auto view = [&](const torch::Tensor& t) { return t.slice(0, off, off + k).view(shape); };
    s.p[group].push_back(view(s.params));
    s.g[group].push_back(view(s.grads));
    s.m[group].push_back(view(s.exp_avg));
    s.v[group].push_back(view(s.exp_avg_sq));
    s.steps[group].push_back(torch::zeros({}, torch::kFloat32));
    off += k;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/adamw: the trainer's flat AdamW step against LibTorch's fused and foreach"};
  int layers = 4, d_model = 128, heads = 4, context = 128, vocab = 256, threads = 1, reps = 15;
  app.add_option("--layers", layers);
  app.add_option("--d-model", d_model);
  app.add_option("--heads", heads);
  app.add_option("--context", context);
  app.add_option("--vocab", vocab);
  app.add_option("--threads", threads);
  app.add_option("--reps", reps, "timed steps per variant");
  std::string only;
  app.add_option("--variants", only, "comma-separated subset (ours is always run); default all");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;

  ModelConfig mc;
  mc.layers = layers;
  mc.d_model = d_model;
  mc.heads = heads;
  mc.context = context;
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t n = 0;
  {
    Gpt model(mc, vocab);
    for (const auto& p : model->parameters()) {
      shapes.push_back(p.sizes().vec());
      n += p.numel();
    }
  }
  torch::Tensor mask = torch::zeros({n});
  {
    std::int64_t off = 0;
    for (const auto& shape : shapes) {
      std::int64_t k = 1;
      for (auto d : shape) k *= d;
      if (shape.size() >= 2) mask.slice(0, off, off + k).fill_(1.0f);
      off += k;
    }
  }
  InnerConfig ic;  // betas 0.9/0.95, eps 1e-8, weight decay 0.1
  const double lr = 1e-3;

  using Step = std::function<void(State&)>;
  std::vector<std::pair<std::string, Step>> variants = {
      {"ours",
       [&](State& s) {
         ++s.step;
         adamw_flat_step(s.params, s.grads, s.exp_avg, s.exp_avg_sq, mask, s.denom, ic, lr, s.step);
       }},
      {"fused",
       [&](State& s) {
         for (int g = 0; g < 2; ++g) {
           for (auto& t : s.steps[g]) t.add_(1);
           at::_fused_adamw_(s.p[g], s.g[g], s.m[g], s.v[g], {}, s.steps[g], lr, ic.betas[0],
                             ic.betas[1], g == 1 ? ic.weight_decay : 0.0, ic.eps, false, false);
         }
       }},
      {"fused-flat",
       [&](State& s) {
         s.flat_step.add_(1);
         s.params.addcmul_(s.params, mask, -lr * ic.weight_decay);
         at::_fused_adamw_({s.params}, {s.grads}, {s.exp_avg}, {s.exp_avg_sq}, {}, {s.flat_step},
                           lr, ic.betas[0], ic.betas[1], 0.0, ic.eps, false, false);
       }},
      {"foreach",
       [&](State& s) {
         ++s.step;
         const double b1 = ic.betas[0], b2 = ic.betas[1];
         const double bc1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
         const double bc2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
         at::_foreach_mul_(s.p[1], 1.0 - lr * ic.weight_decay);
         for (int g = 0; g < 2; ++g) {
           at::_foreach_lerp_(s.m[g], s.g[g], 1.0 - b1);
           at::_foreach_mul_(s.v[g], b2);
           at::_foreach_addcmul_(s.v[g], s.g[g], s.g[g], 1.0 - b2);
           auto denom = at::_foreach_sqrt(s.v[g]);
           at::_foreach_div_(denom, std::sqrt(bc2));
           at::_foreach_add_(denom, ic.eps);
           at::_foreach_addcdiv_(s.p[g], s.m[g], denom, -lr / bc1);
         }
       }},
      {"optim",
       [&](State& s) {
         if (!s.optim) {
           for (int g = 0; g < 2; ++g)
             for (std::size_t i = 0; i < s.p[g].size(); ++i) s.p[g][i].mutable_grad() = s.g[g][i];
           std::vector<torch::optim::OptimizerParamGroup> groups;
           for (int g = 0; g < 2; ++g) {
             auto o = std::make_unique<torch::optim::AdamWOptions>(lr);
             o->betas({ic.betas[0], ic.betas[1]}).eps(ic.eps).weight_decay(g ? ic.weight_decay : 0);
             groups.emplace_back(s.p[g], std::move(o));
           }
           s.optim = std::make_unique<torch::optim::AdamW>(groups);
         }
         s.optim->step();
       }},
  };

  if (!only.empty()) {
    const std::string list = "," + only + ",";
    std::erase_if(variants, [&](const auto& v) {
      return v.first != "ours" && list.find("," + v.first + ",") == std::string::npos;
    });
  }

  // Same floats as ours? Three steps from the same state.
  std::map<std::string, std::string> same;
  {
    State ref = make_state(shapes, n, 1);
    for (int k = 0; k < 3; ++k) variants[0].second(ref);
    for (std::size_t i = 1; i < variants.size(); ++i) {
      State s = make_state(shapes, n, 1);
      for (int k = 0; k < 3; ++k) variants[i].second(s);
      const bool eq = torch::equal(s.params, ref.params) && torch::equal(s.exp_avg, ref.exp_avg) &&
                      torch::equal(s.exp_avg_sq, ref.exp_avg_sq);
      const double diff = (s.params - ref.params).abs().max().item<double>();
      char buf[128];
      std::snprintf(buf, sizeof buf, "%s (max |dθ| %.3g)", eq ? "bit-identical" : "differs", diff);
      same[variants[i].first] = buf;
    }
  }

  std::vector<State> states;
  for (std::size_t i = 0; i < variants.size(); ++i) states.push_back(make_state(shapes, n, 1));
  std::vector<std::vector<double>> times(variants.size());
  for (int r = 0; r < reps + 2; ++r) {
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      variants[i].second(states[i]);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 2) times[i].push_back(dt);  // two untimed warm-up steps
    }
  }
  std::printf(
      "adamw: %lld parameters (layers %d, d_model %d, context %d, vocab %d), %d thread%s, "
      "%d timed steps per variant\n",
      static_cast<long long>(n), layers, d_model, context, vocab, threads, threads == 1 ? "" : "s",
      reps);
  const double ours = median(times[0]);
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const double t = median(times[i]);
    std::printf("  %-10s %10.3f ms/step  speedup %5.2fx  %s\n", variants[i].first.c_str(), t * 1e3,
                ours / t, i == 0 ? "" : same[variants[i].first].c_str());
  }
  return 0;
}
