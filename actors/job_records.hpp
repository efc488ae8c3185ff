#pragma once
// What a DiLoCo job writes about its rounds into its folder (next to its
// checkpoints): two files of JSON lines, for people and plotting scripts.
//
// metrics.jsonl: θ's history, one line per round 0..r, each round number once: a
//   diloco::schema::JobMetricsLine (diloco/job/job_schema.hpp lists its fields).
//   The simulator's fields (schema::MetricsLine), where "bytes" and "time" add up
//   "round_bytes" and "round_time" over rounds 1..r, then:
//     "utilization", "workers"  inner-step time over the pass's wall time; the
//                       round's members at its end
//     "round_bytes"     bytes sent per member by the round's successful all-reduce
//     "round_time"      seconds of the pass that completed the round (joins,
//                       inner steps, the all-reduce, evaluation), without the
//                       failed all-reduce attempts of that pass
//     "failed_attempts" all-reduce attempts of the round that failed (since the
//                       job last went back, see "redo")
//     "redo"            times the job had gone back to a checkpoint or to its
//                       start (every worker lost, or the aggregator restarted)
//                       before it did the round; 0 for a job that never did.
//                       Going back removes the lines of the rounds it undoes,
//                       so that every round number stays once: a redone round's
//                       line comes again, with a higher "redo" than any line
//                       before (the removed lines' "cluster" entries go into the
//                       next line written: what the cluster went through stays).
//                       The undone rounds' cost stays in attempts.jsonl and in
//                       job_*.
//     "job_bytes"       bytes sent per member over every all-reduce attempt of
//                       the job so far: failed ones (as far as known, see
//                       below) and undone rounds included
//     "job_time"        seconds since the job was submitted
//     "members", "late" each member's steps, tokens, seconds and "cpu_seconds" (its
//                       process's CPU time in those steps); who missed the deadline
//     "steps"           one object per inner step of the round over its members:
//                       {"loss","lr","grad_norm","cpu_s" (means), "tokens" (sum),
//                       "tokens_per_s"}
// Every line is written and read with nlohmann-json.
//
// attempts.jsonl: one line per all-reduce attempt, successful or failed, in
//   order, never removed:
//     {"round":R,"redo":n,"attempt":a,"workers":k,"members":[slots in rank order],
//      "outcome":"ok"|"failed","seconds":s,"bytes":[per member, null: not known],
//      "bytes_per_worker":b|null,"errors":[{"worker":i,"lost":true|false,"error":"..."}]}
//   R is the round the attempt was to complete (the log's "all-reduce of round R");
//   a counts the attempts of round R since the job last went back, from 1;
//   "seconds" is the aggregator's wall time from asking the members to the last answer.
//   A member whose reduce failed does not report what it sent: its bytes are null,
//   and "bytes_per_worker" (the known bytes over the k members) is then a lower
//   bound, null when no member's bytes are known.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "diloco/job/metrics.hpp"

namespace loco::actors {

struct AttemptRecord {
  struct Error {
    int worker = 0;
    bool lost = false;  // its actor is gone; else it answered with the error
    std::string message;
  };
  int64_t round = 0;                           // the round it was to complete, from 1
  std::vector<int> members;                    // slots, in rank order
  std::vector<std::optional<uint64_t>> bytes;  // sent by each member, when known
  double seconds = 0;
  std::vector<Error> errors;  // none: the attempt succeeded
};

// The aggregator's figures of a completed round.
// One member's part in a round (metrics.jsonl "members"): its inner steps, the tokens they
// processed and the seconds they took.
struct MemberFigures {
  int worker = 0;
  int steps = 0;
  int64_t tokens = 0;
  double seconds = 0;      // in inner steps; the rest of the round ("wait" in metrics.jsonl) it
                           // waited on the others, the network and the aggregator
  double cpu_seconds = 0;  // CPU time its process used in those steps (StepFigures::cpu_seconds)
  double step_cpu_seconds = 0;  // of which its stepping thread (StepFigures::step_cpu_seconds)
};
// A member's figures from its steps' (the CPU seconds summed).
MemberFigures member_figures(int worker, int steps, int64_t tokens, double seconds,
                             const std::vector<StepFigures>& per_step);

struct RoundFigures {
  double utilization = 0;
  int workers = 0;
  double round_time = 0;
  double job_time = 0;
  std::vector<MemberFigures> members;  // those that finished their inner steps in time
  std::vector<int> late;               // members that missed the round's deadline
  // Step i of the round over its members: loss, grad_norm, lr and mfu their mean, tokens and
  // flops the sum, seconds the slowest, memory the largest (metrics.jsonl "steps", see
  // per_step_means()).
  std::vector<StepFigures> steps;
  double guard_time = -1;  // seconds in the guard's summary exchanges (a member's); < 0: none
};

class JobRecords {
 public:
  // The records in `folder` of a job that starts, or restarts after round `from`
  // (-1: before round 0, whose θ is evaluated again). Records already there
  // mean that the aggregator was restarted: the job goes back to `from` (the
  // lines of later rounds go, "redo" counts one more) and job_bytes carries on.
  JobRecords(std::string folder, int64_t from);

  // The job goes back to round `round` (a checkpoint's, or 0): the lines of the
  // rounds after it go, and the rounds done from now on count one more redo.
  void go_back(int64_t round);
  // Appends an attempt of the round in progress. Returns its line.
  std::string attempt(const AttemptRecord& a);
  // Appends the line of a completed round. m.bytes_per_worker and m.seconds are
  // set here (the history's sums). Returns the line.
  std::string round(diloco::RoundMetrics m, const RoundFigures& f);

  int64_t redo() const { return redo_; }
  uint64_t bytes_per_worker() const { return bytes_; }  // over θ's history
  uint64_t job_bytes_per_worker() const { return job_bytes_; }
  int failed_attempts() const { return failed_; }  // of the round in progress
  const std::string& metrics_path() const { return metrics_path_; }
  const std::string& attempts_path() const { return attempts_path_; }

 private:
  void drop_after(int64_t round);
  std::string metrics_path_, attempts_path_;
  int64_t redo_ = 0;
  uint64_t bytes_ = 0;  // sums of the kept lines' round_bytes and round_time
  double seconds_ = 0;
  uint64_t job_bytes_ = 0;
  int attempts_ = 0, failed_ = 0;  // of the round in progress
  uint64_t ok_bytes_ = 0;          // bytes_per_worker of its successful attempt
  // The "cluster" entries of the lines a go_back removed, oldest first: what happened to the
  // cluster is not undone with the rounds, and goes into the next line written.
  std::vector<diloco::schema::ClusterLine> carried_cluster_;
};

// Step i of a round over the members that did a step i (with inner.budget: time they may do
// different numbers of steps): loss, lr and grad_norm their mean, tokens their sum, seconds
// the slowest's.
std::vector<StepFigures> per_step_means(const std::vector<std::vector<StepFigures>>& members);

// A step's figures as metrics.jsonl's "steps" and the job's "steps" records have them: the
// rates over the step's seconds; mfu, memory and CPU seconds only where measured (not 0).
diloco::schema::Step step_report(const StepFigures& s);

// A field of a line written here, parsed as JSON and written back: a number as JSON writes it,
// a string with its quotes, "null"; "" when the line has no such field or is not JSON.
std::string json_field(const std::string& line, const std::string& key);

// The non-empty lines of a JSON-lines file (metrics.jsonl, attempts.jsonl); none when it is
// missing.
std::vector<std::string> read_json_lines(const std::string& path);

}  // namespace loco::actors
