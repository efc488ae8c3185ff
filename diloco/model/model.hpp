// A decoder-only transformer of one of two skeletons (ModelConfig::arch):
//   gpt2:  token + learned position embeddings, pre-norm blocks of causal self-attention
//          (fused qkv, biases) and a GELU-tanh MLP, LayerNorm.
//   llama, mistral, qwen2: token embeddings only, pre-norm blocks of causal self-attention
//          with rotary positions (HF Llama's convention: rotate_half, cos/sin in fp32; Llama 3's
//          rope scaling optional) and optional grouped-query attention, and a SwiGLU MLP;
//          RMSNorm; no biases but qwen2's on q, k and v; mistral's optional sliding window.
// Then a final norm and a language-model head (optionally tied to the token embedding).
// Both keep their blocks' parameters under "blocks.N." in the flat order (parameter_fragments,
// hf_export.hpp). No dropout anywhere, so a forward pass is a deterministic function of its
// inputs and parameters.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"

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

// What the blocks of one forward pass share: the rotary tables [T, head_dim] (fp32; undefined
// for gpt2) and, for a sliding window shorter than T, the attention mask [T, T] (true: the
// query attends to the key; undefined: plain causal attention).
struct BlockInputs {
  torch::Tensor cos, sin, mask;
};

// A block of either skeleton, as the forward loop and activation checkpointing see it.
class DecoderBlock : public torch::nn::Module {
 public:
  virtual torch::Tensor run(const torch::Tensor& x, const BlockInputs& in) = 0;
};

// The rotary embedding's inverse frequencies [head_dim / 2] (fp32) of a rotary model: HF's
// 1 / θ^(2i / head_dim), and with rope_scaling llama3 transformers' Llama 3 rule, computed with
// the operations its Python runs, in fp32 as it does, so that the tables are its own bit for
// bit.
torch::Tensor inverse_frequencies(const ModelConfig& m, const torch::Device& device);

// Root-mean-square norm with a learned scale, computed in fp32 (as HF's LlamaRMSNorm).
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int d_model, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int d_model, int heads);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int heads_;
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public DecoderBlock {
 public:
  explicit BlockImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor run(const torch::Tensor& x, const BlockInputs&) override { return forward(x); }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, fc_proj{nullptr};
};
TORCH_MODULE(Block);

// Llama attention: qkv is the fused [q; k; v] projection, heads × head_dim rows of q then
// kv_heads × head_dim rows each of k and v (with biases for qwen2, none otherwise); proj maps
// heads × head_dim back to d_model. Key/value head j serves query heads j·g … j·g + g − 1
// (g = heads / kv_heads), as HF's repeat_kv.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x, const BlockInputs& in);
  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

// Llama block: x + attn(rms1(x)), then h + down(silu(gate) · up) of rms2(h). fc is the fused
// [gate; up] projection (mlp_width rows each), fc_proj the down projection.
class LlamaBlockImpl : public DecoderBlock {
 public:
  explicit LlamaBlockImpl(const ModelConfig& cfg);
  torch::Tensor run(const torch::Tensor& x, const BlockInputs& in) override;
  RmsNorm ln1{nullptr}, ln2{nullptr};
  LlamaAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, fc_proj{nullptr};
};
TORCH_MODULE(LlamaBlock);

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
  // state): N(0, 0.02) weights and embeddings, residual projections (attn.proj, fc_proj)
  // N(0, 0.02 / sqrt(2 layers)), zero biases, unit norms. The same rule for both archs.
  void init_weights(std::uint64_t seed);
  std::int64_t parameter_count() const;
  const ModelConfig& config() const { return cfg_; }
  int vocab() const { return vocab_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};  // wpe: gpt2 only
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};  // gpt2's final norm
  RmsNorm rms_f{nullptr};              // the rotary archs', registered as "ln_f" too
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
