// A worker's local ranks (diloco/local_group.hpp) as CPU ranks: threads of this process
// over c10d's Gloo backend and a HashStore, the interface that NCCL ranks use on GPUs.
#include "diloco/local_group.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "diloco/trainer.hpp"

using namespace loco::diloco;

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);

// Runs fn(0) .. fn(n − 1) on n threads and rethrows the first exception. Each rank's
// collectives are bounded by the group's timeout, so a missing rank cannot hang this.
void on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::mutex mu;
  std::exception_ptr first;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

// The G ranks of one worker, joined concurrently (joining blocks until all have).
std::vector<std::unique_ptr<LocalGroup>> make_group(int g) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<LocalGroup>> ranks(static_cast<std::size_t>(g));
  on_threads(g, [&](int r) {
    ranks[static_cast<std::size_t>(r)] =
        std::make_unique<LocalGroup>(store, r, g, LocalBackend::gloo, kTimeout);
  });
  return ranks;
}

std::uint64_t hash_of(const torch::Tensor& t) { return tensor_hash(t.contiguous().cpu()); }

TEST(LocalSlice, SlicesCoverTheVectorOnceOnVectorBoundaries) {
  for (const std::int64_t n : {0L, 1L, 63L, 64L, 1000L, 123457L})
    for (const int g : {1, 2, 3, 8}) {
      std::int64_t next = 0;
      for (int r = 0; r < g; ++r) {
        const Slice s = local_slice(n, r, g);
        EXPECT_EQ(s.begin, next) << n << " " << g << " " << r;
        EXPECT_LE(s.begin, s.end);
        if (s.end < n) {
          EXPECT_EQ(s.size() % 64, 0) << n << " " << g << " " << r;
        }
        next = s.end;
      }
      EXPECT_EQ(next, n) << n << " " << g;
    }
  EXPECT_EQ(local_slice(1000, 0, 1).size(), 1000);
  EXPECT_THROW(local_slice(10, 2, 2), std::invalid_argument);
}

TEST(LocalGroup, NcclWithoutTheBuildOrAGpuSaysSo) {
  if (nccl_compiled() && torch::cuda::is_available())
    GTEST_SKIP() << "NCCL and a GPU are here: diloco_gpu_test covers them";
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    LocalGroup g(store, 0, 1, LocalBackend::nccl, kTimeout);
    FAIL() << "made an NCCL group without NCCL or a GPU";
  } catch (const LocalGroupError& e) {
    const std::string want =
        nccl_compiled() ? "torch sees no CUDA device" : "this build has no NCCL";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(LocalGroup, AllreduceMeanAndGatherOverGlooThreads) {
  constexpr int g = 3;
  auto ranks = make_group(g);
  const std::int64_t n = 1000;  // three slices of 384, 384, 232
  std::vector<torch::Tensor> grads(g), thetas(g);
  on_threads(g, [&](int r) {
    auto& group = *ranks[static_cast<std::size_t>(r)];
    grads[r] = torch::arange(n, torch::kFloat32) * static_cast<float>(r + 1);
    group.allreduce_mean(grads[r]);
    thetas[r] = torch::full({n}, -1.0f);
    const Slice s = group.slice(n);
    thetas[r].slice(0, s.begin, s.end).copy_(torch::arange(s.begin, s.end, torch::kFloat32));
    group.all_gather_slices(thetas[r]);
  });
  const auto mean = torch::arange(n, torch::kFloat32) * 2.0f;  // (1 + 2 + 3) / 3
  for (int r = 0; r < g; ++r) {
    EXPECT_TRUE(torch::allclose(grads[r], mean, 1e-6, 0)) << r;
    EXPECT_EQ(hash_of(grads[r]), hash_of(grads[0])) << r;  // the same bytes on every rank
    EXPECT_TRUE(torch::equal(thetas[r], torch::arange(n, torch::kFloat32))) << r;
  }
}

}  // namespace
