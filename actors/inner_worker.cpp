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
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "actors/round_decisions.hpp"
#include "actors/round_hooks.hpp"
#include "actors/timeouts.hpp"
#include "diloco/averager.hpp"
#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "diloco/device_info.hpp"
#include "diloco/hf_format.hpp"
#include "diloco/local_group.hpp"
#include "diloco/streaming_round.hpp"
#include "diloco/trainer.hpp"
#include "runtime/collective/allreduce.hpp"
#include "runtime/core/actor.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"

namespace loco::actors {

namespace dl = loco::diloco;

dl::DataConfig resolve_job_data(const PathRoots& roots, dl::DataConfig d) {
  d.dir = resolve_data_path(roots, d.dir, "data.dir");
  if (d.tokenizer == dl::TokenizerKind::json)
    d.tokenizer_json = resolve_data_path(roots, d.tokenizer_json, "data.tokenizer");
  return d;
}

namespace {

// Seconds since `t0`, both on the runtime's one steady clock (runtime/core/util.hpp).
double seconds_since(int64_t t0) { return static_cast<double>(loco::now_ms() - t0) / 1000.0; }

// Bytes [offset, offset + length) of a serialized state, shared without a copy; the range is
// checked first (it comes from the network).
Blob bytes_of(const std::shared_ptr<const std::string>& state, int64_t offset, int64_t length,
              const char* method, const char* what) {
  if (offset < 0 || length < 0 || size_t(offset) > state->size() ||
      size_t(length) > state->size() - size_t(offset))
    throw std::invalid_argument(std::string(method) + ": [" + std::to_string(offset) + ", " +
                                std::to_string(offset + length) + ") is outside the " +
                                std::to_string(state->size()) + " bytes of " + what);
  return Blob(state, reinterpret_cast<const uint8_t*>(state->data()) + offset, size_t(length));
}

// The host this node is reached at, for the collective's socket.
std::string node_host() {
  std::string addr = Runtime::current().address();
  auto colon = addr.rfind(':');
  return colon == std::string::npos ? "127.0.0.1" : addr.substr(0, colon);
}

}  // namespace

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

namespace {

// `ar` to `path` atomically (a file beside it, then renamed over it).
void save_archive(torch::serialize::OutputArchive& ar, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  ar.save_to(path + ".tmp");
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace

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
  std::vector<uint64_t> from_op;            // each one's first operation (0: all of the call's)
  std::string self;
  std::string zero_member;  // whose Δ counts with weight zero in operation `zero_op`
  uint64_t zero_op = 0;

  // The group of operation `op`: the members that take part in it, this worker's rank.
  collective::Group at(uint64_t op) {
    std::lock_guard<std::mutex> lock(mu);
    collective::Group g;
    g.round_id = op;
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
    members.push_back({name, endpoint});
    from_op.push_back(op);
    zero_member = name;
    zero_op = op;
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

// The fragments' averages of a stream() call over the network (the round engine's
// FragmentAverager): on the worker's communicator, one operation at a time, each after the one
// before (`last` is the newest; a failure before fails this one too), over the group as it is
// when the operation starts (the ones before it may have dropped members); a member lost on the
// way is dropped and the rest go again.
class GroupAverager final : public dl::FragmentAverager {
 public:
  GroupAverager(collective::Communicator& comm, std::shared_ptr<StreamGroup> group,
                std::shared_future<uint64_t>& last)
      : comm_(comm), group_(std::move(group)), last_(last) {}
  std::shared_future<uint64_t> start(uint64_t op, std::span<const std::span<const float>> deltas,
                                     std::span<const std::span<float>> means) override {
    if (deltas.size() != 1 || means.size() != 1)
      throw std::logic_error("GroupAverager: one replica per worker");
    collective::Communicator* comm = &comm_;
    const std::span<const float> in = deltas[0];
    const std::span<float> out = means[0];
    last_ = std::async(std::launch::async, [comm, group = group_, op, in, out, before = last_] {
              if (before.valid()) before.get();
              uint64_t bytes = 0;
              for (;;) {
                const collective::Group g = group->at(op);
                try {
                  comm->allreduce(g, in, out);
                  bytes += comm->last_stats().bytes_sent;
                  if (const float c = group->weight_correction(g); c != 1.0f)
                    for (float& x : out) x *= c;
                  return bytes;
                } catch (const collective::PeerLostError& e) {
                  bytes += comm->last_stats().bytes_sent;
                  if (!group->drop(e.peer(), g)) throw;
                  log_warn("fragment all-reduce " + std::to_string(op) + ": " + e.peer() +
                           " lost; the others finish it without it");
                }
              }
            }).share();
    return last_;
  }

 private:
  collective::Communicator& comm_;
  std::shared_ptr<StreamGroup> group_;
  std::shared_future<uint64_t>& last_;
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
  std::vector<float> delta, averaged;  // whole; rank r writes and averages its slice
  int64_t delta_round = -1;            // the round whose Δ `delta` holds
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

  // The operations' threads use a rank's communicator; a checkpoint's writer waits for
  // fragments in flight, which drain() lands or abandons.
  ~State() { drain(); }
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
        cfg, dl::parameter_fragments(lead().trainer->model(), cfg.sync.fragments),
        std::vector<dl::Replica>{{lead().trainer.get(), lead().outer.get()}});
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
              collective::detail::Hooks* comm_hooks = nullptr) {
    RoundHooks* hooks = round_hooks();
    if (!hooks) return 0;
    const int64_t t = loco::now_ms();
    hooks->at(point, {index, round, step, cfg.inner.steps, method, &stopping, comm_hooks});
    return seconds_since(t);
  }

  // One inner step of rank `k`, and its figures (per-step records: metrics.jsonl "steps").
  // n steps of this are the arithmetic of run_inner_steps(n).
  StepFigures one_step(Rank& k) {
    if (stopping.load())
      throw std::runtime_error("InnerWorker " + std::to_string(index) +
                               ": stopped between two inner steps (its node is stopping)");
    const int64_t t = loco::now_ms();
    const double cpu = loco::process_cpu_seconds();
    const dl::InnerStats st = k.trainer->run_inner_steps(1);
    StepFigures f{st.mean_loss, st.last_lr, st.grad_norm, seconds_since(t),
                  int64_t(cfg.tokens_per_inner_step())};
    f.cpu_seconds = loco::process_cpu_seconds() - cpu;
    f.flops = flops_per_token * double(f.tokens);
    if (peak_flops > 0 && f.seconds > 0) f.mfu = f.flops / f.seconds / peak_flops;
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
      loss += per_step.back().loss;
      stepping += per_step.back().seconds;
      ++steps;
      stepping += hook(RoundPoint::after_inner_step, round, steps, "inner_timed");
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
        roots(this_actor().roots) {}

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

// A group as the aggregator sends it (names, one endpoint list per member, this member's rank),
// checked before use: lists of one length, a rank inside them, and as many endpoints per
// member as this worker has local ranks.
void check_group(const char* what, int index, const std::vector<std::string>& names,
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

}  // namespace

InnerWorker::InnerWorker(std::string job_id, std::string spec, int index) {
  require_own_job("diloco.InnerWorker", job_id);
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
  s_->flops_per_token = dl::training_flops_per_token(
      s_->cfg.model, s_->cfg.model.parameter_count(s_->cfg.vocab_size()));
  s_->ranks.resize(size_t(g));
  for (int r = 0; r < g; ++r) {
    Rank& k = s_->ranks[size_t(r)];
    k.device = devices[size_t(r)];
    auto options = State::collective_options(s_->cfg);
    options.security = Runtime::current().security();  // the node's cluster key
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
  s_->streaming.reset();  // over the ranks' trainers and outer states, which are made anew
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
    inner_ar->load_from(init.inner_state, torch::kCPU);
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
    k.outer = std::make_unique<dl::OuterOptimizer>(s_->cfg.outer, k.trainer->flat_parameters());
  }
  s_->make_streaming();
  const int64_t t0 = loco::now_ms();
  if (!init.source.empty()) {
    // Straight from a live member (idle between rounds), in parts with a few in
    // flight: on a slow link one 100 MB reply would hold up the heartbeats behind
    // it past the detection time. Parts are sized to about 100 ms of the measured
    // rate (128 KB to 16 MB), so at most ~0.4 s of data is ever queued ahead.
    constexpr size_t kInFlight = 4;
    auto src = Runtime::current().get_actor<InnerWorker>(init.source);
    // Mid-round (streaming): the source's snapshot between two of its inner steps, served
    // beside its stream() call; its landings since come with this worker's stream().
    std::optional<JoinOffer> offer;
    if (init.mid_round)
      offer = src.call(&InnerWorker::offer_state, init.round).get(kOfferStateCall);
    auto part_of = [&](int64_t at, int64_t len) {
      return offer ? src.call(&InnerWorker::snapshot_part, init.round, offer->step, at, len)
                   : src.call(&InnerWorker::join_state_part, init.round, at, len);
    };
    const int64_t total =
        offer ? offer->bytes
              : src.call(&InnerWorker::join_state_size, init.round).get(kStateCopyCall);
    std::string bytes(size_t(total), '\0');
    std::deque<std::pair<int64_t, Future<Blob>>> parts;
    const int64_t started = loco::now_ms();
    int64_t received = 0;
    for (int64_t next = 0; next < total || !parts.empty();) {
      while (next < total && parts.size() < kInFlight) {
        const double rate = double(received) / std::max(1e-3, seconds_since(started));
        const int64_t part = std::clamp<int64_t>(int64_t(rate * 0.1), 128 << 10, 16 << 20);
        const int64_t len = std::min(part, total - next);
        parts.emplace_back(next, part_of(next, len));
        next += len;
      }
      auto [at, f] = std::move(parts.front());
      parts.pop_front();
      Blob b = f.get(kStateCopyCall);
      std::memcpy(bytes.data() + at, b.data(), b.size());
      received += int64_t(b.size());
    }
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
      s_->streaming->read_in_flight(ar);
    s_->joined_snapshot_step = offer ? offer->step : -1;
    out.snapshot_step = s_->joined_snapshot_step;
    out.state_bytes = bytes.size();
  } else if (!init.checkpoint.empty()) {
    torch::serialize::InputArchive ar;
    ar.load_from(init.checkpoint, torch::kCPU);
    for (Rank& k : s_->ranks) k.outer->load(ar, "outer.");
    if (s_->overlapped()) s_->streaming->read_in_flight(ar);
    // Eager: each average in flight is corrected with this worker's own provisional θ, from its
    // inner state of the same round, not with the one of the worker that wrote the checkpoint.
    c10::IValue round;
    if (s_->overlapped() && inner_ar && inner_ar->try_read("round", round) &&
        round.toInt() == s_->lead().outer->round())
      s_->streaming->read_provisionals(*inner_ar);
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
    for (Rank& k : s_->ranks) k.outer = std::make_unique<dl::OuterOptimizer>(s_->cfg.outer, theta);
    s_->make_streaming();
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
  const auto n = size_t(s_->lead().trainer->parameter_count());
  s_->delta.assign(n, 0.0f);
  s_->averaged.assign(n, 0.0f);
  s_->delta_round = -1;
  s_->stepped_round = -1;
  out.parameters = int64_t(n);
  out.theta_hash = outer.theta_hash();
  out.device = s_->device.reason;
  if (s_->ranks.size() > 1) out.device += ", " + std::to_string(s_->ranks.size()) + " local ranks";
  return out;
}

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
  // The ranks step together (their gradients averaged every step), then each writes its
  // slice of Δ = θ − θ_local. The loss is averaged over the ranks too: rank 0's is the worker's.
  // One step at a time (the same arithmetic as run_inner_steps(H)), for the per-step figures.
  const int h = s_->cfg.inner.steps;
  std::vector<StepFigures> per_step;
  s_->for_ranks([&](Rank& k) {
    std::vector<StepFigures> mine;
    for (int i = 0; i < h; ++i) {
      mine.push_back(s_->one_step(k));
      s_->hook(RoundPoint::after_inner_step, round, i + 1, "inner");
    }
    if (&k == &s_->lead()) per_step = std::move(mine);
    const dl::Slice sl = s_->slice_of(k);
    k.trainer->pseudo_gradient(k.outer->theta(), {s_->delta.data() + sl.begin, size_t(sl.size())},
                               sl.begin);
  });
  s_->delta_round = round;
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

InnerResult InnerWorker::inner_timed(int64_t round, double seconds) {
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
  return s_->timed_steps(round, seconds, t0);
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
  const double scale = req.tokens.empty() ? 1.0 : member_scale(req.tokens, req.rank);
  // Rank r averages slice r of Δ with rank r of every other member. Out of place: Δ stays
  // intact if a member is lost, for the re-formed group. Δ is kept after a success too: an
  // attempt can succeed for this member and fail for another, and the retry (the same round,
  // perhaps fewer members) must start from the outer state that every member of it holds:
  // the one before this member's step.
  s_->for_ranks([&](Rank& k) {
    const size_t r = size_t(&k - s_->ranks.data());
    collective::Group group;
    for (size_t i = 0; i < req.names.size(); ++i)
      group.members.push_back({g == 1 ? req.names[i] : req.names[i] + "/rank" + std::to_string(r),
                               req.endpoints[i][r]});
    group.rank = req.rank;
    group.round_id = req.op_id;
    const dl::Slice sl = s_->slice_of(k);
    if (scale == 1.0) {
      k.comm->allreduce(group, {s_->delta.data() + sl.begin, size_t(sl.size())},
                        {s_->averaged.data() + sl.begin, size_t(sl.size())});
    } else {
      // Weighted by tokens: the plain mean of the members' scaled Δ. Scaled into `averaged`
      // (Δ stays as it was for a retry), reduced in place there.
      for (int64_t i = sl.begin; i < sl.end; ++i)
        s_->averaged[size_t(i)] = float(double(s_->delta[size_t(i)]) * scale);
      k.comm->allreduce(group, std::span<float>(s_->averaged.data() + sl.begin, size_t(sl.size())));
    }
  });
  s_->hook(RoundPoint::after_allreduce, req.round, 0, "reduce");
  // Each rank steps its slice of θ and the momentum, then the ranks gather the slices: θ
  // and the momentum whole again on every rank (the momentum for checkpoints and joiners).
  const bool redo = s_->stepped_round == req.round;
  s_->for_ranks([&](Rank& k) {
    if (redo)
      k.outer->undo_step();
    else
      k.outer->keep_before_step();
    const dl::Slice sl = s_->slice_of(k);
    k.outer->step({s_->averaged.data() + sl.begin, size_t(sl.size())}, sl.begin);
    k.trainer->gather_outer_state(*k.outer, true);
  });
  s_->stepped_round = req.round;
  ReduceResult r;
  r.theta_hash = s_->lead().outer->theta_hash();
  for (const Rank& k : s_->ranks) r.bytes_sent += k.comm->last_stats().bytes_sent;
  r.seconds = seconds_since(t0);
  return r;
}

// Streaming DiLoCo on a cluster, the simulator's run_streaming_round for one worker: from
// event to event (a fragment's synchronization after inner step start + (f+1)·H/P, or a
// landing τ steps after one), inner steps in between. A synchronization writes the fragment's
// Δ and starts its all-reduce on a thread; a landing waits for that average (the only time
// the inner steps wait on the network), applies the outer step to the fragment's ranges and
// mixes them into the local parameters.
StreamResult InnerWorker::stream(StreamRequest req) {
  const int64_t t0 = loco::now_ms();
  // A round sent ahead (pipeline_next) reaches the actor the head restarted after the member it
  // was meant for died: this instance holds no outer state, and that member is gone.
  if (!s_->lead().trainer)
    throw ActorDiedError("InnerWorker " + std::to_string(s_->index) +
                         " holds no outer state (restarted, or never initialized): the member "
                         "that round " + std::to_string(req.round + 1) + " was sent to is gone");
  if (!s_->overlapped())
    throw std::logic_error("InnerWorker: stream() in a job whose sync.mode is blocking");
  const std::string checkpoint_file =
      req.checkpoint.empty() ? "" : s_->checkpoint_path(req.checkpoint, "stream: checkpoint");
  const std::string inner_file =
      req.inner_state.empty() ? "" : s_->checkpoint_path(req.inner_state, "stream: inner_state");
  if (s_->ranks.size() != 1)
    throw dl::ConfigError("sync.mode: streaming runs one local rank per worker for now");
  check_group("stream", s_->index, req.names, req.endpoints, req.rank, 1);
  Rank& k = s_->lead();
  if (k.outer->round() != req.round)
    throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) + ": stream of round " +
                                std::to_string(req.round + 1) +
                                ", but its outer state is of round " +
                                std::to_string(k.outer->round()));
  const dl::FragmentSchedule schedule = s_->schedule();
  const int64_t start = schedule.start(req.round);
  const bool joining = req.from_step >= 0;
  const std::optional<int> first =
      joining ? schedule.fragment_inside(req.round, req.from_step) : std::nullopt;
  if (joining && (!first || req.source.empty() || s_->joined_snapshot_step < 0))
    throw std::invalid_argument(
        "InnerWorker " + std::to_string(s_->index) + ": stream of round " +
        std::to_string(req.round + 1) + " from step " + std::to_string(req.from_step) +
        (s_->joined_snapshot_step < 0 ? ", but it copied no snapshot mid-round"
                                      : ", which is not a fragment boundary inside the round"));

  auto group = std::make_shared<StreamGroup>();
  for (size_t i = 0; i < req.names.size(); ++i) {
    group->members.push_back({req.names[i], req.endpoints[i][0]});
    group->from_op.push_back(0);
  }
  group->self = req.names[size_t(req.rank)];
  if (joining) {
    group->zero_member = group->self;
    group->zero_op = req.op_id + uint64_t(*first);
  }
  JoinDesk& desk = s_->desk;
  {
    std::lock_guard<std::mutex> lock(desk.mu);
    desk.forget();
    desk.admit.reset();
    desk.round = req.round;
    desk.reached = joining ? req.from_step : start;
  }
  // However the call ends, nobody waits on this round's desk any longer.
  struct Close {
    JoinDesk& d;
    ~Close() {
      std::lock_guard<std::mutex> lock(d.mu);
      d.round = -1;
      d.forget();
      d.admit.reset();
      d.cv.notify_all();
    }
  } close{desk};

  StreamResult out;
  if (joining) catch_up(req);

  // What this worker does between the round engine's events: its inner steps, one at a time
  // for the per-step figures (the arithmetic of run_inner_steps(n)), with the test hooks; a
  // snapshot a joiner asked for; the admission of a joiner at a boundary; the landings kept
  // for a joiner that copied a snapshot.
  struct Worker final : dl::StreamingRound::Driver {
    State& s;
    const StreamRequest& req;
    StreamGroup& group;
    StreamResult& out;
    int64_t start;
    double loss = 0;
    Worker(State& st, const StreamRequest& r, StreamGroup& g, StreamResult& o, int64_t s0)
        : s(st), req(r), group(g), out(o), start(s0) {}
    void before_steps(int64_t now) override { s.snapshot_if_wanted(req.round, now); }
    void steps(int64_t now, int n) override {
      const int64_t t_inner = loco::now_ms();
      double chunk = 0;  // summed as run_inner_steps(n) sums, then its mean times n as before
      for (int i = 0; i < n; ++i) {
        out.inner.per_step.push_back(s.one_step(s.lead()));
        chunk += out.inner.per_step.back().loss;
        // A test hook's delay counts as inner time, as in timed_steps.
        s.hook(RoundPoint::after_inner_step, req.round, now - start + i + 1, "stream");
      }
      out.inner.seconds += seconds_since(t_inner);
      out.inner.steps += n;
      loss += (n > 0 ? chunk / n : 0.0) * n;
      s.hook(RoundPoint::stream_events, req.round, now + n - start, "stream");
    }
    void at_event(int64_t now) override {
      out.wait_seconds += s.admit_at(req, group, now);
    }
    void landed(dl::InFlightFragment& f, int64_t now) override {
      s.log_landing(f.fragment, f.mean[0], now);
    }
  } worker(*s_, req, *group, out, start);
  GroupAverager averager(*k.comm, group, s_->last_op);

  dl::StreamingRound::Round round;
  round.round = req.round;
  round.last = req.last;
  round.from_step = req.from_step;
  round.op_base = req.op_id;
  const dl::StreamingRound::Result r = s_->streaming->run(round, averager, worker);
  out.wait_seconds += r.wait_seconds;
  out.bytes_sent += r.bytes_sent;
  out.inner.round = req.round;
  // Over the steps it took: a worker that joined mid-round took fewer than H.
  out.inner.mean_loss = out.inner.steps > 0 ? worker.loss / out.inner.steps : 0.0;
  out.theta_hash = k.outer->theta_hash();
  out.group = group->names();
  if (!checkpoint_file.empty() || !inner_file.empty())
    s_->start_checkpoint(checkpoint_file, inner_file);
  out.seconds = seconds_since(t0);
  return out;
}

// A worker that joined mid-round: its snapshot (of the donor's step joined_snapshot_step)
// brought up to the fragment boundary it takes part from, with the averages the donor landed
// since, in the donor's order; then its parameters start from that θ and its schedule at that
// step. The donor's landings before from_step are all done once it has reached from_step.
void InnerWorker::catch_up(const StreamRequest& req) {
  Rank& k = s_->lead();
  auto src = Runtime::current().get_actor<InnerWorker>(req.source);
  const int64_t since = s_->joined_snapshot_step;
  size_t applied = 0;
  const int64_t deadline = loco::now_ms() + Millis(kCatchUp).count();
  for (;;) {
    const LandedList l =
        src.call(&InnerWorker::landed, req.round, since, req.from_step).get(kStateCopyCall);
    if (l.fragments.size() != l.lands.size() || l.fragments.size() < applied)
      throw std::runtime_error("InnerWorker " + std::to_string(s_->index) + ": " + req.source +
                               " listed its landings inconsistently");
    for (; applied < l.fragments.size(); ++applied) {
      const int f = l.fragments[applied];
      if (f < 0 || f >= s_->cfg.sync.fragments)
        throw std::runtime_error("InnerWorker " + std::to_string(s_->index) + ": " + req.source +
                                 " landed fragment " + std::to_string(f) + " of " +
                                 std::to_string(s_->cfg.sync.fragments));
      const Blob mean = src.call(&InnerWorker::landed_mean, req.round, since, int64_t(applied))
                            .get(kStateCopyCall);
      const int64_t size = s_->streaming->fragment_size(f);
      if (mean.as<float>().size() != size_t(size))
        throw std::runtime_error("InnerWorker " + std::to_string(s_->index) + ": the average of " +
                                 "fragment " + std::to_string(f) + " from " + req.source +
                                 " holds " + std::to_string(mean.as<float>().size()) +
                                 " values, not " + std::to_string(size));
      s_->streaming->land_outer(f, mean.as<float>());
    }
    if (l.complete) break;
    if (loco::now_ms() > deadline)
      throw std::runtime_error("InnerWorker " + std::to_string(s_->index) + ": " + req.source +
                               " did not reach inner step " + std::to_string(req.from_step) +
                               " within " + std::to_string(kCatchUp.count()) + " s");
  }
  k.trainer->load_parameters(k.outer->theta());
  k.trainer->set_step(req.from_step);
  s_->joined_snapshot_step = -1;
  log_info("worker " + std::to_string(s_->index) + " joins round " + std::to_string(req.round + 1) +
           " at inner step " + std::to_string(req.from_step) + ": snapshot of step " +
           std::to_string(since) + " and " + std::to_string(applied) + " landing(s) since, from " +
           req.source);
}

JoinOffer InnerWorker::offer_state(int64_t round) {
  if (s_->cfg.sync.mode != dl::SyncMode::streaming)
    throw std::invalid_argument("offer_state: joining mid-round is for sync.mode streaming");
  JoinDesk& d = s_->desk;
  std::unique_lock<std::mutex> lock(d.mu);
  auto have = [&] { return d.snapshot && d.snapshot_round == round; };
  if (d.round != round)
    throw std::invalid_argument("offer_state: worker " + std::to_string(s_->index) +
                                " is not in round " + std::to_string(round + 1));
  if (!have()) {
    d.wanted = true;
    d.cv.wait_for(lock, kOfferState, [&] { return have() || d.round != round; });
  }
  if (!have())
    throw std::runtime_error("offer_state: worker " + std::to_string(s_->index) +
                             " took no snapshot in round " + std::to_string(round + 1) +
                             " (the round ended, or no inner step came within " +
                             std::to_string(kOfferState.count()) + " s)");
  return JoinOffer{round, d.snapshot_step, int64_t(d.snapshot->size())};
}

Blob InnerWorker::snapshot_part(int64_t round, int64_t step, int64_t offset, int64_t length) {
  JoinDesk& d = s_->desk;
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.snapshot || d.snapshot_round != round || d.snapshot_step != step)
    throw std::invalid_argument("snapshot_part: worker " + std::to_string(s_->index) +
                                " holds no snapshot of step " + std::to_string(step) +
                                " of round " + std::to_string(round + 1) + " any more");
  return bytes_of(d.snapshot, offset, length, "snapshot_part", "the snapshot");
}

LandedList InnerWorker::landed(int64_t round, int64_t since, int64_t upto) {
  JoinDesk& d = s_->desk;
  std::unique_lock<std::mutex> lock(d.mu);
  auto same = [&] { return d.round == round && d.snapshot && d.snapshot_step == since; };
  // Up to kLandedHold for the donor to reach `upto`; what landed so far comes back either way.
  d.cv.wait_for(lock, kLandedHold, [&] { return !same() || d.reached >= upto; });
  if (!same())
    throw std::runtime_error("landed: worker " + std::to_string(s_->index) +
                             " no longer holds the snapshot of step " + std::to_string(since) +
                             " of round " + std::to_string(round + 1));
  LandedList out;
  for (const JoinDesk::Landing& l : d.landed) {
    if (l.lands >= upto) break;
    out.fragments.push_back(l.fragment);
    out.lands.push_back(l.lands);
  }
  out.complete = d.reached >= upto;
  return out;
}

Blob InnerWorker::landed_mean(int64_t round, int64_t since, int64_t index) {
  JoinDesk& d = s_->desk;
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.round != round || !d.snapshot || d.snapshot_step != since || index < 0 ||
      size_t(index) >= d.landed.size())
    throw std::invalid_argument("landed_mean: worker " + std::to_string(s_->index) +
                                " holds no landing " + std::to_string(index) + " since step " +
                                std::to_string(since) + " of round " + std::to_string(round + 1));
  const auto& mean = d.landed[size_t(index)].mean;
  return Blob(mean, reinterpret_cast<const uint8_t*>(mean->data()), mean->size() * sizeof(float));
}

int64_t InnerWorker::progress(int64_t round) {
  std::lock_guard<std::mutex> lock(s_->desk.mu);
  return s_->desk.round == round ? s_->desk.reached : -1;
}

bool InnerWorker::admit(AdmitRequest req) {
  JoinDesk& d = s_->desk;
  std::lock_guard<std::mutex> lock(d.mu);
  if (req.phase == AdmitRequest::prepare) {
    // Yes only while this worker is before that boundary, which must be a synchronization
    // inside the round, and with no other admission pending.
    if (s_->cfg.sync.mode != dl::SyncMode::streaming || d.round != req.round ||
        d.reached >= req.step || !s_->schedule().fragment_inside(req.round, req.step) || d.admit ||
        req.name.empty() || req.endpoint.empty())
      return false;
    d.admit = req;
    return true;
  }
  if (req.phase != AdmitRequest::commit && req.phase != AdmitRequest::abort)
    throw std::invalid_argument("admit: phase " + std::to_string(req.phase) + " is not one");
  if (!d.admit || d.admit->round != req.round || d.admit->step != req.step ||
      d.admit->name != req.name || d.admit->phase != AdmitRequest::prepare)
    return false;
  d.admit->phase = req.phase;
  d.cv.notify_all();
  return true;
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
    if (s_->streaming) s_->streaming->write_in_flight(ar);
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
  if (s_->streaming) s_->streaming->write_in_flight(ar);
  save_archive(ar, path);
  return std::filesystem::absolute(path).string();
}

std::string InnerWorker::save_inner_state(std::string path) {
  path = s_->checkpoint_path(path, "save_inner_state: path");
  torch::serialize::OutputArchive ar;
  s_->inner_state_archive(ar);
  save_archive(ar, path);
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
                  .concurrent_method("checkpoint_written", &InnerWorker::checkpoint_written));

}  // namespace loco::actors
