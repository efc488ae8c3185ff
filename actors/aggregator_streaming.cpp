// sync.mode streaming or eager: a round as one stream() call per member, with the
// synchronizations of its fragments in flight; the next round sent right behind it
// (pipeline_next); its end (finish_stream); and the checkpoint its members write under the
// next round's inner steps (settle_checkpoint).
#include <algorithm>
#include <chrono>
#include <utility>

#include "actors/outer_aggregator_state.hpp"

namespace loco::actors {

OuterAggregator::State::RoundOutcome OuterAggregator::State::stream_round(
    int64_t r, const std::vector<int>& members, double t_round, bool sent_ahead) {
  std::optional<StreamCalls> sent;
  if (sent_ahead) {
    sent = std::move(*ahead);
  } else {
    try {
      sent = send_stream(r, r + 1 == total_rounds,
                         checkpoint_due(r + 1, cfg.checkpoint.every, total_rounds) &&
                             room_for_checkpoint(r + 1),
                         evaluation_due(steps_since_eval + cfg.inner.steps, cfg.eval.every, r + 1,
                                        total_rounds),
                         members);
    } catch (const std::exception& e) {
      // A member's actor could not be reached to send it the round (some others may have
      // it already): back to the checkpoint, which every member re-reads.
      log("round " + std::to_string(r + 1) + " could not be sent: " + e.what() +
          "; the job goes back to " + resume_point());
      return failure(RoundOutcome::Kind::rewind, std::string("it could not be sent: ") + e.what());
    }
  }
  StreamCalls calls = std::move(*sent);
  // Those the round's calls asked (a worker that joins it mid-round is not asked).
  std::vector<int> asked_checkpoint;
  if (!calls.checkpoint.empty()) asked_checkpoint = calls.members;
  ahead.reset();
  const Pipeline p = send_ahead(r, members);
  RoundOutcome o = finish_stream(calls, t_round);
  if (o.kind == RoundOutcome::Kind::diverged) return o;
  if (o.kind != RoundOutcome::Kind::completed) {
    log("round " + std::to_string(r + 1) +
        " failed with synchronizations in flight; the job goes back to " + resume_point());
    give_up_sent(calls, "round " + std::to_string(r + 1) + " failed (" + o.why.substr(0, 300) +
                            "); the job goes back to " + resume_point());
    return o;
  }
  ahead_since = o.results_in;  // a round sent ahead began on the members then
  o.asked_checkpoint = std::move(asked_checkpoint);
  // The checkpoint the round before asked for: written under this round's inner steps.
  settle_checkpoint();
  if (o.results_in > 0)
    log_info(job_id + ": round " + std::to_string(r + 1) + " results in " +
             std::to_string(o.results_in - t_round) + " s after it began; bookkeeping " +
             std::to_string(now_s() - o.results_in) + " s; round " + std::to_string(r + 2) + ": " +
             to_string(p));
  return o;
}

Pipeline OuterAggregator::State::send_ahead(int64_t r, const std::vector<int>& members) {
  read_target();
  end_by_time(r + 1);  // before round r + 1 is sent, with its `last`
  PipelineInput next;
  next.round = r;
  next.rounds = total_rounds;
  // Whether θ is evaluated after round r + 1 (sent now, before round r's end is counted): the
  // members evaluate a copy of it in the background as that round ends (StreamRequest::
  // eval_begin), so an evaluation holds nothing back.
  int64_t steps = steps_since_eval + cfg.inner.steps;
  if (evaluation_due(steps, cfg.eval.every, r + 1, total_rounds)) steps = 0;
  const bool evaluate_next =
      evaluation_due(steps + cfg.inner.steps, cfg.eval.every, r + 2, total_rounds);
  // Those still in the job: a member of a round that was sent ahead may have been lost since.
  std::vector<int> staying;
  for (int m : members)
    if (slots[size_t(m)].active) staying.push_back(m);
  next.members = int(staying.size());
  // A slot the guard removed is never filled again: the members it leaves are the whole job.
  // (Counted in the target, it held every later round back from being sent ahead: the soak's
  // record ran 60 rounds so after an eviction.)
  int removed = 0;
  for (int i = 0; i < target && size_t(i) < slots.size(); ++i)
    removed += slots[size_t(i)].removed.empty() ? 0 : 1;
  next.target = target - removed;
  next.min = cfg.workers.min;
  const Pipeline p = pipeline_next(next);
  // Whether rounds are sent ahead, and why not, said when it changes.
  auto say = [&](Pipeline now) {
    if (now == Pipeline::last_round || now == pipeline_said) return;
    log("round " + std::to_string(r + 2) +
        (now == Pipeline::ahead
             ? ": sent right behind round " + std::to_string(r + 1) +
                   ", which each member begins when it ends round " + std::to_string(r + 1)
             : ": not sent ahead: " + std::string(to_string(now))));
    pipeline_said = now;
  };
  // Sent ahead: round r + 1's calls go out right behind round r's and wait in each member's
  // mailbox, so that a member begins round r + 1 as soon as it ends round r, with no barrier
  // between the rounds and no trip to the aggregator (members drift apart by up to a fragment
  // interval; the collective's entry window lets a member be behind without being lost).
  say(p);
  if (p == Pipeline::ahead) {
    try {
      ahead = send_stream(r + 1, r + 2 == total_rounds,
                          checkpoint_due(r + 2, cfg.checkpoint.every, total_rounds) &&
                              room_for_checkpoint(r + 2),
                          evaluate_next, staying);
    } catch (const std::exception& e) {
      // Some members may hold it already: they begin it after this round, and its proper
      // sending (a round mismatch for them) sends the job back to its checkpoint.
      log("round " + std::to_string(r + 2) + " could not be sent ahead: " + e.what());
      ahead.reset();
    }
  }
  return p;
}

StreamCalls OuterAggregator::State::send_stream(int64_t r, bool last, bool checkpoint,
                                                bool evaluate, const std::vector<int>& members) {
  StreamRequest req;
  req.round = r;
  req.last = last;
  const std::string file = checkpoint ? checkpoint_file(r + 1) : std::string();
  // One operation id per fragment, all above the last one used (see ReduceRequest::op_id).
  const auto us = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
  req.op_id = std::max(last_op_id + 1, us);
  last_op_id = req.op_id + uint64_t(cfg.sync.fragments) - 1;
  for (int m : members) {
    req.names.push_back(slots[size_t(m)].name);
    req.endpoints.push_back(slots[size_t(m)].endpoints);
  }
  req.codec = plan_codec(r, int(members.size()));
  StreamCalls c;
  c.round = r;
  c.op_id = req.op_id;
  c.last = last;
  c.members = members;
  c.checkpoint = file;
  c.sent = now_s();
  std::vector<EvalPart> parts;
  if (evaluate) parts = evaluation_split(windows, cfg.inner.batch_size, int(members.size()));
  for (size_t i = 0; i < members.size(); ++i) {
    req.rank = int(i);
    req.checkpoint = i == 0 ? file : std::string();
    req.inner_state = checkpoint ? inner_state_path(file, members[i]) : std::string();
    req.eval_begin = req.eval_end = 0;
    for (const EvalPart& p : parts)
      if (p.member == int(i)) {
        req.eval_begin = p.begin;
        req.eval_end = p.end;
        c.eval.push_back({members[i], p.begin, p.end});
      }
    c.calls.push_back(worker(members[i]).call(&InnerWorker::stream, req));
  }
  return c;
}

void OuterAggregator::State::settle_checkpoint() {
  if (!pending_checkpoint) return;
  PendingCheckpoint pc = std::move(*pending_checkpoint);
  pending_checkpoint.reset();
  std::vector<Failure> errors;
  // Written while the round after it ran: normally ready by now.
  auto got = gather(pc.written, errors, kCheckpointWrittenCall);
  std::optional<std::string> path;
  for (size_t i = 0; i < pc.members.size(); ++i) {
    if (got[i] && !got[i]->empty()) path = *got[i];
    if (!got[i])  // a worker without its file starts afresh on resume
      log("worker " + std::to_string(pc.members[i]) +
          " did not write its part of the checkpoint of round " + std::to_string(pc.round) + ": " +
          errors[i].message);
  }
  if (!path) {
    log("the checkpoint of round " + std::to_string(pc.round) +
        " was not written; should the job go back, it goes back to " + resume_point());
    return;
  }
  record_checkpoint(*path, pc.round);
}

size_t OuterAggregator::State::tell_gone(StreamCalls& c) {
  c.seen.resize(c.calls.size(), false);
  size_t ended = 0;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    if (!c.calls[i].ready()) continue;
    ++ended;
    if (c.seen[i]) continue;
    c.seen[i] = true;
    std::string why;
    try {
      (void)c.calls[i].get(kEndedCall);
      continue;
    } catch (const ActorDiedError& e) {
      why = e.what();
    } catch (const ActorNotFoundError& e) {
      why = e.what();
    } catch (const std::exception& e) {
      // Dropped from the round, it left it as told: no news.
      if (dropped_in(c, c.members[i])) continue;
      // It answered: it is alive, and its group knows what it did. Holding a θ of its own, it
      // sends the job back (after_overlapped_round), whatever the others do now.
      if (!c.failed)
        c.failed = "worker " + std::to_string(c.members[i]) + " failed round " +
                   std::to_string(c.round + 1) + ": " + std::string(e.what()).substr(0, 300);
      continue;
    }
    drop_from_sent(c, i, why.substr(0, 300));
  }
  return ended;
}

void OuterAggregator::State::drop_from_sent(StreamCalls& c, size_t i, const std::string& why) {
  const int w = c.members[i];
  Slot& s = slots[size_t(w)];
  const uint64_t below = last_op_id + 1;
  if (s.dropped_below_op >= below) return;
  s.dropped_below_op = below;
  // Died, or only its answer lost with a head that restarted (its actor still runs): the
  // head's record of the actor tells, where the head can be asked now.
  std::string state = "the head cannot tell whether its actor still runs";
  try {
    const ActorInfo info = rt.lookup(s.name);
    state = info.state == ActorState::alive && s.handle && info.id == s.handle->id()
                ? "its actor still runs (the call's answer was lost)"
                : "its actor died";
  } catch (const ActorNotFoundError&) {
    state = "its actor died";
  } catch (const std::exception&) {
  }
  const std::string reason = state + ": " + why;
  const MemberGone note{s.endpoints, reason, below};
  const std::vector<int> told = still_running(c, w);
  for (int m : told) {
    try {
      worker(m).tell(&InnerWorker::member_gone, note);
    } catch (const std::exception& e) {
      log_warn(job_id + ": telling worker " + std::to_string(m) + " that worker " +
               std::to_string(w) + " is gone: " + e.what());
    }
  }
  leave_dropped(w);
  const bool with_ahead = ahead && ahead->round != c.round;
  log("worker " + std::to_string(w) + " dropped from round " + std::to_string(c.round + 1) +
      (with_ahead ? " and round " + std::to_string(ahead->round + 1) + " (sent ahead)" : "") +
      (told.empty() ? "" : "; workers " + join_ints(told) + " finish without it") + ": " + reason);
}

std::vector<int> OuterAggregator::State::still_running(const StreamCalls& c, int except) const {
  std::vector<int> out;
  auto add = [&](const StreamCalls& calls) {
    for (size_t j = 0; j < calls.calls.size(); ++j)
      if (calls.members[j] != except && !calls.calls[j].ready()) out.push_back(calls.members[j]);
  };
  add(c);
  if (ahead && ahead->round != c.round) add(*ahead);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void OuterAggregator::State::leave_dropped(int w) {
  const Slot& s = slots[size_t(w)];
  if (s.dropped_below_op == 0 || !s.handle) return;
  try {
    s.handle->tell(&InnerWorker::give_up,
                   RoundsGivenUp{s.dropped_below_op, "the aggregator lost its answer", true});
  } catch (const std::exception&) {
    // Not reachable now (a head restarting): told again as the round ends (release).
  }
}

void OuterAggregator::State::give_up_sent(StreamCalls& failed, const std::string& why) {
  if (!std::exchange(failed.given_up, true)) {
    const RoundsGivenUp note{last_op_id + 1, why};
    const std::vector<int> told = still_running(failed);
    for (int m : told) {
      try {
        worker(m).tell(&InnerWorker::give_up, note);
      } catch (const std::exception& e) {
        log_warn(job_id + ": telling worker " + std::to_string(m) + " to give up round " +
                 std::to_string(failed.round + 1) + ": " + e.what());
      }
    }
    if (!told.empty())
      log("round " + std::to_string(failed.round + 1) +
          (ahead ? " and round " + std::to_string(ahead->round + 1) + " (sent ahead)" : "") +
          " given up on workers " + join_ints(told) + ", who end them at once: " + why);
  }
  ahead.reset();
}

void OuterAggregator::State::await_stream(StreamCalls& c) {
  std::vector<const FutureBase*> watched;
  for (const auto& f : c.calls) watched.push_back(&f);
  for (;;) {
    const size_t ended = tell_gone(c);
    if (c.failed && !c.given_up)
      give_up_sent(c, *c.failed + "; the job goes back to " + resume_point());
    if (ended == c.calls.size() || stop) return;
    // Until one more ends, or a stop; past kInnerPhase, gather's own wait ends the round.
    if (loco::wait(watched, ended + 1, kInnerPhase, wake.get_token()).size() <= ended) return;
  }
}

OuterAggregator::State::RoundOutcome OuterAggregator::State::finish_stream(StreamCalls& c,
                                                                           double started) {
  const int64_t r = c.round;
  const std::vector<int>& members = c.members;
  join_mid_round(c);
  await_stream(c);
  std::vector<Failure> errors;
  auto res = gather(c.calls, errors, kInnerPhase);
  // A member dropped from the round is lost to it, whatever it answered (the others were told
  // to finish without it).
  for (size_t i = 0; i < members.size(); ++i)
    if (dropped_in(c, members[i])) {
      if (res[i] || !errors[i].gone)
        errors[i] = Failure{
            "dropped from the round: " +
                (res[i] ? std::string("its answer came after the drop") : errors[i].message),
            true};
      res[i].reset();
    }
  const double seconds = now_s() - std::max(c.sent, started);
  std::vector<MemberOutcome> outcomes;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!res[i]) {
      outcomes.push_back(MemberOutcome{false, 0, errors[i].gone, {}});
      continue;
    }
    MemberOutcome o{true, res[i]->theta_hash, false, {}};
    for (const std::string& name : res[i]->group) {
      int slot = -1;
      for (int m : members)
        if (slots[size_t(m)].name == name) slot = m;
      o.group.push_back(slot);
    }
    std::sort(o.group.begin(), o.group.end());
    outcomes.push_back(std::move(o));
  }
  const OverlappedDecision d = after_overlapped_round(members, outcomes);
  RoundOutcome o;
  o.eval = c.eval;
  // The next round was sent right behind this one: it began on the members as this one ended,
  // here, whether all of them agreed or the survivors of a lost member did.
  if (d.kind == OverlappedDecision::Kind::agreed || d.kind == OverlappedDecision::Kind::smaller)
    o.results_in = now_s();
  AttemptRecord rec;
  rec.round = r + 1;
  rec.members = members;
  rec.seconds = seconds;
  for (size_t i = 0; i < members.size(); ++i) {
    rec.bytes.push_back(res[i] ? std::optional(res[i]->bytes_sent) : std::nullopt);
    if (!res[i]) rec.errors.push_back({members[i], errors[i].gone, errors[i].message});
  }
  records->attempt(rec);
  if (d.kind == OverlappedDecision::Kind::rewind) {
    std::string why = "its members did not end it in one group";
    for (size_t i = 0; i < members.size(); ++i) {
      if (res[i]) continue;
      if (why.rfind("worker ", 0) != 0)
        why = "worker " + std::to_string(members[i]) + " " +
              (errors[i].gone ? "was lost" : "failed") + ": " + errors[i].message;
      if (errors[i].gone)
        release(members[i], "lost in round " + std::to_string(r + 1) + ": " + errors[i].message);
      else
        log("worker " + std::to_string(members[i]) + " failed round " + std::to_string(r + 1) +
            ": " + errors[i].message);
    }
    return failure(RoundOutcome::Kind::rewind, why);
  }
  // Where member (slot) m is in `members`, res and errors.
  auto index_of = [&](int m) {
    return size_t(std::find(members.begin(), members.end(), m) - members.begin());
  };
  if (d.kind == OverlappedDecision::Kind::diverged) {
    // Against the first member that finished (d.theta_hash): members[0] may be one lost.
    return failure(RoundOutcome::Kind::diverged,
                   "round " + std::to_string(r + 1) + ": worker " +
                       std::to_string(d.diverged_member) + " holds a different θ (hash " +
                       std::to_string(res[index_of(d.diverged_member)]->theta_hash) + " vs " +
                       std::to_string(d.theta_hash) + ")");
  }
  if (d.kind == OverlappedDecision::Kind::smaller)
    for (int m : d.lost) {
      const size_t i = index_of(m);
      release(m,
              "lost in round " + std::to_string(r + 1) +
                  "; the others finished its fragments in flight without it: " + errors[i].message);
    }
  for (size_t i = 0; i < members.size(); ++i)
    if (res[i]) {
      // The same verdicts on every member: the first's.
      note_left_out(r, res[i]->left_out, res[i]->guard_seconds);
      break;
    }
  int losses = 0;
  std::vector<std::pair<uint64_t, double>> exchanges;
  std::vector<double> step_secs;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!res[i]) continue;
    const InnerResult& in = res[i]->inner;
    exchanges.emplace_back(res[i]->bytes_sent, res[i]->exchange_seconds);
    if (in.steps > 0) step_secs.push_back(in.seconds / in.steps);
    if (std::string why = non_finite_of(members[i], in, cfg.inner.steps); !why.empty()) {
      // It stopped its steps there and abstained from the round's averages since (with the
      // guard: the verdicts of those averages say so).
      log(why + "; it stopped its steps and sent nothing more in round " + std::to_string(r + 1));
    } else {
      o.loss += in.mean_loss;
      ++losses;
    }
    o.inner_secs += in.seconds;
    int64_t tokens = 0;
    for (const StepFigures& f : in.per_step) tokens += f.tokens;
    round_members.push_back(member_figures(members[i], in.steps, tokens, in.seconds, in.per_step));
    round_steps.push_back(in.per_step);
  }
  note_link(exchanges, std::move(step_secs), "round " + std::to_string(r + 1));
  std::vector<const StreamResult*> reports;
  for (const auto& got : res) reports.push_back(got ? &*got : nullptr);
  fragment_codec_notes(reports);
  o.loss = losses > 0 ? o.loss / losses : std::numeric_limits<double>::quiet_NaN();
  o.theta_hash = d.theta_hash;
  o.ready = o.group = o.members = d.finished;
  return o;
}

}  // namespace loco::actors
