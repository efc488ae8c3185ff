// A GPT-style decoder: token + learned position embeddings, pre-norm blocks
// of causal self-attention and a GELU MLP, a final norm, and a language-model
// head (optionally tied to the token embedding). No dropout anywhere, so a
// forward pass is a deterministic function of its inputs and parameters.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "diloco/config.hpp"

namespace loco::diloco {

// Autocast on `device` for the guard's lifetime (to `dtype`, or off), as torch.autocast
// does: the previous state comes back at the end, and the cache of casted weights is
// cleared when the outermost autocast region ends.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device, bool enabled, at::ScalarType dtype = at::kBFloat16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int d_model, int heads);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int heads_;
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int d_model, int heads, int mlp_ratio);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, fc_proj{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // vocab: the tokenizer's vocabulary size (JobConfig::vocab_size()).
  GptImpl(const ModelConfig& cfg, int vocab);
  // idx: [B, T] int64 token ids, T <= context. Returns logits [B, T, vocab].
  // With model.activation_checkpointing and grad mode on, each block keeps only its
  // input and is run again in the backward pass (same result, less memory).
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean next-token cross-entropy of `targets` [B, T].
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // Deterministic initialisation from `seed` (its own generator, no global
  // state): N(0, 0.02) weights and embeddings, residual projections
  // N(0, 0.02 / sqrt(2 layers)), zero biases, unit norms.
  void init_weights(std::uint64_t seed);
  std::int64_t parameter_count() const;
  const ModelConfig& config() const { return cfg_; }
  int vocab() const { return vocab_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when embeddings are tied

 private:
  ModelConfig cfg_;
  int vocab_;
};
TORCH_MODULE(Gpt);

// [begin, end) of the flat parameter vector (the model's parameters() in order).
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

// The flat parameter vector cut into `count` fragments for Streaming DiLoCo, strided over
// depth: fragment f holds the transformer blocks i with i mod count == f, and fragment 0
// also the parameters outside the blocks (embeddings, final norm, an untied head). Each
// fragment's ranges are in the flat vector's order, adjacent ones merged; together the
// fragments cover the vector once. One fragment: the whole vector.
std::vector<std::vector<Range>> parameter_fragments(Gpt& model, int count);

}  // namespace loco::diloco
