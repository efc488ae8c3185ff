// The round engine, written once: the simulator (K replicas in one process) and InnerWorker
// (one replica, its averages over the network) drive the same StreamingRound, so a distributed
// job holds the simulator's θ by construction, not by keeping two copies in step.
//
// sync.mode blocking is the engine with one fragment (all of θ) that synchronizes at the
// round's end and lands at once: every replica's Δ averaged, the outer step, and the replica
// goes on from θ. A worker runs it in the two halves its round has, the aggregator between
// them (InnerWorker::inner, then reduce: step_half, then land_half, again on a retry); the
// simulator runs the two at once (run()).
//
// sync.mode streaming (Streaming DiLoCo, Douillard et al. 2025): from event to event (a
// fragment's synchronization, a landing, the round's end: FragmentSchedule), inner steps in
// between. A synchronization writes each replica's Δ of the fragment's ranges and starts their
// average (FragmentAverager::start); a landing waits for it (the only time the inner steps wait
// on the network), applies the outer step to the fragment's ranges and mixes them into the
// local parameters (sync.mix). sync.mode eager is the same machinery with one fragment at the
// round's end, each replica going on from its provisional θ (its own Δ stepped) and corrected
// when the average lands. The fragments still in flight at the job's last round land before it
// ends; otherwise they cross into the next round, and so into checkpoints and join states,
// under the keys this file writes and reads.
#pragma once

#include <cstdint>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <torch/torch.h>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/model/model.hpp"
#include "diloco/round/averager.hpp"
#include "diloco/round/fragment_schedule.hpp"

namespace loco::diloco {

class InnerTrainer;
class OuterOptimizer;

// One model replica the round steps: its inner trainer and its copy of the outer state.
struct Replica {
  InnerTrainer* trainer = nullptr;
  OuterOptimizer* outer = nullptr;
};

// A checkpoint's copy of a fragment in flight, made once its average is known (the means and
// eager's provisional θ, one per replica).
struct InFlightCopy {
  int fragment = 0;
  std::int64_t synced = 0, lands = 0;
  std::vector<torch::Tensor> mean, provisional;
};

// A checkpoint of a round's end waits for the averages of the fragments in flight then: each
// one hands its copy in as it lands in the next round (the thread that writes the file waits
// for them all). A fragment dropped before it lands abandons the checkpoint.
class PendingLandings {
 public:
  explicit PendingLandings(std::size_t n) : copies_(n) {}
  void hand_in(std::size_t i, InFlightCopy c);
  void abandon(std::string why);
  // Every copy, once all are handed in; throws when one was abandoned or `limit` passed.
  std::vector<InFlightCopy> wait(std::chrono::seconds limit);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<InFlightCopy>> copies_;
  std::string abandoned_;  // why, once one will never be handed in
};

// A fragment whose average is on its way.
struct InFlightFragment {
  int fragment = 0;
  std::int64_t synced = 0;  // the inner step count after which it synchronized
  std::int64_t lands = 0;   // the inner step count after which it lands
  std::uint64_t op = 0;     // its average's operation (Round::op_base + fragment; 0: read back)
  std::vector<std::vector<float>> delta;    // per replica: its Δ, range after range
  std::vector<std::vector<float>> mean;     // per replica: the average, once `done` is ready
  std::vector<torch::Tensor> provisional;   // eager, per replica: the θ it went on from
  std::shared_future<std::uint64_t> done;   // bytes each member sent; get() rethrows a failure
  std::shared_ptr<PendingLandings> checkpoint;  // waiting for its copy (see await_landings)
  std::size_t checkpoint_index = 0;

  InFlightFragment() = default;
  InFlightFragment(const InFlightFragment&) = delete;
  InFlightFragment& operator=(const InFlightFragment&) = delete;
  ~InFlightFragment();
  InFlightCopy copy() const;
};

class StreamingRound {
 public:
  // What the caller does between events. steps(now, n): n inner steps of every replica from
  // step count `now` (with the caller's figures and hooks). at_event(now): before the events at
  // `now` (InnerWorker: admissions of a joiner). landed(f, now): a fragment landed, its outer
  // step applied, before the parameters are mixed (InnerWorker keeps the mean for a joiner: it
  // may move f.mean[0] out).
  class Driver {
   public:
    virtual ~Driver() = default;
    virtual void steps(std::int64_t now, int n) = 0;
    virtual void before_steps(std::int64_t /*now*/) {}
    virtual void at_event(std::int64_t /*now*/) {}
    virtual void landed(InFlightFragment& /*f*/, std::int64_t /*now*/) {}
  };
  struct Round {
    std::int64_t round = 0;
    bool last = false;             // the job's last round: every fragment lands before it ends
    std::int64_t from_step = -1;   // a worker joining mid-round: the boundary it enters at
    std::uint64_t op_base = 0;     // fragment f's average is operation op_base + f
  };
  struct Result {
    double wait_seconds = 0;       // waiting for averages at landings
    std::uint64_t bytes_sent = 0;  // by each member, for the fragments landed in the round
  };

  // `replicas` stay owned by the caller; `fragments[f]` are fragment f's ranges of the flat
  // vector (parameter_fragments).
  StreamingRound(const JobConfig& cfg, std::vector<std::vector<Range>> fragments,
                 std::vector<Replica> replicas);
  ~StreamingRound();

  Result run(const Round& r, FragmentAverager& averager, Driver& driver);
  // sync.mode blocking in two halves. step_half: the round's inner steps (one steps() call of
  // H), then each replica's Δ of all of θ, kept. land_half: the average of that Δ and the outer
  // step, the replicas going on from θ. Called again for the same round (an attempt that
  // succeeded here failed for another member, and the group tries again), the same Δ is
  // averaged again and the step before is undone first: every member of the retry steps from
  // the same outer state. The averager runs before anything is stepped: when it throws, θ is
  // as it was.
  void step_half(const Round& r, Driver& driver);
  Result land_half(const Round& r, FragmentAverager& averager, Driver& driver);
  // step_half's Δ of replica k (a test's hook changes it: a hostile worker's Δ).
  std::span<float> kept_delta(std::size_t k);
  // The outer step of a fragment's average that landed elsewhere (a joiner catching up with
  // what its donor landed since its snapshot): θ and momentum only, the parameters untouched.
  void land_outer(int fragment, std::span<const float> mean);

  const FragmentSchedule& schedule() const { return schedule_; }
  const std::vector<Range>& ranges(int fragment) const;
  std::int64_t fragment_size(int fragment) const;
  std::size_t in_flight() const { return in_flight_.size(); }
  // Waits for every average in flight (each ends, by success or failure) and forgets them:
  // before the state they work on is replaced or destroyed.
  void drain();

  // Checkpoints and join states: the fragments in flight with their averages, under
  // "in_flight.I.{fragment,lands,synced}", ".K" (replica K's mean), ".provisional.K" (eager).
  // write_in_flight waits for their averages (throws naming a failed one); read_in_flight
  // replaces what is in flight, checking each fragment's number and size.
  void write_in_flight(torch::serialize::OutputArchive& ar) const;
  void read_in_flight(torch::serialize::InputArchive& ar);
  // A checkpoint written later, once the fragments in flight now have landed.
  std::shared_ptr<PendingLandings> await_landings();
  static void write_copies(torch::serialize::OutputArchive& ar,
                           const std::vector<InFlightCopy>& copies);
  // Eager: each replica's own provisional θ of the averages in flight (an inner state file: a
  // worker resumed from a checkpoint corrects with its own, not the writer's).
  void write_provisionals(torch::serialize::OutputArchive& ar) const;
  void read_provisionals(torch::serialize::InputArchive& ar);

 private:
  void synchronize(int fragment, const Round& r, std::int64_t now, FragmentAverager& averager);
  // Each replica's Δ of the fragment's ranges at step count `now` (eager: its provisional θ
  // loaded), its average not started.
  std::unique_ptr<InFlightFragment> write_delta(int fragment, std::int64_t now);
  void start_average(InFlightFragment& f, const Round& r, FragmentAverager& averager);
  void land(InFlightFragment& f, std::int64_t now, Result& out, Driver& driver);
  bool eager() const { return mode_ == SyncMode::eager; }

  FragmentSchedule schedule_;
  SyncMode mode_;
  double mix_;
  std::vector<std::vector<Range>> fragments_;
  std::vector<Replica> replicas_;
  std::deque<std::unique_ptr<InFlightFragment>> in_flight_;
  // sync.mode blocking: step_half's Δ of round kept_round_, and the round whose step θ holds.
  std::unique_ptr<InFlightFragment> kept_;
  std::int64_t kept_round_ = -1, stepped_round_ = -1;
};

}  // namespace loco::diloco
