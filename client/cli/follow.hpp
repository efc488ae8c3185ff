#pragma once
// Printing a job as it runs: `loco submit`, `loco logs -f`, `loco up job.yaml`.
#include <optional>

#include "client/client.hpp"

namespace loco::cli {

// Follows a job: log lines as they come, reports (when `progress`) as a live
// progress line on a terminal (one line per round otherwise). Returns the
// final record, or nullopt when interrupted (stop_requested()).
std::optional<JobInfo> follow(JobHandle& job, bool progress);

}  // namespace loco::cli
