#include "diloco/round/fragment_schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "diloco/job/config.hpp"

namespace loco::diloco {

FragmentSchedule::FragmentSchedule(int steps, int fragments, int overlap_steps)
    : steps_(steps), fragments_(fragments), overlap_(overlap_steps) {
  if (steps_ < 1 || fragments_ < 1 || fragments_ > steps_ || overlap_ < 0)
    throw std::invalid_argument("FragmentSchedule: " + std::to_string(fragments_) +
                                " fragment(s) of " + std::to_string(steps_) +
                                " inner steps, overlap " + std::to_string(overlap_));
}

FragmentSchedule::FragmentSchedule(const JobConfig& cfg)
    : FragmentSchedule(cfg.inner.steps, std::max(1, cfg.sync.fragments), cfg.sync.overlap_steps) {}

std::vector<int> FragmentSchedule::syncing_at(std::int64_t round, std::int64_t now) const {
  std::vector<int> out;
  for (int f = 0; f < fragments_; ++f)
    if (sync_step(round, f) == now) out.push_back(f);
  return out;
}

std::int64_t FragmentSchedule::next_event(std::int64_t round, std::int64_t now,
                                          std::optional<std::int64_t> earliest_landing) const {
  std::int64_t next = end(round);
  for (int f = 0; f < fragments_; ++f)
    if (sync_step(round, f) > now) next = std::min(next, sync_step(round, f));
  if (earliest_landing) next = std::min(next, *earliest_landing);
  return next;
}

std::optional<int> FragmentSchedule::fragment_inside(std::int64_t round, std::int64_t step) const {
  const std::int64_t s = start(round);
  if (step <= s || step >= end(round) || (step - s) % stride() != 0) return std::nullopt;
  const std::int64_t f = (step - s) / stride() - 1;
  if (f >= fragments_) return std::nullopt;
  return static_cast<int>(f);
}

std::optional<std::int64_t> FragmentSchedule::join_step(
    std::int64_t round, const std::vector<std::int64_t>& progress) const {
  if (fragments_ < 2 || progress.empty() || overlap_ >= stride()) return std::nullopt;
  std::int64_t furthest = start(round);
  for (std::int64_t p : progress) {
    if (p < 0) return std::nullopt;
    furthest = std::max(furthest, p);
  }
  for (std::int64_t b = start(round) + stride(); b < end(round); b += stride())
    if (b > furthest) return b;
  return std::nullopt;
}

}  // namespace loco::diloco
