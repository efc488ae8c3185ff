// Device <-> host copies of a round's flat fp32 vectors (θ_local out, θ_global in) through two
// pinned host buffers, chunk by chunk, so that the DMA of one chunk runs while the host works
// on the one before it. A pageable copy of the whole vector is staged by the CUDA driver
// through a small pinned buffer of its own, one piece at a time and synchronously: a 124 M
// model's 496 MB cross PCIe at a fraction of the link's speed, and the host's subtraction of
// θ_local from θ_global waits for all of it (issue "20 ·", item 3).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace loco::diloco {

class HostStaging {
 public:
  // chunk: floats a pinned buffer holds (two are allocated, pinned, at the first copy).
  explicit HostStaging(std::int64_t chunk = std::int64_t(1) << 22);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // For each chunk [offset, offset + piece.numel()) of `device_src` (flat, on a CUDA device),
  // in order: `consume(offset, piece)` with `piece` a host tensor holding the chunk's values,
  // valid until consume returns. The chunk after it is on its way meanwhile.
  using Consumer = std::function<void(std::int64_t offset, const torch::Tensor& piece)>;
  void to_host(const torch::Tensor& device_src, const Consumer& consume);
  // device_dst ← host_src (both flat, of one length; host_src in host memory). Returns once
  // every copy is done, so host_src may change afterwards.
  void to_device(const torch::Tensor& host_src, torch::Tensor& device_dst);

  std::int64_t chunk() const { return chunk_; }

 private:
  struct Buffers;  // the pinned buffers and their CUDA events (CUDA headers stay in the .cpp)
  Buffers& buffers(const torch::Device& device);

  std::int64_t chunk_;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace loco::diloco
