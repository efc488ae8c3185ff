// One line of metrics.jsonl, as the simulator (`loco train`) and a distributed
// job's aggregator write it. No LibTorch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loco::diloco {

// One round. Tokens, bytes and seconds are cumulative over the rounds so far.
struct RoundMetrics {
  int round = 0;                 // rounds done (baselines: H-step segments done)
  std::int64_t inner_steps = 0;  // per worker
  std::int64_t tokens_per_worker = 0;
  std::int64_t tokens_total = 0;       // over all workers
  double train_loss = 0;               // mean over the round's steps and workers
  std::optional<double> val_loss;      // when evaluated this round
  std::uint64_t bytes_per_worker = 0;  // sent by each worker, all-reduce model of averager.hpp
  double seconds = 0;  // wall time since start (this process; a job: see actors/job_records.hpp)
  std::uint64_t theta_hash = 0;
  // {"round":..,"inner_steps":..,"tokens":..,"tokens_total":..,"train_loss":..,
  //  "val_loss":..|null,"bytes":..,"time":..,"theta_hash":"<hex>"}
  std::string to_json() const;
};

}  // namespace loco::diloco
