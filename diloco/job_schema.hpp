// The names of what a DiLoCo job reports and records, in one place: written by actors/ (the
// aggregator's reports and records, outer_aggregator.cpp; metrics.jsonl, job_records.cpp) and
// diloco/ (metrics.jsonl, metrics.cpp), read by client/ (the dashboard's views and so /api and
// /metrics, `loco plot`, `loco jobs --json`, `loco submit`'s RoundReport). A key written in one
// place and read in another as two string literals can drift apart with nothing to notice it;
// these constants cannot.
//
// Header only, with no includes: client/ (no LibTorch, no link to diloco/) includes it.
#pragma once

namespace loco::diloco::schema {

// Kinds of a job's typed records in its event log (Runtime::job_record), besides the runtime's
// own "report" (a JobProgress) and "log" (a line).
namespace record {
// A round's per-step figures: msgpack of std::vector<JobProgress>, step = the job's inner step,
// metrics keyed by schema::step. At most 500 a round.
inline constexpr char kSteps[] = "steps";
// A checkpoint the job wrote: msgpack of [path, round].
inline constexpr char kCheckpoint[] = "checkpoint";
}  // namespace record

// A round's report: JobProgress::metrics of the aggregator's "report" events (step = the round,
// total = the rounds to run). The dashboard's /api/jobs/ID gives each as a field of the round's
// "rounds_done" row, and /metrics the newest as loco_job_*.
namespace report {
inline constexpr char kInnerStep[] = "inner_step";     // inner steps per worker so far
inline constexpr char kLoss[] = "loss";                // mean training loss of the round's steps
inline constexpr char kValLoss[] = "val_loss";         // only when evaluated this round
inline constexpr char kValPpl[] = "val_ppl";           // exp(val_loss), with it
inline constexpr char kTokensPerS[] = "tokens_per_s";  // all workers together
// All-reduce bytes sent per worker, cumulative: over θ's history, and over every attempt
// (failed ones and undone rounds included).
inline constexpr char kBytesPerWorker[] = "bytes_per_worker";
inline constexpr char kJobBytesPerWorker[] = "job_bytes_per_worker";
inline constexpr char kFailedAttempts[] = "failed_attempts";  // of this round
inline constexpr char kRedo[] = "redo";                       // times the job went back
inline constexpr char kUtilization[] = "utilization";         // inner-step time / wall time, 0..1
inline constexpr char kWorkers[] = "workers";                 // the round's members
inline constexpr char kLate[] = "late";  // members that missed the deadline; absent when none
inline constexpr char kRoundTokens[] = "round_tokens";  // the round's members' tokens
inline constexpr char kRoundTime[] = "round_time";      // seconds of the round
inline constexpr char kJobTime[] = "job_time";          // seconds since the job was submitted
inline constexpr char kAllreduceSecondsTotal[] = "allreduce_seconds_total";
}  // namespace report

// One inner step's figures over the round's members: the metrics of a "steps" record and the
// objects of metrics.jsonl's "steps".
namespace step {
inline constexpr char kLoss[] = "loss";                // mean
inline constexpr char kLr[] = "lr";                    // mean
inline constexpr char kGradNorm[] = "grad_norm";       // mean
inline constexpr char kTokens[] = "tokens";            // sum (metrics.jsonl only)
inline constexpr char kTokensPerS[] = "tokens_per_s";  // all members
inline constexpr char kTflops[] = "tflops";            // model TFLOP/s, all members
inline constexpr char kMfu[] = "mfu";                  // mean model FLOPs utilization, 0..1
inline constexpr char kMemoryGb[] = "memory_gb";       // the most device memory, GB
inline constexpr char kCpuS[] = "cpu_s";               // mean CPU seconds (metrics.jsonl only)
}  // namespace step

// The fields of a metrics.jsonl line that are read back (`loco plot --metrics`); the rest are
// described in diloco/metrics.hpp and actors/job_records.hpp.
namespace metrics_line {
inline constexpr char kRound[] = "round";
inline constexpr char kInnerSteps[] = "inner_steps";
inline constexpr char kTokensTotal[] = "tokens_total";
inline constexpr char kTrainLoss[] = "train_loss";
inline constexpr char kValLoss[] = "val_loss";
inline constexpr char kSteps[] = "steps";  // of schema::step, the round's, in order
}  // namespace metrics_line

}  // namespace loco::diloco::schema
