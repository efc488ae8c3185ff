#pragma once
// What the dashboard shows, as pure functions of what the cluster reports: the JSON of its API
// and the Prometheus text of /metrics. No sockets here, so tests build the inputs by hand.
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "diloco/job/job_schema.hpp"
#include "runtime/core/cluster_types.hpp"
#include "runtime/core/job_event_id.hpp"

namespace loco::dashboard {

// One round of a job as its entry actor reported it, and when the report was logged.
struct RoundPoint {
  JobProgress progress;
  diloco::schema::Report report;  // progress.metrics, read (a figure it lacks: the default)
  int64_t unix_ms = 0;            // from the event's id in the job's log (0: not known)
};

// A job's timeline: what changed, derived from its reports (members joined or lost, all-reduce
// retries, going back to a checkpoint, stragglers) and its typed records (checkpoints).
struct TimelineEntry {
  int64_t unix_ms = 0;
  int64_t round = 0;
  std::string kind;  // "join", "loss", "retry", "redo", "late", "left_out", or a record's kind
  std::string text;
};

// Everything the dashboard has read of one job's event log, folded as it arrives.
class JobHistory {
 public:
  static constexpr size_t kMaxLines = 2000;     // log lines kept (the newest)
  static constexpr size_t kMaxTimeline = 5000;  // timeline entries kept (the newest)
  static constexpr size_t kMaxSteps = 20000;    // per-step figures kept (the newest)
  static constexpr size_t kMaxRounds = 10000;   // rounds kept (the newest)

  // Folds in one event of the job's log. A report of a round already held (the job went back
  // to a checkpoint and redid it) replaces that round and drops the rounds after it.
  void add(const JobEvent& e);
  const std::map<int64_t, RoundPoint>& rounds() const { return rounds_; }
  const std::deque<TimelineEntry>& timeline() const { return timeline_; }
  const std::deque<std::pair<int64_t, std::string>>& lines() const { return lines_; }
  // The workers' per-step figures (schema::record::kSteps records): the job's inner step ->
  // its figures.
  const std::map<int64_t, diloco::schema::Step>& steps() const { return steps_; }
  // The newest report, if any.
  const RoundPoint* last() const { return rounds_.empty() ? nullptr : &rounds_.rbegin()->second; }
  // Bumped whenever rounds or steps held are replaced (the job went back and redid them): an
  // answer since an older revision is the whole history again.
  uint64_t revision() const { return revision_; }
  // Log lines and timeline entries ever folded in: the held ones are the newest of them, so
  // the first held has number lines_added() - lines().size().
  uint64_t lines_added() const { return lines_added_; }
  uint64_t timeline_added() const { return timeline_added_; }
  std::string cursor;  // the id of the last event folded in

 private:
  void add_report(const JobProgress& p, int64_t at);
  void note(TimelineEntry e);
  std::map<int64_t, RoundPoint> rounds_;
  std::map<int64_t, diloco::schema::Step> steps_;
  std::deque<TimelineEntry> timeline_;
  std::deque<std::pair<int64_t, std::string>> lines_;
  // Join and left records (schema::record::kJoin, kLeft) since the last report: they name who
  // joined or left, so the report does not note its rise or fall in workers again.
  bool joins_recorded_ = false, lefts_recorded_ = false;
  uint64_t revision_ = 0, lines_added_ = 0, timeline_added_ = 0;
};

// What a poller already holds of a job (the "cursor" of job_json's last answer, which it sends
// back as `?since=`): the history's revision, the last round and inner step, and how many log
// lines and timeline entries it has seen. Text "REVISION:ROUND:STEP:LINES:TIMELINE".
struct Since {
  uint64_t revision = 0;
  int64_t round = -1, step = -1;
  uint64_t lines = 0, timeline = 0;
  std::string text() const;
  // nullopt for text that is not five numbers so (at most 100 bytes).
  static std::optional<Since> parse(std::string_view text);
};

// Fields of job_json's "rounds_done" rows that the views derive, beside the report's own
// (diloco/job/job_schema.hpp's schema::Report): the round's all-reduce bytes per worker, and the
// tokens along θ's history (the charts' x axis).
inline constexpr char kRoundBytes[] = "round_bytes";
inline constexpr char kTokens[] = "tokens";

// The keys of the fields the API's rows carry, for the page's script: {"report": [schema::Report's
// keys], "step": [schema::Step's], "derived": [kRoundBytes, kTokens]}.
nlohmann::json field_keys();

// event_unix_ms (runtime/core/job_event_id.hpp): the time in an event's id.
using loco::event_unix_ms;

nlohmann::json cluster_json(const ClusterStatus& st);
nlohmann::json job_info_json(const JobInfo& j, const JobHistory* h);
nlohmann::json jobs_json(const std::vector<JobInfo>& jobs,
                         const std::map<std::string, JobHistory>& histories);
// One job: its record, every round's figures (bytes per round from the cumulative counts), the
// timeline and the newest log lines, and a "cursor" for the next poll. With `since` (of the same
// revision), only what came after it ("full": false): a poller that sends its cursor back costs
// the dashboard what is new, not the job's whole history on every poll (which made the soak's
// head grow with its job: decision 0054).
nlohmann::json job_json(const JobInfo& j, const JobHistory& h,
                        const std::optional<Since>& since = std::nullopt);

// /metrics in Prometheus' text exposition format (version 0.0.4).
std::string prometheus_text(const ClusterStatus& st, const std::vector<JobInfo>& jobs,
                            const std::map<std::string, JobHistory>& histories);

}  // namespace loco::dashboard
