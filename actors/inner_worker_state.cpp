#include "actors/inner_worker_state.hpp"

#include <c10/core/CachingDeviceAllocator.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "runtime/core/run_after.hpp"

namespace loco::actors {

Blob bytes_of(const std::shared_ptr<const std::string>& state, int64_t offset, int64_t length,
              const char* method, const char* what) {
  if (offset < 0 || length < 0 || size_t(offset) > state->size() ||
      size_t(length) > state->size() - size_t(offset))
    throw std::invalid_argument(std::string(method) + ": [" + std::to_string(offset) + ", " +
                                std::to_string(offset + length) + ") is outside the " +
                                std::to_string(state->size()) + " bytes of " + what);
  return Blob(state, reinterpret_cast<const uint8_t*>(state->data()) + offset, size_t(length));
}

std::string node_host() {
  std::string addr = Runtime::current().address();
  auto colon = addr.rfind(':');
  return colon == std::string::npos ? "127.0.0.1" : addr.substr(0, colon);
}

std::vector<LeftOutNote> notes_of(const std::vector<dl::LeftOut>& left) {
  std::vector<LeftOutNote> out;
  for (const dl::LeftOut& l : left) out.push_back({l.member, l.fragment, l.rule, l.why});
  return out;
}

double InnerWorker::State::hook(RoundPoint point, int64_t round, int64_t step, const char* method,
                                collective::detail::Hooks* comm_hooks, std::span<float> delta,
                                double* step_loss) {
  RoundHooks* hooks = round_hooks();
  if (!hooks) return 0;
  const int64_t t = loco::now_ms();
  hooks->at(point,
            {index, round, step, cfg.inner.steps, method, &stopping, comm_hooks, delta, step_loss});
  return seconds_since(t);
}

void InnerWorker::State::checkpoint_archive(torch::serialize::OutputArchive& ar,
                                            const dl::ArchiveCopy& copy) const {
  ar.write("config", c10::IValue(cfg.to_yaml()));
  ar.write("round", c10::IValue(lead().outer->round()));
  ar.write("worker_index", c10::IValue(int64_t(index)));
  // compression auto: the codec of the round the checkpoint ends, where a resumed job starts.
  if (cfg.autocodec.on) ar.write("codec", c10::IValue(choice.name()));
  lead().outer->save(ar, "outer.", copy);
  lead().trainer->save(ar, "worker.0.", copy);
}

void InnerWorker::State::inner_state_archive(torch::serialize::OutputArchive& ar,
                                             const dl::ArchiveCopy& copy) const {
  ar.write("stream", c10::IValue(int64_t(stream)));
  ar.write("round", c10::IValue(lead().outer->round()));
  lead().trainer->save(ar, "worker.", copy);
  // The operations in flight make their codes as they begin (plans_codecs): the copy waits for
  // the newest to have made its own (the ones before it have ended), so that the buffer holds
  // every Δ the round synchronized, as it does when the codes are made at synchronization.
  if (feedback && last_prepared.valid()) last_prepared.wait();
  if (feedback) feedback->save(ar, "error_feedback.", 0);  // a copy, made here
  // Eager: this worker's own provisional θ for each average in flight (the outer checkpoint
  // holds its writer's), which a worker resumed from the checkpoint corrects with. Never
  // changed once made, so not copied.
  if (engine) engine->write_provisionals(ar);
}

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

void InnerWorker::State::start_evaluation(int64_t begin, int64_t end) {
  if (!evaluator) evaluator = std::make_unique<dl::Evaluator>(cfg, lead().device);
  const torch::Tensor theta = lead().outer->theta().clone();
  const torch::Tensor windows = val_windows.slice(0, begin, end);
  dl::Evaluator* e = evaluator.get();
  // One at a time on the model; each holds its θ copy, not the evaluations before it.
  last_evaluation = loco::run_after(last_evaluation, false,
                                    [e, theta, windows] { return e->evaluate(theta, windows); });
  std::lock_guard<std::mutex> lock(checkpoints_mu);
  while (evaluations.size() >= 4) evaluations.erase(evaluations.begin());  // nobody asked
  evaluations[lead().outer->round()] = last_evaluation;
}

InnerWorker::State::~State() {
  drain();
  if (last_evaluation.valid()) last_evaluation.wait();  // it uses `evaluator`
}

void InnerWorker::State::drain() {
  if (engine) engine->drain();
  if (last_op.valid()) last_op.wait();
  last_op = {};
}

void InnerWorker::State::make_engine() {
  engine.reset();
  engine = std::make_unique<dl::StreamingRound>(
      cfg, lead().trainer->model().fragments(overlapped() ? cfg.sync.fragments : 1),
      std::vector<dl::Replica>{{lead().trainer.get(), lead().outer.get()}});
}

void InnerWorker::State::choose(const std::string& codec, const char* method) {
  if (codec.empty()) {
    choice = dl::fixed_choice(cfg);
    return;
  }
  const auto c = dl::parse_choice(codec);
  const bool dense_ok = c && !c->sparse();
  // topk needs the error feedback (compression topk, or auto down to topk: keeps_feedback).
  const bool sparse_ok = c && c->sparse() && feedback && c->topk_k <= uint32_t(cfg.topk.chunk);
  if (!dense_ok && !sparse_ok)
    throw std::invalid_argument("InnerWorker " + std::to_string(index) + ": " + method +
                                " with codec '" + codec.substr(0, 24) +
                                "', which this job's workers cannot run (compression " +
                                cfg.compression_name() + ")");
  choice = *c;
}

void InnerWorker::State::make_feedback() {
  feedback.reset();
  coded_round = -1;
  choice = dl::fixed_choice(cfg);
  codecs.reset();
  last_prepared = {};
  if (plans_codecs()) {
    int64_t largest = 0;
    for (int f = 0; f < engine->schedule().fragments(); ++f)
      largest = std::max(largest, engine->fragment_size(f));
    codecs = std::make_shared<FragmentCodecs>();
    codecs->planner = std::make_unique<dl::FragmentCodecPlanner>(cfg, size_t(largest));
  }
  if (!cfg.keeps_feedback()) return;
  std::vector<size_t> sizes;
  for (int f = 0; f < engine->schedule().fragments(); ++f)
    sizes.push_back(size_t(engine->fragment_size(f)));
  feedback = std::make_unique<dl::ErrorFeedback>(cfg.topk, sizes, 1);
}

void InnerWorker::State::snapshot_if_wanted(int64_t round, int64_t now) {
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

void InnerWorker::State::log_landing(int fragment, std::vector<float>& mean, int64_t now) {  // takes the mean
  std::lock_guard<std::mutex> lock(desk.mu);
  if (!desk.snapshot) return;
  if (desk.landed_floats + mean.size() > 2 * size_t(lead().trainer->parameter_count())) {
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

double InnerWorker::State::admit_at(const StreamRequest& req, StreamGroup& group, int64_t now) {
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

StepFigures InnerWorker::State::one_step(Rank& k) {
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

bool InnerWorker::State::diverged(const StepFigures& f) {
  return !std::isfinite(f.loss) || !std::isfinite(f.grad_norm);
}

void InnerWorker::State::note_diverged(int64_t round, int64_t step, const StepFigures& f) {
  diverged_round = round;
  log_warn("worker " + std::to_string(index) + ": inner loss " + std::to_string(f.loss) +
           ", gradient norm " + std::to_string(f.grad_norm) + " at step " +
           std::to_string(step) + " of round " + std::to_string(round + 1) +
           ": it stops its steps there and sends nothing more in that round");
}

InnerResult InnerWorker::State::timed_steps(int64_t round, double seconds, int64_t t0,
                                            int64_t max_steps) {
  Rank& k = lead();
  const int h = cfg.inner.steps;
  int cap = seconds > 0 ? 4 * h : h;
  if (max_steps > 0 && max_steps < cap) cap = int(max_steps);
  int steps = 0;
  double loss = 0;
  double stepping = 0;
  std::vector<StepFigures> per_step;
  // Another step only while it would end within the budget (its length: the mean of this
  // round's so far): a member ends at most a step short of its budget, never past it, so the
  // round ends at its budget and the slowest member, whose steps are the longest, neither holds
  // the others up nor misses the deadline by its last step.
  while (steps < cap &&
         (seconds <= 0 || steps == 0 || seconds_since(t0) + stepping / steps <= seconds)) {
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

InnerWorker::State::State(std::string job, const std::string& spec, int idx)
    : job_id(std::move(job)),
      index(idx),
      cfg(dl::JobConfig::from_yaml(spec)),
      store(dl::TokenStore::open(data_under_root(cfg.data), cfg.vocab_size())),
      roots(this_actor().roots)  {
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

dl::DataConfig InnerWorker::State::data_under_root(dl::DataConfig d) {
  return resolve_job_data(this_actor().roots, std::move(d));
}

std::string InnerWorker::State::checkpoint_path(const std::string& path, const char* what) const {
  std::string p = resolve_checkpoint_path(roots, path, what);
  if (p == roots.checkpoints)
    throw PathError(std::string(what) + ": the checkpoint root itself is not a file");
  return p;
}

int64_t InnerWorker::State::max_state_bytes() const {
  return 12 * int64_t(sizeof(float)) * cfg.model.parameter_count(cfg.vocab_size()) + (64 << 20);
}

dl::ArchiveCopy InnerWorker::State::checkpoint_copier() {
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

void InnerWorker::State::start_checkpoint(const std::string& checkpoint, const std::string& inner) {
  const int64_t t0 = loco::now_ms();
  auto inner_ar = std::make_shared<torch::serialize::OutputArchive>();
  auto outer_ar = std::make_shared<torch::serialize::OutputArchive>();
  const dl::ArchiveCopy copy = checkpoint_copier();
  if (!inner.empty()) inner_state_archive(*inner_ar, copy);
  std::shared_ptr<dl::PendingLandings> landed;
  if (!checkpoint.empty()) {
    checkpoint_archive(*outer_ar, copy);
    landed = engine->await_landings();
  }
  const int64_t round = lead().outer->round();
  const std::string who = "worker " + std::to_string(index) + ": the checkpoint after round " +
                          std::to_string(round) + ": ";
  log_info(who + "state copied in " + std::to_string(loco::now_ms() - t0) + " ms (" +
           std::to_string(checkpoint_buffers_new) + " new buffers), " +
           std::to_string(engine->in_flight()) + " fragment(s) in flight");
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
                   if (!inner.empty()) dl::write_archive(*inner_ar, inner);
                   std::string written = inner;
                   if (!checkpoint.empty()) {
                     dl::StreamingRound::write_copies(*outer_ar, landed->wait(kLandedCopies));
                     dl::write_archive(*outer_ar, checkpoint);
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

void InnerWorker::State::for_ranks(const std::function<void(Rank&)>& fn) {
  dl::on_ranks(ranks.size(), [&](size_t r) { fn(ranks[r]); });
}

dl::Slice InnerWorker::State::slice_of(const Rank& k) const {
  const int64_t n = lead().trainer->parameter_count();
  return k.group ? k.group->slice(n) : dl::Slice{0, n};
}

collective::Options InnerWorker::State::collective_options(const dl::JobConfig& cfg) {
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

}  // namespace loco::actors
