// sync.mode blocking: a round as its inner phase (every member's H inner steps, or its budget
// of seconds, up to the deadline for stragglers) and then all-reduce attempts of its group
// until the group agrees on θ or gives up.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "actors/outer_aggregator_state.hpp"

namespace loco::actors {

namespace dl = loco::diloco;

OuterAggregator::State::RoundOutcome OuterAggregator::State::blocking_round(
    int64_t r, const std::vector<int>& members) {
  RoundOutcome o = inner_phase(r, members);
  if (o.kind != RoundOutcome::Kind::completed) return o;
  all_reduce(r, o);
  return o;
}

// 1-2. Every member runs its H inner steps, or (inner.budget: time) steps until the round's
// budget of seconds is spent.
OuterAggregator::State::RoundOutcome OuterAggregator::State::inner_phase(
    int64_t r, const std::vector<int>& members) {
  RoundOutcome o;
  o.members = members;
  double budget =
      cfg.inner.budget == dl::InnerBudget::time
          ? inner_budget_seconds(cfg.inner.round_seconds, cfg.inner.steps, step_seconds)
          : 0;
  // Each member's steps bounded by its share of the remaining tokens (token_caps).
  std::vector<int64_t> caps(members.size(), 0);
  if (budget > 0 && cfg.ends_at_tokens()) {
    const int64_t remaining = cfg.token_target() - tokens_done();
    caps = token_caps(remaining, cfg.tokens_per_inner_step(), step_seconds_of_members(members));
    const TokenRound t = token_round(budget, remaining, tokens_per_second);
    if (t.last) {
      budget = std::max(t.seconds, 1e-3);  // at least one step each
      total_rounds = int(r + 1);
      last_by_tokens = r;
      char line[200];
      std::snprintf(line, sizeof line,
                    "round %lld is the last: %lld tokens remain of token_budget's %lld, "
                    "%.2f s at the members' %.0f tokens/s",
                    static_cast<long long>(r + 1), static_cast<long long>(remaining),
                    static_cast<long long>(cfg.token_target()), budget, tokens_per_second);
      log(line);
    }
  }
  std::vector<Future<InnerResult>> inner;
  for (size_t i = 0; i < members.size(); ++i)
    inner.push_back(budget > 0
                        ? worker(members[i]).call(&InnerWorker::inner_timed, r, budget, caps[i])
                        : worker(members[i]).call(&InnerWorker::inner, r));
  std::vector<Failure> errors;
  std::vector<bool> late;
  double window = 0;
  auto results = gather_inner(inner, errors, late, window);
  step_seconds.clear();
  double rate = 0;  // tokens per second, the members' together
  std::string steps_line;
  // The first member whose inner steps diverged, if any (the cause of a redo below).
  std::string non_finite;
  for (size_t i = 0; i < members.size(); ++i) {
    if (results[i]) {
      if (std::string why = non_finite_of(members[i], *results[i], budget > 0 ? 0 : cfg.inner.steps);
          !why.empty()) {
        // It stopped its steps at the one that diverged and sends nothing: it leaves the round,
        // and comes back with the outer state before the next. With the guard, it is recorded
        // as left out (and counts toward guard.evict_after).
        release(members[i], why);
        if (non_finite.empty()) non_finite = why;
        if (cfg.guard.on) round_left_out.push_back({members[i], 0, "abstained", why});
        continue;
      }
      o.ready.push_back(members[i]);
      o.loss += results[i]->mean_loss;
      o.inner_secs += results[i]->seconds;
      tokens_of[members[i]] = results[i]->tokens;
      round_members.push_back(member_figures(members[i], results[i]->steps, results[i]->tokens,
                                             results[i]->seconds, results[i]->per_step));
      round_steps.push_back(results[i]->per_step);
      if (results[i]->steps > 0) {
        step_seconds.push_back(results[i]->seconds / results[i]->steps);
        step_seconds_of[members[i]] = step_seconds.back();
      }
      if (results[i]->seconds > 0) rate += double(results[i]->tokens) / results[i]->seconds;
      steps_line += (steps_line.empty() ? "" : ", ") + std::to_string(members[i]) + ": " +
                    std::to_string(results[i]->steps);
    } else if (late[i]) {
      Slot& s = slots[size_t(members[i])];
      s.late = inner[i];
      s.late_round = r;
      s.active = false;
      round_late.push_back(members[i]);
      char line[200];
      std::snprintf(line, sizeof line,
                    "worker %d missed the deadline of round %lld (%.1f s after the quorum); "
                    "it sits the round out and catches up when its inner steps end",
                    members[i], static_cast<long long>(r + 1), window);
      log(line);
    } else {
      release(members[i], "failed in round " + std::to_string(r + 1) + ": " + errors[i].message);
    }
  }
  if (rate > 0) tokens_per_second = rate;
  if (budget > 0) {
    char line[96];
    std::snprintf(line, sizeof line, " (budget %.2f s)", budget);
    log("round " + std::to_string(r + 1) + ": inner steps per worker " + steps_line + line);
  }
  if (after_inner(int(o.ready.size()), cfg.workers.min) == AfterInner::redo) {
    if (!non_finite.empty()) {
      char fix[96];
      std::snprintf(fix, sizeof fix, "lower inner.lr (%g): the inner steps diverge", cfg.inner.lr);
      return failure(RoundOutcome::Kind::redo, non_finite, fix);
    }
    std::string first;  // the first member that failed, with why
    for (size_t i = 0; i < members.size() && first.empty(); ++i)
      if (!results[i] && !late[i])
        first = "; worker " + std::to_string(members[i]) + " failed: " + errors[i].message;
    return failure(RoundOutcome::Kind::redo,
                   std::to_string(o.ready.size()) +
                       " workers finished their inner steps, below workers.min = " +
                       std::to_string(cfg.workers.min) + first);
  }
  o.loss /= double(o.ready.size());
  return o;
}

// 3-5. The group averages Δ and steps; every member reports θ's hash. The group could not
// agree: o becomes a redo; its members hold different θ: o becomes diverged.
void OuterAggregator::State::all_reduce(int64_t r, RoundOutcome& o) {
  std::vector<int> group = o.ready;
  std::vector<Failure> errors;
  std::optional<uint64_t> agreed;
  // compression auto: the round's codec, the same for every attempt.
  const std::string codec = plan_codec(r, int(group.size()));
  for (uint64_t attempt = 0; !agreed; ++attempt) {
    ReduceRequest req;
    req.round = r;
    req.codec = codec;
    const auto us = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
    last_op_id = req.op_id = std::max(last_op_id + 1, us);
    for (int m : group) {
      req.names.push_back(slots[size_t(m)].name);
      req.endpoints.push_back(slots[size_t(m)].endpoints);
      if (cfg.inner.budget == dl::InnerBudget::time) req.tokens.push_back(tokens_of[m]);
    }
    const double t_attempt = now_s();
    std::vector<Future<ReduceResult>> red;
    for (size_t i = 0; i < group.size(); ++i) {
      req.rank = int(i);
      red.push_back(worker(group[i]).call(&InnerWorker::reduce, req));
    }
    auto rr = gather(red, errors, kReduceCall);
    AttemptRecord rec;
    rec.round = r + 1;
    rec.members = group;
    rec.seconds = now_s() - t_attempt;
    for (size_t i = 0; i < group.size(); ++i) {
      // A member whose reduce failed does not say what it sent before it did.
      rec.bytes.push_back(rr[i] ? std::optional(rr[i]->bytes_sent) : std::nullopt);
      if (!rr[i]) rec.errors.push_back({group[i], errors[i].gone, errors[i].message});
    }
    records->attempt(rec);
    allreduce_total += rec.seconds;
    if (!rec.errors.empty()) o.failed_secs += rec.seconds;
    std::vector<MemberOutcome> outcomes;
    for (size_t i = 0; i < group.size(); ++i) {
      outcomes.push_back(rr[i] ? MemberOutcome{true, rr[i]->theta_hash, false}
                               : MemberOutcome{false, 0, errors[i].gone});
      if (!rr[i] && !errors[i].gone)
        log("worker " + std::to_string(group[i]) + " failed the all-reduce of round " +
            std::to_string(r + 1) + ": " + errors[i].message);
    }
    const AttemptDecision d = after_attempt(group, outcomes, attempt);
    for (size_t i = 0; i < group.size(); ++i) {
      if (!rr[i] && errors[i].gone)
        release(group[i], "lost in the all-reduce of round " + std::to_string(r + 1) + ": " +
                              errors[i].message);
    }
    if (d.kind == AttemptDecision::Kind::diverged) {
      const size_t i =
          size_t(std::find(group.begin(), group.end(), d.diverged_member) - group.begin());
      const std::string why = "round " + std::to_string(r + 1) + ": worker " +
                              std::to_string(d.diverged_member) + " holds a different θ (hash " +
                              std::to_string(rr[i]->theta_hash) + " vs " +
                              std::to_string(rr[0]->theta_hash) + ")";
      o = failure(RoundOutcome::Kind::diverged, why);
      return;
    }
    if (d.kind == AttemptDecision::Kind::agreed) {
      agreed = d.theta_hash;
      std::vector<std::pair<uint64_t, double>> exchanges;
      for (const auto& res : rr)
        if (res) exchanges.emplace_back(res->bytes_sent, res->seconds);
      note_link(exchanges, step_seconds, "round " + std::to_string(r + 1));
      for (const auto& res : rr)
        if (res) {
          note_left_out(r, res->left_out, res->guard_seconds);  // the same verdicts everywhere
          break;
        }
      break;
    }
    if (d.kind == AttemptDecision::Kind::give_up) break;
    if (d.next_group.size() < group.size())
      log("round " + std::to_string(r + 1) + " re-formed with " +
          std::to_string(d.next_group.size()) + " workers: " + join_ints(d.next_group));
    group = d.next_group;
    if (d.backoff_ms > 0) {
      log("round " + std::to_string(r + 1) + ": the all-reduce is tried again in " +
          std::to_string(d.backoff_ms) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(d.backoff_ms));  // a backoff
    }
  }
  if (!agreed) {
    // The group could not agree: its members' θ may differ now. Drop them all;
    // reconcile brings them back with the outer state of a checkpoint.
    for (int m : group) slots[size_t(m)].active = false;
    o = failure(RoundOutcome::Kind::redo,
                "the all-reduce failed 4 times; the last time: " + errors[0].message);
    return;
  }
  o.group = group;
  o.theta_hash = *agreed;
}

std::vector<std::optional<InnerResult>> OuterAggregator::State::gather_inner(
    std::vector<Future<InnerResult>>& fs, std::vector<Failure>& errors, std::vector<bool>& late,
    double& window) {
  const size_t n = fs.size();
  late.assign(n, false);
  window = 0;
  if (cfg.workers.grace_max_s <= 0) return gather(fs, errors, kInnerPhase);
  std::vector<double> arrived(n, -1);
  const double phase_start = now_s();
  const int quorum = std::max(1, cfg.workers.min);
  const double limit = now_s() + double(kInnerPhase.count());
  double quorum_at = 0;
  int reported = 0;
  for (;;) {
    // One more report, the phase's close (the quorum's window, or the limit), or a stop.
    const double closes = reported >= quorum ? std::min(quorum_at + window, limit) : limit;
    const auto until = Millis(1 + int64_t(std::ceil(std::max(0.0, closes - now_s()) * 1000)));
    for (size_t i : loco::wait(fs, size_t(reported) + 1, until, wake.get_token())) {
      if (arrived[i] >= 0) continue;
      arrived[i] = now_s();
      if (++reported == quorum) {
        quorum_at = arrived[i];
        window = grace_window(std::vector<double>(lateness.begin(), lateness.end()), kGraceK,
                              kGraceFloorS, cfg.workers.grace_max_s, quorum_at - phase_start);
      }
    }
    if (inner_phase_closed(reported, int(n), cfg.workers.min, cfg.workers.grace_max_s, now_s(),
                           quorum_at, window) ||
        stop || now_s() > limit)
      break;
  }
  std::vector<Future<InnerResult>> done;
  std::vector<size_t> which;
  for (size_t i = 0; i < n; ++i) {
    if (arrived[i] < 0 && !stop) {
      late[i] = true;
      continue;
    }
    done.push_back(fs[i]);
    which.push_back(i);
  }
  std::vector<Failure> errs;
  auto got = gather(done, errs, kEndedCall);
  std::vector<std::optional<InnerResult>> out(n);
  errors.assign(n, Failure{"late: missed the round's deadline", false});
  for (size_t k = 0; k < which.size(); ++k) {
    out[which[k]] = std::move(got[k]);
    errors[which[k]] = errs[k];
  }
  // The samples of the next windows: how late each member was against the round's median.
  std::vector<double> times;
  for (double t : arrived)
    if (t >= 0) times.push_back(t);
  if (times.size() >= 2) {
    const double mid = median(times);
    for (double t : times) lateness.push_back(t - mid);
    while (lateness.size() > 64) lateness.pop_front();
  }
  return out;
}

}  // namespace loco::actors
