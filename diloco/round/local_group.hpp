// The local ranks of one DiLoCo worker: G processes or threads, one per GPU (or,
// in tests, per CPU rank), that run the worker's inner steps data-parallel. A thin
// layer over LibTorch's c10d backends: Gloo for CPU tensors, NCCL for CUDA tensors
// (compiled when the torch wheel and the NCCL headers allow it: LOCO_HAVE_NCCL).
//
// What a worker needs of its local ranks, and nothing else:
//   - every inner step: the mean of the flat gradient buffer over the ranks;
//   - at a round's end: which slice of the flat vector each rank owns (it computes
//     that slice's pseudo-gradient, averages it across workers over the butterfly
//     and applies the outer step to it), then the all-gather of the slices so that
//     every rank holds the whole θ again.
//
// Every rank calls the same operations in the same order (c10d's contract). Every
// wait is bounded by the group's timeout; a rank that does not arrive makes the
// others throw LocalGroupError naming the operation.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace loco::diloco {

struct LocalGroupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// [begin, end) of the flat vector of n elements owned by local rank `rank` of `size`:
// equal slices of ceil(n / size) elements rounded up to a multiple of 64, the last ones
// shorter (or empty when n is small); all of it for one rank.
struct Slice {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
Slice local_slice(std::int64_t n, int rank, int size);

enum class LocalBackend { gloo, nccl };

// Runs fn(0), …, fn(n − 1) each on a thread of its own, with the caller's torch thread
// count, waits for all of them and rethrows the first exception any threw; n = 1 runs on
// the caller's thread. How the local ranks of a worker (or of the simulator's workers)
// run their part of a step: every collective a rank waits on is bounded by its group's
// timeout, so a rank that fails cannot hold the others here for longer than that.
void on_ranks(std::size_t n, const std::function<void(std::size_t)>& fn);

// Runs fn(0), …, fn(n − 1), at most `width` at a time on threads of their own (each with the
// caller's torch thread count), in no set order; waits for all and rethrows the first
// exception any threw. width ≤ 1 runs them in order on the caller's thread. For calls that do
// not wait on each other (the simulator's workers' inner steps: `loco-train --parallel`).
void in_parallel(std::size_t n, std::size_t width, const std::function<void(std::size_t)>& fn);

// Whether this build can make NCCL groups (torch's ProcessGroupNCCL and nccl.h at
// compile time); whether there is a GPU is a separate question.
bool nccl_compiled();

class LocalGroup {
 public:
  // Joins the group of `size` ranks through `store` (c10d::HashStore for threads of
  // one process; TCPStore or FileStore across processes). Blocks until all ranks
  // have joined or `timeout` passes. nccl: throws LocalGroupError when the build has
  // no NCCL or torch sees no GPU. size 1 is a one-rank group through the same code.
  LocalGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, LocalBackend backend,
             std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  LocalBackend backend() const { return backend_; }
  Slice slice(std::int64_t n) const { return local_slice(n, rank_, size_); }

  // t ← the mean of t over the ranks (sum, then division by size: a one-rank group
  // leaves t bit for bit as it was). Every rank ends with the same bytes. t: contiguous,
  // floating point, on the backend's device (CPU for gloo, CUDA for nccl).
  void allreduce_mean(torch::Tensor& t);

  // full: a flat vector of n elements, the same length on every rank, where this
  // rank's slice(n) holds its part. On return every rank's `full` holds every
  // rank's part. Goes through a padded scratch buffer of size × the slice length.
  void all_gather_slices(torch::Tensor& full);

 private:
  void wait(const char* what, const c10::intrusive_ptr<c10d::Work>& work);

  int rank_, size_;
  LocalBackend backend_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  torch::Tensor gather_scratch_, gather_in_;  // size × the slice length, the slice length
};

}  // namespace loco::diloco
