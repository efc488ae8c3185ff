// One DiLoCo worker's algorithm: the inner trainer (model replica, AdamW with
// warmup + cosine, clipping, accumulation, its data shards) and the outer
// optimizer (θ_global and the Nesterov momentum, fp32). Nothing here knows
// actors or sockets; the simulator and the distributed InnerWorker both drive it:
//
//   trainer.run_inner_steps(H);
//   trainer.pseudo_gradient(outer.theta(), delta);      // Δ = θ − θ_local
//   averager.average({delta}, cfg.compression);         // mean over the round
//   outer.step(delta);                                  // θ ← Nesterov(θ, Δ)
//   trainer.load_parameters(outer.theta());
//
// Local ranks: a worker with G GPUs runs G InnerTrainers, one per local rank of a
// LocalGroup (local_group.hpp), data-parallel: each reads its 1/G of the worker's
// batch, the gradients are averaged over the group every step, and the identical
// AdamW step keeps θ_local the same on every rank. At the round's end each rank
// carries its slice s = group.slice(n) of the flat vector:
//
//   trainer.pseudo_gradient(outer.theta(), delta.subspan(s.begin, s.size()), s.begin);
//   averager.average({that slice}, ...);      // rank r of every worker: G butterflies
//   outer.step(that slice, s.begin);          // θ and momentum of the slice only
//   trainer.gather_outer_state(outer);        // θ whole again on every rank, loaded
//
// All of it is elementwise, so with fp32 compression the slices give θ bit for bit as
// the unsliced round (SlicedRound.EqualsTheWholeRound); lossy codecs move the
// collective's part owners, so there the bits differ by their rounding (every rank of
// every worker still agrees).
//
// Devices: the trainer's model, its flat parameter and gradient buffers, the
// AdamW moments and the batches live on its device (the CPU by default); the
// outer state stays in host memory, fp32, whatever the device: the all-reduce,
// θ's hash and checkpoints work on host memory. A round costs one copy each way:
// pseudo_gradient() device → host into the averager's buffer, load_parameters()
// host → device. Checkpoints hold CPU tensors and load onto any device.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "diloco/data/data.hpp"
#include "diloco/job/config.hpp"
#include "diloco/model/model.hpp"
#include "diloco/model/trainable_model.hpp"
#include "diloco/round/host_staging.hpp"
#include "diloco/round/local_group.hpp"

namespace loco::diloco {

// What a save() puts in the archive in place of one of its tensors (a CPU copy of it); none:
// the tensor itself (a device's tensor is copied to the CPU either way).
using ArchiveCopy = std::function<torch::Tensor(const torch::Tensor&)>;

// Learning rate of inner step `step` (0-based) out of `total`: linear warmup
// from lr/warmup to lr over `warmup` steps, then cosine decay to lr * min_lr_ratio.
double inner_lr(const InnerConfig& c, std::int64_t step, std::int64_t total);

// One AdamW step over flat fp32 buffers, the arithmetic of torch.optim.AdamW, with
// decoupled weight decay where `decay_mask` is 1; `step` counts this step (1 for the
// first, for the bias correction); `denom` is scratch. The inner step of InnerTrainer
// (exposed for bench/adamw, which compares it with LibTorch's fused and foreach AdamW).
void adamw_flat_step(torch::Tensor& params, const torch::Tensor& grads, torch::Tensor& exp_avg,
                     torch::Tensor& exp_avg_sq, const torch::Tensor& decay_mask,
                     torch::Tensor& denom, const InnerConfig& c, double lr, std::int64_t step);

// A 64-bit hash of a contiguous tensor's bytes (4 lanes of 8-byte words, then
// the tail byte-wise): equal hashes across workers mean bit-identical θ.
std::uint64_t tensor_hash(const torch::Tensor& t);

struct InnerStats {
  int steps = 0;
  double mean_loss = 0;  // mean training loss over the steps
  double last_loss = 0;
  double last_lr = 0;
  double grad_norm = 0;  // of the last step, before clipping
  // A step's loss or gradient norm was not finite: that step was not taken (parameters and
  // AdamW moments as after the step before) and the call stopped there (`steps` counts it).
  bool diverged = false;
};

class OuterOptimizer;

class InnerTrainer {
 public:
  // Builds the model from cfg.model with deterministic weights from cfg.seed (a TorchScript
  // module: the file's; make_model), and puts every parameter into one flat fp32 buffer
  // (views: no copies, in the model's named_parameters() order),
  // and packs the gradients into another after each backward, so that
  // pseudo-gradients, AdamW and clipping each run over one contiguous vector. `stream` separates
  // the data streams of workers; `total_steps` is the length of the learning-rate schedule.
  // Weights are initialised on the CPU (the same on every device), then moved to `device`.
  //
  // With `group` (not owned; it outlives the trainer) this trainer is local rank
  // group->rank() of group->size(): it reads windows [rank · B, (rank + 1) · B) of each of
  // the worker's batches of inner.batch_size = G · B sequences (B split into grad_accum
  // micro-batches) and averages its gradients over the group before each AdamW step: the
  // worker's step is one rank's step on the whole batch, to float rounding. The group's
  // backend must suit `device` (gloo: CPU; nccl: CUDA). A one-rank group computes bit for
  // bit what no group does.
  InnerTrainer(const JobConfig& cfg, const TokenStore& store, std::vector<int> shards,
               std::uint64_t stream, std::int64_t total_steps, torch::Device device = torch::kCPU,
               LocalGroup* group = nullptr);
  InnerTrainer(const InnerTrainer&) = delete;
  InnerTrainer& operator=(const InnerTrainer&) = delete;

  // h inner steps on this worker's shards, fewer when one diverges (InnerStats::diverged).
  // Inner optimizer state persists across calls.
  // With precision bf16 the forward passes run under autocast; parameters, gradients and
  // AdamW moments stay fp32 either way.
  InnerStats run_inner_steps(int h);
  // The seconds of one inner step's forward and backward passes on a batch of the job's shape
  // (token 0 throughout), the least of `repeats` (the first pays for the allocator's warm-up):
  // what inner.budget: time sizes a job's first round by, before any round is measured. Leaves
  // everything a step depends on as it was: the model runs in eval mode (no dropout, so no
  // random draws; buffers such as BatchNorm's keep their values), the data stream does not
  // move, and the gradients are dropped. The optimizer's own step is not timed (small beside
  // the passes; a budget a little short of H steps costs less than one that waits).
  double measure_step_seconds(int repeats = 2);

  // out[i] = theta_global[begin + i] − θ_local[begin + i], written straight into `out`
  // (host memory: the buffer that the averager then works on), for the slice
  // [begin, begin + out.size()) of the flat vector (a local rank's; all of it by
  // default). theta_global: host, fp32, whole. On a GPU, θ_local's slice comes to the host in
  // pinned chunks (HostStaging), each subtracted into `out` while the next is copied.
  void pseudo_gradient(const torch::Tensor& theta_global, std::span<float> out,
                       std::int64_t begin = 0) const;
  // θ_local ← theta (a flat fp32 tensor of parameter_count() elements, any device).
  void load_parameters(const torch::Tensor& theta);
  // Streaming DiLoCo's merge of a fragment that synchronized: on `ranges` of the flat vector,
  // θ_local ← mix · θ_local + (1 − mix) · theta (host, whole); mix 0 copies theta's bytes.
  void merge_parameters(const torch::Tensor& theta, const std::vector<Range>& ranges, double mix);
  // sync.mode eager: the local parameters, started from `provisional`, move by what θ moved
  // since: θ_local += theta − provisional (host tensors of θ's size).
  void correct_parameters(const torch::Tensor& theta, const torch::Tensor& provisional);
  // The validation loss (as evaluate) of the parameters `theta` (host, whole) instead of
  // θ_local, which is put back after.
  double evaluate_parameters(const torch::Tensor& theta, const torch::Tensor& windows);
  // The end of a sliced round (see the top of this file): each rank of the trainer's
  // group holds the outer step's result for its slice of outer.theta() (and, with
  // `momentum`, of outer.momentum()); gathers the slices over the group, through this
  // trainer's device buffers (θ_local, and the gradient buffer as scratch), so that every
  // rank's θ_local and outer θ (and momentum) hold every slice. Without `momentum`, each
  // rank's momentum is right on its own slice only: enough for the next sliced step, not
  // for a checkpoint. Without a group, or with one rank: load_parameters(outer.theta()).
  void gather_outer_state(OuterOptimizer& outer, bool momentum = false);
  LocalGroup* group() const { return group_; }

  // Mean validation loss over `windows` ([n, context + 1] int64, host), in batches
  // of inner.batch_size, in the job's precision. Deterministic.
  double evaluate(const torch::Tensor& windows);

  // The flat parameter buffer, on device(); the model's parameters are views into it.
  const torch::Tensor& flat_parameters() const { return params_; }
  torch::Device device() const { return device_; }
  const torch::Tensor& flat_gradients() const { return grads_; }
  const torch::Tensor& exp_avg() const { return exp_avg_; }
  const torch::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  TrainableModel& model() { return *model_; }
  std::int64_t parameter_count() const { return params_.numel(); }
  std::int64_t step() const { return step_; }
  // A worker that joins mid-job takes the job's place in the learning-rate
  // schedule. Its AdamW moments keep their own count for the bias correction:
  // moments that start at zero are corrected as from step 1; corrected with the
  // job's count, the first steps would be off by (1−β1)/√(1−β2).
  void set_step(std::int64_t step) { step_ = step; }
  std::int64_t adam_steps() const { return adam_steps_; }
  ShardSampler& sampler() { return sampler_; }

  // Inner state: parameters, AdamW moments, step (which fixes the schedule),
  // sampler position and shards. Keys are prefixed with `prefix`. Saved as CPU
  // tensors and loaded onto this trainer's device: archives move between devices.
  // With `copy` the archive holds what it makes of each tensor (a copy, into a buffer the
  // caller keeps), not this trainer's own, so that it can be written on another thread while
  // the inner steps go on.
  void save(torch::serialize::OutputArchive& ar, const std::string& prefix,
            const ArchiveCopy& copy = {}) const;
  void load(torch::serialize::InputArchive& ar, const std::string& prefix);
  // The AdamW moments and their step count alone (keys prefixed with `prefix`, as
  // in save): what a worker that joins a running job copies from a live one, so
  // that its first inner steps are as large as everyone's and not the sign-like
  // steps of fresh moments. load_moments refuses non-finite moments.
  void save_moments(torch::serialize::OutputArchive& ar, const std::string& prefix,
                    const ArchiveCopy& copy = {}) const;
  void load_moments(torch::serialize::InputArchive& ar, const std::string& prefix);

 private:
  // The model's mean loss, under autocast when the job's precision is bf16.
  torch::Tensor forward_loss(const torch::Tensor& idx, const torch::Tensor& targets);

  JobConfig cfg_;
  torch::Device device_;
  LocalGroup* group_ = nullptr;  // local ranks (not owned), or none
  int local_batch_ = 0;          // sequences this rank reads per step: batch_size / G
  std::unique_ptr<TrainableModel> model_;
  ShardSampler sampler_;
  std::int64_t total_steps_;
  std::int64_t step_ = 0;                  // place in the learning-rate schedule
  std::int64_t adam_steps_ = 0;            // steps the AdamW moments have seen (bias correction)
  std::vector<torch::Tensor> param_list_;  // the model's parameters, views into params_
  std::vector<torch::Tensor> grad_views_;  // scratch for packing gradients
  torch::Tensor params_, grads_;           // flat fp32 (grads_: on a GPU only with a group)
  torch::Tensor exp_avg_, exp_avg_sq_;     // AdamW moments, flat fp32
  torch::Tensor decay_mask_;               // 1 where weight decay applies (CPU)
  torch::Tensor denom_;                    // scratch (CPU)
  // On a GPU the inner AdamW is LibTorch's fused kernel (one pass over each tensor instead of
  // seven over the flat buffers), over per-parameter views of the flat buffers in two groups:
  // with weight decay (2+ dimensions) and without. `fused_step_` holds the bias-correction
  // count on the device, one tensor that every view's entry names.
  struct FusedGroup {
    std::vector<std::size_t> index;  // into param_list_
    std::vector<torch::Tensor> params, exp_avg, exp_avg_sq, steps, grads;
  };
  std::array<FusedGroup, 2> fused_;  // [0] with weight decay, [1] without; empty on the CPU
  torch::Tensor fused_step_;
  // One inner step's optimizer on a GPU: the gradient norm (returned) over the gradients as
  // autograd left them (or the group's mean in grads_), then clipping folded into the fused
  // kernel's grad_scale, unless the step diverged (the norm or `loss` not finite).
  double fused_norm();
  void fused_adamw(double norm, double lr);
  torch::Tensor batch_;         // [B, context + 1] int64, reused, host (the sampler fills it)
  torch::Tensor batch_device_;  // its copy on the device; undefined on the CPU
  mutable HostStaging staging_;  // on a GPU: θ_local out, θ in, through pinned chunks
};

// θ_global and the momentum buffer, fp32, replicated on every worker, always in
// host memory (the all-reduce hands Δ over in host memory, and θ is hashed there).
// θ's validation loss on a model of its own, so that it can run on another thread beside an
// InnerTrainer's steps (a streaming job evaluates the outer θ of a round's end under the next
// round's inner steps): the floats InnerTrainer::evaluate_parameters computes, the same model,
// batches and precision. Building it leaves the global torch RNG as it found it.
class Evaluator {
 public:
  Evaluator(const JobConfig& cfg, torch::Device device);
  // `theta` (host or device, flat fp32, the model's length), `windows` as InnerTrainer::evaluate.
  double evaluate(const torch::Tensor& theta, const torch::Tensor& windows);

 private:
  JobConfig cfg_;
  torch::Device device_;
  std::unique_ptr<TrainableModel> model_;
};

class OuterOptimizer {
 public:
  // theta0: the initial parameters (copied to host memory from any device).
  OuterOptimizer(const OuterConfig& cfg, const torch::Tensor& theta0);

  // One step with the averaged pseudo-gradient Δ (as torch.optim.SGD,
  // dampening 0): buf ← μ buf + Δ; g ← Δ + μ buf (Nesterov) or buf; θ ← θ − lr g.
  // With lr 1 and μ 0 this is plain averaging: θ ← θ − mean(θ − θ_k).
  // `delta` is the slice [begin, begin + delta.size()) of Δ: only that slice of θ and
  // the momentum changes (a local rank's outer step), elementwise as the whole step.
  void step(std::span<const float> delta, std::int64_t begin = 0);
  // A fragment's step (Streaming DiLoCo): `packed` holds its Δ range after range, each range
  // stepped as step() steps a slice, with the fragment's own part of the momentum. The round
  // does not advance: end_round() does, once per H inner steps.
  void step_ranges(std::span<const float> packed, const std::vector<Range>& ranges);
  void end_round() { ++round_; }
  // sync.mode eager: θ as it would be after step_ranges(packed, ranges), the state untouched
  // (the same arithmetic, on copies): a worker's provisional start with its own Δ in place of
  // the average that is still on its way. A new tensor.
  torch::Tensor provisional_ranges(std::span<const float> packed,
                                   const std::vector<Range>& ranges) const;

  // A step taken can be taken back, bit for bit: keep_before_step() copies θ, the momentum
  // and the round (into buffers it reuses), undo_step() puts them back. A worker that stepped
  // when its all-reduce succeeded, while the attempt failed for another member, redoes the
  // round's step from the same state as the others (StreamingRound::land_half).
  void keep_before_step();
  void undo_step();
  // θ, the momentum and the round of `other` (of the same model): a worker's other local ranks
  // after the lead rank's outer step.
  void assign(const OuterOptimizer& other);

  const torch::Tensor& theta() const { return theta_; }
  const torch::Tensor& momentum() const { return momentum_; }
  // For gathering slices stepped by the local ranks (InnerTrainer::gather_outer_state).
  torch::Tensor& mutable_theta() { return theta_; }
  torch::Tensor& mutable_momentum() { return momentum_; }
  std::int64_t round() const { return round_; }
  std::uint64_t theta_hash() const { return tensor_hash(theta_); }

  // `copy`: as InnerTrainer::save.
  void save(torch::serialize::OutputArchive& ar, const std::string& prefix,
            const ArchiveCopy& copy = {}) const;
  void load(torch::serialize::InputArchive& ar, const std::string& prefix);

 private:
  OuterConfig cfg_;
  torch::Tensor theta_, momentum_, scratch_;
  std::int64_t round_ = 0;
  torch::Tensor kept_theta_, kept_momentum_;  // keep_before_step()
  std::int64_t kept_round_ = -1;
};

// Flat fp32 tensor viewing `data` without copying.
torch::Tensor flat_view(std::span<float> data);

}  // namespace loco::diloco
