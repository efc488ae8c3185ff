// What a job's actors must hold, estimated from the job file alone, and the check at submission
// against the nodes that would host them (docs/guide/memory.md). No LibTorch here: the
// client and the tests use it without compiling LibTorch headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"

namespace loco::diloco {

// One term of an estimate: what it holds, and its bytes.
struct MemoryTerm {
  std::string what;
  double bytes = 0;
};

// The bytes one InnerWorker needs, term by term (P: the model's parameters, 4 bytes each in
// fp32; G: the worker's local ranks; b: a rank's micro-batch, inner.batch_size / (G ·
// grad_accum) sequences of model.context tokens).
//   each rank, on its device (the host on the CPU, one GPU on CUDA):
//     θ_local                               4P  (the flat parameter buffer the model views)
//     gradients                             8P  (the flat buffer, and autograd's own tensors
//                                                before they are packed into it; on CUDA 4P,
//                                                autograd's alone, which the fused AdamW takes
//                                                as they are, unless G > 1 ranks average them
//                                                in the flat buffer)
//     AdamW's two moments                   8P
//     AdamW's scratch and decay mask        8P  (the CPU's flat passes; none on CUDA)
//     bf16 copies of the weights            2P  (precision: bf16 only)
//     activations                           4 · b · context · layers · (10·width + 4·mlp
//                                                + 2·heads·context)  (what autograd keeps of a
//                                                block, an upper bound over both archs; with
//                                                activation_checkpointing: each block's input,
//                                                4 · b · context · layers · width, plus one
//                                                block's whole)
//     logits                                12 · b · context · vocab  (logits, log-softmax and
//                                                their gradient)
//   each rank, on the host: the outer state (θ_global, momentum, scratch: 12P) and its copy
//     before a step (keep_before_step: 8P)
//   the worker, on the host:
//     Δ and its average                     8P
//     the collective's buffers              2P · the codec's bytes per value (its part's
//                                                chunks from every peer, and its own encoded)
//     streaming or eager: the averages in flight (4P) and the checkpoint copies (θ, momentum,
//       AdamW's moments: 16P)
//     the state a joiner copies             16P (θ, momentum and AdamW's moments, serialized)
//     the data loader                       64 MiB (its mapped windows, dropped every 32 MiB,
//                                                and the batches)
//     the process                           512 MiB (LibTorch and the runtime)
// About 80 bytes a parameter on the CPU with one rank in fp32 (16 on one GPU, 20 with G > 1):
// an upper bound, not a measurement.
struct MemoryEstimate {
  std::vector<MemoryTerm> host;    // the worker's process, in host memory
  std::vector<MemoryTerm> device;  // one GPU's (device: cuda); empty on the CPU
  double host_bytes() const;
  double device_bytes() const;
};
MemoryEstimate worker_memory(const JobConfig& cfg, bool cuda);

// The host bytes of one worker on the CPU (worker_memory(cfg, false).host_bytes()).
double worker_memory_bytes(const JobConfig& cfg);

// The bytes the OuterAggregator needs: its process (512 MiB) and, for checkpoint.resume, the
// checkpoint it reads at submission (θ, momentum and one worker's AdamW moments: 16P). It
// holds no model state otherwise: the workers do.
double aggregator_memory_bytes(const JobConfig& cfg);

// The job-file field that most makes the worker's memory (its GPU's with `cuda`) what it is,
// with its value, for a message: "model.layers (1024) and model.width (64): 51.2 M
// parameters", "model.vocab (50257) and model.width (768): ...", "inner.batch_size (64
// sequences of 1024 tokens; ...)".
std::string memory_field(const JobConfig& cfg, bool cuda);

// No node holds this much: refused by validate() without asking the cluster (the simulator,
// `loco submit` before anything is sent). The cluster's own check (check_fits) is the real one.
inline constexpr double kMaxWorkerBytes = 16.0 * (double(1) * (1 << 30)) * 1024;  // 16 TiB

// At submission: throws ConfigError naming memory_field(cfg) when one worker needs more than
// the largest live node holds (`largest_memory`: the greatest `memory` resource of the live
// nodes, in bytes), or, on CUDA, more than the largest GPU (`largest_gpu_memory`: the greatest
// `gpu_memory` resource, bytes per GPU). The aggregator needs less than a worker
// (aggregator_memory_bytes), so a node that holds a worker holds it too. A bound that is not
// known (nullopt: no node advertises it) is not checked.
void check_fits(const JobConfig& cfg, bool cuda, std::optional<double> largest_memory,
                std::optional<double> largest_gpu_memory);

// "3.7 GiB"
std::string gib(double bytes);

}  // namespace loco::diloco
