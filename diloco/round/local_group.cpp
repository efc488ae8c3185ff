#include "diloco/round/local_group.hpp"

// The torch wheel's libtorch_cpu holds c10d and Gloo (built with USE_C10D_GLOO); the
// header needs Gloo's own headers, which come from Debian's libgloo-dev (scripts/setup).
// Only out-of-line functions of ProcessGroupGloo are called (the constructor, the device
// factory, the collectives through Backend's vtable), so the version of those headers
// only has to declare the types.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

namespace loco::diloco {

namespace detail {
#ifdef LOCO_HAVE_NCCL
// local_group_nccl.cpp: the one translation unit that sees ProcessGroupNCCL and CUDA headers.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);
#endif
}  // namespace detail

namespace {
// Every local group of this process issues its collectives through here, under one lock
// (waiting for them is outside it). c10d's flight recorder, one per process, inserts a group's status into a
// map outside its own lock the first time that group records a collective: ranks of one
// worker issuing their first collectives from their threads at once crashed in that map
// (LocalGroup.AllreduceMeanAndGatherOverGlooThreads, about 1 run in 30 under
// --gtest_repeat; gdb: FlightRecorder::recordWithResetEnabled, _Rb_tree_insert).
template <typename Issue>
c10::intrusive_ptr<c10d::Work> issued(Issue&& issue) {
  static std::mutex m;
  std::lock_guard lock(m);
  return issue();
}

// Elements per slice: ceil(n / size), rounded up to 64 floats so that every slice starts
// on a 256-byte boundary, where ATen's vectorized elementwise loops start too: a slice's
// elements go through the same (vector or scalar) code as in the whole vector.
std::int64_t slice_stride(std::int64_t n, int size) {
  const std::int64_t c = (n + size - 1) / size;
  return (c + 63) / 64 * 64;
}
}  // namespace

Slice local_slice(std::int64_t n, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("local_slice: rank " + std::to_string(rank) + " of " +
                                std::to_string(size));
  if (size == 1) return {0, n};
  const std::int64_t c = slice_stride(n, size);
  return {std::min(n, c * rank), std::min(n, c * (rank + 1))};
}

void on_ranks(std::size_t n, const std::function<void(std::size_t)>& fn) { in_parallel(n, n, fn); }

void in_parallel(std::size_t n, std::size_t width, const std::function<void(std::size_t)>& fn) {
  if (width <= 1 || n <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr first;
  std::atomic<std::size_t> next{0};
  const int torch_threads = at::get_num_threads();
  for (std::size_t t = 0; t < std::min(width, n); ++t)
    threads.emplace_back([&] {
      at::set_num_threads(torch_threads);  // OpenMP's thread count is the calling thread's
      for (std::size_t i = next++; i < n; i = next++) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

bool nccl_compiled() {
#ifdef LOCO_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

LocalGroup::LocalGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                       LocalBackend backend, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), backend_(backend), timeout_(timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("LocalGroup: rank " + std::to_string(rank) + " of " +
                                std::to_string(size) + " (want 0 <= rank < size)");
  if (backend == LocalBackend::gloo) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // Local ranks share one host: loopback, whatever the host's name resolves to.
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 1;
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    } catch (const std::exception& e) {
      throw LocalGroupError("local group (gloo): rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + " could not join within " +
                            std::to_string(timeout.count()) + " ms: " + e.what());
    }
  } else {
#ifdef LOCO_HAVE_NCCL
    if (!torch::cuda::is_available())
      throw LocalGroupError("local group (nccl): rank " + std::to_string(rank) + " of " +
                            std::to_string(size) +
                            ": torch sees no CUDA device; NCCL ranks need one GPU each");
    pg_ = detail::make_nccl_backend(store, rank, size, timeout);
#else
    throw LocalGroupError(
        "local group: this build has no NCCL (torch's ProcessGroupNCCL or nccl.h was not found "
        "when loco was configured); build against the CUDA torch wheel with its nvidia-nccl "
        "package, or run the local ranks on the CPU (gloo)");
#endif
  }
}

LocalGroup::~LocalGroup() = default;

void LocalGroup::wait(const char* what, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    if (!work->wait(timeout_))
      throw LocalGroupError(std::string("local group: ") + what + " did not complete");
  } catch (const LocalGroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw LocalGroupError(std::string("local group: ") + what + " on rank " +
                          std::to_string(rank_) + " of " + std::to_string(size_) +
                          " failed (a rank missing or late past " +
                          std::to_string(timeout_.count()) + " ms?): " + e.what());
  }
}

void LocalGroup::allreduce_mean(torch::Tensor& t) {
  TORCH_CHECK(t.is_contiguous() && t.is_floating_point(),
              "LocalGroup::allreduce_mean: want a contiguous floating-point tensor");
  std::vector<at::Tensor> ts{t};
  wait("allreduce", issued([&] { return pg_->allreduce(ts); }));
  if (size_ > 1) t.div_(static_cast<double>(size_));
}

void LocalGroup::all_gather_slices(torch::Tensor& full) {
  TORCH_CHECK(full.is_contiguous() && full.dim() == 1 && full.scalar_type() == torch::kFloat32,
              "LocalGroup::all_gather_slices: want a flat contiguous fp32 tensor");
  if (size_ == 1) return;
  const std::int64_t n = full.numel();
  const std::int64_t c = slice_stride(n, size_);
  if (!gather_scratch_.defined() || gather_scratch_.numel() != c * size_ ||
      gather_scratch_.device() != full.device()) {
    gather_scratch_ = torch::empty({c * size_}, full.options());
    gather_in_ = torch::zeros({c}, full.options());  // the last slice's padding stays 0
  }
  const Slice s = slice(n);
  // The input apart from the output: Gloo copies it into its place first.
  gather_in_.slice(0, 0, s.size()).copy_(full.slice(0, s.begin, s.end));
  wait("all-gather", issued([&] { return pg_->_allgather_base(gather_scratch_, gather_in_); }));
  full.copy_(gather_scratch_.slice(0, 0, n));
}

}  // namespace loco::diloco
