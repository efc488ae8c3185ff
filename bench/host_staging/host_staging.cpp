// bench/host_staging: a round's device <-> host copies on a GPU (issue "20 ·", item 3). For a
// flat fp32 vector of --floats values (default GPT-2 small's 124,439,808) on CUDA device 0:
//   out:  Δ = θ_global − θ_local on the host, θ_local on the device (InnerTrainer's
//         pseudo_gradient): a pageable copy of the whole then the subtraction, against
//         HostStaging's pinned chunks, each subtracted while the next is copied;
//   in:   θ onto the device (load_parameters): a pageable copy against pinned chunks.
// Medians of --runs timed runs after one untimed, each checked against the pageable result
// bit for bit; then the same vector's fp32 butterfly all-reduce at 1 Gbit/s as the bound
// (2 (K − 1)/K · 4n bytes sent per member at 125 MB/s) for the share the copies take.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "bench/stats.hpp"
#include "diloco/model/device_info.hpp"
#include "diloco/round/host_staging.hpp"

using loco::bench::median;
using loco::diloco::HostStaging;

namespace {

template <typename F>
double seconds_of(F&& f) {
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/host_staging: device <-> host copies of θ, pageable vs pinned chunks"};
  std::int64_t floats = 124439808, chunk = std::int64_t(1) << 22;
  int runs = 5, members = 4;
  app.add_option("--floats", floats)->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 31));
  app.add_option("--chunk", chunk, "floats a pinned buffer holds")
      ->check(CLI::Range(std::int64_t(1024), std::int64_t(1) << 28));
  app.add_option("--runs", runs)->check(CLI::Range(1, 100));
  app.add_option("--members", members, "K, for the all-reduce's bytes")->check(CLI::Range(2, 1024));
  CLI11_PARSE(app, argc, argv);
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_host_staging: torch sees no CUDA device\n");
    return 2;
  }
  torch::NoGradGuard no_grad;
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::Tensor theta = torch::randn({floats});
  const torch::Tensor local = (theta + 0.01 * torch::randn({floats})).to(cuda);
  torch::Tensor out_pageable = torch::empty({floats}), out_staged = torch::empty({floats});
  torch::Tensor onto = torch::empty({floats}, torch::TensorOptions().device(cuda));
  HostStaging staging(chunk);

  std::vector<double> out_pg, out_st, in_pg, in_st;
  for (int r = 0; r <= runs; ++r) {
    const double a = seconds_of([&] {
      out_pageable.copy_(local);
      torch::sub_out(out_pageable, theta, out_pageable);
    });
    const double b = seconds_of([&] {
      staging.to_host(local, [&](std::int64_t off, const torch::Tensor& piece) {
        auto o = out_staged.slice(0, off, off + piece.numel());
        torch::sub_out(o, theta.slice(0, off, off + piece.numel()), piece);
      });
    });
    const double c = seconds_of([&] { onto.copy_(theta); });
    const double d = seconds_of([&] { staging.to_device(theta, onto); });
    if (!torch::equal(out_pageable, out_staged) || !torch::equal(onto.cpu(), theta)) {
      std::fprintf(stderr, "bench_host_staging: the staged copies differ from the pageable ones\n");
      return 1;
    }
    if (r == 0) continue;  // untimed: first touches, the pinned buffers' allocation
    out_pg.push_back(a), out_st.push_back(b), in_pg.push_back(c), in_st.push_back(d);
  }
  const double bytes = 4.0 * double(floats);
  const double allreduce_s = 2.0 * (members - 1) / members * bytes / 125e6;
  std::printf("host_staging: %lld floats (%.0f MB), chunks of %lld, %d runs, %s\n",
              static_cast<long long>(floats), bytes / 1e6, static_cast<long long>(chunk), runs,
              loco::diloco::cuda_device_name(0).c_str());
  auto row = [&](const char* what, double pageable, double staged) {
    std::printf(
        "  %-34s pageable %8.1f ms (%5.1f GB/s)  pinned chunks %8.1f ms (%5.1f GB/s)  %.2fx\n", what,
        1e3 * pageable, bytes / pageable / 1e9, 1e3 * staged, bytes / staged / 1e9,
                pageable / staged);
  };
  row("out: Δ = θ − θ_local to the host", median(out_pg), median(out_st));
  row("in: θ onto the device", median(in_pg), median(in_st));
  std::printf("  fp32 all-reduce of the same vector at 1 Gbit/s, K = %d: %.2f s; the copies "
              "(pinned, out + in) are %.2f %% of it\n",
              members, allreduce_s, 100 * (median(out_st) + median(in_st)) / allreduce_s);
  return 0;
}
