#include "diloco/round/host_staging.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace loco::diloco {

struct HostStaging::Buffers {
  torch::Device device;
  std::array<torch::Tensor, 2> pinned;
  std::array<at::cuda::CUDAEvent, 2> done;  // the last copy into or out of each buffer
};

HostStaging::HostStaging(std::int64_t chunk) : chunk_(chunk) {
  if (chunk <= 0) throw std::invalid_argument("HostStaging: chunk must be positive");
}

HostStaging::~HostStaging() = default;

HostStaging::Buffers& HostStaging::buffers(const torch::Device& device) {
  if (!device.is_cuda())
    throw std::invalid_argument("HostStaging: " + device.str() + " is not a CUDA device");
  if (!buffers_ || buffers_->device != device) {
    const auto pinned = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true);
    buffers_.reset(new Buffers{
        device, {torch::empty({chunk_}, pinned), torch::empty({chunk_}, pinned)}, {}});
  }
  return *buffers_;
}

void HostStaging::to_host(const torch::Tensor& device_src, const Consumer& consume) {
  Buffers& b = buffers(device_src.device());
  const c10::cuda::CUDAGuard guard(device_src.device());
  const std::int64_t n = device_src.numel();
  auto piece = [&](std::int64_t k) {
    const std::int64_t off = k * chunk_;
    return b.pinned[size_t(k % 2)].slice(0, 0, std::min(chunk_, n - off));
  };
  const std::int64_t chunks = (n + chunk_ - 1) / chunk_;
  for (std::int64_t k = 0; k <= chunks; ++k) {
    if (k < chunks) {  // chunk k on its way (its buffer's previous chunk, k − 2, is consumed)
      const std::int64_t off = k * chunk_;
      piece(k).copy_(device_src.slice(0, off, off + piece(k).numel()), /*non_blocking=*/true);
      b.done[size_t(k % 2)].record();
    }
    if (k > 0) {  // meanwhile the host works on chunk k − 1
      b.done[size_t((k - 1) % 2)].synchronize();
      consume((k - 1) * chunk_, piece(k - 1));
    }
  }
}

void HostStaging::to_device(const torch::Tensor& host_src, torch::Tensor& device_dst) {
  if (host_src.numel() != device_dst.numel())
    throw std::invalid_argument("HostStaging::to_device: " + std::to_string(host_src.numel()) +
                                " values for " + std::to_string(device_dst.numel()));
  Buffers& b = buffers(device_dst.device());
  const c10::cuda::CUDAGuard guard(device_dst.device());
  const std::int64_t n = host_src.numel();
  for (std::int64_t off = 0, k = 0; off < n; off += chunk_, ++k) {
    const std::int64_t len = std::min(chunk_, n - off);
    auto& buf = b.pinned[size_t(k % 2)];
    b.done[size_t(k % 2)].synchronize();  // its last chunk has left for the device
    buf.slice(0, 0, len).copy_(host_src.slice(0, off, off + len));
    device_dst.slice(0, off, off + len).copy_(buf.slice(0, 0, len), /*non_blocking=*/true);
    b.done[size_t(k % 2)].record();
  }
  for (auto& e : b.done) e.synchronize();
}

}  // namespace loco::diloco
