// bench/guard: what robust averaging's guard (diloco/round/guard.hpp) costs a worker's CPU, on one
// core, for a pseudo-gradient of n floats (default the 6.4 M GPT of bench/overlap; --floats
// 124000000 for the 124M preset):
//   summarize   the summary a worker makes of its Δ before every dense average (‖Δ‖ in double,
//               the sketch of 2,048 values), against `pass`: a float sum of squares over the
//               same vector in eight independent sums (vectorized: about the bound of any pass
//               that reads it);
//   judge       the rule over K summaries (decode, Gram matrix, verdicts);
//   sparse      compression topk: sparse_facts() over K gathered codes (decoding each once more
//               and the pairwise cosines over shared entries), against `mean`: the
//               ErrorFeedback mean's own decode_add of the K codes, which the average does anyway.
// Alternated run by run; prints medians and the ratios.
//   bench_guard [--floats 6400000] [--members 4] [--runs 7]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/stats.hpp"
#include "diloco/job/config.hpp"
#include "diloco/round/guard.hpp"
#include "runtime/collective/sparse.hpp"

using namespace loco::diloco;
using loco::bench::seconds_of;

int main(int argc, char** argv) {
  CLI::App app{"bench/guard: the guard's CPU work on one core"};
  size_t floats = 6'400'000;
  int members = 4, runs = 7;
  app.add_option("--floats", floats, "values of Δ");
  app.add_option("--members", members, "K");
  app.add_option("--runs", runs, "runs of each");
  CLI11_PARSE(app, argc, argv);
  const GuardConfig cfg;
  std::vector<std::vector<float>> d;
  for (int k = 0; k < members; ++k) d.push_back(loco::bench::gradient_like(floats, uint64_t(k)));
  std::vector<std::vector<uint8_t>> summaries;
  for (const auto& x : d) summaries.push_back(guard::encode(guard::summarize(x, size_t(cfg.sketch))));
  loco::collective::sparse::Params p;  // the topk defaults: 4,096 / 64 / 2 bits
  std::vector<std::vector<uint8_t>> codes;
  std::vector<float> sent(floats);
  for (const auto& x : d) codes.push_back(loco::collective::sparse::encode(x, p, sent));
  const std::vector<std::span<const uint8_t>> views(codes.begin(), codes.end());
  std::vector<float> out(floats);

  std::vector<double> t_pass, t_sum, t_judge, t_sparse, t_mean;
  volatile double sink = 0;
  for (int r = 0; r < runs; ++r) {
    t_pass.push_back(seconds_of([&] {
      // Eight independent sums, so that the compiler vectorizes and memory sets the pace.
      float s[8] = {};
      const size_t n8 = floats / 8 * 8;
      for (size_t i = 0; i < n8; i += 8)
        for (int l = 0; l < 8; ++l) s[l] += d[0][i + l] * d[0][i + l];
      sink = sink + (s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7]);
    }));
    t_sum.push_back(seconds_of([&] { sink = sink + guard::summarize(d[0], size_t(cfg.sketch)).norm; }));
    t_judge.push_back(seconds_of([&] {
      sink = sink + double(guard::judge(guard::facts_of(summaries, size_t(cfg.sketch)), cfg).size());
    }));
    t_sparse.push_back(seconds_of([&] {
      sink = sink + double(guard::judge(guard::sparse_facts(views, p, floats), cfg).size());
    }));
    t_mean.push_back(seconds_of([&] {
      std::fill(out.begin(), out.end(), 0.0f);
      for (const auto& c : views) loco::collective::sparse::decode_add(c, p, 0.25f, out);
    }));
  }
  using loco::bench::median;
  const double pass = median(t_pass), sum = median(t_sum), judge = median(t_judge),
               sparse = median(t_sparse), mean = median(t_mean);
  std::printf("n = %zu floats, K = %d, sketch %d, %d runs, medians:\n", floats, members, cfg.sketch,
              runs);
  std::printf("  summarize  %8.2f ms   one float pass %8.2f ms   ratio %.2f\n", 1e3 * sum,
              1e3 * pass, sum / pass);
  std::printf("  judge      %8.3f ms   (K summaries: decode, Gram, verdicts)\n", 1e3 * judge);
  std::printf("  sparse     %8.2f ms   the mean's decode_add of K codes %8.2f ms   ratio %.2f\n",
              1e3 * sparse, 1e3 * mean, sparse / mean);
  return 0;
}
