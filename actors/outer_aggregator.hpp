#pragma once
// OuterAggregator: the entry actor of a DiLoCo job. It owns the outer loop:
// the round number, the job's workers and their shards, when to evaluate and
// checkpoint, and the job's metrics. It runs the loop on its own thread; its
// actor methods only answer questions about it.
#include <memory>
#include <string>

namespace loco::actors {

class OuterAggregator {
 public:
  // Validates the job file (a bad field fails the submission with its name)
  // and starts the job's loop.
  OuterAggregator(std::string job_id, std::string spec);
  ~OuterAggregator();

  int64_t round() const;
  std::string folder() const;

 private:
  struct State;
  std::shared_ptr<State> s_;
};

}  // namespace loco::actors
