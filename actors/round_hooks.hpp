#pragma once
// Points in an InnerWorker's round where test code may act: the fault-injection library
// (tests/actors/fault_injection.cpp, loaded only by the tests that ask for it) installs hooks
// that kill, stall, slow or fail a worker at a known moment. Production code installs none
// and compiles no fault in: the worker calls its hooks at these points, which costs one atomic
// load when none is installed.
#include <atomic>
#include <cstdint>
#include <span>

namespace loco::collective::detail {
struct Hooks;
}

namespace loco::actors {

enum class RoundPoint {
  // inner(), inner_timed(): before the round's first inner step.
  before_inner_steps,
  // After each inner step of a rank, before its next one (inner(), inner_timed(), stream()):
  // `step` is that step's number in the round, from 1. Time spent here counts as inner time
  // (a delay stands for slower hardware).
  after_inner_step,
  // stream(): after a run of inner steps, before the synchronizations due at the step
  // `step` (counted from the round's start) are sent and landed.
  stream_events,
  // reduce(): before the all-reduce; `collective` is the lead rank's communicator's hooks.
  before_allreduce,
  // reduce(): the all-reduce returned, before the outer step. A throw fails the call.
  after_allreduce,
  // stream(): the round's events done (its last synchronizations sent, its landings applied),
  // before the call returns its result (fragments may still be in flight).
  stream_end,
  // Δ is written, before it is summarized and averaged: `delta` is it (blocking: all of the
  // worker's, once per round; streaming and eager: fragment `step`'s, a copy), which a hook may
  // change (a test's broken or hostile worker).
  pseudo_gradient,
};

struct RoundContext {
  int worker = 0;           // the worker's index
  int64_t round = 0;        // counted from 0
  int64_t step = 0;         // see RoundPoint
  int steps_per_round = 0;  // H (inner.steps)
  const char* method = "";  // the InnerWorker method: "inner", "inner_timed", "stream", "reduce"
  // Set once the worker's node asks it to stop (InnerWorker::stop).
  const std::atomic<bool>* stopping = nullptr;
  collective::detail::Hooks* collective = nullptr;  // before_allreduce only
  std::span<float> delta;                           // pseudo_gradient only
  // after_inner_step: the step's loss as the worker reports it. A hook may make it non-finite
  // (a test's diverging worker: the worker then stops its round, as after a step the trainer
  // refused to take).
  double* step_loss = nullptr;
};

// Called from the worker's threads (several at once with several local ranks).
class RoundHooks {
 public:
  virtual ~RoundHooks() = default;
  virtual void at(RoundPoint point, const RoundContext& context) = 0;
};

// Installs `hooks` for every InnerWorker of this process (nullptr: none). They must outlive the
// workers: a test library installs a static object from its static initialiser.
void install_round_hooks(RoundHooks* hooks);

// The installed hooks, or nullptr (production: always).
RoundHooks* round_hooks();

}  // namespace loco::actors
