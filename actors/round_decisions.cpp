#include "actors/round_decisions.hpp"

#include <stdexcept>

namespace loco::actors {

AfterInner after_inner(int finished, int min) {
  return finished == 0 || finished < min ? AfterInner::redo : AfterInner::reduce;
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
  return d;
}

}  // namespace loco::actors
