#include "diloco/model/model.hpp"

#include <cmath>
#include <numbers>

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
// its input (and the blocks' shared BlockInputs, which need no gradient: they travel in a
// struct, not as tensor arguments, so that the engine neither tracks them nor sees gpt2's
// undefined ones). Backward: the block again with grad on and under the forward's autocast
// state, then its gradients with respect to the input and the parameters. The parameters are
// inputs of the function so that the engine accumulates their gradients as usual. There is no
// dropout in the model, so no RNG state to replay.
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               at::TensorList /*params: for the engine*/,
                               const std::shared_ptr<DecoderBlock>& block, const BlockInputs& in) {
    const auto dev = x.device().type();
    ctx->save_for_backward({x});
    ctx->saved_data["cos"] = in.cos;
    ctx->saved_data["sin"] = in.sin;
    ctx->saved_data["mask"] = in.mask;
    ctx->saved_data["block"] = c10::IValue::make_capsule(c10::make_intrusive<BlockRef>(block));
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(dev);
    ctx->saved_data["autocast_dtype"] =
        static_cast<std::int64_t>(at::autocast::get_autocast_dtype(dev));
    return block->run(x, in);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto capsule = ctx->saved_data["block"].toCapsule();
    auto& block = static_cast<BlockRef*>(capsule.get())->block;
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    variable_list inputs{x};
    for (const auto& p : block->parameters()) inputs.push_back(p);
    const BlockInputs in{ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(),
                         ctx->saved_data["mask"].toTensor()};
    torch::Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      AutocastGuard autocast(
          x.device().type(), ctx->saved_data["autocast"].toBool(),
          static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt()));
      y = block->run(x, in);
    }
    auto grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    grads.emplace_back();  // for the `block` argument
    grads.emplace_back();  // for `in`
    return grads;
  }
};

// HF Llama's rotary embedding: the angles position · inv_freq in fp32; the halves of each head
// rotate together (rotate_half), not interleaved pairs. Returns cos and sin of [T, head_dim].
std::pair<torch::Tensor, torch::Tensor> rope_tables(int t, const ModelConfig& m,
                                                    const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const auto freqs =
      torch::arange(t, f32).unsqueeze(1) * inverse_frequencies(m, device).unsqueeze(0);
  const auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

// transformers' sliding-window causal mask: query i attends to keys j with i − window < j <= i.
torch::Tensor sliding_window_mask(std::int64_t t, int window, const torch::Device& device) {
  const auto pos = torch::arange(t, torch::TensorOptions().dtype(torch::kInt64).device(device));
  const auto i = pos.unsqueeze(1), j = pos.unsqueeze(0);
  return (j <= i).logical_and(j > i - window);
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

torch::Tensor inverse_frequencies(const ModelConfig& m, const torch::Device& device) {
  const int hd = m.head_dim();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const auto inv = 1.0 / torch::pow(c10::Scalar(m.rope_theta), torch::arange(0, hd, 2, f32) / hd);
  if (!m.rope_scaling.llama3) return inv;
  // transformers' _compute_llama3_parameters. Its `number / tensor` is tensor.reciprocal() ·
  // number (Tensor.__rtruediv__), written so here; the wavelength bounds are Python floats.
  const RopeScaling& r = m.rope_scaling;
  const double low_wavelen = r.original_context / r.low_freq_factor;
  const double high_wavelen = r.original_context / r.high_freq_factor;
  const auto wavelen = inv.reciprocal() * (2 * std::numbers::pi);
  const auto scaled = torch::where(wavelen > low_wavelen, inv / r.factor, inv);
  const auto smooth = (wavelen.reciprocal() * r.original_context - r.low_freq_factor) /
                      (r.high_freq_factor - r.low_freq_factor);
  const auto smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const auto medium =
      (wavelen < high_wavelen).logical_not().logical_and((wavelen > low_wavelen).logical_not());
  return torch::where(medium, smoothed, scaled);
}

RmsNormImpl::RmsNormImpl(int d_model, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({d_model}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto h = x.to(torch::kFloat32);
  const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const ModelConfig& cfg)
    : heads_(cfg.heads), kv_heads_(cfg.kv_head_count()), head_dim_(cfg.head_dim()) {
  const int d = cfg.d_model, q = heads_ * head_dim_;
  qkv = register_module(
      "qkv", torch::nn::Linear(
                 torch::nn::LinearOptions(d, q + 2 * kv_heads_ * head_dim_).bias(cfg.qkv_bias())));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(q, d).bias(false)));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const BlockInputs& in) {
  const auto b = x.size(0), t = x.size(1);
  const std::int64_t hd = head_dim_;
  const auto parts = qkv(x).split_with_sizes({heads_ * hd, kv_heads_ * hd, kv_heads_ * hd}, -1);
  auto q = apply_rope(parts[0].view({b, t, heads_, hd}).transpose(1, 2), in.cos, in.sin);
  auto k = apply_rope(parts[1].view({b, t, kv_heads_, hd}).transpose(1, 2), in.cos, in.sin);
  auto v = parts[2].view({b, t, kv_heads_, hd}).transpose(1, 2);
  if (kv_heads_ < heads_) {
    k = k.repeat_interleave(heads_ / kv_heads_, 1);
    v = v.repeat_interleave(heads_ / kv_heads_, 1);
  }
  const bool window = in.mask.defined();
  auto y = at::scaled_dot_product_attention(
      q, k, v, window ? std::optional<at::Tensor>(in.mask) : std::nullopt, /*dropout_p=*/0.0,
      /*is_causal=*/!window);
  return proj(y.transpose(1, 2).reshape({b, t, heads_ * hd}));
}

LlamaBlockImpl::LlamaBlockImpl(const ModelConfig& cfg) {
  ln1 = register_module("ln1", RmsNorm(cfg.d_model, cfg.norm_eps));
  attn = register_module("attn", LlamaAttention(cfg));
  ln2 = register_module("ln2", RmsNorm(cfg.d_model, cfg.norm_eps));
  const int m = cfg.mlp_width();
  fc = register_module("fc",
                       torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, 2 * m).bias(false)));
  fc_proj = register_module(
      "fc_proj", torch::nn::Linear(torch::nn::LinearOptions(m, cfg.d_model).bias(false)));
}

torch::Tensor LlamaBlockImpl::run(const torch::Tensor& x, const BlockInputs& in) {
  auto h = x + attn(ln1(x), in);
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
  if (!cfg.hf.empty())
    throw std::logic_error("model.hf " + cfg.hf +
                           " is not resolved (resolve_hf_model reads its config.json first)");
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
  torch::Tensor x;
  BlockInputs in;
  if (gpt2) {
    x = wte(idx) + wpe->weight.slice(0, 0, t);
  } else {
    x = wte(idx);
    std::tie(in.cos, in.sin) = rope_tables(static_cast<int>(t), cfg_, idx.device());
    if (cfg_.sliding_window > 0 && cfg_.sliding_window < t)
      in.mask = sliding_window_mask(t, cfg_.sliding_window, idx.device());
  }
  const bool checkpoint = cfg_.activation_checkpointing && torch::GradMode::is_enabled();
  for (std::size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks->ptr<DecoderBlock>(i);
    if (checkpoint) {
      const auto params = block->parameters();
      x = CheckpointedBlock::apply(x, at::TensorList(params), block, in);
    } else {
      x = block->run(x, in);
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
