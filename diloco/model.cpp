#include "diloco/model.hpp"

#include <cmath>

namespace loco::diloco {

namespace F = torch::nn::functional;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int d_model, int heads) : heads_(heads) {
  qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
  proj = register_module("proj", torch::nn::Linear(d_model, d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const auto b = x.size(0), t = x.size(1), c = x.size(2);
  auto parts =
      qkv(x).view({b, t, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4});  // 3, B, H, T, hd
  auto y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], /*attn_mask=*/{},
                                            /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
  return proj(y.transpose(1, 2).reshape({b, t, c}));
}

BlockImpl::BlockImpl(int d_model, int heads, int mlp_ratio) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  attn = register_module("attn", CausalSelfAttention(d_model, heads));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  fc = register_module("fc", torch::nn::Linear(d_model, mlp_ratio * d_model));
  fc_proj = register_module("fc_proj", torch::nn::Linear(mlp_ratio * d_model, d_model));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln1(x));
  return h + fc_proj(F::gelu(fc(ln2(h)), F::GELUFuncOptions().approximate("tanh")));
}

GptImpl::GptImpl(const ModelConfig& cfg, int vocab) : cfg_(cfg), vocab_(vocab) {
  wte = register_module("wte", torch::nn::Embedding(vocab, cfg.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.context, cfg.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < cfg.layers; ++i)
    blocks->push_back(Block(cfg.d_model, cfg.heads, cfg.mlp_ratio));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
  if (!cfg.tied_embeddings)
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, vocab).bias(false)));
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  const auto t = idx.size(1);
  TORCH_CHECK(t <= cfg_.context, "sequence of ", t, " tokens is longer than model.context ",
              cfg_.context);
  auto x = wte(idx) + wpe->weight.slice(0, 0, t);
  for (const auto& block : *blocks) x = block->as<Block>()->forward(x);
  x = ln_f(x);
  return cfg_.tied_embeddings ? F::linear(x, wte->weight) : lm_head(x);
}

torch::Tensor GptImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);
  return F::cross_entropy(logits.view({-1, vocab_}), targets.reshape({-1}));
}

void GptImpl::init_weights(std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std_res = 0.02 / std::sqrt(2.0 * cfg_.layers);
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor p = item.value();
    if (name.ends_with(".bias")) {
      p.zero_();
    } else if (name.find("ln") != std::string::npos) {
      p.fill_(1.0);
    } else if (name.ends_with("proj.weight")) {
      p.normal_(0.0, std_res, gen);
    } else {
      p.normal_(0.0, 0.02, gen);
    }
  }
}

std::int64_t GptImpl::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace loco::diloco
