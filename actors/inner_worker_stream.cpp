#include <chrono>

#include "actors/inner_worker_state.hpp"
#include "runtime/core/remote_input.hpp"
#include "runtime/core/run_after.hpp"

namespace loco::actors {

namespace {

// The fragments' averages of a stream() call over the network (the round engine's
// FragmentAverager): on the worker's communicator, one operation at a time, each after the one
// before (`last` is the newest; a failure before fails this one too), over the group as it is
// when the operation starts (the ones before it may have dropped members); a member lost on the
// way is dropped and the rest go again.
class GroupAverager final : public dl::FragmentAverager {
 public:
  // What it needs of the worker: its communicator, the newest operation, its error feedback
  // (topk; else null), its guard settings and log, whether it abstains (its inner steps
  // diverged this round), and the test hook on a fragment's Δ (RoundPoint::pseudo_gradient).
  struct Worker {
    collective::Communicator& comm;
    std::shared_future<uint64_t>& last_op;
    dl::ErrorFeedback* feedback;
    dl::GuardConfig guard;
    dl::GuardLog& log;
    std::function<bool()> abstaining;
    std::function<void(int, std::span<float>)> hook;
    dl::CodecChoice choice;  // the round's codec
    bool flush = true;       // compression auto: what a dense average does with the feedback
    ExchangeDesk& exchanges;  // each operation puts its figures there as it ends
    // compression auto in streaming and eager: each operation's codec agreed as it begins
    // (null: the round's), its code made then; the newest one's code made.
    std::shared_ptr<FragmentCodecs> codecs;
    std::shared_future<void>& last_prepared;
    int64_t round = 0;  // the round whose fragments it starts
  };
  GroupAverager(Worker w, std::shared_ptr<StreamGroup> group)
      : s_(std::move(w)), group_(std::move(group)) {}
  std::shared_future<uint64_t> start(uint64_t op, int fragment,
                                     std::span<const std::span<const float>> deltas,
                                     std::span<const std::span<float>> means) override {
    if (deltas.size() != 1 || means.size() != 1)
      throw std::logic_error("GroupAverager: one replica per worker");
    collective::Communicator* comm = &s_.comm;
    std::span<const float> in = deltas[0];
    const std::span<float> out = means[0];
    // A test's broken or hostile worker (RoundPoint::pseudo_gradient) changes a copy.
    std::shared_ptr<std::vector<float>> copy;
    if (round_hooks()) {
      copy = std::make_shared<std::vector<float>>(in.begin(), in.end());
      s_.hook(fragment, *copy);
      in = *copy;
    }
    // What the policy sends of the fragment (topk: its code; with the guard: its summary). A
    // worker whose inner steps diverged this round abstains: an empty code, an abstaining
    // summary. Made here on the stepping thread with the round's codec; with codecs agreed per
    // operation, by the operation once its codec is agreed (the ones before it have ended, and
    // the fragment's feedback is touched by its own operations only).
    auto op_state = std::make_shared<Op>(s_, fragment, s_.abstaining());
    if (!s_.codecs)
      op_state->sent = op_state->policy->prepare(fragment, {&in, 1}, op_state->abstain);
    auto prepared = std::make_shared<std::promise<void>>();
    if (s_.codecs) s_.last_prepared = prepared->get_future().share();
    const bool guard_on = s_.guard.on;
    dl::GuardLog* log = &s_.log;
    ExchangeDesk* exchanges = &s_.exchanges;
    // After the operation before (its failure is this one's), holding it only until then.
    s_.last_op = loco::run_after(
        s_.last_op, true,
        [comm, group = group_, op, in, out, op_state, prepared, fragment, guard_on, log, copy,
         exchanges]() -> uint64_t {
          uint64_t bytes = 0;
          // Its time, start to mean, goes to the desk as it ends, however it ends.
          struct Timed {
            ExchangeDesk* desk;
            std::chrono::steady_clock::time_point began = std::chrono::steady_clock::now();
            double seconds() const {
              return std::chrono::duration<double>(std::chrono::steady_clock::now() - began)
                  .count();
            }
            ~Timed() { desk->put(seconds()); }
          } timed{exchanges};
          bool fresh = false;  // a member this worker had not run an operation with
          for (;;) {
            collective::Group g = group->at(op);
            CommMembers members(*comm, g);
            try {
              if (op_state->codecs) {
                fresh = op_state->plan(members, g, op, bytes) || fresh;
                if (!op_state->sent) {
                  op_state->sent = op_state->policy->prepare(fragment, {&in, 1}, op_state->abstain);
                  prepared->set_value();
                }
              }
              const dl::DeltaAverager& policy = *op_state->policy;
              const auto judged = policy.judge(members, op, fragment, *op_state->sent);
              bytes += judged.guard_bytes + judged.code_bytes;
              log->add_seconds(judged.guard_seconds);
              if (!judged.verdicts.empty()) g.left_out = judged.left_out();
              // A joiner's first fragment (its Δ zero): left out with the guard on (the
              // others' mean, exactly); else its zero counted and the mean corrected.
              float correction = 1.0f;
              if (guard_on)
                group->leave_out_zero(g, op);
              else
                correction = group->weight_correction(g);
              bytes +=
                  policy.reduce(members, op, fragment, judged, g.left_out, {&in, 1}, {&out, 1});
              if (correction != 1.0f)
                for (float& x : out) x *= correction;
              log->add(fragment, names_of(g), judged.verdicts);
              if (op_state->codecs) op_state->measured(g, bytes, timed.seconds(), fresh);
              return bytes;
            } catch (const collective::PeerLostError& e) {
              bytes += comm->last_stats().bytes_sent;
              if (!group->drop(e.peer(), g)) throw;
              log_warn("fragment all-reduce " + std::to_string(op) + ": " + e.peer() +
                       " lost; the others finish it without it");
            }
          }
        });
    return s_.last_op;
  }

 private:
  // One operation's policy and what it sends; with codecs agreed per operation, its plan.
  struct Op {
    std::shared_ptr<FragmentCodecs> codecs;
    double step_seconds = 0;
    int64_t round = 0;
    int fragment = 0;
    bool abstain = false;
    std::optional<dl::DeltaAverager> policy;
    std::optional<dl::DeltaAverager::Sent> sent;
    std::optional<int> agreed;  // the rung agreed, once it was
    dl::GuardConfig guard;
    dl::ErrorFeedback* feedback = nullptr;
    bool flush = true;
    Op(const Worker& w, int f, bool abstaining)
        : codecs(w.codecs),
          step_seconds(w.codecs ? w.exchanges.step_seconds() : 0.0),
          round(w.round),
          fragment(f),
          abstain(abstaining),
          guard(w.guard),
          feedback(w.feedback),
          flush(w.flush) {
      if (!codecs) policy.emplace(w.guard, w.feedback, w.choice, w.flush);
    }
    // The plan exchange: this worker's proposal (or, on a retry, what it agreed on before)
    // all-gathered, the least lossy taken (agree_codec). True when the group holds a member no
    // operation of this worker ran with before: its time is not the link's (new connections).
    bool plan(CommMembers& members, const collective::Group& g, uint64_t op, uint64_t& bytes) {
      std::unique_lock<std::mutex> lock(codecs->mu);
      dl::FragmentCodecPlanner& planner = *codecs->planner;
      const auto& ladder = planner.planner().ladder();
      bool fresh = false;
      for (const auto& m : g.members) fresh |= !codecs->met.count(m.endpoint);
      dl::CodecProposal mine;
      if (agreed)
        mine.rung = mine.current = uint8_t(*agreed);
      else
        mine = planner.propose(int(g.members.size()), step_seconds);
      lock.unlock();  // the exchange waits for the others
      std::vector<std::vector<uint8_t>> all;
      if (g.members.size() >= 2)
        bytes += members.allgather(dl::plan_round(op), {{dl::encode_proposal(mine)}},
                                   dl::kProposalBytes, all);
      else
        all = {dl::encode_proposal(mine)};
      const dl::CodecAgreement a = dl::agree_codec(all, ladder.size());
      if (agreed && a.rung != *agreed)
        throw std::runtime_error("fragment " + std::to_string(fragment) + "'s operation " +
                                 std::to_string(op) + ": retried without a lost member, its " +
                                 "members agreed on " + ladder[size_t(a.rung)].name() +
                                 ", not the " + ladder[size_t(*agreed)].name() +
                                 " its code was made with");
      if (agreed) return fresh;
      agreed = a.rung;
      const dl::CodecChoice& c = ladder[size_t(a.rung)];
      policy.emplace(guard, feedback, c, flush);
      lock.lock();
      planner.agreed(a.rung);
      FragmentCodecNote note;
      note.round = round;
      note.fragment = fragment;
      note.op = op;
      note.codec = c.name();
      const int members_n = int(g.members.size());
      const int was = codecs->last < 0 ? a.rung : codecs->last;
      if (a.proposer < 0)
        note.reason = "no member measured its link: the least lossy codec they stood at";
      else if (a.reading.probe)
        note.reason = "a probe: " +
                      planner.planner().reading(a.rung, a.reading.rate, a.reading.window, members_n,
                                                "takes") +
                      " on a small exchange, which says little of the link (" +
                      g.members[size_t(a.proposer)].name + "'s reading)";
      else
        note.reason =
            planner.planner().reading(a.rung > was ? was : a.rung, a.reading.rate, a.reading.window,
                                      members_n, a.rung > was ? "would take" : "takes") +
            " (" + g.members[size_t(a.proposer)].name + "'s reading)";
      codecs->last = a.rung;
      codecs->notes.push_back(std::move(note));
      while (codecs->notes.size() > 256) codecs->notes.erase(codecs->notes.begin());
      return fresh;
    }
    // The operation ended: its bytes and seconds are the next proposal's reading, unless its
    // group was new to this worker.
    void measured(const collective::Group& g, uint64_t bytes, double seconds, bool fresh) {
      std::lock_guard<std::mutex> lock(codecs->mu);
      for (const auto& m : g.members) codecs->met.insert(m.endpoint);
      while (codecs->met.size() > 1024) codecs->met.erase(codecs->met.begin());
      if (!fresh) codecs->planner->measured(bytes, seconds);
    }
  };

  Worker s_;
  std::shared_ptr<StreamGroup> group_;
};

}  // namespace

std::vector<std::string> names_of(const collective::Group& g) {
  std::vector<std::string> out;
  for (const auto& m : g.members) out.push_back(m.name);
  return out;
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
  if (req.eval_end > req.eval_begin &&
      (req.eval_begin < 0 || req.eval_end > s_->val_windows.size(0)))
    throw std::invalid_argument("InnerWorker " + std::to_string(s_->index) + ": stream asks to " +
                                "evaluate windows [" + std::to_string(req.eval_begin) + ", " +
                                std::to_string(req.eval_end) + "), not inside its " +
                                std::to_string(s_->val_windows.size(0)));
  s_->choose(req.codec, "stream");
  // compression auto: the round's codec is where this worker's planner stands until it has
  // measured an operation of its own.
  if (s_->codecs) {
    std::lock_guard<std::mutex> lock(s_->codecs->mu);
    s_->codecs->planner->seed(s_->choice);
  }
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

  auto group = StreamGroup::of(
      req, joining ? std::optional<uint64_t>(req.op_id + uint64_t(*first)) : std::nullopt,
      s_->relay);
  const JoinDesk::Open desk = s_->desk.open(req.round, joining ? req.from_step : start);
  s_->exchanges.open();

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
      // Diverged earlier in the round: no more steps in it (its averages abstain).
      if (s.diverged_round == req.round) return;
      const int64_t t_inner = loco::now_ms();
      double chunk = 0;  // summed as run_inner_steps(n) sums, then its mean times n as before
      int taken = 0;
      for (int i = 0; i < n; ++i) {
        out.inner.per_step.push_back(s.one_step(s.lead()));
        StepFigures& f = out.inner.per_step.back();
        // A test hook's delay counts as inner time, as in timed_steps.
        s.hook(RoundPoint::after_inner_step, req.round, now - start + i + 1, "stream", nullptr, {},
               &f.loss);
        chunk += f.loss;
        ++taken;
        if (State::diverged(f)) {
          s.note_diverged(req.round, now - start + i + 1, f);
          break;
        }
      }
      const double took = seconds_since(t_inner);
      out.inner.seconds += took;
      s.exchanges.add_steps(took, taken);
      out.inner.steps += taken;
      loss += (taken > 0 ? chunk / taken : 0.0) * taken;
      s.hook(RoundPoint::stream_events, req.round, now + n - start, "stream");
    }
    void at_event(int64_t now) override {
      out.wait_seconds += s.admit_at(req, group, now);
    }
    void landed(dl::InFlightFragment& f, int64_t now) override {
      last_landed = std::max(last_landed, f.op);
      s.log_landing(f.fragment, f.mean[0], now);
    }
    uint64_t last_landed = 0;  // the newest operation that landed in the call
  } worker(*s_, req, *group, out, start);
  const int64_t round_of_call = req.round;
  GroupAverager averager(
      GroupAverager::Worker{*k.comm, s_->last_op, s_->feedback.get(), s_->cfg.guard, s_->guard_log,
                            [this, round_of_call] { return s_->diverged_round == round_of_call; },
                            [this, round_of_call](int fragment, std::span<float> delta) {
                              s_->hook(RoundPoint::pseudo_gradient, round_of_call, fragment,
                                       "stream", nullptr, delta);
                            },
                            s_->choice, s_->cfg.autocodec.flush, s_->exchanges, s_->codecs,
                            s_->last_prepared, req.round},
      group);

  dl::StreamingRound::Round round;
  round.round = req.round;
  round.last = req.last;
  round.from_step = req.from_step;
  round.op_base = req.op_id;
  const dl::StreamingRound::Result r = s_->engine->run(round, averager, worker);
  s_->hook(RoundPoint::stream_end, req.round, s_->cfg.inner.steps, "stream");
  out.wait_seconds += r.wait_seconds;
  out.bytes_sent += r.bytes_sent;
  out.inner.round = req.round;
  // Over the steps it took: a worker that joined mid-round took fewer than H.
  out.inner.mean_loss = out.inner.steps > 0 ? worker.loss / out.inner.steps : 0.0;
  out.theta_hash = k.outer->theta_hash();
  out.group = group->names_as_landed(worker.last_landed);
  out.left_out = notes_of(s_->guard_log.take());
  out.guard_seconds = s_->guard_log.take_seconds();
  out.exchange_seconds = s_->exchanges.take_seconds();
  if (s_->codecs) {
    std::lock_guard<std::mutex> lock(s_->codecs->mu);
    out.codecs = std::exchange(s_->codecs->notes, {});
  }
  if (!checkpoint_file.empty() || !inner_file.empty())
    s_->start_checkpoint(checkpoint_file, inner_file);
  if (req.eval_end > req.eval_begin) s_->start_evaluation(req.eval_begin, req.eval_end);
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
      const int64_t size = s_->engine->fragment_size(f);
      if (mean.as<float>().size() != size_t(size))
        throw std::runtime_error("InnerWorker " + std::to_string(s_->index) + ": the average of " +
                                 "fragment " + std::to_string(f) + " from " + req.source +
                                 " holds " + std::to_string(mean.as<float>().size()) +
                                 " values, not " + std::to_string(size));
      s_->engine->land_outer(f, mean.as<float>());
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

void InnerWorker::member_gone(MemberGone gone) {
  if (gone.endpoints.size() > 64)
    throw std::invalid_argument("member_gone: " + std::to_string(gone.endpoints.size()) +
                                " endpoints, more than a member has ranks (64 at most)");
  if (gone.below_op > (uint64_t(1) << 62))
    throw std::invalid_argument("member_gone: operation id " + std::to_string(gone.below_op) +
                                " is out of range");
  const uint64_t below = gone.below_op ? dl::plan_round(gone.below_op) : 0;
  const std::string why = escape_remote(gone.reason, 500);
  // The ranks and their communicators are made once, by the constructor.
  for (Rank& k : s_->ranks)
    for (const std::string& ep : gone.endpoints) k.comm->peer_gone(ep, why, below);
}

void InnerWorker::give_up(RoundsGivenUp given_up) {
  // Operation ids are the aggregator's microsecond clock: far below 2^62, whose collective
  // round ids (3 op to 3 op + 2) do not wrap.
  if (given_up.below_op > (uint64_t(1) << 62))
    throw std::invalid_argument("give_up: operation id " + std::to_string(given_up.below_op) +
                                " is out of range");
  const std::string why = escape_remote(given_up.reason, 500);
  for (Rank& k : s_->ranks)
    k.comm->give_up_below(dl::plan_round(given_up.below_op), why, given_up.as_lost);
  // In this node's log: a worker dropped from its rounds (as_lost) leaves them at its next
  // operation, which may be long after (it stalls, say).
  log_info("rounds before operation " + std::to_string(given_up.below_op) + " given up" +
           (given_up.as_lost ? ", this worker leaving them" : "") + ": " + why);
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

}  // namespace loco::actors
