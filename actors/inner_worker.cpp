#include "actors/inner_worker.hpp"

#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "diloco/averager.hpp"
#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "diloco/trainer.hpp"
#include "runtime/collective/allreduce.hpp"
#include "runtime/core/actor.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"

namespace loco::actors {

namespace dl = loco::diloco;

namespace {

// Seconds since `t0`, both on the runtime's one steady clock (runtime/core/util.hpp).
double seconds_since(int64_t t0) { return static_cast<double>(loco::now_ms() - t0) / 1000.0; }

// Fault injection for the fault-tolerance tests and scripts/chaos, off unless
// LOCO_FAULT is set: "worker=I,round=R,at=inner|reduce" makes the process that
// hosts worker I SIGKILL itself in round R (counted from 1), halfway through its
// inner steps or right after its first all-reduce message. The moment goes to
// the file $LOCO_FAULT_LOG (unix ms), so that a test can time the detection.
struct FaultPlan {
  int worker = -1;
  int64_t round = -1;
  std::string at;

  static FaultPlan from_env() {
    FaultPlan p;
    const char* v = std::getenv("LOCO_FAULT");
    if (!v) return p;
    std::string s = v;
    for (size_t at = 0; at < s.size();) {
      size_t end = s.find(',', at);
      std::string kv = s.substr(at, end == std::string::npos ? std::string::npos : end - at);
      auto eq = kv.find('=');
      if (eq != std::string::npos) {
        std::string k = kv.substr(0, eq), val = kv.substr(eq + 1);
        if (k == "worker") p.worker = std::stoi(val);
        if (k == "round") p.round = std::stoll(val);
        if (k == "at") p.at = val;
      }
      if (end == std::string::npos) break;
      at = end + 1;
    }
    return p;
  }
  bool hits(int index, int64_t round0, const char* where) const {
    return worker == index && round == round0 + 1 && at == where;
  }
  [[noreturn]] static void die() {
    if (const char* log = std::getenv("LOCO_FAULT_LOG")) {
      std::ofstream(log, std::ios::app) << unix_ms() << "\n";
    }
    ::kill(::getpid(), SIGKILL);
    std::abort();
  }
};

// The host this node is reached at, for the collective's socket.
std::string node_host() {
  std::string addr = Runtime::current().core()->address();
  auto colon = addr.rfind(':');
  return colon == std::string::npos ? "127.0.0.1" : addr.substr(0, colon);
}

}  // namespace

struct InnerWorker::State {
  std::string job_id;
  int index = 0;
  dl::JobConfig cfg;
  dl::TokenStore store;
  std::unique_ptr<dl::InnerTrainer> trainer;
  std::unique_ptr<dl::OuterOptimizer> outer;
  std::vector<float> delta, averaged;
  int64_t delta_round = -1;    // the round whose Δ `delta` holds
  int64_t stepped_round = -1;  // the round whose outer step θ holds (undone if it is re-run)
  bool fault_fired = false;
  InnerResult last_inner;
  uint64_t stream = 0;
  std::shared_ptr<const std::string> shared_state;  // see join_state()
  int64_t shared_state_round = -1;
  FaultPlan fault = FaultPlan::from_env();
  torch::Tensor val_windows;
  dl::DeviceChoice device;        // from the job's `device` and the GPUs the head gave this actor
  collective::Communicator comm;  // one for the worker's life: failed operations leave it ready

  State(std::string job, const std::string& spec, int idx)
      : job_id(std::move(job)),
        index(idx),
        cfg(dl::JobConfig::from_yaml(spec)),
        store(dl::TokenStore::open(cfg.data)),
        comm("tcp://" + node_host() + ":0", collective_options(cfg)) {}

  static collective::Options collective_options(const dl::JobConfig& cfg) {
    collective::Options o;
    o.codec = cfg.compression;
    o.chunk_bytes = size_t(cfg.allreduce.chunk_kb) * 1024;
    o.peer_timeout = std::chrono::milliseconds(std::llround(cfg.allreduce.peer_timeout_s * 1000));
    return o;
  }
};

InnerWorker::InnerWorker(std::string job_id, std::string spec, int index) {
  s_ = std::make_unique<State>(std::move(job_id), spec, index);
  if (s_->cfg.threads > 0) at::set_num_threads(s_->cfg.threads);
  // CUDA is not even probed for device: cpu.
  const bool cuda = s_->cfg.device != dl::DeviceKind::cpu && torch::cuda::is_available();
  s_->device = dl::choose_device(s_->cfg.device, this_actor().gpus, cuda,
                                 cuda ? int(torch::cuda::device_count()) : 0);
  const int n = s_->cfg.eval.batches * s_->cfg.inner.batch_size;
  s_->val_windows = torch::empty({n, s_->cfg.model.context + 1}, torch::kInt64);
  dl::validation_windows(s_->store, s_->cfg.model.context, n,
                         {s_->val_windows.data_ptr<int64_t>(), size_t(s_->val_windows.numel())});
}

InnerWorker::~InnerWorker() = default;

std::string InnerWorker::endpoint() const { return s_->comm.endpoint(); }

InitResult InnerWorker::init(WorkerInit init) {
  InitResult out;
  s_->index = init.index;
  // A job resumed from a checkpoint continues each worker from its own inner
  // state (exactly); a worker that joins a live job takes a new data stream and
  // copies the AdamW moments of the live worker it copies θ from.
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
  const torch::Device device = s_->device.cuda
                                   ? torch::Device(torch::kCUDA, c10::DeviceIndex(s_->device.index))
                                   : torch::Device(torch::kCPU);
  s_->trainer = std::make_unique<dl::InnerTrainer>(s_->cfg, s_->store, init.shards, init.stream,
                                                   init.total_steps, device);
  if (inner_ar) {
    s_->trainer->load(*inner_ar, "worker.");  // AdamW moments, step, data position
    // The aggregator's dealing holds, should the members differ from the checkpoint's.
    if (s_->trainer->sampler().shards() != init.shards)
      s_->trainer->sampler().set_shards(init.shards);
  }
  // Behind the job when the slot's inner state is older than the outer state it gets.
  s_->trainer->set_step(init.round * s_->cfg.inner.steps);
  s_->outer = std::make_unique<dl::OuterOptimizer>(s_->cfg.outer, s_->trainer->flat_parameters());
  const int64_t t0 = loco::now_ms();
  if (!init.source.empty()) {
    // Straight from a live member (idle between rounds), in parts with a few in
    // flight: on a slow link one 100 MB reply would hold up the heartbeats behind
    // it past the detection time. Parts are sized to about 100 ms of the measured
    // rate (128 KB to 16 MB), so at most ~0.4 s of data is ever queued ahead.
    constexpr size_t kInFlight = 4;
    auto src = Runtime::current().get_actor<InnerWorker>(init.source);
    const int64_t total = src.call(&InnerWorker::join_state_size, init.round).get(Millis(60000));
    std::string bytes(size_t(total), '\0');
    std::deque<std::pair<int64_t, Future<Blob>>> parts;
    const int64_t started = loco::now_ms();
    int64_t received = 0;
    for (int64_t next = 0; next < total || !parts.empty();) {
      while (next < total && parts.size() < kInFlight) {
        const double rate = double(received) / std::max(1e-3, seconds_since(started));
        const int64_t part = std::clamp<int64_t>(int64_t(rate * 0.1), 128 << 10, 16 << 20);
        const int64_t len = std::min(part, total - next);
        parts.emplace_back(next, src.call(&InnerWorker::join_state_part, init.round, next, len));
        next += len;
      }
      auto [at, f] = std::move(parts.front());
      parts.pop_front();
      Blob b = f.get(Millis(60000));
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
    s_->outer->load(ar, "outer.");
    s_->trainer->load_moments(ar, "moments.");
    out.state_bytes = bytes.size();
  } else if (!init.checkpoint.empty()) {
    torch::serialize::InputArchive ar;
    ar.load_from(init.checkpoint, torch::kCPU);
    s_->outer->load(ar, "outer.");
    out.state_bytes = uint64_t(std::filesystem::file_size(init.checkpoint));
  }
  if (s_->outer->round() != init.round && (!init.source.empty() || !init.checkpoint.empty()))
    throw std::runtime_error(
        "InnerWorker " + std::to_string(init.index) + ": the outer state from " +
        (init.source.empty() ? init.checkpoint : init.source) + " is of round " +
        std::to_string(s_->outer->round()) + ", not " + std::to_string(init.round));
  out.copy_seconds = seconds_since(t0);
  s_->trainer->load_parameters(s_->outer->theta());
  const auto n = size_t(s_->trainer->parameter_count());
  s_->delta.assign(n, 0.0f);
  s_->averaged.assign(n, 0.0f);
  s_->delta_round = -1;
  s_->stepped_round = -1;
  out.parameters = int64_t(n);
  out.theta_hash = s_->outer->theta_hash();
  out.device = s_->device.reason;
  return out;
}

InnerResult InnerWorker::inner(int64_t round) {
  if (!s_->trainer) throw std::logic_error("InnerWorker: inner() before init()");
  // Asked again for a round whose Δ it holds (the round is redone because too
  // few workers finished it): that Δ stands, no second H steps.
  if (s_->delta_round == round) {
    InnerResult again = s_->last_inner;
    again.seconds = 0;
    return again;
  }
  const int64_t t0 = loco::now_ms();
  if (s_->fault.hits(s_->index, round, "inner")) {
    s_->trainer->run_inner_steps(std::max(1, s_->cfg.inner.steps / 2));
    FaultPlan::die();
  }
  dl::InnerStats st = s_->trainer->run_inner_steps(s_->cfg.inner.steps);
  s_->trainer->pseudo_gradient(s_->outer->theta(), s_->delta);
  s_->delta_round = round;
  InnerResult r;
  r.round = round;
  r.steps = st.steps;
  r.mean_loss = st.mean_loss;
  r.seconds = seconds_since(t0);
  s_->last_inner = r;
  return r;
}

ReduceResult InnerWorker::reduce(ReduceRequest req) {
  if (s_->delta_round != req.round)
    throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) + ": reduce of round " +
                                std::to_string(req.round) + " but its Δ is of round " +
                                std::to_string(s_->delta_round));
  const int64_t t0 = loco::now_ms();
  if (req.names.size() != req.endpoints.size() || req.rank < 0 ||
      size_t(req.rank) >= req.names.size())
    throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) + ": reduce with " +
                                std::to_string(req.names.size()) + " names, " +
                                std::to_string(req.endpoints.size()) + " endpoints and rank " +
                                std::to_string(req.rank));
  collective::Group g;
  for (size_t i = 0; i < req.names.size(); ++i)
    g.members.push_back({req.names[i], req.endpoints[i]});
  g.rank = req.rank;
  g.round_id = req.op_id;
  if (s_->fault.hits(s_->index, req.round, "reduce"))
    s_->comm.hooks().after_send = [](uint64_t) { FaultPlan::die(); };
  // Out of place: Δ stays intact if a member is lost, for the re-formed group. Δ is kept
  // after a success too: an attempt can succeed for this member and fail for another, and the
  // retry (the same round, perhaps fewer members) must start from the outer state that
  // every member of it holds: the one before this member's step.
  s_->comm.allreduce(g, s_->delta, s_->averaged);
  if (s_->fault.hits(s_->index, req.round, "after_allreduce") && !s_->fault_fired) {
    s_->fault_fired = true;
    throw std::runtime_error("injected fault: after the all-reduce of round " +
                             std::to_string(req.round + 1));
  }
  if (s_->stepped_round == req.round)
    s_->outer->undo_step();
  else
    s_->outer->keep_before_step();
  s_->outer->step(s_->averaged);
  s_->stepped_round = req.round;
  s_->trainer->load_parameters(s_->outer->theta());
  ReduceResult r;
  r.theta_hash = s_->outer->theta_hash();
  r.bytes_sent = s_->comm.last_stats().bytes_sent;
  r.seconds = seconds_since(t0);
  return r;
}

double InnerWorker::evaluate() { return s_->trainer->evaluate(s_->val_windows); }

double InnerWorker::evaluate_windows(int64_t begin, int64_t end) {
  const int64_t n = s_->val_windows.size(0);
  if (begin < 0 || end > n || begin >= end)
    throw std::invalid_argument("evaluate_windows: [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") is not inside the " + std::to_string(n) +
                                " validation windows");
  return s_->trainer->evaluate(s_->val_windows.slice(0, begin, end));
}

int64_t InnerWorker::validation_windows() const { return s_->val_windows.size(0); }

// The join state serialized once per round, for joiners that copy it in parts:
// one archive of the outer state ("outer.", as in a checkpoint) and the AdamW
// moments ("moments.").
// The moments are as of the first request in the round (a round being redone
// may have moved them by one round's inner steps; they only steer step sizes).
const std::shared_ptr<const std::string>& InnerWorker::join_state(int64_t round) {
  if (s_->outer->round() != round)
    throw std::invalid_argument(
        "InnerWorker " + std::to_string(s_->index) + " holds the outer state of round " +
        std::to_string(s_->outer->round()) + ", not of round " + std::to_string(round));
  if (!s_->shared_state || s_->shared_state_round != round) {
    torch::serialize::OutputArchive ar;
    s_->outer->save(ar, "outer.");
    s_->trainer->save_moments(ar, "moments.");
    std::ostringstream out;
    ar.save_to(out);
    s_->shared_state = std::make_shared<const std::string>(std::move(out).str());
    s_->shared_state_round = round;
  }
  return s_->shared_state;
}

int64_t InnerWorker::join_state_size(int64_t round) { return int64_t(join_state(round)->size()); }

Blob InnerWorker::join_state_part(int64_t round, int64_t offset, int64_t length) {
  const auto& state = join_state(round);
  if (offset < 0 || length < 0 || size_t(offset + length) > state->size())
    throw std::invalid_argument("join_state_part: [" + std::to_string(offset) + ", " +
                                std::to_string(offset + length) + ") is outside the " +
                                std::to_string(state->size()) + " bytes of the join state");
  return Blob(state, reinterpret_cast<const uint8_t*>(state->data()) + offset, size_t(length));
}

uint64_t InnerWorker::theta_hash() const { return s_->outer->theta_hash(); }

void InnerWorker::set_shards(std::vector<int> shards) {
  if (!s_->trainer) throw std::logic_error("InnerWorker: set_shards() before init()");
  s_->trainer->sampler().set_shards(std::move(shards));
}

std::vector<int> InnerWorker::shards() const {
  return s_->trainer ? s_->trainer->sampler().shards() : std::vector<int>{};
}

std::string InnerWorker::save_checkpoint(std::string path) {
  torch::serialize::OutputArchive ar;
  ar.write("config", c10::IValue(s_->cfg.to_yaml()));
  ar.write("round", c10::IValue(s_->outer->round()));
  ar.write("worker_index", c10::IValue(int64_t(s_->index)));
  s_->outer->save(ar, "outer.");
  s_->trainer->save(ar, "worker.0.");
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  ar.save_to(path + ".tmp");
  std::filesystem::rename(path + ".tmp", path);
  return std::filesystem::absolute(p).string();
}

std::string InnerWorker::save_inner_state(std::string path) {
  torch::serialize::OutputArchive ar;
  ar.write("stream", c10::IValue(int64_t(s_->stream)));
  ar.write("round", c10::IValue(s_->outer->round()));
  s_->trainer->save(ar, "worker.");
  ar.save_to(path + ".tmp");
  std::filesystem::rename(path + ".tmp", path);
  return path;
}

LOCO_REGISTER(InnerWorker, loco::ActorClass<InnerWorker>("diloco.InnerWorker")
                               .constructor<std::string, std::string, int>()
                               .method("endpoint", &InnerWorker::endpoint)
                               .method("init", &InnerWorker::init)
                               .method("inner", &InnerWorker::inner)
                               .method("reduce", &InnerWorker::reduce)
                               .method("evaluate", &InnerWorker::evaluate)
                               .method("evaluate_windows", &InnerWorker::evaluate_windows)
                               .method("validation_windows", &InnerWorker::validation_windows)
                               .method("join_state_size", &InnerWorker::join_state_size)
                               .method("join_state_part", &InnerWorker::join_state_part)
                               .method("save_checkpoint", &InnerWorker::save_checkpoint)
                               .method("save_inner_state", &InnerWorker::save_inner_state)
                               .method("theta_hash", &InnerWorker::theta_hash)
                               .method("set_shards", &InnerWorker::set_shards)
                               .method("shards", &InnerWorker::shards));

}  // namespace loco::actors
