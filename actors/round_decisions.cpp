#include "actors/round_decisions.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace loco::actors {

AfterInner after_inner(int finished, int min) {
  return finished == 0 || finished < min ? AfterInner::redo : AfterInner::reduce;
}

std::string non_finite_inner(int member, double mean_loss, const std::vector<StepHealth>& steps,
                             int of_steps) {
  auto show = [](double v) { return std::isnan(v) ? std::string("nan") : v > 0 ? "inf" : "-inf"; };
  const std::string who = "worker " + std::to_string(member) + "'s ";
  const std::string of =
      " of " + std::to_string(of_steps > 0 ? size_t(of_steps) : steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string at = " at step " + std::to_string(i + 1) + of;
    if (!std::isfinite(steps[i].loss))
      return who + "inner loss became non-finite (" + show(steps[i].loss) + ")" + at;
    if (!std::isfinite(steps[i].grad_norm))
      return who + "gradient norm became non-finite (" + show(steps[i].grad_norm) + ")" + at;
  }
  if (!std::isfinite(mean_loss))
    return who + "mean inner loss is non-finite (" + show(mean_loss) + ")";
  return "";
}

RedoDecision RoundRedos::failed(int64_t round, const std::string& why, const std::string& fix) {
  std::vector<std::string>& whys = failures_[round];
  whys.push_back(why);
  RedoDecision d;
  const int redos = int(whys.size()) - 1;  // done before this failure
  if (redos < max_redos_) {
    d.redo = redos + 1;
    return d;
  }
  d.give_up = true;
  const std::string r = "round " + std::to_string(round + 1);
  const bool same = std::all_of(whys.begin(), whys.end(), [&](const auto& w) { return w == why; });
  if (same) {
    d.message = r + ": " + why + "; the round was redone " + std::to_string(redos) +
                (redos == 1 ? " time" : " times") + " with the same result";
  } else {
    d.message = r + " failed " + std::to_string(whys.size()) + " times (redone " +
                std::to_string(redos) + " times): ";
    for (size_t i = 0; i < whys.size(); ++i) d.message += (i ? "; then " : "") + whys[i];
  }
  if (!fix.empty()) d.message += "; " + fix;
  return d;
}

int RoundRedos::failures(int64_t round) const {
  auto it = failures_.find(round);
  return it == failures_.end() ? 0 : int(it->second.size());
}

std::vector<int> copy_sources(const std::vector<int>& up_to_date, const std::vector<int>& joiners) {
  std::vector<int> out;
  if (up_to_date.empty()) return out;
  for (size_t k = 0; k < joiners.size(); ++k) out.push_back(up_to_date[k % up_to_date.size()]);
  return out;
}

AttemptDecision after_attempt(const std::vector<int>& group,
                              const std::vector<MemberOutcome>& outcomes, uint64_t attempt) {
  if (group.size() != outcomes.size())
    throw std::invalid_argument("after_attempt: " + std::to_string(outcomes.size()) +
                                " outcomes for a group of " + std::to_string(group.size()));
  AttemptDecision d;
  bool all_ok = true;
  for (size_t i = 0; i < group.size(); ++i) {
    const MemberOutcome& o = outcomes[i];
    all_ok = all_ok && o.ok;
    // A survivor that saw a peer go retries; a member whose actor is gone is released.
    if (o.ok || !o.gone)
      d.next_group.push_back(group[i]);
    else
      d.lost.push_back(group[i]);
  }
  if (all_ok && !group.empty()) {
    d.theta_hash = outcomes[0].theta_hash;
    d.kind = AttemptDecision::Kind::agreed;
    for (size_t i = 1; i < group.size(); ++i) {
      if (outcomes[i].theta_hash != d.theta_hash) {
        d.kind = AttemptDecision::Kind::diverged;
        d.diverged_member = group[i];
        break;
      }
    }
    d.next_group.clear();
    return d;
  }
  // Members that are still there retry, those that stepped included (their all-reduce
  // succeeded, another's failed): each holds its Δ until its next round's inner steps, and
  // one that stepped goes back to the outer state from before its step (InnerWorker::reduce).
  d.kind = attempt >= kMaxReduceRetries || d.next_group.empty() ? AttemptDecision::Kind::give_up
                                                                : AttemptDecision::Kind::retry;
  if (d.kind == AttemptDecision::Kind::give_up) d.next_group.clear();
  if (d.kind == AttemptDecision::Kind::retry && d.lost.empty())
    d.backoff_ms = int64_t(1000) << std::min<uint64_t>(attempt, 2);
  return d;
}

OverlappedDecision after_overlapped_round(const std::vector<int>& members,
                                          const std::vector<MemberOutcome>& outcomes) {
  if (members.size() != outcomes.size())
    throw std::invalid_argument("after_overlapped_round: " + std::to_string(outcomes.size()) +
                                " outcomes for " + std::to_string(members.size()) + " members");
  OverlappedDecision d;
  bool failed_alive = false;  // a member whose round failed but which is still there
  std::vector<size_t> ok;
  for (size_t i = 0; i < members.size(); ++i) {
    if (outcomes[i].ok)
      ok.push_back(i);
    else if (outcomes[i].gone)
      d.lost.push_back(members[i]);
    else
      failed_alive = true;
  }
  // It may hold a θ of its own: only the checkpoint is known to every member.
  if (ok.empty() || failed_alive) return d;
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  auto group_of = [&](size_t i) { return outcomes[i].group.empty() ? sorted : outcomes[i].group; };
  // The members that returned must have ended with one group, which holds each of them: then
  // they reduced every fragment over the same members, and only lost members are missing.
  const std::vector<int> group = group_of(ok[0]);
  for (size_t i : ok) {
    if (group_of(i) != group) return d;
    if (!std::binary_search(group.begin(), group.end(), members[i])) return d;
  }
  for (int m : group)
    if (m < 0) return d;
  d.kind = d.lost.empty() ? OverlappedDecision::Kind::agreed : OverlappedDecision::Kind::smaller;
  d.theta_hash = outcomes[ok[0]].theta_hash;
  for (size_t i : ok) {
    d.finished.push_back(members[i]);
    if (outcomes[i].theta_hash != d.theta_hash) {
      d.kind = OverlappedDecision::Kind::diverged;
      d.diverged_member = members[i];
      break;
    }
  }
  return d;
}

bool must_rewind(int members_holding_state, int64_t round, int64_t resume_round) {
  return members_holding_state == 0 && round > resume_round;
}

std::vector<EvalPart> evaluation_split(int64_t windows, int64_t batch_size, int members) {
  if (windows < 0 || batch_size < 1 || members < 1)
    throw std::invalid_argument("evaluation_split: " + std::to_string(windows) +
                                " windows, batch " + std::to_string(batch_size) + ", " +
                                std::to_string(members) + " members");
  std::vector<EvalPart> out;
  const int64_t batches = (windows + batch_size - 1) / batch_size;
  const int64_t per = (batches + members - 1) / members;
  for (int i = 0; i < members; ++i) {
    const int64_t b = int64_t(i) * per * batch_size;
    const int64_t e = std::min(windows, (int64_t(i) + 1) * per * batch_size);
    if (b < e) out.push_back({i, b, e});
  }
  return out;
}

std::vector<EvalPart> evaluation_split(int64_t windows, int64_t batch_size,
                                       const std::vector<double>& speeds) {
  for (double v : speeds)
    if (!(v > 0) || !std::isfinite(v))
      throw std::invalid_argument("evaluation_split: a member's speed is " + std::to_string(v));
  if (windows < 0 || batch_size < 1 || speeds.empty())
    throw std::invalid_argument("evaluation_split: " + std::to_string(windows) +
                                " windows, batch " + std::to_string(batch_size) + ", " +
                                std::to_string(speeds.size()) + " members");
  const int64_t batches = (windows + batch_size - 1) / batch_size;
  std::vector<int64_t> count(speeds.size(), 0);
  for (int64_t b = 0; b < batches; ++b) {
    size_t best = 0;
    for (size_t i = 1; i < speeds.size(); ++i)
      if (double(count[i] + 1) / speeds[i] < double(count[best] + 1) / speeds[best]) best = i;
    ++count[best];
  }
  std::vector<EvalPart> out;
  int64_t at = 0;
  for (size_t i = 0; i < speeds.size(); ++i) {
    const int64_t e = std::min(windows, at + count[i] * batch_size);
    if (at < e) out.push_back({int(i), at, e});
    at = e;
  }
  return out;
}

bool evaluation_due(int64_t steps_since_eval, int64_t every, int64_t completed, int64_t rounds) {
  return steps_since_eval >= every || completed == rounds;
}

bool checkpoint_due(int64_t completed, int64_t every, int64_t rounds) {
  return every > 0 && completed % every == 0 && completed < rounds;
}

Pipeline pipeline_next(const PipelineInput& in) {
  if (in.round + 1 >= in.rounds) return Pipeline::last_round;
  if (in.members != in.target || in.members < std::max(1, in.min)) return Pipeline::membership;
  return Pipeline::ahead;
}

const char* to_string(Pipeline p) {
  switch (p) {
    case Pipeline::ahead:
      return "sent ahead";
    case Pipeline::last_round:
      return "the last round";
    case Pipeline::membership:
      return "the members may change";
  }
  return "?";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double inner_budget_seconds(double configured, int h, std::vector<double> recent_step_seconds) {
  if (configured > 0) return configured;
  if (recent_step_seconds.empty()) return 0;
  return double(h) * median(std::move(recent_step_seconds));
}

TokenRound token_round(double seconds, int64_t remaining, double tokens_per_second) {
  if (!(tokens_per_second > 0) || !(seconds > 0)) return {seconds, false};
  const double need = double(std::max<int64_t>(0, remaining)) / tokens_per_second;
  if (need > kLastRoundStretch * seconds) return {seconds, false};
  return {need, true};
}

std::vector<int64_t> token_caps(int64_t remaining, int64_t tokens_per_step,
                                const std::vector<double>& step_seconds) {
  std::vector<int64_t> caps(step_seconds.size(), 0);
  double speed = 0;  // steps a second, every member's together
  for (double s : step_seconds) {
    if (!(s > 0) || !std::isfinite(s)) return caps;
    speed += 1 / s;
  }
  if (tokens_per_step <= 0 || !(speed > 0)) return caps;
  const double steps = double(std::max<int64_t>(0, remaining)) / double(tokens_per_step);
  for (size_t i = 0; i < caps.size(); ++i)
    caps[i] = std::max<int64_t>(1, int64_t(std::ceil(steps * (1 / step_seconds[i]) / speed)));
  return caps;
}

bool tokens_reached(int64_t remaining, int64_t tokens_per_step, int members, bool planned_last,
                    int64_t round_tokens) {
  if (remaining < tokens_per_step * std::max(1, members)) return true;
  return planned_last && double(remaining) < kLastRoundShortfall * double(round_tokens);
}

int rounds_estimate(int64_t done_rounds, int64_t remaining, int64_t last_round_tokens, int cap) {
  int64_t more = 1;
  if (last_round_tokens > 0 && remaining > 0)
    more = std::max<int64_t>(1, (remaining + last_round_tokens - 1) / last_round_tokens);
  return int(std::clamp<int64_t>(done_rounds + more, done_rounds + 1,
                                 std::max<int64_t>(cap, done_rounds + 1)));
}

double grace_window(std::vector<double> recent_lateness, double k, double floor_s, double max_s,
                    double quorum_s, double first_fraction) {
  if (recent_lateness.empty())
    return std::clamp(first_fraction * quorum_s, std::min(floor_s, max_s), max_s);
  const double m = median(recent_lateness);
  std::vector<double> dev;
  for (double x : recent_lateness) dev.push_back(std::abs(x - m));
  const double mad = median(std::move(dev));
  return std::clamp(m + k * mad, std::min(floor_s, max_s), max_s);
}

bool inner_phase_closed(int reported, int members, int min, double grace_max_s, double now,
                        double quorum_at, double window) {
  if (reported >= members) return true;
  if (grace_max_s <= 0 || reported < std::max(1, min)) return false;
  return now >= quorum_at + window;
}

double member_scale(const std::vector<int64_t>& tokens, int rank,
                    std::span<const uint8_t> left_out) {
  if (rank < 0 || size_t(rank) >= tokens.size())
    throw std::invalid_argument("member_scale: rank " + std::to_string(rank) + " of " +
                                std::to_string(tokens.size()) + " members");
  if (!left_out.empty() && left_out.size() != tokens.size())
    throw std::invalid_argument("member_scale: " + std::to_string(left_out.size()) +
                                " flags for " + std::to_string(tokens.size()) + " members");
  const auto out = [&](size_t i) { return !left_out.empty() && left_out[i] != 0; };
  int64_t total = 0;
  size_t counted = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] <= 0) throw std::invalid_argument("member_scale: a member processed no tokens");
    if (out(i)) continue;
    total += tokens[i];
    ++counted;
  }
  if (out(size_t(rank))) return 0.0;
  return double(counted) * double(tokens[size_t(rank)]) / double(total);
}

}  // namespace loco::actors
