// Compiled only when CMake found torch's ProcessGroupNCCL and nccl.h (LOCO_HAVE_NCCL):
// the one translation unit that sees the CUDA and NCCL headers.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "diloco/round/local_group.hpp"

namespace loco::diloco::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  try {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  } catch (const std::exception& e) {
    throw LocalGroupError("local group (nccl): rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + " could not start: " + e.what());
  }
}

}  // namespace loco::diloco::detail
