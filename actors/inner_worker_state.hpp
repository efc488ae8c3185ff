// InnerWorker's insides, shared by its files: inner_worker.cpp (construction, init, the
// blocking round, checkpoints) and inner_worker_stream.cpp (the streaming round and a joiner's
// way in mid-round). Private to actors/.
#pragma once
#include "actors/inner_worker.hpp"
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "actors/round_decisions.hpp"
#include "actors/round_hooks.hpp"
#include "actors/timeouts.hpp"
#include "diloco/averager.hpp"
#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "diloco/error_feedback.hpp"
#include "diloco/device_info.hpp"
#include "diloco/hf_format.hpp"
#include "diloco/local_group.hpp"
#include "diloco/streaming_round.hpp"
#include "diloco/torchscript_model.hpp"
#include "diloco/trainer.hpp"
#include "runtime/collective/allreduce.hpp"
#include "runtime/core/actor.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"

namespace loco::actors {

namespace dl = loco::diloco;

// Seconds since `t0`, both on the runtime's one steady clock (runtime/core/util.hpp).
inline double seconds_since(int64_t t0) { return static_cast<double>(loco::now_ms() - t0) / 1000.0; }

// Bytes [offset, offset + length) of a serialized state, shared without a copy; the range is
// checked first (it comes from the network).
inline Blob bytes_of(const std::shared_ptr<const std::string>& state, int64_t offset, int64_t length,
              const char* method, const char* what) {
  if (offset < 0 || length < 0 || size_t(offset) > state->size() ||
      size_t(length) > state->size() - size_t(offset))
    throw std::invalid_argument(std::string(method) + ": [" + std::to_string(offset) + ", " +
                                std::to_string(offset + length) + ") is outside the " +
                                std::to_string(state->size()) + " bytes of " + what);
  return Blob(state, reinterpret_cast<const uint8_t*>(state->data()) + offset, size_t(length));
}

// The host this node is reached at, for the collective's socket.
inline std::string node_host() {
  std::string addr = Runtime::current().address();
  auto colon = addr.rfind(':');
  return colon == std::string::npos ? "127.0.0.1" : addr.substr(0, colon);
}

// `ar` to `path` atomically (a file beside it, then renamed over it).
inline void save_archive(torch::serialize::OutputArchive& ar, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  ar.save_to(path + ".tmp");
  std::filesystem::rename(path + ".tmp", path);
}

// One local rank of the worker (one GPU, or a CPU rank): its model replica and inner
// optimizer, its copy of the outer state, and the communicator that carries its slice of Δ
// across workers (rank r of every worker averages slice r: G streams over the slow link).
struct Rank {
  torch::Device device = torch::kCPU;
  std::unique_ptr<dl::LocalGroup> group;  // none with one rank: the same arithmetic, bit for bit
  std::unique_ptr<dl::InnerTrainer> trainer;
  std::unique_ptr<dl::OuterOptimizer> outer;
  std::unique_ptr<collective::Communicator> comm;  // for the worker's life: failures leave it ready
};

// The round ids of a fragment's (or a blocking round's) operation `op`: the guard's summaries
// (an all-gather) and then the data (the all-reduce, or topk's all-gather): ids of their own,
// in that order (collective/allreduce.hpp).
inline uint64_t summary_round(uint64_t op) { return 2 * op; }
inline uint64_t data_round(uint64_t op) { return 2 * op + 1; }
// The members' names, in rank order (the guard's verdicts name them).
std::vector<std::string> names_of(const collective::Group& g);
// The guard's left-outs as a worker reports them to the aggregator.
inline std::vector<LeftOutNote> notes_of(const std::vector<dl::LeftOut>& left) {
  std::vector<LeftOutNote> out;
  for (const dl::LeftOut& l : left) out.push_back({l.member, l.fragment, l.rule, l.why});
  return out;
}
// This worker's summary of Δ for the guard (diloco/guard.hpp), as sent; `abstain`: its inner
// steps diverged this round, it sends nothing.
std::vector<uint8_t> summary_of(std::span<const float> delta, bool abstain,
                                const dl::GuardConfig& guard);
// The guard's verdicts on a dense average of operation `op` over `g`: the members' summaries
// (`mine` this one's, summary_of a Δ of n values) all-gathered under summary_round(op) and
// judged, the same on every member. None for a group of one. Adds the bytes sent to `bytes`,
// and the exchange's seconds to `seconds`.
std::vector<dl::guard::Verdict> exchange_summaries(collective::Communicator& comm,
                                                   collective::Group g, uint64_t op,
                                                   const std::vector<uint8_t>& mine, size_t n,
                                                   const dl::GuardConfig& guard, uint64_t& bytes,
                                                   double& seconds);

// The group a stream() call's fragments reduce over: the request's members, less those a
// fragment's all-reduce lost on the way, plus a worker admitted mid-round. Every survivor drops
// the member the failed operation names and runs it again without it (the collective lets a
// retry without the lost member keep its round id), so the fragment finishes as a smaller group
// and the worker's inner steps go on; later fragments of the call start without that member.
// The aggregator accepts the round only when the survivors end with the same group and the
// same θ (after_overlapped_round). A member admitted at a fragment boundary takes part in the
// operations from that fragment's on (`from_op`); its first one counts with weight zero, since
// it has taken no inner step yet (its Δ is zero): the others' mean is the sum over n − 1.
struct StreamGroup {
  std::mutex mu;
  std::vector<collective::Member> members;  // in rank order
  collective::RelayEndpoint relay;
  std::vector<uint64_t> from_op;            // each one's first operation (0: all of the call's)
  std::string self;
  std::string zero_member;  // whose Δ counts with weight zero in operation `zero_op`
  uint64_t zero_op = 0;

  // The group of a stream() call, `first` the operation a joiner takes part from (its Δ of
  // weight zero).
  static std::shared_ptr<StreamGroup> of(const StreamRequest& req, std::optional<uint64_t> first,
                                         collective::RelayEndpoint relay) {
    auto g = std::make_shared<StreamGroup>();
    g->relay = std::move(relay);
    for (size_t i = 0; i < req.names.size(); ++i) {
      g->members.push_back(collective::member_at(req.names[i], req.endpoints[i][0]));
      g->from_op.push_back(0);
    }
    g->self = req.names[size_t(req.rank)];
    if (first) {
      g->zero_member = g->self;
      g->zero_op = *first;
    }
    return g;
  }
  // The group of operation `op`: the members that take part in it, this worker's rank.
  collective::Group at(uint64_t op) {
    std::lock_guard<std::mutex> lock(mu);
    collective::Group g;
    g.round_id = op;
    g.relay = relay;
    for (size_t i = 0; i < members.size(); ++i) {
      if (from_op[i] > op) continue;
      if (members[i].name == self) g.rank = int(g.members.size());
      g.members.push_back(members[i]);
    }
    return g;
  }
  std::vector<std::string> names() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> out;
    for (const auto& m : members) out.push_back(m.name);
    return out;
  }
  void add(const std::string& name, const std::string& endpoint, uint64_t op) {
    std::lock_guard<std::mutex> lock(mu);
    members.push_back(collective::member_at(name, endpoint));
    from_op.push_back(op);
    zero_member = name;
    zero_op = op;
  }
  // With the guard on: the joiner's zero Δ in operation `op` is left out of g's mean (the
  // others' mean, exactly), instead of weight_correction's factor.
  void leave_out_zero(collective::Group& g, uint64_t op) {
    std::lock_guard<std::mutex> lock(mu);
    if (op != zero_op || zero_member.empty()) return;
    for (size_t i = 0; i < g.members.size(); ++i)
      if (g.members[i].name == zero_member) {
        g.left_out.resize(g.members.size(), 0);
        g.left_out[i] = 1;
      }
  }
  // The factor that turns the collective's mean over `g` into the mean over the members whose
  // Δ counts: n / (n − 1) when operation g.round_id has a member of weight zero, else 1.
  float weight_correction(const collective::Group& g) {
    std::lock_guard<std::mutex> lock(mu);
    if (g.round_id != zero_op || g.members.size() < 2) return 1.0f;
    for (const auto& m : g.members)
      if (m.name == zero_member)
        return float(g.members.size()) / float(g.members.size() - 1);
    return 1.0f;
  }
  // `lost` is gone: drop it, unless it is this worker. False when the group of `tried`'s
  // operation is not smaller than `tried` (nothing new to try).
  bool drop(const std::string& lost, const collective::Group& tried) {
    std::lock_guard<std::mutex> lock(mu);
    if (lost.empty() || lost == self) return false;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].name == lost) {
        members.erase(members.begin() + std::ptrdiff_t(i));
        from_op.erase(from_op.begin() + std::ptrdiff_t(i));
        break;
      }
    size_t now = 0;
    for (uint64_t f : from_op) now += f <= tried.round_id ? 1 : 0;
    return now < tried.members.size();  // dropped here, or by another fragment meanwhile
  }
};

// sync.mode streaming: what stream() shares with the concurrent methods through which a worker
// joins mid-round (offer_state, snapshot_part, landed, landed_mean, progress, admit), all
// under `mu`. A donor takes a snapshot of its state between two inner steps when asked, then
// keeps the average of every fragment it lands after it, so that a joiner that copied the
// snapshot can bring it up to date; an admission says from which fragment boundary the joiner
// is in the group.
struct JoinDesk {
  std::mutex mu;
  std::condition_variable cv;
  int64_t round = -1;    // the round stream() runs (-1: none)
  int64_t reached = -1;  // the inner step count its loop reached (events there done or doing)
  bool wanted = false;   // offer_state asks for a snapshot at the loop's next boundary
  std::shared_ptr<const std::string> snapshot;
  int64_t snapshot_round = -1, snapshot_step = -1;
  struct Landing {
    int fragment = 0;
    int64_t lands = 0;
    std::shared_ptr<const std::vector<float>> mean;
  };
  std::vector<Landing> landed;  // since the snapshot, in order
  size_t landed_floats = 0;
  std::optional<AdmitRequest> admit;  // phase: prepare (undecided), commit or abort

  // stream() of `round` begins, its loop at step count `reached`; as the returned guard goes,
  // however the call ends, nobody waits on that round's desk any longer.
  struct Open {
    JoinDesk& d;
    ~Open() {
      std::lock_guard<std::mutex> lock(d.mu);
      d.round = -1;
      d.forget();
      d.admit.reset();
      d.cv.notify_all();
    }
  };
  [[nodiscard]] Open open(int64_t r, int64_t at) {
    std::lock_guard<std::mutex> lock(mu);
    forget();
    admit.reset();
    round = r;
    reached = at;
    return Open{*this};
  }

  void forget() {  // with the lock held
    snapshot.reset();
    snapshot_round = snapshot_step = -1;
    landed.clear();
    landed_floats = 0;
    wanted = false;
  }
};

struct InnerWorker::State {
  std::string job_id;
  int index = 0;
  dl::JobConfig cfg;
  dl::TokenStore store;
  std::vector<Rank> ranks;  // rank 0 answers for the worker: θ's hash, evaluation, checkpoints
  // Where members behind NAT meet (the head's --relay, through this worker's node): every
  // group this worker builds names it.
  collective::RelayEndpoint relay;
  std::vector<float> delta, averaged;  // whole; rank r writes and averages its slice
  int64_t delta_round = -1;            // the round whose Δ `delta` holds
  // The round whose inner steps diverged (a step's loss or gradient norm not finite): the
  // worker stopped them and abstains from that round's averages. -1: none.
  int64_t diverged_round = -1;
  // The guard's left-outs of the averages that ended since the last stream() returned.
  dl::GuardLog guard_log;
  // reduce()'s work on one local rank (inner_worker.cpp): what the guard left out and what
  // its summary exchange cost.
  struct RankAverage {
    std::vector<LeftOutNote> left_out;
    uint64_t guard_bytes = 0;
    double guard_seconds = 0;
  };
  RankAverage average_rank(Rank& k, const ReduceRequest& req);
  // compression topk: this worker's error feedback (one buffer per fragment; blocking: one),
  // and in blocking rounds the code of round `coded_round`'s Δ, made once: an attempt retried
  // sends the same bytes, and the buffer takes each round's Δ once.
  std::unique_ptr<dl::ErrorFeedback> feedback;
  std::vector<uint8_t> code;
  int64_t coded_round = -1;
  int64_t stepped_round = -1;  // the round whose outer step θ holds (undone if it is re-run)
  // Its node is stopping (InnerWorker::stop): inner steps end at the next one.
  std::atomic<bool> stopping{false};
  InnerResult last_inner;
  uint64_t stream = 0;
  std::shared_ptr<const std::string> shared_state;  // see join_state()
  int64_t shared_state_round = -1;
  torch::Tensor val_windows;
  dl::DeviceChoice device;  // from the job's `device` and the GPUs the head gave this actor
  // For the per-step figures, set at construction: model FLOPs per token, and the peak FLOP/s
  // of all the worker's devices (0: not known, no MFU).
  double flops_per_token = 0;
  double peak_flops = 0;
  std::string device_key;  // StepFigures::device: the CUDA UUIDs of the worker's GPUs

  PathRoots roots;  // its node's data and checkpoint roots: where it may read and write

  // sync.mode streaming and eager: the round engine the simulator drives too (the fragments in
  // flight, their landing), over this worker's one rank; made by init(). The fragments'
  // all-reduces run on threads of their own, one after another (one communicator runs one
  // operation at a time): `last_op` is the newest.
  std::unique_ptr<dl::StreamingRound> streaming;
  std::shared_future<uint64_t> last_op;
  JoinDesk desk;
  int64_t joined_snapshot_step = -1;  // init() copied a donor's snapshot of this step (mid-round)

  // Checkpoints stream() was asked for, by the rounds they are of (the outer state's round once
  // the round ended): their writes, each on a thread of its own (start_checkpoint).
  std::mutex checkpoints_mu;
  std::map<int64_t, std::shared_future<std::string>> checkpoint_writes;
  // Evaluations stream() was asked for (StreamRequest::eval_begin), by the outer state's round,
  // each after the one before on the evaluator's model (made at the first).
  std::unique_ptr<dl::Evaluator> evaluator;
  std::map<int64_t, std::shared_future<double>> evaluations;  // under checkpoints_mu
  std::shared_future<double> last_evaluation;

  // stream(), as its round ends: validation windows [begin, end) of a copy of θ, evaluated on a
  // thread of its own.
  void start_evaluation(int64_t begin, int64_t end) {
    if (!evaluator) evaluator = std::make_unique<dl::Evaluator>(cfg, lead().device);
    const torch::Tensor theta = lead().outer->theta().clone();
    const torch::Tensor windows = val_windows.slice(0, begin, end);
    dl::Evaluator* e = evaluator.get();
    std::shared_future<double> before = last_evaluation;
    last_evaluation = std::async(std::launch::async, [e, theta, windows, before] {
                        if (before.valid()) before.wait();  // one at a time on the model
                        return e->evaluate(theta, windows);
                      }).share();
    std::lock_guard<std::mutex> lock(checkpoints_mu);
    while (evaluations.size() >= 4) evaluations.erase(evaluations.begin());  // nobody asked
    evaluations[lead().outer->round()] = last_evaluation;
  }

  // The operations' threads use a rank's communicator; a checkpoint's writer waits for
  // fragments in flight, which drain() lands or abandons.
  ~State() {
    drain();
    if (last_evaluation.valid()) last_evaluation.wait();  // it uses `evaluator`
  }
  // Waits for every operation in flight (each ends, by success or by the peer timeout) and
  // forgets them: before the state they work on is replaced or destroyed.
  void drain() {
    if (streaming) streaming->drain();
    if (last_op.valid()) last_op.wait();
    last_op = {};
  }
  // streaming or eager: the rounds run through stream(), with synchronizations in flight.
  bool overlapped() const { return cfg.sync.mode != dl::SyncMode::blocking; }
  dl::FragmentSchedule schedule() const { return dl::FragmentSchedule(cfg); }
  // The round engine over the lead rank's trainer and outer state as they are now.
  void make_streaming() {
    streaming.reset();
    if (!overlapped()) return;
    streaming = std::make_unique<dl::StreamingRound>(
        cfg, lead().trainer->model().fragments(cfg.sync.fragments),
        std::vector<dl::Replica>{{lead().trainer.get(), lead().outer.get()}});
  }
  // compression topk: the error feedback at zero (a worker that joins starts with nothing
  // unsent: the others' residuals are theirs to send), per fragment of the round engine.
  void make_feedback() {
    feedback.reset();
    coded_round = -1;
    if (!cfg.topk.on) return;
    std::vector<size_t> sizes;
    if (streaming)
      for (int f = 0; f < cfg.sync.fragments; ++f) sizes.push_back(size_t(streaming->fragment_size(f)));
    else
      sizes.push_back(size_t(lead().trainer->parameter_count()));
    feedback = std::make_unique<dl::ErrorFeedback>(cfg.topk, sizes, 1);
  }

  // stream(), between two inner steps at step count `now`: the snapshot offer_state asked
  // for, if it did: the outer state (every fragment at its last synchronized value; the ones
  // in flight land later, in the landings kept from here on) and the AdamW moments.
  void snapshot_if_wanted(int64_t round, int64_t now) {
    {
      std::lock_guard<std::mutex> lock(desk.mu);
      if (!desk.wanted) return;
    }
    torch::serialize::OutputArchive ar;
    lead().outer->save(ar, "outer.");
    lead().trainer->save_moments(ar, "moments.");
    std::ostringstream out;
    ar.save_to(out);
    auto bytes = std::make_shared<const std::string>(std::move(out).str());
    std::lock_guard<std::mutex> lock(desk.mu);
    desk.forget();
    desk.snapshot = std::move(bytes);
    desk.snapshot_round = round;
    desk.snapshot_step = now;
    desk.cv.notify_all();
  }
  // stream(): a landing, kept while a snapshot is offered. More than two rounds' worth of
  // averages (the joiner is far behind) drops the snapshot, and that join with it.
  void log_landing(int fragment, std::vector<float>& mean, int64_t now) {  // takes the mean
    std::lock_guard<std::mutex> lock(desk.mu);
    if (!desk.snapshot) return;
    if (desk.landed_floats + mean.size() > 2 * delta.size()) {
      log_warn("worker " + std::to_string(index) + ": the snapshot of step " +
               std::to_string(desk.snapshot_step) + " is dropped: its joiner fell behind by " +
               "more than two rounds of landings");
      desk.forget();
      desk.cv.notify_all();
      return;
    }
    desk.landed.push_back(
        {fragment, now, std::make_shared<const std::vector<float>>(std::move(mean))});
    desk.landed_floats += desk.landed.back().mean->size();
    desk.cv.notify_all();
  }

  // stream(), at step count `now` before its events: the loop's progress for the joiners, and an
  // admission there (accepted before this boundary: the decision normally came long ago); the
  // member it commits takes part from this boundary's operation on. The seconds it waited.
  double admit_at(const StreamRequest& req, StreamGroup& group, int64_t now) {
    std::unique_lock<std::mutex> lock(desk.mu);
    desk.reached = now;
    desk.cv.notify_all();
    if (!desk.admit || desk.admit->step != now) return 0;
    const int64_t t_wait = loco::now_ms();
    desk.cv.wait_for(lock, kAdmitDecision,
                     [&] { return desk.admit->phase != AdmitRequest::prepare; });
    const double waited = seconds_since(t_wait);
    if (desk.admit->phase == AdmitRequest::commit) {
      group.add(desk.admit->name, desk.admit->endpoint,
                req.op_id + uint64_t(*schedule().fragment_inside(req.round, now)));
      log_info("worker " + std::to_string(index) + ": " + desk.admit->name +
               " takes part from inner step " + std::to_string(now) + " of round " +
               std::to_string(req.round + 1) + " on");
    } else if (desk.admit->phase == AdmitRequest::prepare) {
      log_warn("worker " + std::to_string(index) + ": no decision on admitting " +
               desk.admit->name + " at inner step " + std::to_string(now) + " within " +
               std::to_string(kAdmitDecision.count()) + " s; going on without it");
    }
    desk.admit.reset();
    return waited;
  }

  // The test hooks installed in this process at `point` (actors/round_hooks.hpp; none in
  // production), and the seconds they took.
  double hook(RoundPoint point, int64_t round, int64_t step, const char* method,
              collective::detail::Hooks* comm_hooks = nullptr, std::span<float> delta = {},
              double* step_loss = nullptr) {
    RoundHooks* hooks = round_hooks();
    if (!hooks) return 0;
    const int64_t t = loco::now_ms();
    hooks->at(point,
              {index, round, step, cfg.inner.steps, method, &stopping, comm_hooks, delta, step_loss});
    return seconds_since(t);
  }

  // One inner step of rank `k`, and its figures (per-step records: metrics.jsonl "steps").
  // n steps of this are the arithmetic of run_inner_steps(n).
  StepFigures one_step(Rank& k) {
    if (stopping.load())
      throw std::runtime_error("InnerWorker " + std::to_string(index) +
                               ": stopped between two inner steps (its node is stopping)");
    const int64_t t = loco::now_ms();
    const double cpu = loco::process_cpu_seconds(), thread_cpu = loco::thread_cpu_seconds();
    const dl::InnerStats st = k.trainer->run_inner_steps(1);
    StepFigures f{st.mean_loss, st.last_lr, st.grad_norm, seconds_since(t),
                  int64_t(cfg.tokens_per_inner_step())};
    f.cpu_seconds = loco::process_cpu_seconds() - cpu;
    f.step_cpu_seconds = loco::thread_cpu_seconds() - thread_cpu;
    f.flops = flops_per_token * double(f.tokens);
    if (peak_flops > 0 && f.seconds > 0) f.mfu = f.flops / f.seconds / peak_flops;
    f.device = device_key;
    if (k.device.is_cuda()) {
      // The most memory allocated on this rank's GPU since the last step's figures.
      auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
      f.memory_bytes = allocator->getDeviceStats(k.device.index())
                           .allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)]
                           .peak;
      allocator->resetPeakStats(k.device.index());
    }
    return f;
  }

  // A step whose loss or gradient norm is not finite: the trainer did not take it (or a test
  // hook made its loss NaN); the round's steps stop there and the worker abstains from the
  // round's averages.
  static bool diverged(const StepFigures& f) {
    return !std::isfinite(f.loss) || !std::isfinite(f.grad_norm);
  }
  // Round `round` diverged at its inner step `step` (figures `f`): noted, and said in the log.
  void note_diverged(int64_t round, int64_t step, const StepFigures& f) {
    diverged_round = round;
    log_warn("worker " + std::to_string(index) + ": inner loss " + std::to_string(f.loss) +
             ", gradient norm " + std::to_string(f.grad_norm) + " at step " +
             std::to_string(step) + " of round " + std::to_string(round + 1) +
             ": it stops its steps there and sends nothing more in that round");
  }

  // Inner steps one at a time until `seconds` are spent since `t0` (at least one step, at most
  // 4·H; with seconds 0, exactly H), then Δ. One rank.
  InnerResult timed_steps(int64_t round, double seconds, int64_t t0) {
    Rank& k = lead();
    const int h = cfg.inner.steps;
    const int cap = seconds > 0 ? 4 * h : h;
    int steps = 0;
    double loss = 0;
    double stepping = 0;
    std::vector<StepFigures> per_step;
    while (steps < cap && (seconds <= 0 || steps == 0 || seconds_since(t0) < seconds)) {
      per_step.push_back(one_step(k));
      stepping += per_step.back().seconds;
      ++steps;
      stepping += hook(RoundPoint::after_inner_step, round, steps, "inner_timed", nullptr, {},
                       &per_step.back().loss);
      loss += per_step.back().loss;
      if (diverged(per_step.back())) {
        note_diverged(round, steps, per_step.back());
        break;
      }
    }
    k.trainer->pseudo_gradient(k.outer->theta(), {delta.data(), delta.size()}, 0);
    delta_round = round;
    InnerResult r;
    r.round = round;
    r.steps = steps;
    r.mean_loss = loss / steps;
    // A test hook's per-step delay counts as inner time: it stands for slower hardware, not
    // for waiting.
    r.seconds = stepping;
    r.tokens = int64_t(steps) * cfg.tokens_per_inner_step();
    r.per_step = std::move(per_step);
    last_inner = r;
    return r;
  }
  bool eager() const { return cfg.sync.mode == dl::SyncMode::eager; }

  State(std::string job, const std::string& spec, int idx)
      : job_id(std::move(job)),
        index(idx),
        cfg(dl::JobConfig::from_yaml(spec)),
        store(dl::TokenStore::open(data_under_root(cfg.data), cfg.vocab_size())),
        roots(this_actor().roots) {
    if (cfg.model.is_torchscript()) {
      dl::require_code_models_allowed();
      // The aggregator described the module at submission: every worker's file must be that.
      if (cfg.model.torchscript_hash.empty() || cfg.model.torchscript_parameters == 0)
        throw std::invalid_argument(
            "model.torchscript: the job does not record the module's hash and size (the "
            "aggregator writes them at submission)");
      cfg.model.torchscript_file =
          resolve_data_path(roots, cfg.model.torchscript, "model.torchscript");
    }
  }

  // The job's data folder (and tokenizer.json) as this node allows them: under its data root.
  static dl::DataConfig data_under_root(dl::DataConfig d) {
    return resolve_job_data(this_actor().roots, std::move(d));
  }
  // A path the aggregator (or anyone) asks this worker to write or read a checkpoint at.
  // A file strictly inside the root: its ".tmp" sibling must be inside too.
  std::string checkpoint_path(const std::string& path, const char* what) const {
    std::string p = resolve_checkpoint_path(roots, path, what);
    if (p == roots.checkpoints)
      throw PathError(std::string(what) + ": the checkpoint root itself is not a file");
    return p;
  }

  // The most bytes a join state or snapshot of this job can hold: θ, the momentum, the AdamW
  // moments, and the averages and provisional θ of the fragments in flight (each at most θ's
  // size; 12 copies in all is more than a job holds), with room for the archive's records.
  int64_t max_state_bytes() const {
    return 12 * int64_t(sizeof(float)) * cfg.model.parameter_count(cfg.vocab_size()) + (64 << 20);
  }
  Rank& lead() { return ranks[0]; }
  const Rank& lead() const { return ranks[0]; }

  // What save_checkpoint writes, less the fragments in flight, and what save_inner_state
  // writes; with `copy` the archives hold copies of the state (checkpoint_copier), to be
  // written on another thread while the inner steps go on.
  void checkpoint_archive(torch::serialize::OutputArchive& ar,
                          const dl::ArchiveCopy& copy = {}) const {
    ar.write("config", c10::IValue(cfg.to_yaml()));
    ar.write("round", c10::IValue(lead().outer->round()));
    ar.write("worker_index", c10::IValue(int64_t(index)));
    lead().outer->save(ar, "outer.", copy);
    lead().trainer->save(ar, "worker.0.", copy);
  }
  void inner_state_archive(torch::serialize::OutputArchive& ar,
                           const dl::ArchiveCopy& copy = {}) const {
    ar.write("stream", c10::IValue(int64_t(stream)));
    ar.write("round", c10::IValue(lead().outer->round()));
    lead().trainer->save(ar, "worker.", copy);
    if (feedback) feedback->save(ar, "error_feedback.", 0);  // a copy, made here
    // Eager: this worker's own provisional θ for each average in flight (the outer checkpoint
    // holds its writer's), which a worker resumed from the checkpoint corrects with. Never
    // changed once made, so not copied.
    if (streaming) streaming->write_provisionals(ar);
  }

  // Host buffers that checkpoints copy the state into, kept from one to the next: fresh ones
  // would fault their pages in on every copy, which took 0.1 to 0.6 s of a stepping thread for
  // a 6.4 M-parameter model on the 2-core VM against tens of milliseconds for the copy itself.
  std::vector<torch::Tensor> checkpoint_buffers;
  int checkpoint_buffers_new = 0;  // made by the last checkpoint_copier (the others were reused)
  // For one checkpoint: each distinct tensor copied once (the outer checkpoint and the inner
  // state both hold the parameters and moments), into the kept buffer of its turn when no
  // write in progress still holds that one, else into a new one that is kept from then on.
  dl::ArchiveCopy checkpoint_copier() {
    auto made = std::make_shared<std::map<const void*, torch::Tensor>>();
    auto turn = std::make_shared<size_t>(0);
    checkpoint_buffers_new = 0;
    return [this, made, turn](const torch::Tensor& t) {
      if (auto it = made->find(t.data_ptr()); it != made->end()) return it->second;
      if (*turn == checkpoint_buffers.size()) checkpoint_buffers.emplace_back();
      torch::Tensor& b = checkpoint_buffers[(*turn)++];
      // One reference (this list's) means no archive holds it: the write before is done.
      if (!b.defined() || b.use_count() > 1 || b.sizes() != t.sizes() ||
          b.scalar_type() != t.scalar_type()) {
        b = torch::empty(t.sizes(), t.options().device(torch::kCPU));
        ++checkpoint_buffers_new;
      }
      b.copy_(t);
      (*made)[t.data_ptr()] = b;
      return b;
    };
  }

  // stream(), as its round ends: the checkpoint it was asked for (StreamRequest::checkpoint,
  // inner_state; paths already resolved). Only a copy of the state is made here, on the
  // stepping thread; the files are written on a thread of their own, the outer checkpoint once
  // the fragments now in flight have landed in the next round (each hands its average in as it
  // lands), so that it holds them as save_checkpoint would.
  void start_checkpoint(const std::string& checkpoint, const std::string& inner) {
    const int64_t t0 = loco::now_ms();
    auto inner_ar = std::make_shared<torch::serialize::OutputArchive>();
    auto outer_ar = std::make_shared<torch::serialize::OutputArchive>();
    const dl::ArchiveCopy copy = checkpoint_copier();
    if (!inner.empty()) inner_state_archive(*inner_ar, copy);
    std::shared_ptr<dl::PendingLandings> landed;
    if (!checkpoint.empty()) {
      checkpoint_archive(*outer_ar, copy);
      landed = streaming->await_landings();
    }
    const int64_t round = lead().outer->round();
    const std::string who = "worker " + std::to_string(index) + ": the checkpoint after round " +
                            std::to_string(round) + ": ";
    log_info(who + "state copied in " + std::to_string(loco::now_ms() - t0) + " ms (" +
             std::to_string(checkpoint_buffers_new) + " new buffers), " +
             std::to_string(streaming->in_flight()) + " fragment(s) in flight");
    std::shared_future<std::string> write =
        std::async(std::launch::async,
                   [inner_ar, outer_ar, landed, checkpoint, inner, who]() mutable -> std::string {
                     // The archives go as the write ends, however it ends: their buffers are
                     // free for the next checkpoint (checkpoint_copier).
                     struct Release {
                       std::shared_ptr<torch::serialize::OutputArchive>&a, &b;
                       ~Release() { a.reset(), b.reset(); }
                     } release{inner_ar, outer_ar};
                     const int64_t t = loco::now_ms();
                     if (!inner.empty()) save_archive(*inner_ar, inner);
                     std::string written = inner;
                     if (!checkpoint.empty()) {
                       dl::StreamingRound::write_copies(*outer_ar, landed->wait(kLandedCopies));
                       save_archive(*outer_ar, checkpoint);
                       written += (written.empty() ? "" : " and ") + checkpoint;
                     }
                     log_info(who + "wrote " + written + " " + std::to_string(loco::now_ms() - t) +
                              " ms after the round's end");
                     return checkpoint.empty() ? std::string()
                                               : std::filesystem::absolute(checkpoint).string();
                   })
            .share();
    std::lock_guard<std::mutex> lock(checkpoints_mu);
    // Written ones nobody asked after go; one still being written stays (forgetting it here
    // would wait for it on this thread).
    for (auto it = checkpoint_writes.begin(); it != checkpoint_writes.end();)
      it = it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready
               ? checkpoint_writes.erase(it)
               : std::next(it);
    checkpoint_writes[round] = std::move(write);
  }
  // fn(rank) for every rank, each on its own thread (the caller's with one rank).
  void for_ranks(const std::function<void(Rank&)>& fn) {
    dl::on_ranks(ranks.size(), [&](size_t r) { fn(ranks[r]); });
  }
  dl::Slice slice_of(const Rank& k) const {
    const auto n = int64_t(delta.size());
    return k.group ? k.group->slice(n) : dl::Slice{0, n};
  }

  static collective::Options collective_options(const dl::JobConfig& cfg) {
    collective::Options o;
    o.codec = cfg.compression;
    o.chunk_bytes = size_t(cfg.allreduce.chunk_kb) * 1024;
    o.max_floats = size_t(cfg.model.parameter_count(cfg.vocab_size()));  // bounds what peers send
    o.peer_timeout = std::chrono::milliseconds(std::llround(cfg.allreduce.peer_timeout_s * 1000));
    // Streaming and eager: members begin a fragment's all-reduce up to a fragment interval apart.
    if (cfg.sync.mode != dl::SyncMode::blocking)
      o.entry_timeout =
          std::chrono::milliseconds(std::llround(cfg.allreduce.entry_timeout_s * 1000));
    return o;
  }
};

// A group as the aggregator sends it (names, one endpoint list per member, this member's rank),
// checked before use: lists of one length, a rank inside them, and as many endpoints per
// member as this worker has local ranks.
inline void check_group(const char* what, int index, const std::vector<std::string>& names,
                 const std::vector<std::vector<std::string>>& endpoints, int rank, size_t g) {
  const std::string who = "InnerWorker " + std::to_string(index) + ": " + what;
  if (names.size() != endpoints.size() || rank < 0 || size_t(rank) >= names.size())
    throw std::invalid_argument(who + " with " + std::to_string(names.size()) + " names, " +
                                std::to_string(endpoints.size()) + " endpoint lists and rank " +
                                std::to_string(rank));
  for (size_t i = 0; i < endpoints.size(); ++i)
    if (endpoints[i].size() != g)
      throw std::invalid_argument(who + " where " + escape_remote(names[i], 64) + " has " +
                                  std::to_string(endpoints[i].size()) +
                                  " endpoints, not one for each of this worker's " +
                                  std::to_string(g) + " local ranks");
}

}  // namespace loco::actors
