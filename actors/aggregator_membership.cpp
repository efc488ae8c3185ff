// The job's membership: slots spawned and initialized with the outer state (acquire), the
// data shards dealt over the members, workers that leave (lost, late or scaled down), what
// reconcile does between rounds, and a worker joining a streaming round mid-round.
#include <algorithm>
#include <cstdio>
#include <regex>

#include "actors/outer_aggregator_state.hpp"
#include "diloco/data/data.hpp"
#include "diloco/job/memory.hpp"
#include "diloco/round/fragment_schedule.hpp"

namespace loco::actors {

namespace dl = loco::diloco;

// `loco scale` writes the job record; bounded by workers.max.
void OuterAggregator::State::read_target() {
  int want = cfg.workers.count;
  try {
    JobInfo info = rt.job(job_id);
    if (info.scale > 0) want = info.scale;
  } catch (const std::exception&) {
    return;  // the head or Redis is away: keep the last target
  }
  if (cfg.workers.max > 0 && want > cfg.workers.max) want = cfg.workers.max;
  // compression topk: past this many members, gathering the codes sends more than int8's
  // all-reduce would (JobConfig::topk_max_workers); the job stays at it.
  const int most = cfg.topk.on ? cfg.topk_max_workers() : 0;
  const bool capped = most > 0 && want > most;
  if (capped) want = most;
  if (want != target)
    log("scale: " + std::to_string(target) + " -> " + std::to_string(want) + " workers" +
        (capped ? " (compression topk: more members would each send more than int8's "
                  "all-reduce)"
         : cfg.workers.max > 0 && want == cfg.workers.max ? " (workers.max)"
                                                          : ""));
  target = want;
}

void OuterAggregator::State::note_waiting(int i, const std::string& why) {
  Slot& s = slots[size_t(i)];
  // Logged when the reason changes; each failed spawn names a new actor id, which does not count.
  static const std::regex actor_id(R"( ?\(a-[0-9a-f]+\))");
  std::string reason = std::regex_replace(why, actor_id, "");
  if (s.waiting != reason) log("worker " + std::to_string(i) + " cannot join yet: " + reason);
  s.waiting = reason;
}

// Slot i's actor, ready for calls: found (restarted by the head after its node died, or from
// before this aggregator was itself restarted) or spawned. False, with the reason noted, when
// it is restarting or cannot be placed now.
bool OuterAggregator::State::spawn_slot(int i) {
  Slot& s = slots[size_t(i)];
  try {
    std::optional<ActorInfo> info;
    try {
      info = rt.lookup(s.name);
    } catch (const ActorNotFoundError&) {
    }
    s.handle.reset();
    if (info && (info->state == ActorState::restarting || info->state == ActorState::pending)) {
      note_waiting(i, "its actor is restarting (" + info->reason + ")");
      return false;
    }
    if (info && info->state != ActorState::dead) s.handle = rt.get_actor<InnerWorker>(s.name);
    if (!s.handle)
      s.handle = rt.spawn<InnerWorker>(ActorOptions()
                                           .with_name(s.name)
                                           .with_resources(worker_resources())
                                           .with_shared_gpus(cfg.workers.share_gpu)
                                           .with_max_restarts(cfg.workers.max_restarts),
                                       job_id, std::string(cfg.to_yaml()), i);
    return true;
  } catch (const std::exception& e) {
    note_waiting(i, e.what());
    return false;
  }
}

// Brings the slots in `want` into the job at round r: spawns their actors (or
// finds them restarted by the head), then initializes them with the outer
// state: copied from a live member, read from the checkpoint, or from the seed.
// Returns the slots that joined.
std::vector<int> OuterAggregator::State::acquire(const std::vector<int>& want, int64_t r) {
  std::vector<int> live;
  std::map<int, double> t0;
  for (int i : want) {
    if (stop) return {};
    t0[i] = now_s();
    if (spawn_slot(i)) live.push_back(i);
  }
  if (live.empty()) return {};
  // Shards as if they all join (reconcile's deal_shards evens them out if some do not).
  const std::vector<int> current = active();
  std::vector<int> members = current;
  members.insert(members.end(), live.begin(), live.end());
  std::sort(members.begin(), members.end());
  for (size_t k = 0; k < members.size(); ++k)
    if (std::find(live.begin(), live.end(), members[k]) != live.end())
      slots[size_t(members[k])].shards =
          dl::round_robin_shards(cfg.data.shards, int(k), int(members.size()));

  // Members that hold the current outer state, one per joiner, spread over them.
  const std::vector<int> sources = copy_sources(current, live);
  auto source_of = [&](size_t k) {
    return sources.empty() ? std::string() : slots[size_t(sources[k])].name;
  };
  const bool fresh = r == 0 && resume_from.empty();
  std::vector<Future<std::vector<std::string>>> eps;
  for (int i : live) eps.push_back(worker(i).call(&InnerWorker::endpoints));
  std::vector<Failure> errors;
  auto got = gather(eps, errors, kWorkerCall);
  std::vector<int> initing;
  std::vector<Future<InitResult>> inits;
  for (size_t k = 0; k < live.size(); ++k) {
    int i = live[k];
    if (!got[k]) {
      note_waiting(i, errors[k].message);
      continue;
    }
    Slot& s = slots[size_t(i)];
    s.endpoints = *got[k];
    WorkerInit wi;
    wi.index = i;
    wi.shards = s.shards;
    // Workers that start with the job read the simulator's streams; later ones new streams.
    wi.stream = fresh ? uint64_t(i) : (uint64_t(r) << 16) | uint64_t(i);
    wi.total_steps = total_steps;
    wi.round = r;
    // While the job resumes from a checkpoint (it started from it, or went back to it), every
    // slot reads it and its own inner state, as the slot was: a slot whose actor comes back
    // later than the others must not copy their moments instead, or the resume is no longer
    // exact. Otherwise a joiner copies the current state from a live member.
    if (!fresh) {
      if (!sources.empty() && !(resuming && !resume_from.empty())) {
        wi.source = source_of(k);
      } else {
        wi.checkpoint = resume_from;
        if (!resume_from.empty()) wi.inner_state = inner_state_path(resume_from, i);
      }
    }
    initing.push_back(i);
    inits.push_back(worker(i).call(&InnerWorker::init, wi));
  }
  auto done = gather(inits, errors, kInitCall);
  std::vector<int> joined;
  std::vector<double> measured;  // inner.budget: time: the joiners' step seconds at init
  for (size_t k = 0; k < initing.size(); ++k) {
    int i = initing[k];
    const std::string source =
        resuming && !resume_from.empty()
            ? std::string()
            : source_of(size_t(std::find(live.begin(), live.end(), i) - live.begin()));
    Slot& s = slots[size_t(i)];
    if (!done[k]) {
      if (!source.empty() && !errors[k].gone) copy_failed = true;
      note_waiting(i, errors[k].message);
      continue;
    }
    s.active = true;
    s.waiting.clear();
    joined.push_back(i);
    if (done[k]->step_seconds > 0) {
      measured.push_back(done[k]->step_seconds);
      step_seconds_of[i] = done[k]->step_seconds;  // round 0's evaluation is shared by speed too
    }
    char line[320];
    std::snprintf(line, sizeof line,
                  "worker %d joined at round %lld on %s: %.1f MB of state %s in %.2f s; "
                  "joined in %.2f s",
                  i, static_cast<long long>(r + 1), worker(i).address().c_str(),
                  double(done[k]->state_bytes) / 1e6,
                  fresh            ? "from the seed"
                  : source.empty() ? ("from " + resume_from).c_str()
                                   : ("copied from " + source).c_str(),
                  done[k]->copy_seconds, now_s() - t0[i]);
    if (!fresh)
      log_join(i, r + 1, line);
    else
      slots[size_t(i)].placed = worker(i).address();
    if (cfg.device != dl::DeviceKind::cpu || cfg.ranks_per_worker(false) > 1)
      log("worker " + std::to_string(i) + " trains on " + done[k]->device);
  }
  // No round measured yet (the job's first, or its first since a resume): the time budget of
  // the next round comes from the steps the workers timed at init, so that it is timed too
  // and a slow member does its share of it, rather than H steps that the others wait for.
  if (cfg.inner.budget == dl::InnerBudget::time && step_seconds.empty() && !measured.empty()) {
    step_seconds = measured;
    char line[160];
    std::snprintf(line, sizeof line,
                  "inner.budget: time: round %lld's budget from the steps timed at init "
                  "(median %.3f s a step)",
                  static_cast<long long>(r + 1), median(measured));
    log(line);
  }
  return joined;
}

// What a worker's actor asks its node for: a cpu, and with a GPU device
// workers.gpus GPUs (their indices are the worker's own unless workers.share_gpu).
// device: auto asks for GPUs when some live node offers them.
Resources OuterAggregator::State::worker_resources() {
  bool cluster_has_gpus = false;
  if (cfg.device == dl::DeviceKind::auto_) {
    for (const NodeStatus& n : rt.status().nodes)
      if (n.node.state == NodeState::alive && n.node.resources.count("gpu") &&
          n.node.resources.at("gpu") >= 1)
        cluster_has_gpus = true;
  }
  Resources r{{"cpu", 1}};
  if (cfg.wants_gpus(cluster_has_gpus)) r["gpu"] = cfg.workers.gpus;
  return r;
}

void OuterAggregator::State::check_memory() {
  std::optional<double> memory, gpu_memory;
  bool gpus = false;
  for (const NodeStatus& n : rt.status().nodes) {
    if (n.node.state != NodeState::alive) continue;
    const Resources& r = n.node.resources;
    auto most = [&](std::optional<double>& m, const char* name) {
      if (auto it = r.find(name); it != r.end()) m = std::max(m.value_or(0), it->second);
    };
    most(memory, "memory");
    most(gpu_memory, "gpu_memory");
    gpus = gpus || (r.count("gpu") && r.at("gpu") >= 1);
  }
  const bool cuda = cfg.wants_gpus(gpus);
  const dl::MemoryEstimate e = dl::worker_memory(cfg, cuda);
  std::string said = "memory: a worker needs about " + dl::gib(e.host_bytes());
  if (cuda) said += " and " + dl::gib(e.device_bytes()) + " on each GPU";
  said += memory ? "; the largest node has " + dl::gib(*memory)
                 : "; no node advertises `memory`: not checked";
  if (cuda)
    said += gpu_memory ? ", the largest GPU " + dl::gib(*gpu_memory)
                       : "; no node advertises `gpu_memory`: the GPUs not checked";
  log(said);
  dl::check_fits(cfg, cuda, memory, gpu_memory);
}

// Deals every data shard over the active workers, round-robin in slot order,
// so that no part of the data goes unread when workers come and go. Says so
// when members of the last dealing are gone, wherever they were lost.
void OuterAggregator::State::deal_shards() {
  std::vector<int> members = active();
  std::vector<int> lost;
  std::vector<int> late;
  for (int m : dealt)
    if (std::find(members.begin(), members.end(), m) == members.end())
      (slots[size_t(m)].late ? late : lost).push_back(m);
  std::vector<Future<void>> sets;
  std::vector<int> who;
  for (size_t k = 0; k < members.size(); ++k) {
    Slot& s = slots[size_t(members[k])];
    auto next = dl::round_robin_shards(cfg.data.shards, int(k), int(members.size()));
    if (next == s.shards) continue;
    s.shards = next;
    who.push_back(members[k]);
    sets.push_back(s.handle->call(&InnerWorker::set_shards, next));
  }
  std::vector<Failure> errors;
  for (size_t k = 0; k < sets.size(); ++k) {
    try {
      sets[k].get(kWorkerCall);
    } catch (const std::exception& e) {
      release(who[k], std::string("could not take its shards: ") + e.what());
    }
  }
  if (!lost.empty()) {
    const std::string n = std::to_string(members.size());
    log("round " + std::to_string(round + 1) + ": lost worker(s) " + join_ints(lost) +
        "; their shards went to the " + n + " others; going on with " + n + " workers");
  }
  if (!late.empty())
    log("round " + std::to_string(round + 1) + ": late worker(s) " + join_ints(late) +
        "; their shards go to the " + std::to_string(members.size()) +
        " others until they are back");
  dealt = members;
}

// The slot leaves the job for good (scaled down, or removed by the guard): its actor is
// stopped, and its shards are not counted as lost (it left).
void OuterAggregator::State::stop_slot(int i) {
  Slot& s = slots[size_t(i)];
  s.active = false;
  s.left = true;
  try {
    if (s.handle) rt.kill(s.handle->id());
  } catch (const std::exception& e) {
    log_warn(job_id + ": stopping " + s.name + ": " + e.what());
  }
  s.handle.reset();
  std::erase(dealt, i);
}

// The slot leaves the round's members; its actor stays (the head may restart it).
void OuterAggregator::State::release(int i, const std::string& why) {
  slots[size_t(i)].active = false;
  slots[size_t(i)].left = true;
  leave_dropped(i);
  log_left("worker " + std::to_string(i) + " left: " + why);
}

void OuterAggregator::State::note_left_out(int64_t r, const std::vector<LeftOutNote>& notes,
                                          double guard_seconds) {
  round_guard_seconds = guard_seconds;
  for (const LeftOutNote& n : notes) {
    // A member's name, or with local ranks "NAME/rankR" (each rank judges its own slice).
    const std::string name = n.member.substr(0, n.member.find("/rank"));
    int slot = -1;
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].name == name) slot = int(i);
    if (slot < 0) continue;  // not a slot of this job: nothing to record
    round_left_out.push_back({slot, n.fragment, n.rule, n.why});
    log("round " + std::to_string(r + 1) + ": the guard left worker " + std::to_string(slot) +
        " out of the average" +
        (cfg.sync.mode == dl::SyncMode::blocking ? "" : " of fragment " + std::to_string(n.fragment)) +
        " (" + n.rule + "): " + n.why);
  }
}

void OuterAggregator::State::evict_left_out(int64_t r, const std::vector<int>& members) {
  std::map<int, std::string> rule;  // slot -> the first rule that left it out this round
  for (const auto& l : round_left_out) rule.emplace(l.worker, l.rule);
  left_out_total += rule.size();
  for (int m : members) {
    Slot& s = slots[size_t(m)];
    auto it = rule.find(m);
    s.left_out_streak = it == rule.end() ? 0 : s.left_out_streak + 1;
    if (it == rule.end() || cfg.guard.evict_after <= 0 || s.left_out_streak < cfg.guard.evict_after)
      continue;
    s.removed = "the guard left it out of " + std::to_string(s.left_out_streak) +
                " rounds in a row, the last round " + std::to_string(r + 1) + " (rule " +
                it->second + "; guard.evict_after = " + std::to_string(cfg.guard.evict_after) + ")";
    stop_slot(m);
    log_left("worker " + std::to_string(m) + kRemovedLine + s.removed);
  }
}

// Between rounds: act on `loco scale`, bring back or add workers up to the
// target, drop surplus ones; below workers.min, wait for joins up to wait_s.
bool OuterAggregator::State::reconcile(int64_t r) {
  read_target();
  // Surplus workers leave, the highest slots first.
  std::vector<int> members = active();
  for (size_t k = members.size(); k-- > size_t(target);) {
    stop_slot(members[k]);
    log_left("worker " + std::to_string(members[k]) + " left: scaled down to " +
             std::to_string(target));
  }
  const double deadline = now_s() + cfg.workers.wait_s;
  bool said_waiting = false;
  for (;;) {
    if (int(slots.size()) < target) slots.resize(size_t(target));
    std::vector<int> want;
    for (int i = 0; i < target; ++i) {
      Slot& s = slots[size_t(i)];
      if (s.name.empty()) s.name = job_id + ".worker-" + std::to_string(i);
      if (s.active || !s.removed.empty()) continue;
      if (s.late) {
        // A member that missed a deadline: its actor is busy until its inner steps end.
        if (!s.late->ready()) continue;
        log("worker " + std::to_string(i) + " ended its inner steps of round " +
            std::to_string(s.late_round + 1) + "; their Δ is dropped, and it catches up at round " +
            std::to_string(r + 1));
        s.late.reset();
      }
      want.push_back(i);
    }
    if (!want.empty()) {
      if (must_rewind(int(active().size()), r, resume_round)) {
        // Every worker is gone, and the outer state with them: go back to the
        // last checkpoint (or the start).
        log("round " + std::to_string(r + 1) + ": no worker holds the outer state; going back to " +
            (resume_from.empty() ? std::string("the start") : resume_from));
        return false;
      }
      acquire(want, r);
    }
    deal_shards();  // also after members left outside a reduce (evaluation, checkpoint)
    const int have = int(active().size());
    if (have >= std::max(1, cfg.workers.min) || stop) return true;
    // Too few, and the joiners cannot copy the state from those left: waiting does not help
    // (the soak bench waited out workers.wait_s and failed the job); the checkpoint does.
    if (const std::string broken = std::exchange(copy_failed, false) ? held_state_broken(r) : "";
        !broken.empty()) {
      log("round " + std::to_string(r + 1) + ": " + std::to_string(have) +
          " workers, below workers.min = " + std::to_string(cfg.workers.min) +
          ", and the joiners cannot copy the outer state from them (" + broken +
          "); going back to " + (resume_from.empty() ? std::string("the start") : resume_from));
      return false;
    }
    std::string why;
    for (int i = 0; i < target; ++i)
      if (!slots[size_t(i)].active && !slots[size_t(i)].waiting.empty())
        why += "; worker " + std::to_string(i) + ": " + slots[size_t(i)].waiting;
    if (now_s() > deadline)
      throw std::runtime_error("round " + std::to_string(r + 1) + ": " + std::to_string(have) +
                               " workers, below workers.min = " + std::to_string(cfg.workers.min) +
                               ", for workers.wait_s = " + std::to_string(int(cfg.workers.wait_s)) +
                               " s; no more could join" + why);
    if (!said_waiting)
      log("round " + std::to_string(r + 1) + ": " + std::to_string(have) +
          " workers, below workers.min = " + std::to_string(cfg.workers.min) + "; waiting up to " +
          std::to_string(int(cfg.workers.wait_s)) + " s for more" + why);
    said_waiting = true;
    pause(kClusterPoll);
  }
}

std::string OuterAggregator::State::held_state_broken(int64_t r) {
  const std::vector<int> members = active();
  if (members.empty()) return "";
  auto size = worker(members[0]).call(&InnerWorker::join_state_size, r);
  std::vector<Future<int64_t>> asked{size};
  std::vector<Failure> errors;
  (void)gather(asked, errors, kStateCopyCall);
  return errors[0].gone ? std::string() : errors[0].message;
}

// join_mid_round's admission of slot `s` into round c: the fragment boundary it joins at,
// agreed by every member; nothing (said with `why_not`) when the round has none left.
std::optional<int64_t> OuterAggregator::State::admit_mid_round(const StreamCalls& c, const Slot& s,
                                                               const std::string& why_not) {
  const dl::FragmentSchedule schedule(cfg);
  const int64_t r = c.round;
  // Where: the first boundary past the member furthest on. A member that gets there before
  // the admission reaches it says no; then again at the next one, while the round has one.
  std::optional<int64_t> step;
  for (int attempt = 0; attempt < 4 && !step; ++attempt) {
    std::vector<Future<int64_t>> asked;
    for (int m : c.members) asked.push_back(worker(m).call(&InnerWorker::progress, r));
    std::vector<Failure> errors;
    std::vector<int64_t> progress;
    for (auto& got : gather(asked, errors, kAdmissionCall)) progress.push_back(got ? *got : -1);
    const auto at = schedule.join_step(r, progress);
    if (!at) {
      log(why_not + "no fragment boundary left before the round's end");
      return std::nullopt;
    }
    AdmitRequest a;
    a.round = r;
    a.step = *at;
    a.name = s.name;
    a.endpoint = s.endpoints[0];
    std::vector<Future<bool>> votes;
    for (int m : c.members) votes.push_back(worker(m).call(&InnerWorker::admit, a));
    bool all = true;
    for (auto& v : gather(votes, errors, kAdmissionCall)) all = all && v && *v;
    a.phase = all ? AdmitRequest::commit : AdmitRequest::abort;
    std::vector<Future<bool>> acks;
    for (int m : c.members) acks.push_back(worker(m).call(&InnerWorker::admit, a));
    (void)gather(acks, errors, kAdmissionCall);
    if (all) step = at;
  }
  if (!step) log(why_not + "the members kept passing the boundaries it was offered");
  return step;
}

// sync.mode streaming: while round c's calls run, a slot that can join takes part from a
// fragment boundary of the round (docs/decisions/0029-joining-mid-round.md): its actor spawned, its
// state copied from a donor's snapshot taken between two of the donor's inner steps, its
// admission agreed by every member in two phases (each says yes only while it is before the
// boundary), then its own stream() call goes out and joins c. It gives up, and the slot joins
// at the next round boundary as before, when a step fails, when the round has no boundary left
// far enough ahead, or as soon as the round's calls have all ended. One joiner per round.
void OuterAggregator::State::join_mid_round(StreamCalls& c) {
  if (cfg.sync.mode != dl::SyncMode::streaming || resuming || stop ||
      !dl::FragmentSchedule(cfg).join_step(c.round, {c.round * cfg.inner.steps}))
    return;
  const int64_t r = c.round;
  auto round_over = [&] {
    for (auto& f : c.calls)
      if (!f.ready()) return false;
    return true;
  };
  // Waits for `f` while the round goes on; false once the round's calls have all ended.
  auto while_round = [&](const FutureBase& f) {
    std::vector<const FutureBase*> watched{&f};
    for (const auto& call : c.calls) watched.push_back(&call);
    size_t ended = 0;
    while (!f.ready()) {
      (void)tell_gone(c);
      if (round_over() || stop) return false;
      // Until f or one more of the round's calls ends, or a stop.
      ended = loco::wait(watched, ended + 1, Millis::max(), wake.get_token()).size();
    }
    return true;
  };
  // A free slot, and a node to put its actor on: tried every half second while the round
  // runs (a node may arrive at any time).
  int i = -1;
  double t0 = 0;
  for (;;) {
    read_target();
    i = -1;
    for (int j = 0; j < target && i < 0; ++j) {
      if (size_t(j) >= slots.size()) slots.resize(size_t(j) + 1);
      Slot& s = slots[size_t(j)];
      if (s.may_join() && std::find(c.members.begin(), c.members.end(), j) == c.members.end())
        i = j;
    }
    if (i < 0) return;
    Slot& s = slots[size_t(i)];
    if (s.name.empty()) s.name = job_id + ".worker-" + std::to_string(i);
    t0 = now_s();
    if (spawn_slot(i)) break;
    (void)loco::wait(c.calls, c.calls.size(), kClusterPoll, wake.get_token());
    (void)tell_gone(c);
    if (round_over() || stop) return;
  }
  Slot& s = slots[size_t(i)];
  const std::string why_not = "worker " + std::to_string(i) + " does not join round " +
                              std::to_string(r + 1) + " mid-round: ";
  try {
    auto eps = worker(i).call(&InnerWorker::endpoints);
    if (!while_round(eps)) return;
    s.endpoints = eps.get(kEndedCall);
    if (s.endpoints.size() != 1) return;
    std::vector<int> members = c.members;
    members.push_back(i);
    std::sort(members.begin(), members.end());
    const auto k = size_t(std::find(members.begin(), members.end(), i) - members.begin());
    s.shards = dl::round_robin_shards(cfg.data.shards, int(k), int(members.size()));
    const int donor = copy_sources(c.members, {i}).at(0);
    WorkerInit wi;
    wi.index = i;
    wi.shards = s.shards;
    wi.stream = (uint64_t(r) << 16) | uint64_t(i);
    wi.total_steps = total_steps;
    wi.round = r;
    wi.source = slots[size_t(donor)].name;
    wi.mid_round = true;
    auto init = worker(i).call(&InnerWorker::init, wi);
    if (!while_round(init)) return;
    const InitResult copied = init.get(kEndedCall);

    const std::optional<int64_t> step = admit_mid_round(c, s, why_not);
    if (!step) return;
    StreamRequest req;
    req.round = r;
    req.op_id = c.op_id;
    req.last = c.last;
    for (int m : c.members) {
      req.names.push_back(slots[size_t(m)].name);
      req.endpoints.push_back(slots[size_t(m)].endpoints);
    }
    req.names.push_back(s.name);
    req.endpoints.push_back(s.endpoints);
    req.rank = int(c.members.size());
    req.from_step = *step;
    req.source = wi.source;
    req.codec = plan_codec(r, int(c.members.size()));  // the round's, decided when it was sent
    c.calls.push_back(worker(i).call(&InnerWorker::stream, req));
    c.members.push_back(i);
    s.active = true;
    s.waiting.clear();
    char line[320];
    std::snprintf(line, sizeof line,
                  "worker %d joined round %lld at inner step %lld (a fragment boundary) on %s: "
                  "%.1f MB snapshot of step %lld copied from %s in %.2f s; joined in %.2f s",
                  i, static_cast<long long>(r + 1), static_cast<long long>(*step),
                  worker(i).address().c_str(), double(copied.state_bytes) / 1e6,
                  static_cast<long long>(copied.snapshot_step), wi.source.c_str(),
                  copied.copy_seconds, now_s() - t0);
    log_join(i, r + 1, line);
  } catch (const std::exception& e) {
    log(why_not + e.what());
  }
}

}  // namespace loco::actors
