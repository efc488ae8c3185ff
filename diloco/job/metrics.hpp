// One line of metrics.jsonl, as the simulator (`loco train`) and a distributed job's aggregator
// write it: schema::MetricsLine, whose fields and keys diloco/job/job_schema.hpp lists (a job's line
// adds its own: schema::JobMetricsLine). No LibTorch here.
#pragma once

#include "diloco/job/job_schema.hpp"

namespace loco::diloco {

// One round. Tokens, bytes and seconds are cumulative over the rounds so far.
using RoundMetrics = schema::MetricsLine;

}  // namespace loco::diloco
