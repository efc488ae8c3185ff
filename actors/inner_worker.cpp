#include "actors/inner_worker_state.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

namespace loco::actors {

dl::DataConfig resolve_job_data(const PathRoots& roots, dl::DataConfig d) {
  d.dir = resolve_data_path(roots, d.dir, "data.dir");
  if (d.tokenizer == dl::TokenizerKind::json)
    d.tokenizer_json = resolve_data_path(roots, d.tokenizer_json, "data.tokenizer");
  return d;
}

namespace {

// The devices of a worker's G ranks: the GPUs the head gave its actor, one each and all
// different (NCCL puts one rank on a GPU), or the CPU G times.
std::vector<torch::Device> rank_devices(const dl::DeviceChoice& choice,
                                        const std::vector<int>& gpus, int g) {
  if (!choice.cuda) return std::vector<torch::Device>(size_t(g), torch::Device(torch::kCPU));
  if (int(gpus.size()) < g)
    throw dl::ConfigError("workers.gpus: " + std::to_string(g) + " ranks, but the runtime gave " +
                          "this worker " + std::to_string(gpus.size()) + " GPU(s)");
  std::vector<torch::Device> out;
  const int visible = int(torch::cuda::device_count());
  for (int r = 0; r < g; ++r) {
    const int gpu = gpus[size_t(r)];
    if (gpu < 0 || gpu >= visible)
      throw dl::ConfigError("device: GPU index " + std::to_string(gpu) +
                            " was assigned, but this process sees " + std::to_string(visible) +
                            " CUDA device(s)");
    if (std::find(gpus.begin(), gpus.begin() + r, gpu) != gpus.begin() + r)
      throw dl::ConfigError("workers.gpus: " + std::to_string(g) +
                            " ranks need as many different GPUs (one NCCL rank per GPU), but GPU " +
                            std::to_string(gpu) + " was given twice (workers.share_gpu?)");
    out.emplace_back(torch::kCUDA, c10::DeviceIndex(gpu));
  }
  return out;
}

}  // namespace

namespace {

// The join state of live member init.source (or its mid-round snapshot, `offer`), straight
// from it (idle between rounds), in parts with a few in flight: on a slow link one 100 MB
// reply would hold up the heartbeats behind it past the detection time. Parts are sized to
// about 100 ms of the measured rate (128 KB to 16 MB), so at most ~0.4 s of data is ever queued
// ahead. The size it announces and each part's are checked before they are used.
std::string copy_join_state(const WorkerInit& init, const std::optional<JoinOffer>& offer,
                            int64_t max_bytes) {
  constexpr size_t kInFlight = 4;
  auto src = Runtime::current().get_actor<InnerWorker>(init.source);
  auto part_of = [&](int64_t at, int64_t len) {
    return offer ? src.call(&InnerWorker::snapshot_part, init.round, offer->step, at, len)
                 : src.call(&InnerWorker::join_state_part, init.round, at, len);
  };
  const int64_t total =
      offer ? offer->bytes
            : src.call(&InnerWorker::join_state_size, init.round).get(kStateCopyCall);
  if (total < 0 || total > max_bytes)
    throw std::runtime_error("InnerWorker " + std::to_string(init.index) + ": " + init.source +
                             " offers a join state of " + std::to_string(total) +
                             " bytes; this job's is at most " + std::to_string(max_bytes));
  std::string bytes(size_t(total), '\0');
  std::deque<std::tuple<int64_t, int64_t, Future<Blob>>> parts;
  const int64_t started = loco::now_ms();
  int64_t received = 0;
  for (int64_t next = 0; next < total || !parts.empty();) {
    while (next < total && parts.size() < kInFlight) {
      const double rate = double(received) / std::max(1e-3, seconds_since(started));
      const int64_t part = std::clamp<int64_t>(int64_t(rate * 0.1), 128 << 10, 16 << 20);
      const int64_t len = std::min(part, total - next);
      parts.emplace_back(next, len, part_of(next, len));
      next += len;
    }
    auto [at, len, f] = std::move(parts.front());
    parts.pop_front();
    Blob b = f.get(kStateCopyCall);
    if (int64_t(b.size()) != len)
      throw std::runtime_error("InnerWorker " + std::to_string(init.index) + ": " + init.source +
                               " sent " + std::to_string(b.size()) + " bytes of its join state" +
                               " for the " + std::to_string(len) + " asked at " +
                               std::to_string(at));
    std::memcpy(bytes.data() + at, b.data(), b.size());
    received += int64_t(b.size());
  }
  return bytes;
}

}  // namespace

InnerWorker::InnerWorker(std::string job_id, std::string spec, int index) {
  begin_job_actor("diloco.InnerWorker", job_id);
  s_ = std::make_unique<State>(std::move(job_id), spec, index);
  if (s_->cfg.threads > 0) at::set_num_threads(s_->cfg.threads);
  // CUDA is not even probed for device: cpu.
  const bool cuda = s_->cfg.device != dl::DeviceKind::cpu && torch::cuda::is_available();
  const std::vector<int>& gpus = this_actor().gpus;
  s_->device =
      dl::choose_device(s_->cfg.device, gpus, cuda, cuda ? int(torch::cuda::device_count()) : 0);
  const int g = s_->cfg.ranks_per_worker(s_->device.cuda);
  const auto devices = rank_devices(s_->device, gpus, g);
  s_->peak_flops =
      g * dl::peak_flops(s_->device.cuda ? dl::cuda_device_name(s_->device.index) : "cpu",
                         s_->cfg.precision);
  if (s_->device.cuda)
    for (const auto& d : devices) s_->device_key += dl::cuda_device_uuid(d.index()) + ",";
  s_->flops_per_token = dl::training_flops_per_token(
      s_->cfg.model, s_->cfg.model.parameter_count(s_->cfg.vocab_size()));
  s_->ranks.resize(size_t(g));
  // Behind NAT (its node is reverse or relayed) a worker's collective binds nothing: it dials
  // its reachable peers and meets the others at the cluster's relay (docs/guide/nat.md, "Members
  // behind NAT").
  const NodeNetwork network = Runtime::current().network();
  s_->relay = {network.relay.endpoint, network.relay.public_key};
  for (int r = 0; r < g; ++r) {
    Rank& k = s_->ranks[size_t(r)];
    k.device = devices[size_t(r)];
    auto options = State::collective_options(s_->cfg);
    options.security = Runtime::current().security();  // the node's cluster key
    options.outbound_only = behind_nat(network.reachability);
    k.comm = std::make_unique<collective::Communicator>("tcp://" + node_host() + ":0", options);
  }
  if (g > 1) {
    // The ranks join their group together: joining blocks until all have.
    auto rendezvous = c10::make_intrusive<c10d::HashStore>();
    const auto backend = s_->device.cuda ? dl::LocalBackend::nccl : dl::LocalBackend::gloo;
    dl::on_ranks(size_t(g), [&](size_t r) {
      s_->ranks[r].group = std::make_unique<dl::LocalGroup>(rendezvous, int(r), g, backend);
    });
  }
  const int n = s_->cfg.eval.batches * s_->cfg.inner.batch_size;
  s_->val_windows = torch::empty({n, s_->cfg.model.context + 1}, torch::kInt64);
  dl::validation_windows(s_->store, s_->cfg.model.context, n,
                         {s_->val_windows.data_ptr<int64_t>(), size_t(s_->val_windows.numel())});
}

InnerWorker::~InnerWorker() = default;

void InnerWorker::stop() {
  s_->stopping.store(true);
  // The ranks and their communicators exist from construction on, and leave() is thread-safe.
  for (Rank& k : s_->ranks) k.comm->leave("worker " + std::to_string(s_->index) + " is stopping");
}

std::vector<std::string> InnerWorker::endpoints() const {
  std::vector<std::string> out;
  for (const Rank& k : s_->ranks) out.push_back(k.comm->endpoint());
  return out;
}

InitResult InnerWorker::init(WorkerInit init) {
  InitResult out;
  s_->drain();  // fragments of a round that is being redone or rewound
  s_->engine.reset();  // over the ranks' trainers and outer states, which are made anew
  // A new attempt: a peer's late notice that it gave up an operation of the last one is not a
  // sign that it will miss this one's (Communicator::new_attempt).
  for (Rank& k : s_->ranks) k.comm->new_attempt();
  // The state a joiner copies (join_state) is kept per round number; once the job went back,
  // the same round number comes again with another θ. Served from before the rewind, it gave
  // a joiner the undone rounds' θ (the 30-minute soak, 2026-11-29: "round 8: worker 5 holds a
  // different θ", its donor's copy made for round 8 before a rewind to round 4).
  s_->shared_state.reset();
  s_->shared_state_round = -1;
  s_->index = init.index;
  // A job resumed from a checkpoint continues each worker from its own inner
  // state (exactly); a worker that joins a live job takes a new data stream and
  // copies the AdamW moments of the live worker it copies θ from.
  if (!init.checkpoint.empty())
    init.checkpoint = s_->checkpoint_path(init.checkpoint, "init: checkpoint");
  if (!init.inner_state.empty())
    init.inner_state = s_->checkpoint_path(init.inner_state, "init: inner_state");
  std::optional<torch::serialize::InputArchive> inner_ar;
  if (init.source.empty() && !init.inner_state.empty() &&
      std::filesystem::exists(init.inner_state)) {
    inner_ar.emplace();
    dl::read_archive(*inner_ar, init.inner_state);
    c10::IValue v;
    inner_ar->read("stream", v);
    init.stream = uint64_t(v.toInt());
  }
  s_->stream = init.stream;
  // Every rank reads the worker's stream, rank r its windows [r·B, (r+1)·B) of each batch.
  s_->for_ranks([&](Rank& k) {
    k.trainer = std::make_unique<dl::InnerTrainer>(s_->cfg, s_->store, init.shards, init.stream,
                                                   init.total_steps, k.device, k.group.get());
  });
  for (Rank& k : s_->ranks) {
    if (inner_ar) {
      k.trainer->load(*inner_ar, "worker.");  // AdamW moments, step, data position
      // The aggregator's dealing holds, should the members differ from the checkpoint's.
      if (k.trainer->sampler().shards() != init.shards)
        k.trainer->sampler().set_shards(init.shards);
    }
    // Behind the job when the slot's inner state is older than the outer state it gets.
    k.trainer->set_step(init.round * s_->cfg.inner.steps);
    k.outer = std::make_unique<dl::OuterOptimizer>(s_->cfg.outer_step(), k.trainer->flat_parameters());
  }
  s_->make_engine();
  const int64_t t0 = loco::now_ms();
  if (!init.source.empty()) {
    auto src = Runtime::current().get_actor<InnerWorker>(init.source);
    // Mid-round (streaming): the source's snapshot between two of its inner steps, served
    // beside its stream() call; its landings since come with this worker's stream().
    std::optional<JoinOffer> offer;
    if (init.mid_round)
      offer = src.call(&InnerWorker::offer_state, init.round).get(kOfferStateCall);
    const std::string bytes = copy_join_state(init, offer, s_->max_state_bytes());
    torch::serialize::InputArchive ar;
    try {
      ar.load_from(bytes.data(), bytes.size(), torch::kCPU);
    } catch (const std::exception& e) {
      throw std::runtime_error("InnerWorker " + std::to_string(init.index) +
                               ": the join state from " + init.source + " is malformed (" +
                               std::to_string(bytes.size()) + " bytes): " + e.what());
    }
    for (Rank& k : s_->ranks) {
      k.outer->load(ar, "outer.");
      k.trainer->load_moments(ar, "moments.");
    }
    if (s_->overlapped() && !offer)
      s_->engine->read_in_flight(ar);
    s_->joined_snapshot_step = offer ? offer->step : -1;
    out.snapshot_step = s_->joined_snapshot_step;
    out.state_bytes = bytes.size();
  } else if (!init.checkpoint.empty()) {
    torch::serialize::InputArchive ar;
    dl::read_archive(ar, init.checkpoint);
    for (Rank& k : s_->ranks) k.outer->load(ar, "outer.");
    if (s_->overlapped()) s_->engine->read_in_flight(ar);
    // Eager: each average in flight is corrected with this worker's own provisional θ, from its
    // inner state of the same round, not with the one of the worker that wrote the checkpoint.
    c10::IValue round;
    if (s_->overlapped() && inner_ar && inner_ar->try_read("round", round) &&
        round.toInt() == s_->lead().outer->round())
      s_->engine->read_provisionals(*inner_ar);
    out.state_bytes = uint64_t(std::filesystem::file_size(init.checkpoint));
  } else if (!s_->cfg.init.empty()) {
    // A fresh job of `init: hf:DIR`: every worker reads the same folder (under its node's data
    // root), so all start from the same θ; the aggregator checks their hashes agree.
    const std::string dir = resolve_data_path(s_->roots, dl::hf_init_dir(s_->cfg.init), "init");
    auto values = dl::import_hf(dir, s_->cfg.model, s_->cfg.vocab_size());
    const auto theta = torch::from_blob(values.data(), {int64_t(values.size())}, torch::kFloat32);
    if (theta.numel() != s_->lead().trainer->parameter_count())
      throw std::runtime_error("init: " + dir + " holds " + std::to_string(theta.numel()) +
                               " parameters, the job's model " +
                               std::to_string(s_->lead().trainer->parameter_count()));
    for (Rank& k : s_->ranks) k.outer = std::make_unique<dl::OuterOptimizer>(s_->cfg.outer_step(), theta);
    s_->make_engine();
    out.state_bytes = uint64_t(values.size() * sizeof(float));
  }
  const dl::OuterOptimizer& outer = *s_->lead().outer;
  if (outer.round() != init.round && (!init.source.empty() || !init.checkpoint.empty()))
    throw std::runtime_error(
        "InnerWorker " + std::to_string(init.index) + ": the outer state from " +
        (init.source.empty() ? init.checkpoint : init.source) + " is of round " +
        std::to_string(outer.round()) + ", not " + std::to_string(init.round));
  out.copy_seconds = seconds_since(t0);
  // Streaming: a worker resumed from its own inner state keeps its local parameters, which
  // differ from θ in the fragments not synchronized since (as the simulator's checkpoints do).
  if (!(s_->overlapped() && inner_ar))
    for (Rank& k : s_->ranks) k.trainer->load_parameters(k.outer->theta());
  s_->make_feedback();
  // Resumed from its own inner state: its error feedback as it was (none there: zero).
  if (s_->feedback && inner_ar) s_->feedback->load(*inner_ar, "error_feedback.", 0);
  s_->delta_round = -1;
  out.parameters = s_->lead().trainer->parameter_count();
  out.theta_hash = outer.theta_hash();
  // A job's start or resume (not a joiner copying a live member: the job has measured rounds
  // by then, and the copy already holds the round up): a step timed for the first budget.
  if (s_->cfg.inner.budget == dl::InnerBudget::time && init.source.empty())
    out.step_seconds = s_->lead().trainer->measure_step_seconds();
  out.device = s_->device.reason;
  if (s_->ranks.size() > 1) out.device += ", " + std::to_string(s_->ranks.size()) + " local ranks";
  return out;
}

namespace {

// A blocking round's steps between the round engine's events: the caller's.
struct BlockingSteps final : dl::StreamingRound::Driver {
  std::function<void()> take;
  explicit BlockingSteps(std::function<void()> fn) : take(std::move(fn)) {}
  void steps(int64_t, int) override { take(); }
};

dl::StreamingRound::Round blocking_round(int64_t round, uint64_t op = 0) {
  dl::StreamingRound::Round r;
  r.round = round;
  r.op_base = op;
  return r;
}

// One attempt of reduce() as the round engine's FragmentAverager: `average(Δ, mean)`, there
// synchronously (the handle is ready when start() returns; a failure is thrown from it,
// before the engine steps).
class ReduceAverager final : public dl::FragmentAverager {
 public:
  explicit ReduceAverager(std::function<void(std::span<const float>, std::span<float>)> average)
      : average_(std::move(average)) {}
  std::shared_future<uint64_t> start(uint64_t, int, std::span<const std::span<const float>> deltas,
                                     std::span<const std::span<float>> means) override {
    if (deltas.size() != 1 || means.size() != 1)
      throw std::logic_error("ReduceAverager: one replica per worker");
    average_(deltas[0], means[0]);
    std::promise<uint64_t> done;
    done.set_value(0);  // reduce() counts the bytes, the communicators' and the guard's
    return done.get_future().share();
  }

 private:
  std::function<void(std::span<const float>, std::span<float>)> average_;
};

}  // namespace

InnerResult InnerWorker::inner(int64_t round) {
  if (!s_->lead().trainer) throw std::logic_error("InnerWorker: inner() before init()");
  // Asked again for a round whose Δ it holds (the round is redone because too
  // few workers finished it): that Δ stands, no second H steps.
  if (s_->delta_round == round) {
    InnerResult again = s_->last_inner;
    again.seconds = 0;
    return again;
  }
  const int64_t t0 = loco::now_ms();
  s_->hook(RoundPoint::before_inner_steps, round, 0, "inner");
  // The ranks step together (their gradients averaged every step, so their parameters stay
  // equal), then the round engine keeps the lead rank's Δ = θ − θ_local. The loss is averaged
  // over the ranks too: rank 0's is the worker's. One step at a time (the same arithmetic as
  // run_inner_steps(H)), for the per-step figures.
  const int h = s_->cfg.inner.steps;
  std::vector<StepFigures> per_step;
  BlockingSteps steps([&] {
    s_->for_ranks([&](Rank& k) {
      std::vector<StepFigures> mine;
      for (int i = 0; i < h; ++i) {
        mine.push_back(s_->one_step(k));
        s_->hook(RoundPoint::after_inner_step, round, i + 1, "inner", nullptr, {},
                 &mine.back().loss);
        // Every rank sees the same averaged loss and norm, so all stop at the same step; the
        // aggregator leaves the worker out of the round on the non-finite figure it reports.
        if (State::diverged(mine.back())) break;
      }
      if (&k == &s_->lead()) per_step = std::move(mine);
    });
  });
  s_->engine->step_half(blocking_round(round), steps);
  s_->delta_round = round;
  if (!per_step.empty() && State::diverged(per_step.back()))
    s_->note_diverged(round, int64_t(per_step.size()), per_step.back());
  s_->hook(RoundPoint::pseudo_gradient, round, 0, "inner", nullptr, s_->engine->kept_delta(0));
  InnerResult r;
  r.round = round;
  r.steps = int(per_step.size());
  double loss_sum = 0;
  for (const StepFigures& f : per_step) loss_sum += f.loss;
  r.mean_loss = h > 0 ? loss_sum / h : 0.0;
  r.seconds = seconds_since(t0);
  r.tokens = int64_t(r.steps) * s_->cfg.tokens_per_inner_step();
  // Every rank stepped on its share of the worker's batch: the step's tokens are the worker's.
  for (StepFigures& f : per_step) f.tokens = s_->cfg.tokens_per_inner_step();
  r.per_step = std::move(per_step);
  s_->last_inner = r;
  return r;
}

InnerResult InnerWorker::inner_timed(int64_t round, double seconds, int64_t max_steps) {
  if (!s_->lead().trainer) throw std::logic_error("InnerWorker: inner_timed() before init()");
  if (s_->ranks.size() != 1)
    throw dl::ConfigError("inner.budget: time runs one local rank per worker for now");
  if (s_->delta_round == round) {
    InnerResult again = s_->last_inner;
    again.seconds = 0;
    return again;
  }
  const int64_t t0 = loco::now_ms();
  s_->hook(RoundPoint::before_inner_steps, round, 0, "inner_timed");
  InnerResult r;
  BlockingSteps steps([&] { r = s_->timed_steps(round, seconds, t0, max_steps); });
  s_->engine->step_half(blocking_round(round), steps);
  s_->delta_round = round;
  return r;
}

// Rank k's part of reduce(): its slice of Δ averaged with rank k of every other member (topk:
// the whole Δ's code gathered), the guard's verdicts first (dense: the members' summaries of
// their slices; topk: the gathered codes), into that slice of `mean`.
InnerWorker::State::RankAverage InnerWorker::State::average_rank(Rank& k, const ReduceRequest& req,
                                                                 std::span<const float> delta,
                                                                 std::span<float> mean) {
  const size_t g = ranks.size();
  const size_t r = size_t(&k - ranks.data());
  collective::Group group;
  for (size_t i = 0; i < req.names.size(); ++i)
    group.members.push_back(collective::member_at(
        g == 1 ? req.names[i] : req.names[i] + "/rank" + std::to_string(r), req.endpoints[i][r]));
  group.relay = relay;
  group.rank = req.rank;
  group.round_id = dl::data_round(req.op_id);
  const dl::Slice sl = slice_of(k);
  const std::span<const float> mine = delta.subspan(size_t(sl.begin), size_t(sl.size()));
  const std::span<float> out = mean.subspan(size_t(sl.begin), size_t(sl.size()));
  dl::DeltaAverager policy = this->policy();
  // With error feedback (compression topk or auto: one rank, no token weights: config.cpp) what
  // it sends of this round's Δ, made once (a code, or the dense Δ: ErrorFeedback::dense). Else,
  // with the guard on, this rank's slice summarized (each rank judges its own slice, in its own
  // group).
  dl::DeltaAverager::Sent sent;
  if (feedback) {
    if (coded_round != req.round) {
      code = policy.prepare(0, {&delta, 1});
      coded_round = req.round;
    }
  } else {
    sent = policy.prepare(0, {&mine, 1});
  }
  CommMembers members(*k.comm, group);
  const auto judged = policy.judge(members, req.op_id, 0, feedback ? code : sent);
  RankAverage result;
  result.guard_bytes = judged.guard_bytes;
  result.guard_seconds = judged.guard_seconds;
  const std::vector<dl::guard::Verdict>& verdicts = judged.verdicts;
  if (!verdicts.empty()) group.left_out = judged.left_out();
  if (feedback) {
    policy.reduce(members, req.op_id, 0, judged, group.left_out, {&delta, 1}, {&mean, 1});
  } else {
    // Weighted by the tokens of the members averaged (inner.budget: time): the plain mean of
    // the members' scaled Δ, scaled into `mean` (Δ stays as it was for a retry) and reduced
    // in place there.
    const double weight =
        req.tokens.empty() ? 1.0 : member_scale(req.tokens, req.rank, group.left_out);
    std::span<const float> in = mine;
    if (weight != 1.0) {
      for (size_t i = 0; i < mine.size(); ++i) out[i] = float(double(mine[i]) * weight);
      in = out;
    }
    policy.reduce(members, req.op_id, 0, judged, group.left_out, {&in, 1}, {&out, 1});
  }
  result.left_out = notes_of(dl::left_outs(0, names_of(group), verdicts));
  return result;
}

ReduceResult InnerWorker::reduce(ReduceRequest req) {
  const int64_t t0 = loco::now_ms();
  const size_t g = s_->ranks.size();
  check_group("reduce", s_->index, req.names, req.endpoints, req.rank, g);
  if (s_->delta_round != req.round)
    throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) + ": reduce of round " +
                                std::to_string(req.round) + " but its Δ is of round " +
                                std::to_string(s_->delta_round));
  s_->hook(RoundPoint::before_allreduce, req.round, 0, "reduce", &s_->lead().comm->hooks());
  if (!req.tokens.empty() && req.tokens.size() != req.names.size())
    throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) + ": reduce with " +
                                std::to_string(req.tokens.size()) + " token counts for " +
                                std::to_string(req.names.size()) + " members");
  // Token counts that member_scale refuses fail the call before anything is sent.
  if (!req.tokens.empty()) (void)member_scale(req.tokens, req.rank);
  s_->choose(req.codec, "reduce");
  // The round engine's second half: Δ averaged (out of place: the engine keeps it, intact if a
  // member is lost, for the re-formed group; kept after a success too: an attempt can succeed
  // for this member and fail for another, and the retry, the same round perhaps with fewer
  // members, undoes this step and averages again), then the outer step of the lead rank.
  // Rank r of this worker averages slice r of Δ with rank r of every other member (G streams
  // over the slow link), each on its thread, the guard's verdicts first.
  std::vector<State::RankAverage> ranks(g);
  ReduceAverager averager([&](std::span<const float> delta, std::span<float> mean) {
    s_->for_ranks([&](Rank& k) {
      ranks[size_t(&k - s_->ranks.data())] = s_->average_rank(k, req, delta, mean);
    });
    s_->hook(RoundPoint::after_allreduce, req.round, 0, "reduce");
  });
  BlockingSteps none([] {});
  s_->engine->land_half(blocking_round(req.round, req.op_id), averager, none);
  // The other ranks take the lead's θ and momentum (whole: for checkpoints and joiners).
  const Rank& lead = s_->lead();
  for (size_t i = 1; i < g; ++i) {
    Rank& k = s_->ranks[i];
    k.outer->assign(*lead.outer);
    k.trainer->load_parameters(k.outer->theta());
  }
  ReduceResult r;
  r.theta_hash = lead.outer->theta_hash();
  for (const Rank& k : s_->ranks) r.bytes_sent += k.comm->last_stats().bytes_sent;
  for (const State::RankAverage& a : ranks) {
    r.bytes_sent += a.guard_bytes;
    r.guard_seconds = std::max(r.guard_seconds, a.guard_seconds);
    r.left_out.insert(r.left_out.end(), a.left_out.begin(), a.left_out.end());
  }
  r.seconds = seconds_since(t0);
  return r;
}

double InnerWorker::evaluation(int64_t round) {
  std::shared_future<double> e;
  {
    std::lock_guard<std::mutex> lock(s_->checkpoints_mu);
    auto it = s_->evaluations.find(round);
    if (it == s_->evaluations.end())
      throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) +
                                  " was asked to evaluate no θ of round " + std::to_string(round));
    e = it->second;
  }
  if (e.wait_for(kEvaluation) != std::future_status::ready)
    throw std::runtime_error("InnerWorker " + std::to_string(s_->index) + ": θ of round " +
                             std::to_string(round) + " is not evaluated after " +
                             std::to_string(kEvaluation.count()) + " s");
  return e.get();
}

double InnerWorker::evaluate() {
  // Streaming: the outer θ, which no worker's parameters equal while fragments are apart.
  if (s_->overlapped())
    return s_->lead().trainer->evaluate_parameters(s_->lead().outer->theta(), s_->val_windows);
  return s_->lead().trainer->evaluate(s_->val_windows);
}

double InnerWorker::evaluate_windows(int64_t begin, int64_t end) {
  const int64_t n = s_->val_windows.size(0);
  if (begin < 0 || end > n || begin >= end)
    throw std::invalid_argument("evaluate_windows: [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") is not inside the " + std::to_string(n) +
                                " validation windows");
  const torch::Tensor windows = s_->val_windows.slice(0, begin, end);
  if (s_->overlapped())
    return s_->lead().trainer->evaluate_parameters(s_->lead().outer->theta(), windows);
  return s_->lead().trainer->evaluate(windows);
}

int64_t InnerWorker::validation_windows() const { return s_->val_windows.size(0); }

// The join state serialized once per round, for joiners that copy it in parts:
// one archive of the outer state ("outer.", as in a checkpoint) and the AdamW
// moments ("moments.").
// The moments are as of the first request in the round (a round being redone
// may have moved them by one round's inner steps; they only steer step sizes).
const std::shared_ptr<const std::string>& InnerWorker::join_state(int64_t round) {
  if (s_->lead().outer->round() != round)
    throw std::invalid_argument(
        "InnerWorker " + std::to_string(s_->index) + " holds the outer state of round " +
        std::to_string(s_->lead().outer->round()) + ", not of round " + std::to_string(round));
  if (!s_->shared_state || s_->shared_state_round != round) {
    torch::serialize::OutputArchive ar;
    s_->lead().outer->save(ar, "outer.");
    s_->lead().trainer->save_moments(ar, "moments.");
    if (s_->overlapped()) s_->engine->write_in_flight(ar);
    std::ostringstream out;
    ar.save_to(out);
    s_->shared_state = std::make_shared<const std::string>(std::move(out).str());
    s_->shared_state_round = round;
  }
  return s_->shared_state;
}

int64_t InnerWorker::join_state_size(int64_t round) { return int64_t(join_state(round)->size()); }

Blob InnerWorker::join_state_part(int64_t round, int64_t offset, int64_t length) {
  return bytes_of(join_state(round), offset, length, "join_state_part", "the join state");
}

uint64_t InnerWorker::theta_hash() const { return s_->lead().outer->theta_hash(); }

void InnerWorker::set_shards(std::vector<int> shards) {
  if (!s_->lead().trainer) throw std::logic_error("InnerWorker: set_shards() before init()");
  for (Rank& k : s_->ranks) k.trainer->sampler().set_shards(shards);
}

std::vector<int> InnerWorker::shards() const {
  return s_->lead().trainer ? s_->lead().trainer->sampler().shards() : std::vector<int>{};
}

std::string InnerWorker::save_checkpoint(std::string path) {
  path = s_->checkpoint_path(path, "save_checkpoint: path");
  torch::serialize::OutputArchive ar;
  s_->checkpoint_archive(ar);
  if (s_->overlapped()) s_->engine->write_in_flight(ar);
  dl::write_archive(ar, path);
  return std::filesystem::absolute(path).string();
}

std::string InnerWorker::save_inner_state(std::string path) {
  path = s_->checkpoint_path(path, "save_inner_state: path");
  torch::serialize::OutputArchive ar;
  s_->inner_state_archive(ar);
  dl::write_archive(ar, path);
  return path;
}

std::string InnerWorker::checkpoint_written(int64_t round) {
  std::shared_future<std::string> write;
  {
    std::lock_guard<std::mutex> lock(s_->checkpoints_mu);
    auto it = s_->checkpoint_writes.find(round);
    if (it == s_->checkpoint_writes.end())
      throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) +
                                  " was asked for no checkpoint after round " +
                                  std::to_string(round));
    write = it->second;
  }
  if (write.wait_for(kCheckpointWrite) != std::future_status::ready)
    throw std::runtime_error("InnerWorker " + std::to_string(s_->index) +
                             ": the checkpoint after round " + std::to_string(round) +
                             " is not written after " + std::to_string(kCheckpointWrite.count()) +
                             " s");
  return write.get();
}

LOCO_REGISTER(InnerWorker,
              loco::ActorClass<InnerWorker>("diloco.InnerWorker")
                  .constructor<std::string, std::string, int>()
                  .on_stop(&InnerWorker::stop)
                  .internal_method("endpoints", &InnerWorker::endpoints)
                  .internal_method("init", &InnerWorker::init)
                  .internal_method("inner", &InnerWorker::inner)
                  .internal_method("inner_timed", &InnerWorker::inner_timed)
                  .internal_method("reduce", &InnerWorker::reduce)
                  .internal_method("stream", &InnerWorker::stream)
                  .internal_method("evaluate", &InnerWorker::evaluate)
                  .internal_method("evaluate_windows", &InnerWorker::evaluate_windows)
                  .internal_method("validation_windows", &InnerWorker::validation_windows)
                  .internal_method("join_state_size", &InnerWorker::join_state_size)
                  .internal_method("join_state_part", &InnerWorker::join_state_part)
                  .internal_method("save_checkpoint", &InnerWorker::save_checkpoint)
                  .internal_method("save_inner_state", &InnerWorker::save_inner_state)
                  .internal_method("theta_hash", &InnerWorker::theta_hash)
                  .internal_method("set_shards", &InnerWorker::set_shards)
                  .internal_method("shards", &InnerWorker::shards)
                  .concurrent_method("offer_state", &InnerWorker::offer_state)
                  .concurrent_method("snapshot_part", &InnerWorker::snapshot_part)
                  .concurrent_method("landed", &InnerWorker::landed)
                  .concurrent_method("landed_mean", &InnerWorker::landed_mean)
                  .concurrent_method("progress", &InnerWorker::progress)
                  .concurrent_method("admit", &InnerWorker::admit)
                  .concurrent_method("member_gone", &InnerWorker::member_gone)
                  .concurrent_method("give_up", &InnerWorker::give_up)
                  .concurrent_method("checkpoint_written", &InnerWorker::checkpoint_written)
                  .concurrent_method("evaluation", &InnerWorker::evaluation));

}  // namespace loco::actors
