// The fragment schedule of sync.mode streaming and eager: at which inner step count each
// fragment of a round synchronizes, when its average lands, and at which boundary a worker may
// join mid-round. No LibTorch: the aggregator (actors/, loco_job_records) decides with it too.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace loco::diloco {

struct JobConfig;

// Round r covers the inner step counts (start, start + H], start = r·H. Fragment f synchronizes
// after inner step start + (f + 1)·stride, stride = H / P (P fragments; eager: P = 1, at the
// round's end), and its average lands overlap_steps (τ) inner steps later, perhaps in the next
// round.
class FragmentSchedule {
 public:
  FragmentSchedule(int steps, int fragments, int overlap_steps);
  explicit FragmentSchedule(const JobConfig& cfg);  // inner.steps, sync.fragments, overlap_steps

  int steps() const { return steps_; }
  int fragments() const { return fragments_; }
  int overlap_steps() const { return overlap_; }
  std::int64_t stride() const { return steps_ / fragments_; }
  std::int64_t start(std::int64_t round) const { return round * steps_; }
  std::int64_t end(std::int64_t round) const { return start(round) + steps_; }
  // The inner step count after which fragment f of `round` synchronizes, and its average lands.
  std::int64_t sync_step(std::int64_t round, int f) const { return start(round) + (f + 1) * stride(); }
  std::int64_t lands(std::int64_t synced) const { return synced + overlap_; }

  // The fragments of `round` that synchronize at step count `now`, in order.
  std::vector<int> syncing_at(std::int64_t round, std::int64_t now) const;
  // The next event after step count `now` of `round`: a synchronization, the earliest landing
  // of the fragments in flight (`earliest_landing`), or the round's end, whichever is first.
  std::int64_t next_event(std::int64_t round, std::int64_t now,
                          std::optional<std::int64_t> earliest_landing) const;
  // The fragment whose synchronization is at step count `step` strictly inside `round` (a
  // boundary where a worker may join mid-round: the round's end is not one); none otherwise.
  std::optional<int> fragment_inside(std::int64_t round, std::int64_t step) const;
  // A worker joining `round` mid-round: the boundary (a step count) from whose synchronization
  // on it takes part, given the step counts the members' loops have reached (-1: not known). The
  // first boundary past the member furthest on (a member between two boundaries may get there
  // before the admission's two phases reach it: it then says no, and the aggregator asks again
  // for the next one), and before the round's end. None when there is no such boundary, when a
  // member's progress is not known, with one fragment, or when τ ≥ H/P: a fragment synchronized
  // before the boundary would land after it, and the joiner, not in that operation, would miss
  // its average.
  std::optional<std::int64_t> join_step(std::int64_t round,
                                        const std::vector<std::int64_t>& progress) const;

 private:
  int steps_, fragments_, overlap_;
};

}  // namespace loco::diloco
