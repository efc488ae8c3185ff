#include "diloco/job/memory.hpp"

#include <algorithm>
#include <cstdio>

#include "runtime/collective/compression.hpp"

namespace loco::diloco {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kDataLoaderBytes = 64 * kMiB;
constexpr double kProcessBytes = 512 * kMiB;

double parameters(const JobConfig& cfg) {
  return static_cast<double>(cfg.model.parameter_count(cfg.vocab_size()));
}

// One rank's micro-batch, in sequences.
double micro_batch(const JobConfig& cfg, bool cuda) {
  const int ranks = cfg.ranks_per_worker(cuda);
  return std::max(1.0, double(cfg.inner.batch_size) / double(ranks * cfg.inner.grad_accum));
}

// Bytes of what autograd keeps for one rank's micro-batch: the blocks and the logits.
double block_activations(const JobConfig& cfg, bool cuda) {
  const ModelConfig& m = cfg.model;
  if (m.is_torchscript()) return 0;  // the module's own: loco does not know its layers
  const double tokens = micro_batch(cfg, cuda) * m.context;
  const double per_block =
      10.0 * m.d_model + 4.0 * m.mlp_width() + 2.0 * double(m.heads) * m.context;
  if (!m.activation_checkpointing) return 4.0 * tokens * m.layers * per_block;
  return 4.0 * tokens * (double(m.layers) * m.d_model + per_block);
}
double logits(const JobConfig& cfg, bool cuda) {
  return 12.0 * micro_batch(cfg, cuda) * cfg.model.context * cfg.vocab_size();
}

std::string count(double n) {
  char b[32];
  if (n >= 1e9)
    std::snprintf(b, sizeof b, "%.1f B", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(b, sizeof b, "%.1f M", n / 1e6);
  else
    std::snprintf(b, sizeof b, "%.0f", n);
  return b;
}

}  // namespace

double MemoryEstimate::host_bytes() const {
  double s = 0;
  for (const MemoryTerm& t : host) s += t.bytes;
  return s;
}

double MemoryEstimate::device_bytes() const {
  double s = 0;
  for (const MemoryTerm& t : device) s += t.bytes;
  return s;
}

MemoryEstimate worker_memory(const JobConfig& cfg, bool cuda) {
  const double p = parameters(cfg);
  const double ranks = cfg.ranks_per_worker(cuda);
  // On CUDA the fused AdamW steps over autograd's gradients (no flat copy unless ranks
  // average them there) and needs no scratch or decay mask (InnerTrainer).
  std::vector<MemoryTerm> rank = {
      {"θ_local", 4 * p},
      {"gradients", (cuda && ranks == 1 ? 4 : 8) * p},
      {"AdamW's two moments", 8 * p},
      {"AdamW's scratch and decay mask", cuda ? 0 : 8 * p},
      {"activations", block_activations(cfg, cuda)},
      {"logits", logits(cfg, cuda)},
  };
  if (cfg.precision == Precision::bf16) rank.push_back({"bf16 copies of the weights", 2 * p});
  MemoryEstimate e;
  auto add = [](std::vector<MemoryTerm>& to, const std::string& what, double bytes) {
    if (bytes > 0) to.push_back({what, bytes});
  };
  if (cuda) {
    for (const MemoryTerm& t : rank) add(e.device, t.what, t.bytes);
  } else {
    for (const MemoryTerm& t : rank)
      add(e.host, ranks > 1 ? t.what + " (each rank's)" : t.what, ranks * t.bytes);
  }
  add(e.host, "the outer state and its copy before a step", ranks * 20 * p);
  add(e.host, "Δ and its average", 8 * p);
  add(e.host, "the collective's buffers",
      2.0 * double(collective::encoded_bytes(cfg.compression, static_cast<std::size_t>(p))));
  if (cfg.sync.mode != SyncMode::blocking)
    add(e.host, "averages in flight and checkpoint copies", 20 * p);
  add(e.host, "the state a joiner copies", 16 * p);
  add(e.host, "the data loader", kDataLoaderBytes);
  add(e.host, "the process", kProcessBytes);
  return e;
}

double worker_memory_bytes(const JobConfig& cfg) { return worker_memory(cfg, false).host_bytes(); }

double aggregator_memory_bytes(const JobConfig& cfg) {
  return kProcessBytes + (cfg.checkpoint.resume.empty() ? 0.0 : 16 * parameters(cfg));
}

std::string memory_field(const JobConfig& cfg, bool cuda) {
  const ModelConfig& m = cfg.model;
  const double p = parameters(cfg);
  // The terms that grow with the model (per parameter: 80 bytes on the CPU in fp32, 16 or 20
  // on a GPU; see the header), against those that grow with the batch.
  const double model_bytes = (cuda ? (cfg.ranks_per_worker(cuda) > 1 ? 20 : 16) : 80) * p;
  const double batch_bytes = block_activations(cfg, cuda) + logits(cfg, cuda);
  if (batch_bytes > model_bytes)
    return "inner.batch_size (" + std::to_string(cfg.inner.batch_size) + " sequences of " +
           std::to_string(m.context) + " tokens; lower it, raise inner.grad_accum, or set " +
           "model.activation_checkpointing: true)";
  if (m.is_torchscript())
    return "model.torchscript (" + m.torchscript + "): " + count(p) + " parameters";
  const double embeddings = double(cfg.vocab_size()) * m.d_model * (m.tied_embeddings ? 1.0 : 2.0);
  if (embeddings > p / 2)
    return "model.vocab (" + std::to_string(cfg.vocab_size()) + ") and model.width (" +
           std::to_string(m.d_model) + "): " + count(p) + " parameters";
  return "model.layers (" + std::to_string(m.layers) + ") and model.width (" +
         std::to_string(m.d_model) + "): " + count(p) + " parameters";
}

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", bytes / (kMiB * 1024.0));
  return b;
}

void check_fits(const JobConfig& cfg, bool cuda, std::optional<double> largest_memory,
                std::optional<double> largest_gpu_memory) {
  const MemoryEstimate e = worker_memory(cfg, cuda);
  if (largest_memory && e.host_bytes() > *largest_memory)
    throw ConfigError(memory_field(cfg, false) + ": needs about " + gib(e.host_bytes()) +
                      " per worker; the largest node has " + gib(*largest_memory) +
                      " (its `memory` resource): make the model or the batch smaller, or add "
                      "a node with more memory");
  if (cuda && largest_gpu_memory && e.device_bytes() > *largest_gpu_memory)
    throw ConfigError(memory_field(cfg, true) + ": needs about " + gib(e.device_bytes()) +
                      " per GPU; the largest GPU has " + gib(*largest_gpu_memory) +
                      " (its node's `gpu_memory` resource): make the model or the batch "
                      "smaller, or add a node with larger GPUs");
}

}  // namespace loco::diloco
