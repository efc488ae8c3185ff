#include "diloco/round/trainer.hpp"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>

namespace loco::diloco {

double inner_lr(const InnerConfig& c, std::int64_t step, std::int64_t total) {
  if (step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total - c.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup) / span);
  const double min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

void adamw_flat_step(torch::Tensor& params, const torch::Tensor& grads, torch::Tensor& exp_avg,
                     torch::Tensor& exp_avg_sq, const torch::Tensor& decay_mask,
                     torch::Tensor& denom, const InnerConfig& c, double lr, std::int64_t step) {
  const double b1 = c.betas[0], b2 = c.betas[1];
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  if (c.weight_decay > 0) params.addcmul_(params, decay_mask, -lr * c.weight_decay);
  exp_avg.lerp_(grads, 1.0 - b1);
  exp_avg_sq.mul_(b2).addcmul_(grads, grads, 1.0 - b2);
  torch::sqrt_out(denom, exp_avg_sq);
  denom.div_(std::sqrt(bc2)).add_(c.eps);
  params.addcdiv_(exp_avg, denom, -lr / bc1);
}

std::uint64_t tensor_hash(const torch::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), "tensor_hash: tensor must be contiguous");
  TORCH_CHECK(t.is_cpu(), "tensor_hash: tensor must be in host memory, not on ", t.device());
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  const std::size_t n = static_cast<std::size_t>(t.numel()) * t.element_size();
  // XXH3 (Debian's libxxhash): every worker hashes θ at every round's end, on the critical
  // path; byte-wise FNV-1a took ~50 ms per 25 MB there.
  return XXH3_64bits(p, n);
}

torch::Tensor flat_view(std::span<float> data) {
  return torch::from_blob(data.data(), {static_cast<std::int64_t>(data.size())}, torch::kFloat32);
}

InnerTrainer::InnerTrainer(const JobConfig& cfg, const TokenStore& store, std::vector<int> shards,
                           std::uint64_t stream, std::int64_t total_steps, torch::Device device,
                           LocalGroup* group)
    : cfg_(cfg),
      device_(device),
      group_(group),
      model_(make_model(cfg, ModelInit::seed)),
      sampler_(store, std::move(shards), cfg.model.context, cfg.seed, stream),
      total_steps_(total_steps) {
  const int g = group_ ? group_->size() : 1;
  if (cfg.inner.batch_size % (g * cfg.inner.grad_accum) != 0)
    throw std::invalid_argument(
        "inner.batch_size: " + std::to_string(cfg.inner.batch_size) + " sequences do not split " +
        "into " + std::to_string(g) + " local ranks of " + std::to_string(cfg.inner.grad_accum) +
        " micro-batches (inner.grad_accum); make it a multiple of workers.gpus × inner.grad_accum");
  local_batch_ = cfg.inner.batch_size / g;
  torch::NoGradGuard no_grad;
  if (!device_.is_cpu()) model_->to(device_);  // initialised on the CPU: the same everywhere
  auto ps = model_->parameters();
  std::int64_t n = 0;
  for (const auto& p : ps) n += p.numel();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  const bool fused = device_.is_cuda();
  params_ = torch::empty({n}, f32);
  exp_avg_ = torch::zeros({n}, f32);
  exp_avg_sq_ = torch::zeros({n}, f32);
  // The flat gradient buffer: what the CPU's passes run over, and on a GPU what a group
  // averages (NCCL reduces one buffer); the fused kernel takes autograd's own tensors.
  if (!fused || group_) grads_ = torch::zeros({n}, f32);
  if (!fused) {
    decay_mask_ = torch::zeros({n}, f32);
    denom_ = torch::empty({n}, f32);
  } else {
    fused_step_ = torch::zeros({}, f32);
  }
  std::int64_t off = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    auto& p = ps[i];
    const auto k = p.numel();
    auto slot = params_.slice(0, off, off + k);
    slot.copy_(p.detach().reshape({-1}));
    p.set_data(slot.view(p.sizes()));
    const bool decay = p.dim() >= 2;
    if (!fused && decay) decay_mask_.slice(0, off, off + k).fill_(1.0f);
    if (fused) {
      FusedGroup& g = fused_[decay ? 0 : 1];
      g.index.push_back(i);
      g.params.push_back(slot);
      g.exp_avg.push_back(exp_avg_.slice(0, off, off + k));
      g.exp_avg_sq.push_back(exp_avg_sq_.slice(0, off, off + k));
      g.steps.push_back(fused_step_);
    }
    off += k;
  }
  param_list_ = ps;
  grad_views_.resize(ps.size());
  // On a GPU the host batch is pinned, so that its copy to the device does not wait for the
  // card to finish the last step's optimizer (a pageable copy synchronizes the stream).
  batch_ = torch::empty({local_batch_, cfg.model.context + 1},
                        torch::dtype(torch::kInt64).pinned_memory(device_.is_cuda()));
  if (!device_.is_cpu())
    batch_device_ = torch::empty(batch_.sizes(), torch::dtype(torch::kInt64).device(device_));
}

double InnerTrainer::fused_norm() {
  if (group_) {
    // The group's mean gradient lies in grads_: the fused kernel steps over views of it.
    for (FusedGroup& g : fused_) {
      g.grads.clear();
      for (std::size_t i : g.index) {
        const auto& p = param_list_[i];
        const std::int64_t off = p.data_ptr<float>() - params_.data_ptr<float>();
        g.grads.push_back(grads_.slice(0, off, off + p.numel()));
      }
    }
    return grads_.norm().item<double>();
  }
  std::vector<torch::Tensor> all;
  all.reserve(param_list_.size());
  for (FusedGroup& g : fused_) {
    g.grads.clear();
    for (std::size_t i : g.index) {
      const auto& p = param_list_[i];
      torch::Tensor grad = p.grad().defined() ? p.grad().reshape({-1})
                                              : torch::zeros({p.numel()}, params_.options());
      g.grads.push_back(grad);
      all.push_back(grad);
    }
  }
  // The global 2-norm: each tensor's, then theirs (as clip_grad_norm_ on a GPU).
  return torch::linalg_vector_norm(torch::stack(at::_foreach_norm(all, 2)), 2).item<double>();
}

void InnerTrainer::fused_adamw(double norm, double lr) {
  const auto& ic = cfg_.inner;
  std::optional<torch::Tensor> scale;  // the kernel divides the gradients by it
  if (ic.grad_clip > 0) {
    const double coef = ic.grad_clip / (norm + 1e-6);
    if (coef < 1.0) scale = torch::full({}, 1.0 / coef, params_.options());
  }
  fused_step_.fill_(static_cast<double>(adam_steps_));
  for (std::size_t k = 0; k < fused_.size(); ++k) {
    FusedGroup& g = fused_[k];
    if (g.params.empty()) continue;
    at::_fused_adamw_(g.params, g.grads, g.exp_avg, g.exp_avg_sq, /*max_exp_avg_sqs=*/{}, g.steps,
                      lr, ic.betas[0], ic.betas[1], k == 0 ? ic.weight_decay : 0.0, ic.eps,
                      /*amsgrad=*/false, /*maximize=*/false, scale, /*found_inf=*/std::nullopt);
    g.grads.clear();  // autograd's gradients go with the next line
  }
  for (auto& p : param_list_) p.mutable_grad().reset();  // freed before the next forward
}

double InnerTrainer::measure_step_seconds(int repeats) {
  const auto& ic = cfg_.inner;
  const int micro = local_batch_ / ic.grad_accum;
  const int ctx = cfg_.model.context;
  const torch::Tensor batch = torch::zeros(batch_.sizes(), torch::dtype(torch::kInt64).device(device_));
  model_->train(false);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int a = 0; a < ic.grad_accum; ++a) {
      auto mb = batch.slice(0, a * micro, (a + 1) * micro);
      forward_loss(mb.slice(1, 0, ctx), mb.slice(1, 1, ctx + 1)).backward();
    }
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (auto& p : param_list_) p.mutable_grad().reset();
  }
  model_->train(true);
  return best;
}

InnerStats InnerTrainer::run_inner_steps(int h) {
  InnerStats stats;
  const auto& ic = cfg_.inner;
  const int micro = local_batch_ / ic.grad_accum;
  const int first = group_ ? group_->rank() * local_batch_ : 0;
  const int ctx = cfg_.model.context;
  double loss_sum = 0;
  model_->train(true);
  for (int s = 0; s < h; ++s) {
    sampler_.next(local_batch_,
                  {batch_.data_ptr<std::int64_t>(), static_cast<std::size_t>(batch_.numel())},
                  first);
    const torch::Tensor& batch =
        device_.is_cpu() ? batch_ : batch_device_.copy_(batch_, /*non_blocking=*/true);
    // Gradients start undefined so that autograd hands each parameter the
    // tensor it computed (no extra accumulate pass); one cat_out then packs
    // them into the flat gradient buffer. Measured faster than keeping the
    // gradients as views of the flat buffer (bench/train_step).
    for (auto& p : param_list_) p.mutable_grad().reset();
    double step_loss = 0;
    for (int a = 0; a < ic.grad_accum; ++a) {
      auto mb = batch.slice(0, a * micro, (a + 1) * micro);
      auto loss = forward_loss(mb.slice(1, 0, ctx), mb.slice(1, 1, ctx + 1));
      if (ic.grad_accum > 1) loss = loss / static_cast<double>(ic.grad_accum);
      loss.backward();
      step_loss += loss.item<double>();
    }
    torch::NoGradGuard no_grad;
    const bool fused = fused_step_.defined();
    if (!fused || group_) {
      for (std::size_t i = 0; i < param_list_.size(); ++i) {
        const auto& g = param_list_[i].grad();
        grad_views_[i] = g.defined() ? g.reshape({-1})
                                     : torch::zeros({param_list_[i].numel()}, grads_.options());
      }
      torch::cat_out(grads_, grad_views_);
      if (fused) {
        std::fill(grad_views_.begin(), grad_views_.end(), torch::Tensor());
        for (auto& p : param_list_) p.mutable_grad().reset();
      }
    }
    if (group_) {
      // The worker's gradient: the mean over its local ranks (each rank's is the mean over
      // its windows). The same bytes on every rank, so every rank takes the same step.
      group_->allreduce_mean(grads_);
      auto l = torch::full({1}, step_loss, torch::dtype(torch::kFloat64).device(device_));
      group_->allreduce_mean(l);
      step_loss = l.item<double>();
    }
    const double norm = fused ? fused_norm() : grads_.norm().item<double>();
    if (!std::isfinite(step_loss) || !std::isfinite(norm)) {
      // Diverged: the step is not taken, so that θ_local and the moments stay finite (the
      // worker abstains from the round's average: diloco/round/guard.hpp).
      ++step_;
      loss_sum += step_loss;
      stats.last_loss = step_loss;
      stats.grad_norm = norm;
      stats.diverged = true;
      stats.steps = s + 1;
      stats.mean_loss = loss_sum / (s + 1);
      model_->check_after_steps();
      return stats;
    }
    const double lr = inner_lr(ic, step_, total_steps_);
    ++step_;
    ++adam_steps_;
    if (fused) {
      fused_adamw(norm, lr);
    } else {
      if (ic.grad_clip > 0) {
        const double coef = ic.grad_clip / (norm + 1e-6);
        if (coef < 1.0) grads_.mul_(coef);
      }
      // AdamW over the flat buffers, the same arithmetic as torch.optim.AdamW.
      adamw_flat_step(params_, grads_, exp_avg_, exp_avg_sq_, decay_mask_, denom_, ic, lr,
                      adam_steps_);
    }

    loss_sum += step_loss;
    stats.last_loss = step_loss;
    stats.last_lr = lr;
    stats.grad_norm = norm;
  }
  stats.steps = h;
  stats.mean_loss = h > 0 ? loss_sum / h : 0.0;
  model_->check_after_steps();
  return stats;
}

namespace {

// `model`'s loss in the job's arithmetic: with precision bf16 the forward under autocast, as
// torch.autocast advises (the backward then runs each op in the dtype its forward ran in:
// bf16 matmuls, fp32 norms and loss, and the gradients of the fp32 parameters come out fp32
// through the casts).
torch::Tensor model_loss(TrainableModel& model, Precision precision, torch::DeviceType device,
                         const torch::Tensor& idx, const torch::Tensor& targets) {
  if (precision == Precision::fp32) return model.loss(idx, targets);
  AutocastGuard autocast(device, true, at::kBFloat16);
  return model.loss(idx, targets);
}

}  // namespace

torch::Tensor InnerTrainer::forward_loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  return model_loss(*model_, cfg_.precision, params_.device().type(), idx, targets);
}

void InnerTrainer::pseudo_gradient(const torch::Tensor& theta_global, std::span<float> out,
                                   std::int64_t begin) const {
  const auto n = static_cast<std::int64_t>(out.size());
  TORCH_CHECK(begin >= 0 && begin + n <= params_.numel() && theta_global.numel() == params_.numel(),
              "pseudo_gradient: slice [", begin, ", ", begin + n, ") of θ (", theta_global.numel(),
              " elements) does not fit the model's ", params_.numel());
  auto o = flat_view(out);
  const auto theta = theta_global.slice(0, begin, begin + n);
  const auto local = params_.slice(0, begin, begin + n);
  if (device_.is_cpu()) {
    torch::sub_out(o, theta, local);
  } else {
    // The one device → host copy of the round, chunk by chunk through pinned memory.
    staging_.to_host(local, [&](std::int64_t off, const torch::Tensor& piece) {
      const std::int64_t end = off + piece.numel();
      auto o_piece = o.slice(0, off, end);
      torch::sub_out(o_piece, theta.slice(0, off, end), piece);
    });
  }
}

void InnerTrainer::load_parameters(const torch::Tensor& theta) {
  torch::NoGradGuard no_grad;
  if (device_.is_cuda() && theta.is_cpu() && theta.scalar_type() == torch::kFloat32 &&
      theta.is_contiguous() && theta.numel() == params_.numel()) {
    staging_.to_device(theta.reshape({-1}), params_);  // pinned chunks, not a pageable copy
    return;
  }
  params_.copy_(theta);
}

void InnerTrainer::merge_parameters(const torch::Tensor& theta, const std::vector<Range>& ranges,
                                    double mix) {
  torch::NoGradGuard no_grad;
  for (const Range& r : ranges) {
    auto local = params_.slice(0, r.begin, r.end);
    const auto global = theta.slice(0, r.begin, r.end);
    if (mix == 0) {
      local.copy_(global);
    } else {
      local.mul_(mix).add_(global.to(device_), 1.0 - mix);
    }
  }
}

void InnerTrainer::correct_parameters(const torch::Tensor& theta,
                                      const torch::Tensor& provisional) {
  torch::NoGradGuard no_grad;
  params_.add_((theta - provisional).to(device_));
}

double InnerTrainer::evaluate_parameters(const torch::Tensor& theta, const torch::Tensor& windows) {
  torch::NoGradGuard no_grad;
  const torch::Tensor local = params_.clone();
  params_.copy_(theta);
  const double loss = evaluate(windows);
  params_.copy_(local);
  return loss;
}

namespace {

// The mean validation loss of `model` over `windows`, batch by batch (InnerTrainer::evaluate's
// loop, for any model).
double mean_loss(TrainableModel& model, const JobConfig& cfg, torch::Device device,
                 const torch::Tensor& windows) {
  torch::NoGradGuard no_grad;
  const int ctx = cfg.model.context;
  const auto n = windows.size(0);
  double sum = 0;
  for (std::int64_t b = 0; b < n; b += cfg.inner.batch_size) {
    auto w = windows.slice(0, b, std::min<std::int64_t>(n, b + cfg.inner.batch_size)).to(device);
    const torch::Tensor loss =
        model_loss(model, cfg.precision, device.type(), w.slice(1, 0, ctx), w.slice(1, 1, ctx + 1));
    sum += loss.item<double>() * static_cast<double>(w.size(0));
  }
  return sum / static_cast<double>(n);
}

}  // namespace

Evaluator::Evaluator(const JobConfig& cfg, torch::Device device)
    : cfg_(cfg), device_(device), model_(make_model(cfg, ModelInit::keep_rng)) {
  if (!device_.is_cpu()) model_->to(device_);
  model_->train(false);
}

double Evaluator::evaluate(const torch::Tensor& theta, const torch::Tensor& windows) {
  torch::NoGradGuard no_grad;
  std::int64_t off = 0;
  const torch::Tensor t = theta.to(device_, torch::kFloat32).contiguous();
  for (auto& p : model_->parameters()) {
    const auto k = p.numel();
    TORCH_CHECK(off + k <= t.numel(), "Evaluator: θ has ", t.numel(), " values, the model more");
    p.copy_(t.slice(0, off, off + k).view(p.sizes()));
    off += k;
  }
  TORCH_CHECK(off == t.numel(), "Evaluator: θ has ", t.numel(), " values, the model ", off);
  return mean_loss(*model_, cfg_, device_, windows);
}

void InnerTrainer::gather_outer_state(OuterOptimizer& outer, bool momentum) {
  torch::NoGradGuard no_grad;
  if (!group_ || group_->size() == 1) {
    params_.copy_(outer.theta());
    return;
  }
  const Slice s = group_->slice(params_.numel());
  // Through the device buffers: NCCL gathers device memory, and θ_local wants θ anyway.
  const auto gather = [&](torch::Tensor& host, torch::Tensor& buf) {
    buf.slice(0, s.begin, s.end).copy_(host.slice(0, s.begin, s.end));
    group_->all_gather_slices(buf);
    host.copy_(buf);
  };
  gather(outer.mutable_theta(), params_);
  if (momentum) gather(outer.mutable_momentum(), grads_);  // the gradients are spent
}

double InnerTrainer::evaluate(const torch::Tensor& windows) {
  model_->train(false);
  const double loss = mean_loss(*model_, cfg_, device_, windows);
  model_->train(true);
  return loss;
}

namespace {

// dst ← the archive's `key`, which must have as many elements.
void read_into(torch::serialize::InputArchive& ar, const std::string& key, torch::Tensor& dst) {
  torch::Tensor t;
  ar.read(key, t);
  TORCH_CHECK(t.numel() == dst.numel(), "checkpoint: ", key, " has ", t.numel(),
              " elements, expected ", dst.numel(), " (a different model?)");
  dst.copy_(t.reshape(dst.sizes()));
}

}  // namespace

namespace {
// A CPU tensor for an archive: `t` itself on the CPU (or a device's copy), or what `copy`
// makes of it.
torch::Tensor for_archive(const torch::Tensor& t, const ArchiveCopy& copy) {
  return copy ? copy(t) : t.cpu();
}
}  // namespace

void InnerTrainer::save(torch::serialize::OutputArchive& ar, const std::string& prefix,
                        const ArchiveCopy& copy) const {
  ar.write(prefix + "params", for_archive(params_, copy));
  save_moments(ar, prefix, copy);
  ar.write(prefix + "step", c10::IValue(step_));
  ar.write(prefix + "sampler_position",
           c10::IValue(static_cast<std::int64_t>(sampler_.position())));
  std::vector<std::int64_t> shards(sampler_.shards().begin(), sampler_.shards().end());
  ar.write(prefix + "shards", torch::tensor(shards, torch::kInt64));
}

void InnerTrainer::load(torch::serialize::InputArchive& ar, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  read_into(ar, prefix + "params", params_);
  read_into(ar, prefix + "exp_avg", exp_avg_);
  read_into(ar, prefix + "exp_avg_sq", exp_avg_sq_);
  c10::IValue v;
  ar.read(prefix + "step", v);
  step_ = v.toInt();
  // Archives from before the schedule and the moments were counted apart.
  adam_steps_ = ar.try_read(prefix + "adam_steps", v) ? v.toInt() : step_;
  ar.read(prefix + "sampler_position", v);
  sampler_.set_position(static_cast<std::uint64_t>(v.toInt()));
  torch::Tensor shards;
  ar.read(prefix + "shards", shards);
  std::vector<int> s;
  for (std::int64_t i = 0; i < shards.numel(); ++i)
    s.push_back(static_cast<int>(shards[i].item<std::int64_t>()));
  sampler_.set_shards(std::move(s));
}

void InnerTrainer::save_moments(torch::serialize::OutputArchive& ar, const std::string& prefix,
                                const ArchiveCopy& copy) const {
  ar.write(prefix + "exp_avg", for_archive(exp_avg_, copy));
  ar.write(prefix + "exp_avg_sq", for_archive(exp_avg_sq_, copy));
  ar.write(prefix + "adam_steps", c10::IValue(adam_steps_));
}

void InnerTrainer::load_moments(torch::serialize::InputArchive& ar, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  torch::Tensor m = torch::empty_like(exp_avg_), v = torch::empty_like(exp_avg_sq_);
  read_into(ar, prefix + "exp_avg", m);
  read_into(ar, prefix + "exp_avg_sq", v);
  TORCH_CHECK(torch::isfinite(m).all().item<bool>() && torch::isfinite(v).all().item<bool>(),
              "AdamW moments hold NaN or Inf");
  c10::IValue s;
  ar.read(prefix + "adam_steps", s);
  exp_avg_.copy_(m);
  exp_avg_sq_.copy_(v);
  adam_steps_ = s.toInt();
}

OuterOptimizer::OuterOptimizer(const OuterConfig& cfg, const torch::Tensor& theta0)
    : cfg_(cfg),
      theta_(theta0.detach().to(torch::kCPU, torch::kFloat32).clone().reshape({-1})),
      momentum_(torch::zeros_like(theta_)),
      scratch_(torch::empty_like(theta_)) {}

namespace {

// The outer step's arithmetic on the slice [begin, begin + delta.size()) of θ and the
// momentum (scratch: a buffer of θ's size); elementwise, so a slice steps as in the whole.
void outer_step_slice(const OuterConfig& cfg, torch::Tensor& theta_all, torch::Tensor& momentum_all,
                      torch::Tensor& scratch_all, std::span<const float> delta,
                      std::int64_t begin) {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<std::int64_t>(delta.size());
  TORCH_CHECK(begin >= 0 && begin + n <= theta_all.numel(), "OuterOptimizer::step: Δ's slice [",
              begin, ", ", begin + n, ") does not fit θ's ", theta_all.numel(), " elements");
  const auto d = flat_view({const_cast<float*>(delta.data()), delta.size()});
  auto theta = theta_all.slice(0, begin, begin + n),
       momentum = momentum_all.slice(0, begin, begin + n),
       scratch = scratch_all.slice(0, begin, begin + n);
  const double mu = cfg.momentum;
  if (mu > 0) {
    momentum.mul_(mu).add_(d);
    if (cfg.nesterov) {
      torch::add_out(scratch, d, momentum, mu);
      theta.sub_(scratch, cfg.lr);
    } else {
      theta.sub_(momentum, cfg.lr);
    }
  } else {
    theta.sub_(d, cfg.lr);
  }
}

}  // namespace

void OuterOptimizer::step(std::span<const float> delta, std::int64_t begin) {
  outer_step_slice(cfg_, theta_, momentum_, scratch_, delta, begin);
  ++round_;
}

void OuterOptimizer::step_ranges(std::span<const float> packed, const std::vector<Range>& ranges) {
  std::size_t at = 0;
  for (const Range& r : ranges) {
    TORCH_CHECK(at + static_cast<std::size_t>(r.size()) <= packed.size(),
                "OuterOptimizer::step_ranges: ", packed.size(), " values for ranges of more");
    outer_step_slice(cfg_, theta_, momentum_, scratch_,
                     packed.subspan(at, static_cast<std::size_t>(r.size())), r.begin);
    at += static_cast<std::size_t>(r.size());
  }
  TORCH_CHECK(at == packed.size(), "OuterOptimizer::step_ranges: ", packed.size(),
              " values for ranges of ", at);
}

torch::Tensor OuterOptimizer::provisional_ranges(std::span<const float> packed,
                                                 const std::vector<Range>& ranges) const {
  torch::Tensor theta = theta_.clone(), momentum = momentum_.clone(),
                scratch = torch::empty_like(theta_);
  std::size_t at = 0;
  for (const Range& r : ranges) {
    TORCH_CHECK(at + static_cast<std::size_t>(r.size()) <= packed.size(),
                "OuterOptimizer::provisional_ranges: ", packed.size(),
                " values for ranges of more");
    outer_step_slice(cfg_, theta, momentum, scratch,
                     packed.subspan(at, static_cast<std::size_t>(r.size())), r.begin);
    at += static_cast<std::size_t>(r.size());
  }
  return theta;
}

void OuterOptimizer::keep_before_step() {
  torch::NoGradGuard no_grad;
  if (!kept_theta_.defined()) {
    kept_theta_ = torch::empty_like(theta_);
    kept_momentum_ = torch::empty_like(momentum_);
  }
  kept_theta_.copy_(theta_);
  kept_momentum_.copy_(momentum_);
  kept_round_ = round_;
}

void OuterOptimizer::assign(const OuterOptimizer& other) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(other.theta_.numel() == theta_.numel(), "OuterOptimizer::assign: θ of ",
              other.theta_.numel(), " elements, not ", theta_.numel());
  theta_.copy_(other.theta_);
  momentum_.copy_(other.momentum_);
  round_ = other.round_;
}

void OuterOptimizer::undo_step() {
  TORCH_CHECK(kept_round_ >= 0, "OuterOptimizer::undo_step without keep_before_step");
  torch::NoGradGuard no_grad;
  theta_.copy_(kept_theta_);
  momentum_.copy_(kept_momentum_);
  round_ = kept_round_;
}

void OuterOptimizer::save(torch::serialize::OutputArchive& ar, const std::string& prefix,
                          const ArchiveCopy& copy) const {
  ar.write(prefix + "theta", for_archive(theta_, copy));
  ar.write(prefix + "momentum", for_archive(momentum_, copy));
  ar.write(prefix + "round", c10::IValue(round_));
}

void OuterOptimizer::load(torch::serialize::InputArchive& ar, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  torch::Tensor t, m;
  ar.read(prefix + "theta", t);
  ar.read(prefix + "momentum", m);
  TORCH_CHECK(t.numel() == theta_.numel() && m.numel() == theta_.numel(), "outer state: θ has ",
              t.numel(), " elements, expected ", theta_.numel(), " (a different model?)");
  theta_.copy_(t);
  momentum_.copy_(m);
  c10::IValue v;
  ar.read(prefix + "round", v);
  round_ = v.toInt();
}

}  // namespace loco::diloco
