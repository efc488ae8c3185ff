// The simulator: K DiLoCo workers in one process, through the same
// InnerTrainer / Averager / OuterOptimizer code as a distributed run, plus the
// two baselines that the convergence study compares against.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diloco/data/data.hpp"
#include "diloco/job/config.hpp"
#include "diloco/job/metrics.hpp"
#include "diloco/round/averager.hpp"
#include "diloco/round/codec_plan.hpp"
#include "diloco/round/error_feedback.hpp"
#include "diloco/round/streaming_round.hpp"
#include "diloco/round/trainer.hpp"

namespace loco::diloco {

enum class Mode {
  diloco,  // K workers, H inner steps, then average pseudo-gradients + outer step
  single,  // one worker, the same inner steps per worker, no communication
  ddp,     // data-parallel: one model, K x batch, gradients averaged every step (fp32)
};

struct SimulateOptions {
  int workers = 4;  // K
  Mode mode = Mode::diloco;
  int rounds = 0;  // 0: cfg.total_rounds()
  // G: local ranks per worker (diloco mode, CPU device), as threads over Gloo
  // (local_group.hpp): each worker's inner steps data-parallel over its G ranks, each rank
  // averaging and stepping its slice. 1: the plain path, no group, no threads.
  int local_ranks = 1;
  // Faulty workers (tests and studies of the guard, `loco-train --corrupt R:K:KIND`): worker
  // `worker`'s Δ corrupted (guard::corrupt) in every average from round `from_round` (counted
  // from 0) on. One local rank per worker.
  struct Corruption {
    int from_round = 0;
    int worker = 0;
    guard::Fault fault = guard::Fault::nan;
  };
  std::vector<Corruption> corrupt;
  // The codec of each round (`loco-train --codec-trace`): round r (from 0) runs codec_trace[r]
  // (a CodecChoice's name), rounds past its end the last. Empty: the job's compression (with
  // auto: its start). A distributed job's metrics.jsonl "codec"s replayed give its θ.
  std::vector<std::string> codec_trace;
  // sync.mode streaming and eager: the codec each fragment's operation agreed on, by (round,
  // fragment) from 0 (a job's metrics.jsonl "fragment_codecs"), ahead of codec_trace.
  FragmentCodecTrace fragment_codec_trace;
  // How many workers take their inner steps at once (`loco-train --parallel`), each on the
  // process's torch threads; 1: one after another. The same θ either way: a worker's steps
  // read only its own model, optimizer and data, and a model's forward draws no random numbers.
  int parallel = 1;
};

class Simulator {
 public:
  Simulator(const JobConfig& cfg, SimulateOptions opt);
  ~Simulator();

  // Round 0's metrics (validation loss of the initial θ).
  RoundMetrics initial_metrics();
  // Runs one round (baselines: H steps). Evaluates when eval.every steps have
  // passed since the last evaluation, or on the last round.
  RoundMetrics run_round();
  bool done() const { return round_ >= rounds_; }
  int rounds() const { return rounds_; }
  int round() const { return round_; }
  std::int64_t parameter_count() const;
  std::uint64_t theta_hash() const;
  double evaluate();

  // Starts from the parameters θ held in `checkpoint` (any loco checkpoint:
  // a simulation's, a distributed job's; or "hf:DIR", a Hugging Face folder that
  // `loco export` wrote or transformers saved: initial_theta) instead of cfg.seed's
  // initialisation,
  // as the DiLoCo paper's runs start from one pretrained model: every worker's
  // model and θ_global take them; the outer momentum is zero and the inner
  // AdamW state and schedule start fresh (warmup included). Before the first
  // round only; throws if θ's length is not this model's.
  void init_parameters(const std::string& checkpoint);
  // compression topk or auto: worker k's error feedback set to zero, as a worker that joins
  // starts it (what that costs in loss: `loco-train train --fresh-feedback R:K`). Throws
  // without one.
  void clear_feedback(int worker);

  // Checkpoint of the whole simulation (config, round, outer state, every
  // worker's inner state, counters, torch RNG state), written to a temporary
  // file and renamed. load_checkpoint needs a Simulator built with the same
  // config and options; the continuation is bit-identical.
  void save_checkpoint(const std::string& path) const;
  void load_checkpoint(const std::string& path);

  const JobConfig& config() const { return cfg_; }

 private:
  JobConfig cfg_;
  SimulateOptions opt_;
  TokenStore store_;
  // With G local ranks, rank r of worker k is index k·G + r of the next three.
  std::vector<std::unique_ptr<LocalGroup>> groups_;  // empty when G = 1
  std::vector<std::unique_ptr<InnerTrainer>> trainers_;
  std::vector<std::unique_ptr<OuterOptimizer>> outers_;  // one replica per worker (diloco)
  GuardLog guard_log_;  // the guard's left-outs of the round running (before averager_)
  // The workers whose inner steps diverged in the round running (InnerStats::diverged): they
  // take no more steps in it and abstain from its averages (guard off: the round fails).
  std::vector<bool> diverged_;
  LocalAverager averager_;
  // The codec of the round running (codec_trace, or the job's); of its fragment `fragment`'s
  // operation (fragment_codec_trace, else the round's).
  CodecChoice choice() const;
  CodecChoice choice(int fragment) const;
  torch::Tensor val_windows_;
  int rounds_ = 0;
  int round_ = 0;
  std::int64_t steps_since_eval_ = 0;
  std::uint64_t bytes_ = 0;

  // Runs fn(i) for every rank i of every worker, one thread each; rethrows the first error.
  void on_ranks(const std::function<void(std::size_t)>& fn);
  // diloco, every sync mode (blocking: one fragment landing at once): the round engine that
  // InnerWorker drives too (streaming_round.hpp), over the K replicas (with G local ranks: each
  // worker's rank 0; the others step with it and copy its outer state).
  std::unique_ptr<StreamingRound> streaming_;
  // compression topk or auto: each worker's error feedback (per fragment in streaming and eager).
  std::unique_ptr<ErrorFeedback> feedback_;
  void make_streaming();
  // opt_.corrupt applied to worker k's Δ of fragment f in this round (the blocking round's:
  // fragment 0); a worker that diverged abstains (its Δ is made non-finite for the guard; the
  // guard off, this throws, as the collective refuses NaN).
  void corrupt(std::size_t k, int fragment, std::span<float> delta) const;
  bool corrupts() const;
  // n inner steps of every worker (opt_.parallel at once), but those that diverged in this
  // round (none: 0); each one's mean loss.
  std::vector<double> steps_of_all(int n);
  // A streaming round; returns the mean training loss.
  double run_streaming_round();
  double start_seconds_ = 0;
};

// Reads a checkpoint's job config (for `loco-train generate`).
JobConfig checkpoint_config(const std::string& path);
// What a checkpoint (a job's or the simulator's) says of itself: the job config it was written
// with, its round, and whether it holds an outer state (θ and momentum) a job can resume from.
struct CheckpointInfo {
  JobConfig config;
  std::int64_t round = 0;
  bool outer_state = false;
  std::string codec;  // compression auto: the codec of the round it ends ("": not written)
};
CheckpointInfo checkpoint_info(const std::string& path);
// θ (flat fp32) of a checkpoint: the outer θ, or worker 0's parameters.
torch::Tensor checkpoint_theta(const std::string& path);
// θ to start a job of `cfg` from: "hf:DIR" read with import_hf (hf_format.hpp: config.json
// must describe cfg.model), anything else a loco checkpoint (checkpoint_theta).
torch::Tensor initial_theta(const std::string& init, const JobConfig& cfg);
// Throws std::invalid_argument naming `what` when cfg's model is a TorchScript module: for the
// commands that know the built-in decoder only (export, generate, logits).
void refuse_torchscript(const JobConfig& cfg, const std::string& what);
// Loads θ from a checkpoint into a model built from its config (the built-in decoder's only).
Gpt load_model_from_checkpoint(const std::string& path, JobConfig* cfg_out = nullptr);

}  // namespace loco::diloco
