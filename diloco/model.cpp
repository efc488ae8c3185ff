#include "diloco/model.hpp"

#include <cmath>

namespace loco::diloco {

namespace F = torch::nn::functional;

AutocastGuard::AutocastGuard(at::DeviceType device, bool enabled, at::ScalarType dtype)
    : device_(device),
      was_enabled_(at::autocast::is_autocast_enabled(device)),
      was_dtype_(at::autocast::get_autocast_dtype(device)) {
  at::autocast::set_autocast_enabled(device_, enabled);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Keeps a block alive for the backward pass of a graph that went through it.
struct BlockRef : torch::CustomClassHolder {
  explicit BlockRef(std::shared_ptr<DecoderBlock> b) : block(std::move(b)) {}
  std::shared_ptr<DecoderBlock> block;
};

// Activation checkpointing of one block (LibTorch C++ has no torch.utils.checkpoint).
// Forward: the block under no grad (Function::apply turns grad mode off), saving only
// its input (and llama's rotary tables, which need no gradient: they travel in a struct, not as
// tensor arguments, so that the engine neither tracks them nor sees gpt2's undefined ones).
// Backward: the block again with grad on and under the forward's autocast state, then its gradients
// with respect to the input and the parameters. The parameters are inputs of the function so that
// the engine accumulates their gradients as usual. There is no dropout in the model, so no RNG
// state to replay.
struct RopeTables {
  torch::Tensor cos, sin;  // undefined for gpt2
};

struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               at::TensorList /*params: for the engine*/,
                               const std::shared_ptr<DecoderBlock>& block, const RopeTables& rope) {
    const auto dev = x.device().type();
    ctx->save_for_backward({x});
    ctx->saved_data["cos"] = rope.cos;
    ctx->saved_data["sin"] = rope.sin;
    ctx->saved_data["block"] = c10::IValue::make_capsule(c10::make_intrusive<BlockRef>(block));
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(dev);
    ctx->saved_data["autocast_dtype"] =
        static_cast<std::int64_t>(at::autocast::get_autocast_dtype(dev));
    return block->run(x, rope.cos, rope.sin);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto capsule = ctx->saved_data["block"].toCapsule();
    auto& block = static_cast<BlockRef*>(capsule.get())->block;
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    variable_list inputs{x};
    for (const auto& p : block->parameters()) inputs.push_back(p);
    torch::Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      AutocastGuard autocast(
          x.device().type(), ctx->saved_data["autocast"].toBool(),
          static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt()));
      y = block->run(x, ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor());
    }
    auto grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    grads.emplace_back();  // for the `block` argument
    grads.emplace_back();  // for `rope`
    return grads;
  }
};

// HF Llama's rotary embedding: inv_freq = 1 / theta^(2i / head_dim) and the angles
// position · inv_freq, all in fp32; the halves of each head rotate together (rotate_half),
// not interleaved pairs. Returns cos and sin of [T, head_dim].
std::pair<torch::Tensor, torch::Tensor> rope_tables(int t, int head_dim, double theta,
                                                    const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const auto inv_freq =
      1.0 / torch::pow(c10::Scalar(theta), torch::arange(0, head_dim, 2, f32) / head_dim);
  const auto freqs = torch::arange(t, f32).unsqueeze(1) * inv_freq.unsqueeze(0);
  const auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// x: [B, H, T, hd]; cos, sin: [T, hd] in fp32, used in x's dtype (as HF does).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  return x * cos.to(x.scalar_type()) + rotate_half(x) * sin.to(x.scalar_type());
}

}  // namespace

RmsNormImpl::RmsNormImpl(int d_model, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({d_model}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto h = x.to(torch::kFloat32);
  const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(int d_model, int heads, int kv_heads)
    : heads_(heads), kv_heads_(kv_heads) {
  const int hd = d_model / heads;
  qkv = register_module(
      "qkv", torch::nn::Linear(
                 torch::nn::LinearOptions(d_model, (heads + 2 * kv_heads) * hd).bias(false)));
  proj = register_module(
      "proj", torch::nn::Linear(torch::nn::LinearOptions(heads * hd, d_model).bias(false)));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin) {
  const auto b = x.size(0), t = x.size(1);
  const std::int64_t hd = x.size(2) / heads_;
  const auto parts = qkv(x).split_with_sizes({heads_ * hd, kv_heads_ * hd, kv_heads_ * hd}, -1);
  auto q = apply_rope(parts[0].view({b, t, heads_, hd}).transpose(1, 2), cos, sin);
  auto k = apply_rope(parts[1].view({b, t, kv_heads_, hd}).transpose(1, 2), cos, sin);
  auto v = parts[2].view({b, t, kv_heads_, hd}).transpose(1, 2);
  if (kv_heads_ < heads_) {
    k = k.repeat_interleave(heads_ / kv_heads_, 1);
    v = v.repeat_interleave(heads_ / kv_heads_, 1);
  }
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
  return proj(y.transpose(1, 2).reshape({b, t, heads_ * hd}));
}

LlamaBlockImpl::LlamaBlockImpl(const ModelConfig& cfg) {
  ln1 = register_module("ln1", RmsNorm(cfg.d_model, cfg.norm_eps));
  attn = register_module("attn", LlamaAttention(cfg.d_model, cfg.heads, cfg.kv_head_count()));
  ln2 = register_module("ln2", RmsNorm(cfg.d_model, cfg.norm_eps));
  const int m = cfg.mlp_width();
  fc = register_module("fc",
                       torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, 2 * m).bias(false)));
  fc_proj = register_module(
      "fc_proj", torch::nn::Linear(torch::nn::LinearOptions(m, cfg.d_model).bias(false)));
}

torch::Tensor LlamaBlockImpl::run(const torch::Tensor& x, const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  auto h = x + attn(ln1(x), cos, sin);
  const auto gate_up = fc(ln2(h)).chunk(2, -1);
  return h + fc_proj(F::silu(gate_up[0]) * gate_up[1]);
}

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

BlockImpl::BlockImpl(const ModelConfig& cfg) {
  const int d = cfg.d_model, m = cfg.mlp_width();
  ln1 = register_module("ln1",
                        torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(cfg.norm_eps)));
  attn = register_module("attn", CausalSelfAttention(d, cfg.heads));
  ln2 = register_module("ln2",
                        torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(cfg.norm_eps)));
  fc = register_module("fc", torch::nn::Linear(d, m));
  fc_proj = register_module("fc_proj", torch::nn::Linear(m, d));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln1(x));
  return h + fc_proj(F::gelu(fc(ln2(h)), F::GELUFuncOptions().approximate("tanh")));
}

GptImpl::GptImpl(const ModelConfig& cfg, int vocab) : cfg_(cfg), vocab_(vocab) {
  const bool gpt2 = cfg.arch == Arch::gpt2;
  wte = register_module("wte", torch::nn::Embedding(vocab, cfg.d_model));
  if (gpt2) wpe = register_module("wpe", torch::nn::Embedding(cfg.context, cfg.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < cfg.layers; ++i) {
    if (gpt2)
      blocks->push_back(Block(cfg));
    else
      blocks->push_back(LlamaBlock(cfg));
  }
  if (gpt2)
    ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model}).eps(cfg.norm_eps)));
  else
    rms_f = register_module("ln_f", RmsNorm(cfg.d_model, cfg.norm_eps));
  if (!cfg.tied_embeddings)
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, vocab).bias(false)));
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  const auto t = idx.size(1);
  TORCH_CHECK(t <= cfg_.context, "sequence of ", t, " tokens is longer than model.context ",
              cfg_.context);
  const bool gpt2 = cfg_.arch == Arch::gpt2;
  torch::Tensor x, cos, sin;
  if (gpt2) {
    x = wte(idx) + wpe->weight.slice(0, 0, t);
  } else {
    x = wte(idx);
    std::tie(cos, sin) =
        rope_tables(static_cast<int>(t), cfg_.head_dim(), cfg_.rope_theta, idx.device());
  }
  const bool checkpoint = cfg_.activation_checkpointing && torch::GradMode::is_enabled();
  for (std::size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks->ptr<DecoderBlock>(i);
    if (checkpoint) {
      const auto params = block->parameters();
      x = CheckpointedBlock::apply(x, at::TensorList(params), block, RopeTables{cos, sin});
    } else {
      x = block->run(x, cos, sin);
    }
  }
  x = gpt2 ? ln_f(x) : rms_f(x);
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

std::vector<std::vector<Range>> parameter_fragments(Gpt& model, int count) {
  if (count < 1 || count > static_cast<int>(model->blocks->size()))
    throw std::invalid_argument("parameter_fragments: " + std::to_string(count) +
                                " fragments of a model of " +
                                std::to_string(model->blocks->size()) + " blocks");
  std::vector<std::vector<Range>> out(static_cast<std::size_t>(count));
  std::int64_t at = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();  // "blocks.3.attn.qkv.weight", "wte.weight", ...
    int f = 0;
    if (name.rfind("blocks.", 0) == 0) f = std::stoi(name.substr(7)) % count;
    auto& ranges = out[static_cast<std::size_t>(f)];
    const std::int64_t end = at + item.value().numel();
    if (!ranges.empty() && ranges.back().end == at)
      ranges.back().end = end;
    else
      ranges.push_back({at, end});
    at = end;
  }
  return out;
}

std::int64_t GptImpl::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace loco::diloco
