#include "diloco/round/simulator.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "diloco/model/archive_file.hpp"
#include "diloco/model/hf_format.hpp"
#include "diloco/model/torchscript_model.hpp"

namespace loco::diloco {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The simulator is one process on one host: as a node that offers all of its
// GPUs, its K workers share the first (device: cuda, or auto with CUDA).
torch::Device simulator_device(const JobConfig& cfg) {
  const bool cuda = cfg.device != DeviceKind::cpu && torch::cuda::is_available();
  const DeviceChoice d = choose_device(cfg.device, {0}, cuda,
                                       cuda ? static_cast<int>(torch::cuda::device_count()) : 0);
  return d.cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(d.index))
                : torch::Device(torch::kCPU);
}
// The options of the workers' Communicator that bear on the numbers: the codec.
collective::Options averager_options(const JobConfig& cfg) {
  collective::Options o;
  o.codec = cfg.compression;
  return o;
}
}  // namespace

Simulator::Simulator(const JobConfig& cfg, SimulateOptions opt)
    : cfg_(cfg),
      opt_(opt),
      store_(TokenStore::open(cfg.data, cfg.vocab_size())),
      averager_(averager_options(cfg), cfg.guard, &guard_log_) {
  if (opt_.workers < 1)
    throw std::invalid_argument("--simulate: K must be >= 1, got " + std::to_string(opt_.workers));
  // A TorchScript module's hash and size go into the job (and its checkpoints) before the
  // workers load it.
  if (cfg_.model.is_torchscript()) describe_torchscript(cfg_);
  rounds_ = opt_.rounds > 0 ? opt_.rounds : cfg_.total_rounds();
  const std::int64_t total_steps = static_cast<std::int64_t>(rounds_) * cfg_.inner.steps;
  if (cfg_.data.shards < opt_.workers)
    throw std::invalid_argument("data.shards: must be >= the number of workers (" +
                                std::to_string(opt_.workers) + "), got " +
                                std::to_string(cfg_.data.shards));
  const torch::Device device = simulator_device(cfg_);
  std::vector<int> all(static_cast<std::size_t>(cfg_.data.shards));
  for (int s = 0; s < cfg_.data.shards; ++s) all[static_cast<std::size_t>(s)] = s;
  const int g = opt_.local_ranks;
  if (g < 1) throw std::invalid_argument("local ranks: must be >= 1, got " + std::to_string(g));
  if (g > 1 && (opt_.mode != Mode::diloco || !device.is_cpu()))
    throw std::invalid_argument(
        "local ranks: " + std::to_string(g) +
        " per worker run in diloco mode on the CPU only (Gloo ranks as threads); the "
        "simulator's workers share one GPU, and NCCL ranks need a GPU each");
  if (g > 1) {
    // Each worker's ranks join their own group concurrently (joining blocks until all have),
    // then build their trainers: rank r reads its 1/G of the worker's batch.
    const auto k = static_cast<std::size_t>(opt_.workers);
    const auto gs = static_cast<std::size_t>(g);
    std::vector<c10::intrusive_ptr<c10d::Store>> stores;
    for (std::size_t w = 0; w < k; ++w) stores.push_back(c10::make_intrusive<c10d::HashStore>());
    groups_.resize(k * gs);
    trainers_.resize(k * gs);
    outers_.resize(k * gs);
    on_ranks([&](std::size_t i) {
      const int w = static_cast<int>(i / gs), r = static_cast<int>(i % gs);
      groups_[i] = std::make_unique<LocalGroup>(stores[i / gs], r, g, LocalBackend::gloo);
      trainers_[i] = std::make_unique<InnerTrainer>(
          cfg_, store_, round_robin_shards(cfg_.data.shards, w, opt_.workers),
          static_cast<std::uint64_t>(w), total_steps, device, groups_[i].get());
      outers_[i] = std::make_unique<OuterOptimizer>(cfg_.outer_step(), trainers_[i]->flat_parameters());
    });
  } else if (opt_.mode == Mode::diloco) {
    for (int k = 0; k < opt_.workers; ++k) {
      trainers_.push_back(std::make_unique<InnerTrainer>(
          cfg_, store_, round_robin_shards(cfg_.data.shards, k, opt_.workers),
          static_cast<std::uint64_t>(k), total_steps, device));
      outers_.push_back(
          std::make_unique<OuterOptimizer>(cfg_.outer_step(), trainers_.back()->flat_parameters()));
    }
  } else {
    JobConfig c = cfg_;
    if (opt_.mode == Mode::ddp) {
      // K workers' batches in one step: the same gradient as K workers averaging theirs.
      c.inner.batch_size *= opt_.workers;
      c.inner.grad_accum *= opt_.workers;
    }
    trainers_.push_back(std::make_unique<InnerTrainer>(c, store_, all, 0, total_steps, device));
  }
  if (cfg_.sync.mode != SyncMode::blocking && (opt_.mode != Mode::diloco || g > 1))
    throw std::invalid_argument(
        "sync.mode: streaming and eager run in diloco mode with one rank per worker (the "
        "baselines and --local-ranks run blocking)");
  // Every sync mode's rounds run on the round engine (blocking: one fragment, landing at once),
  // with G local ranks too (the engine steps each worker's rank 0; each rank averages its slice).
  if (opt_.mode == Mode::diloco) make_streaming();
  for (const auto& c : opt_.corrupt)
    if (c.worker < 0 || c.worker >= opt_.workers || g > 1 || c.from_round < 0)
      throw std::invalid_argument("--corrupt: worker " + std::to_string(c.worker) + " of " +
                                  std::to_string(opt_.workers) + " from round " +
                                  std::to_string(c.from_round) + " (one local rank per worker)");
  std::vector<std::string> traced = opt_.codec_trace;
  for (const auto& [at, c] : opt_.fragment_codec_trace) traced.push_back(c);
  for (const std::string& c : traced) {
    const auto choice = parse_choice(c);
    if (!choice || (choice->sparse() && !cfg_.keeps_feedback()))
      throw std::invalid_argument("--codec-trace: '" + c.substr(0, 24) + "' is not a codec " +
                                  "this job can run (fp32|fp16|bf16|int8" +
                                  (cfg_.keeps_feedback() ? "|topk:K" : "") + "; compression " +
                                  cfg_.compression_name() + ")");
  }
  if (cfg_.keeps_feedback() && opt_.mode == Mode::diloco) {
    if (g > 1)
      throw std::invalid_argument("compression: topk runs one local rank per worker (got " +
                                  std::to_string(g) + ")");
    std::vector<std::size_t> sizes;
    if (streaming_)
      for (int f = 0; f < streaming_->schedule().fragments(); ++f)
        sizes.push_back(static_cast<std::size_t>(streaming_->fragment_size(f)));
    else
      sizes.push_back(static_cast<std::size_t>(parameter_count()));
    feedback_ = std::make_unique<ErrorFeedback>(cfg_.topk, sizes, trainers_.size());
  }
  const int n = cfg_.eval.batches * cfg_.inner.batch_size;
  val_windows_ = torch::empty({n, cfg_.model.context + 1}, torch::kInt64);
  validation_windows(
      store_, cfg_.model.context, n,
      {val_windows_.data_ptr<std::int64_t>(), static_cast<std::size_t>(val_windows_.numel())});
  start_seconds_ = now_seconds();
}

Simulator::~Simulator() = default;

void Simulator::make_streaming() {
  std::vector<Replica> replicas;
  const auto gs = static_cast<std::size_t>(opt_.local_ranks);
  for (std::size_t k = 0; k < trainers_.size(); k += gs)
    replicas.push_back({trainers_[k].get(), outers_[k].get()});
  const int fragments = cfg_.sync.mode == SyncMode::blocking ? 1 : cfg_.sync.fragments;
  streaming_ = std::make_unique<StreamingRound>(
      cfg_, trainers_[0]->model().fragments(fragments), replicas);
}

bool Simulator::corrupts() const {
  return !opt_.corrupt.empty() || std::find(diverged_.begin(), diverged_.end(), true) != diverged_.end();
}

std::vector<double> Simulator::steps_of_all(int n) {
  const std::size_t k = trainers_.size();
  if (diverged_.size() != k) diverged_.assign(k, false);
  std::vector<InnerStats> st(k);
  const std::vector<bool> skip = diverged_;  // vector<bool>: written only after the threads
  in_parallel(k, static_cast<std::size_t>(opt_.parallel), [&](std::size_t i) {
    if (!skip[i]) st[i] = trainers_[i]->run_inner_steps(n);
  });
  std::vector<double> loss(k, 0.0);
  for (std::size_t i = 0; i < k; ++i) {
    if (skip[i]) continue;
    if (st[i].diverged) diverged_[i] = true;
    loss[i] = st[i].mean_loss;
  }
  return loss;
}

void Simulator::corrupt(std::size_t k, int fragment, std::span<float> delta) const {
  if (k < diverged_.size() && diverged_[k]) {
    if (!cfg_.guard.on)
      throw std::runtime_error("simulator: worker " + std::to_string(k) +
                               "'s inner loss became non-finite in round " +
                               std::to_string(round_ + 1) + " (the guard is off)");
    if (!delta.empty()) delta[0] = std::numeric_limits<float>::quiet_NaN();
  }
  for (const auto& c : opt_.corrupt)
    if (static_cast<std::size_t>(c.worker) == k && round_ >= c.from_round)
      guard::corrupt(delta, c.fault,
                     (static_cast<std::uint64_t>(round_) << 32) ^
                         (static_cast<std::uint64_t>(fragment) << 16) ^ k);
}

void Simulator::on_ranks(const std::function<void(std::size_t)>& fn) {
  diloco::on_ranks(static_cast<std::size_t>(opt_.workers * opt_.local_ranks), fn);
}

double Simulator::run_streaming_round() {
  // The K workers' steps between two events; the bytes of each average as it starts (the
  // local averager's are known at once).
  // A replica's mean loss over the round: its steps' means weighted by their counts, or, when
  // it took all H steps in one call (a blocking round), that call's mean as it is.
  // With G local ranks a worker's ranks step together (their gradients averaged every step,
  // so their parameters stay equal), rank 0's loss the worker's.
  struct Steps final : StreamingRound::Driver {
    Simulator& sim;
    std::vector<double> weighted, last;
    std::vector<int> calls;
    explicit Steps(Simulator& s)
        : sim(s),
          weighted(static_cast<std::size_t>(s.opt_.workers), 0.0),
          last(weighted.size(), 0.0),
          calls(weighted.size(), 0) {}
    void steps(std::int64_t, int n) override {
      const auto gs = static_cast<std::size_t>(sim.opt_.local_ranks);
      std::vector<double> rank_loss(sim.trainers_.size());
      if (gs > 1)
        sim.on_ranks([&](std::size_t i) {
          rank_loss[i] = sim.trainers_[i]->run_inner_steps(n).mean_loss;
        });
      else
        rank_loss = sim.steps_of_all(n);
      for (std::size_t k = 0; k < weighted.size(); ++k) {
        last[k] = rank_loss[k * gs];
        weighted[k] += last[k] * n;
        ++calls[k];
      }
    }
    double mean(std::size_t k, int h) const { return calls[k] == 1 ? last[k] : weighted[k] / h; }
  } steps(*this);
  struct Counted final : FragmentAverager {
    FragmentAverager& local;
    std::uint64_t& bytes;
    Counted(FragmentAverager& l, std::uint64_t& b) : local(l), bytes(b) {}
    std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                            std::span<const std::span<const float>> deltas,
                                            std::span<const std::span<float>> means) override {
      auto done = local.start(op, fragment, deltas, means);
      bytes += done.get();
      return done;
    }
  };
  // opt_.corrupt: the faulty workers' Δ replaced by a corrupted copy on the way in.
  struct Corrupted final : FragmentAverager {
    FragmentAverager& next;
    const Simulator& sim;
    std::vector<std::vector<float>> copies;
    Corrupted(FragmentAverager& n, const Simulator& s) : next(n), sim(s) {}
    std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                            std::span<const std::span<const float>> deltas,
                                            std::span<const std::span<float>> means) override {
      if (!sim.corrupts()) return next.start(op, fragment, deltas, means);
      std::vector<std::span<const float>> in(deltas.begin(), deltas.end());
      copies.resize(deltas.size());
      for (std::size_t k = 0; k < deltas.size(); ++k) {
        copies[k].assign(deltas[k].begin(), deltas[k].end());
        sim.corrupt(k, fragment, copies[k]);
        in[k] = copies[k];
      }
      return next.start(op, fragment, in, means);
    }
  };
  // G local ranks: rank r of every worker averages slice r of Δ (local_slice), as a worker's
  // rank r does over its own communicator.
  struct Sliced final : FragmentAverager {
    FragmentAverager& each;
    int ranks;
    Sliced(FragmentAverager& e, int g) : each(e), ranks(g) {}
    std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                            std::span<const std::span<const float>> deltas,
                                            std::span<const std::span<float>> means) override {
      std::uint64_t bytes = 0;
      const auto n = static_cast<std::int64_t>(deltas[0].size());
      for (int r = 0; r < ranks; ++r) {
        const Slice s = local_slice(n, r, ranks);
        const auto at = static_cast<std::size_t>(s.begin), len = static_cast<std::size_t>(s.size());
        std::vector<std::span<const float>> in;
        std::vector<std::span<float>> out;
        for (std::size_t k = 0; k < deltas.size(); ++k) {
          in.push_back(deltas[k].subspan(at, len));
          out.push_back(means[k].subspan(at, len));
        }
        bytes += each.start(op, fragment, in, out).get();
      }
      std::promise<std::uint64_t> done;
      done.set_value(bytes);
      return done.get_future().share();
    }
  };
  std::optional<LocalSparseAverager> sparse;
  if (feedback_) {
    sparse.emplace(*feedback_, cfg_.guard, &guard_log_);
    sparse->choose(choice(), cfg_.autocodec.flush);
  }
  averager_.set_codec(choice().dense);
  // Each fragment's operation with its own codec (fragment_codec_trace: what a job's members
  // agreed on as it began), chosen as it starts.
  struct Chosen final : FragmentAverager {
    Simulator& sim;
    LocalSparseAverager* sparse;
    Chosen(Simulator& s, LocalSparseAverager* sp) : sim(s), sparse(sp) {}
    std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                            std::span<const std::span<const float>> deltas,
                                            std::span<const std::span<float>> means) override {
      const CodecChoice c = sim.choice(fragment);
      sim.averager_.set_codec(c.dense);
      if (!sparse) return sim.averager_.start(op, fragment, deltas, means);
      sparse->choose(c, sim.cfg_.autocodec.flush);
      return sparse->start(op, fragment, deltas, means);
    }
  } chosen(*this, sparse ? &*sparse : nullptr);
  Corrupted corrupted(chosen, *this);
  Sliced sliced(averager_, opt_.local_ranks);
  Counted averager(opt_.local_ranks > 1 ? static_cast<FragmentAverager&>(sliced) : corrupted,
                   bytes_);
  StreamingRound::Round r;
  r.round = round_;
  r.last = round_ + 1 >= rounds_;
  streaming_->run(r, averager, steps);
  // The other ranks of each worker take its rank 0's outer state (whole: for checkpoints).
  const auto gs = static_cast<std::size_t>(opt_.local_ranks);
  for (std::size_t i = 0; i < trainers_.size(); ++i)
    if (i % gs != 0) {
      outers_[i]->assign(*outers_[i - i % gs]);
      trainers_[i]->load_parameters(outers_[i]->theta());
    }
  double mean = 0;
  for (std::size_t k = 0; k < steps.weighted.size(); ++k) mean += steps.mean(k, cfg_.inner.steps);
  return mean / static_cast<double>(steps.weighted.size());
}

std::int64_t Simulator::parameter_count() const { return trainers_[0]->parameter_count(); }

std::uint64_t Simulator::theta_hash() const {
  return opt_.mode == Mode::diloco ? outers_[0]->theta_hash()
                                   : tensor_hash(trainers_[0]->flat_parameters().cpu());
}

double Simulator::evaluate() {
  // Streaming and eager: the outer θ, which no worker's parameters equal while the workers'
  // own steps are not yet replaced by the average's.
  if (cfg_.sync.mode != SyncMode::blocking)
    return trainers_[0]->evaluate_parameters(outers_[0]->theta(), val_windows_);
  return trainers_[0]->evaluate(val_windows_);
}

RoundMetrics Simulator::initial_metrics() {
  RoundMetrics m;
  m.val_loss = evaluate();
  m.theta_hash = theta_hash();
  m.seconds = now_seconds() - start_seconds_;
  return m;
}

CodecChoice Simulator::choice() const {
  if (!opt_.codec_trace.empty()) {
    const auto i = std::min(static_cast<std::size_t>(round_), opt_.codec_trace.size() - 1);
    return *parse_choice(opt_.codec_trace[i]);  // checked at construction
  }
  if (cfg_.autocodec.on)
    if (auto c = parse_choice(cfg_.autocodec.start); c && (!c->sparse() || feedback_)) return *c;
  return fixed_choice(cfg_);
}

CodecChoice Simulator::choice(int fragment) const {
  const auto it = opt_.fragment_codec_trace.find({round_, fragment});
  if (it != opt_.fragment_codec_trace.end()) return *parse_choice(it->second);  // checked
  return choice();
}

RoundMetrics Simulator::run_round() {
  const int h = cfg_.inner.steps;
  // compression auto or a trace: metrics.jsonl says each round's codec.
  const std::string ran =
      streaming_ && (cfg_.autocodec.on || !opt_.codec_trace.empty()) ? choice().name() : "";
  const int k = opt_.workers;
  const std::int64_t n = parameter_count();
  double loss = 0;
  if (streaming_) {  // diloco: every sync mode on the round engine
    loss = run_streaming_round();
    // With G local ranks every rank's parameters are θ again too (blocking only).
    const auto h0 = outers_[0]->theta_hash();
    const auto gs = static_cast<std::size_t>(opt_.local_ranks);
    for (std::size_t i = 1; i < outers_.size(); ++i)
      if (outers_[i]->theta_hash() != h0 ||
          (gs > 1 && tensor_hash(trainers_[i]->flat_parameters()) != h0))
        throw std::runtime_error("simulator: " +
                                 (gs > 1 ? "rank " + std::to_string(i % gs) + " of worker "
                                         : std::string("worker ")) +
                                 std::to_string(i / gs) + " holds a different θ after round " +
                                 std::to_string(round_ + 1));
  } else {
    loss = trainers_[0]->run_inner_steps(h).mean_loss;
    if (opt_.mode == Mode::ddp)
      bytes_ += static_cast<std::uint64_t>(h) *
                allreduce_bytes_per_member(static_cast<std::size_t>(n), k, collective::Codec::fp32);
  }
  diverged_.assign(trainers_.size(), false);
  ++round_;
  steps_since_eval_ += h;
  RoundMetrics m;
  if (!ran.empty()) m.codec = ran;
  m.round = round_;
  m.inner_steps = static_cast<std::int64_t>(round_) * h;
  m.tokens_per_worker = m.inner_steps * cfg_.tokens_per_inner_step();
  m.tokens_total = m.tokens_per_worker * (opt_.mode == Mode::single ? 1 : k);
  m.train_loss = loss;
  m.bytes_per_worker = bytes_;
  if (const GuardLog::Margins g = guard_log_.take_margins(); g.norm_ratio > 0) {
    m.guard_norm_ratio = g.norm_ratio;
    m.guard_agreement = g.agreement;
  }
  if (auto left = guard_log_.take(); !left.empty()) {
    m.left_out.emplace();
    for (const LeftOut& l : left)
      m.left_out->push_back({std::stoi(l.member), l.fragment, l.rule, l.why});
  }
  if (steps_since_eval_ >= cfg_.eval.every || done()) {
    m.val_loss = evaluate();
    steps_since_eval_ = 0;
  }
  m.theta_hash = theta_hash();
  m.seconds = now_seconds() - start_seconds_;
  return m;
}

void Simulator::clear_feedback(int worker) {
  if (!feedback_)
    throw std::invalid_argument("--fresh-feedback: the job's compression keeps no error feedback "
                                "(topk, or auto down to topk)");
  if (worker < 0 || worker >= opt_.workers)
    throw std::invalid_argument("--fresh-feedback: worker " + std::to_string(worker) + " of " +
                                std::to_string(opt_.workers));
  feedback_->clear(static_cast<std::size_t>(worker));
}

void Simulator::init_parameters(const std::string& checkpoint) {
  if (round_ != 0)
    throw std::logic_error("Simulator::init_parameters: after round " + std::to_string(round_));
  const torch::Tensor theta = initial_theta(checkpoint, cfg_);
  if (theta.numel() != parameter_count())
    throw std::invalid_argument("--init " + checkpoint + ": θ has " +
                                std::to_string(theta.numel()) + " parameters, this job's model " +
                                std::to_string(parameter_count()) + " (model config differs?)");
  for (auto& t : trainers_) t->load_parameters(theta);
  for (auto& o : outers_) o = std::make_unique<OuterOptimizer>(cfg_.outer_step(), theta);
  if (streaming_) make_streaming();  // over the new outer states
}

void Simulator::save_checkpoint(const std::string& path) const {
  torch::serialize::OutputArchive ar;
  ar.write("config", c10::IValue(cfg_.to_yaml()));
  ar.write("mode", c10::IValue(static_cast<std::int64_t>(opt_.mode)));
  ar.write("workers", c10::IValue(static_cast<std::int64_t>(opt_.workers)));
  ar.write("round", c10::IValue(static_cast<std::int64_t>(round_)));
  ar.write("steps_since_eval", c10::IValue(steps_since_eval_));
  ar.write("bytes", c10::IValue(static_cast<std::int64_t>(bytes_)));
  ar.write("rng", at::detail::getDefaultCPUGenerator().get_state());
  if (!outers_.empty()) outers_[0]->save(ar, "outer.");
  // A worker's ranks hold the same inner state (θ_local, moments, step, sampler): rank 0's.
  const auto gs = static_cast<std::size_t>(opt_.local_ranks);
  for (std::size_t i = 0; i < trainers_.size(); i += gs)
    trainers_[i]->save(ar, "worker." + std::to_string(i / gs) + ".");
  if (feedback_)
    for (std::size_t k = 0; k < trainers_.size(); ++k)
      feedback_->save(ar, "worker." + std::to_string(k) + ".error_feedback.", k);
  // Streaming: the fragments on their way, with their averages.
  // Blocking: nothing is in flight at a round's end, and its checkpoints keep their keys.
  if (streaming_ && cfg_.sync.mode != SyncMode::blocking) streaming_->write_in_flight(ar);
  write_archive(ar, path);
}

void Simulator::load_checkpoint(const std::string& path) {
  torch::serialize::InputArchive ar;
  read_archive(ar, path);
  c10::IValue v;
  ar.read("config", v);
  const ModelConfig model = JobConfig::from_yaml(v.toStringRef()).model;
  if (const std::string d = model_difference(model, cfg_.model); !d.empty())
    throw std::runtime_error("checkpoint " + path + " is of another model: " + d);
  ar.read("mode", v);
  const auto mode = v.toInt();
  ar.read("workers", v);
  const auto workers = v.toInt();
  if (mode != static_cast<std::int64_t>(opt_.mode) || workers != opt_.workers)
    throw std::runtime_error("checkpoint " + path + " is of another simulation (mode " +
                             std::to_string(mode) + ", " + std::to_string(workers) + " workers)");
  ar.read("round", v);
  round_ = static_cast<int>(v.toInt());
  ar.read("steps_since_eval", v);
  steps_since_eval_ = v.toInt();
  ar.read("bytes", v);
  bytes_ = static_cast<std::uint64_t>(v.toInt());
  torch::Tensor rng;
  ar.read("rng", rng);
  auto gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rng);
  for (auto& o : outers_) o->load(ar, "outer.");
  const auto gs = static_cast<std::size_t>(opt_.local_ranks);
  for (std::size_t i = 0; i < trainers_.size(); ++i)
    trainers_[i]->load(ar, "worker." + std::to_string(i / gs) + ".");
  if (feedback_)
    for (std::size_t k = 0; k < trainers_.size(); ++k)
      feedback_->load(ar, "worker." + std::to_string(k) + ".error_feedback.", k);
  if (streaming_) streaming_->read_in_flight(ar);
}

namespace {

JobConfig read_config(torch::serialize::InputArchive& ar) {
  c10::IValue v;
  ar.read("config", v);
  return JobConfig::from_yaml(v.toStringRef());
}

torch::Tensor read_theta(torch::serialize::InputArchive& ar, const std::string& path) {
  torch::Tensor theta;
  if (!ar.try_read("outer.theta", theta)) ar.read("worker.0.params", theta);
  TORCH_CHECK(theta.dim() == 1 && theta.scalar_type() == torch::kFloat32, "checkpoint ", path,
              ": θ is not a flat fp32 tensor");
  return theta.contiguous();
}

}  // namespace

void refuse_torchscript(const JobConfig& cfg, const std::string& what) {
  if (cfg.model.is_torchscript())
    throw std::invalid_argument(
        what + ": the model is a TorchScript module (model.torchscript " + cfg.model.torchscript +
        "): Hugging Face export, generate and logits know the built-in decoder only; θ is the " +
        "checkpoint's outer.theta, the module's parameters flat in named_parameters() order");
}

JobConfig checkpoint_config(const std::string& path) {
  torch::serialize::InputArchive ar;
  read_archive(ar, path);
  return read_config(ar);
}

CheckpointInfo checkpoint_info(const std::string& path) {
  torch::serialize::InputArchive ar;
  read_archive(ar, path);
  CheckpointInfo info;
  info.config = read_config(ar);
  c10::IValue round;
  if (ar.try_read("round", round) && round.isInt()) info.round = round.toInt();
  torch::Tensor theta;
  info.outer_state = ar.try_read("outer.theta", theta);
  c10::IValue codec;
  if (ar.try_read("codec", codec) && codec.isString()) info.codec = codec.toStringRef().substr(0, 24);
  return info;
}

torch::Tensor checkpoint_theta(const std::string& path) {
  torch::serialize::InputArchive ar;
  read_archive(ar, path);
  return read_theta(ar, path);
}

torch::Tensor initial_theta(const std::string& init, const JobConfig& cfg) {
  const std::string dir = hf_init_dir(init);
  if (dir.empty()) return checkpoint_theta(init);
  if (cfg.model.is_torchscript())
    throw std::invalid_argument("--init " + init + ": a Hugging Face folder holds the built-in " +
                                "model, not model.torchscript's module (its file holds its θ0)");
  auto values = import_hf(dir, cfg.model, cfg.vocab_size());
  return torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())},
                          torch::kFloat32)
      .clone();
}

Gpt load_model_from_checkpoint(const std::string& path, JobConfig* cfg_out) {
  torch::serialize::InputArchive ar;
  read_archive(ar, path);
  const JobConfig cfg = read_config(ar);
  refuse_torchscript(cfg, "checkpoint " + path);
  Gpt model(cfg.model, cfg.vocab_size());
  const torch::Tensor theta = read_theta(ar, path);
  torch::NoGradGuard no_grad;
  std::int64_t off = 0;
  for (auto& p : model->parameters()) {
    const auto k = p.numel();
    p.copy_(theta.slice(0, off, off + k).view(p.sizes()));
    off += k;
  }
  TORCH_CHECK(off == theta.numel(), "checkpoint ", path, ": θ has ", theta.numel(),
              " elements, the model ", off);
  if (cfg_out) *cfg_out = cfg;
  return model;
}

}  // namespace loco::diloco
