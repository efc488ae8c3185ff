#include "client/dashboard/views.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "runtime/core/codec.hpp"
#include "runtime/core/remote_input.hpp"

namespace loco::dashboard {
namespace {

using json = nlohmann::json;
namespace schema = diloco::schema;
using schema::key;
using schema::Report;
static_assert(std::is_same_v<decltype(JobProgress::metrics), schema::Metrics>,
              "a report's metrics are what job_schema.hpp reads and writes");

// The length of the well-formed UTF-8 sequence of two to four bytes at text[i] (no overlong
// form, no surrogate, nothing past U+10FFFF), or 0.
size_t utf8_sequence(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = at(i);
  size_t n = b >= 0xc2 && b <= 0xdf   ? 2
             : b >= 0xe0 && b <= 0xef ? 3
             : b >= 0xf0 && b <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  const unsigned char c = at(i + 1);
  if ((b == 0xe0 && c < 0xa0) || (b == 0xed && c > 0x9f) || (b == 0xf0 && c < 0x90) ||
      (b == 0xf4 && c > 0x8f))
    return 0;
  return n;
}

// A job's text for the page (its log lines, its records): escape_remote's, except that
// well-formed UTF-8 stays as it is, so that "fp32 → int8" reads so and not as \xe2\x86\x92.
// Control characters and bytes that are not UTF-8 are still escaped, and the cut falls between
// characters; the page's JSON is valid whatever the input.
std::string job_text(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  for (; i < text.size() && i < max_bytes;) {
    const size_t n = utf8_sequence(text, i);
    if (n > 0 && i + n <= max_bytes) {
      out.append(text.substr(i, n));
      i += n;
    } else if (n > 0) {
      break;
    } else {
      out += escape_remote(text.substr(i, 1), 1);
      ++i;
    }
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size() - i) + " more bytes)";
  return out;
}

// A number JSON can hold: NaN and infinities (a diverged loss) become null.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// Prometheus label values: backslash, double quote and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string prom_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class PromWriter {
 public:
  void family(const std::string& name, const char* type, const char* help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void sample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& l,
              double v) {
    out_ << name;
    if (!l.empty()) {
      out_ << "{";
      for (size_t i = 0; i < l.size(); ++i)
        out_ << (i ? "," : "") << l[i].first << "=\"" << label(l[i].second) << "\"";
      out_ << "}";
    }
    out_ << " " << prom_number(v) << "\n";
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

void JobHistory::note(TimelineEntry e) {
  timeline_.push_back(std::move(e));
  ++timeline_added_;
  while (timeline_.size() > kMaxTimeline) timeline_.pop_front();
}

void JobHistory::add_report(const JobProgress& p, int64_t at) {
  const Report r = schema::from_metrics<Report>(p.metrics);
  // The round before this one, as the job's history now stands, to tell what changed.
  auto redone = rounds_.lower_bound(p.step);
  if (redone != rounds_.end()) {
    ++revision_;
    rounds_.erase(redone, rounds_.end());
    // The steps of the undone rounds go too: those after the last round kept.
    const int64_t kept = last() ? last()->report.inner_step : 0;
    steps_.erase(steps_.upper_bound(kept), steps_.end());
  }
  const RoundPoint* before = last();
  const int workers = r.workers;
  if (before) {
    const int had = before->report.workers;
    if (workers > had && !joins_recorded_)
      note({at, p.step, "join",
            std::to_string(workers - had) + " joined: " + std::to_string(had) + " -> " +
                std::to_string(workers)});
    if (workers < had && !lefts_recorded_)
      note({at, p.step, "left",
            std::to_string(had - workers) + " left: " + std::to_string(had) + " -> " +
                std::to_string(workers)});
    if (r.redo > before->report.redo) note({at, p.step, "redo", "went back and redid the round"});
  }
  if (r.failed_attempts > 0)
    note(
        {at, p.step, "retry", std::to_string(r.failed_attempts) + " all-reduce attempt(s) failed"});
  if (const int late = r.late.value_or(0); late > 0)
    note({at, p.step, "late", std::to_string(late) + " member(s) missed the deadline"});
  if (const int out = r.left_out.value_or(0); out > 0)
    note({at, p.step, "left_out",
          std::to_string(out) + " member(s) left out of the average by the guard"});
  rounds_[p.step] = RoundPoint{p, r, at};
  while (rounds_.size() > kMaxRounds) rounds_.erase(rounds_.begin());
  joins_recorded_ = lefts_recorded_ = false;
}

void JobHistory::add(const JobEvent& e) {
  cursor = e.id;
  const size_t lines_before = lines_.size();
  const int64_t at = event_unix_ms(e.id);
  if (e.kind == "report") {
    // Written only by the job's own actors (the head checks), but decoded like network input.
    try {
      add_report(unpack_checked<JobProgress>(e.data, "a job's progress report"), at);
    } catch (const std::exception& ex) {
      lines_.emplace_back(at,
                          "skipped a malformed progress report: " + escape_remote(ex.what(), 200));
    }
  } else if (e.kind == "log") {
    lines_.emplace_back(at, job_text(e.data, 2000));
  } else if (e.kind == schema::record::kSteps) {
    // A round's per-step figures: msgpack of std::vector<JobProgress> (step = inner step).
    try {
      auto steps = unpack_checked<std::vector<JobProgress>>(e.data, "a job's step figures");
      for (const JobProgress& s : steps) {
        auto [it, fresh] =
            steps_.insert_or_assign(s.step, schema::from_metrics<schema::Step>(s.metrics));
        if (!fresh) ++revision_;  // figures of a step already held: a poller's copy is stale
      }
      while (steps_.size() > kMaxSteps) steps_.erase(steps_.begin());
    } catch (const std::exception& ex) {
      lines_.emplace_back(at, "skipped malformed step figures: " + escape_remote(ex.what(), 200));
    }
  } else {
    // A typed record of the job's own: its kind is the event; a [path, round] record (a
    // checkpoint) also says which round.
    TimelineEntry t{at, last() ? last()->progress.step : 0, escape_remote(e.kind, 64), ""};
    try {
      auto oh = unpack_checked(e.data, "a job's record");
      const msgpack::object& o = oh.get();
      if (o.type == msgpack::type::ARRAY && o.via.array.size >= 2 &&
          o.via.array.ptr[0].type == msgpack::type::STR &&
          o.via.array.ptr[1].type == msgpack::type::POSITIVE_INTEGER) {
        t.round = int64_t(o.via.array.ptr[1].via.u64);
        t.text = "round " + std::to_string(t.round) + ": " +
                 job_text(o.via.array.ptr[0].as<std::string>(), 300);
      } else if (o.type == msgpack::type::ARRAY && o.via.array.size >= 1 &&
                 o.via.array.ptr[0].type == msgpack::type::STR) {
        // [text, ...]: the head's cluster records (kClusterRecord), at the job's last round.
        t.text = job_text(o.via.array.ptr[0].as<std::string>(), 300);
      }
    } catch (const std::exception&) {
      // Not one we can read: the kind alone.
    }
    joins_recorded_ = joins_recorded_ || e.kind == schema::record::kJoin;
    lefts_recorded_ = lefts_recorded_ || e.kind == schema::record::kLeft;
    note(std::move(t));
  }
  lines_added_ += lines_.size() - lines_before;
  while (lines_.size() > kMaxLines) lines_.pop_front();
}

json cluster_json(const ClusterStatus& st) {
  json nodes = json::array();
  std::map<std::string, int> actors_on;
  for (const ActorInfo& a : st.actors)
    if (a.state == ActorState::alive || a.state == ActorState::pending) ++actors_on[a.node_id];
  for (const NodeStatus& n : st.nodes) {
    json res = json::object();
    for (const auto& [k, total] : n.node.resources) {
      auto u = n.used.find(k);
      res[k] = {{"total", total}, {"used", u == n.used.end() ? 0.0 : u->second}};
    }
    // Load: the largest share of any resource held by actors.
    double load = 0;
    for (const auto& [k, total] : n.node.resources)
      if (total > 0 && n.used.count(k)) load = std::max(load, n.used.at(k) / total);
    nodes.push_back({{"id", n.node.id},
                     {"address", n.node.address},
                     {"hostname", n.node.hostname},
                     {"pid", n.node.pid},
                     {"state", to_string(n.node.state)},
                     {"reachability", to_string(n.node.reachability)},
                     {"alive", n.node.state == NodeState::alive},
                     {"reason", n.node.reason},
                     {"started_unix_ms", n.node.started_unix_ms},
                     {"resources", res},
                     {"load", load},
                     {"heartbeat",
                      n.heartbeat_silent_ms < 0
                          ? json(nullptr)
                          : json{{"silent_s", double(n.heartbeat_silent_ms) / 1000.0},
                                 {"late", n.heartbeat_late},
                                 {"longest_silence_s", double(n.heartbeat_longest_ms) / 1000.0}}},
                     {"actors", actors_on[n.node.id]}});
  }
  json actors = json::array();
  for (const ActorInfo& a : st.actors)
    actors.push_back({{"id", a.id},
                      {"name", a.name},
                      {"class", a.class_name},
                      {"node", a.node_id},
                      {"state", to_string(a.state)},
                      {"restarts", a.restarts},
                      {"max_restarts", a.max_restarts},
                      {"gpus", a.gpus},
                      {"reason", a.reason}});
  return {{"head", st.head_address},
          {"nodes", nodes},
          {"actors", actors},
          {"events", st.recent_events}};
}

json job_info_json(const JobInfo& j, const JobHistory* h) {
  json out = {{"id", j.id},
              {"name", j.name},
              {"state", to_string(j.state)},
              {"owner", j.owner.empty() ? std::string("(operator)") : j.owner_name},
              {"message", j.message},
              {"entry_actor", j.entry_actor},
              {"submitted_unix_ms", j.submitted_unix_ms},
              {"finished_unix_ms", j.finished_unix_ms}};
  if (h && h->last()) {
    const RoundPoint& last = *h->last();
    out["round"] = last.progress.step;
    out["rounds"] = last.progress.total;
    out[key(&Report::loss)] = number(last.report.loss);
    out[key(&Report::workers)] = last.report.workers;
  }
  return out;
}

json jobs_json(const std::vector<JobInfo>& jobs,
               const std::map<std::string, JobHistory>& histories) {
  json out = json::array();
  for (const JobInfo& j : jobs) {
    auto h = histories.find(j.id);
    out.push_back(job_info_json(j, h == histories.end() ? nullptr : &h->second));
  }
  return out;
}

std::string Since::text() const {
  return std::to_string(revision) + ":" + std::to_string(round) + ":" + std::to_string(step) + ":" +
         std::to_string(lines) + ":" + std::to_string(timeline);
}

std::optional<Since> Since::parse(std::string_view text) {
  if (text.empty() || text.size() > 100) return std::nullopt;
  std::vector<std::string_view> parts;
  size_t from = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == ':') {
      parts.push_back(text.substr(from, i - from));
      from = i + 1;
    }
  if (parts.size() != 5) return std::nullopt;
  int64_t v[5];
  for (size_t k = 0; k < 5; ++k) {
    std::string_view d = parts[k];
    const bool negative = !d.empty() && d[0] == '-';  // round and step: -1 for none yet
    if (negative) d.remove_prefix(1);
    if (d.empty() || d.size() > 18 || (negative && (k == 0 || k > 2))) return std::nullopt;
    int64_t n = 0;
    for (char c : d) {
      if (c < '0' || c > '9') return std::nullopt;
      n = n * 10 + (c - '0');
    }
    v[k] = negative ? -n : n;
  }
  return Since{uint64_t(v[0]), v[1], v[2], uint64_t(v[3]), uint64_t(v[4])};
}

json job_json(const JobInfo& j, const JobHistory& h, const std::optional<Since>& since_asked) {
  json out = job_info_json(j, &h);
  // An answer since a cursor of another revision (the job redid rounds since) is a whole one.
  const bool part = since_asked && since_asked->revision == h.revision();
  const Since since = part ? *since_asked : Since{};
  Since next{h.revision(), h.last() ? h.last()->progress.step : -1,
             h.steps().empty() ? -1 : h.steps().rbegin()->first, h.lines_added(),
             h.timeline_added()};
  out["cursor"] = next.text();
  out["full"] = !part;
  json rounds = json::array();
  double bytes_before = 0, tokens = 0;
  for (const auto& [r, point] : h.rounds()) {
    const JobProgress& p = point.progress;
    if (part && r <= since.round) {  // held by the poller: only what the next rows derive
      bytes_before = double(point.report.bytes_per_worker);
      if (const auto t = schema::find(p.metrics, &Report::round_tokens)) tokens += *t;
      continue;
    }
    json row = {{"round", r}, {"unix_ms", point.unix_ms}, {"note", p.note}};
    // Every figure of the report, those of other entry actors' reports too.
    for (const auto& [k, v] : p.metrics) row[k] = number(v);
    // The reports carry cumulative bytes per worker; the chart wants each round's.
    const double bytes = double(point.report.bytes_per_worker);
    row[kRoundBytes] = number(bytes - bytes_before);
    bytes_before = bytes;
    // Tokens along θ's history (rounds redone count once): the x axis of the loss curves.
    if (const auto t = schema::find(p.metrics, &Report::round_tokens)) {
      tokens += *t;
      row[kTokens] = tokens;
    }
    if (!point.report.val_loss) row[key(&Report::val_loss)] = nullptr;
    // Round 0 evaluates θ before training: no inner steps, so no training figures.
    if (r == 0)
      for (const char* k : {key(&Report::loss), key(&Report::utilization), kRoundBytes,
                            key(&Report::tokens_per_s)})
        row[k] = nullptr;
    rounds.push_back(std::move(row));
  }
  out["rounds_done"] = rounds;
  json steps = json::array();
  for (auto it = part ? h.steps().upper_bound(since.step) : h.steps().begin();
       it != h.steps().end(); ++it) {
    const auto& [step, figures] = *it;
    json row = {{"step", step}};
    for (const auto& [k, v] : schema::to_metrics(figures)) row[k] = number(v);
    steps.push_back(std::move(row));
  }
  out["steps"] = steps;
  // Of the held entries, those numbered at or past the poller's count.
  const auto newer = [](const auto& held, uint64_t added, uint64_t seen) {
    const uint64_t first = added - held.size();
    return held.begin() +
           std::ptrdiff_t(std::min<uint64_t>(held.size(), seen > first ? seen - first : 0));
  };
  json timeline = json::array();
  for (auto it = part ? newer(h.timeline(), h.timeline_added(), since.timeline)
                      : h.timeline().begin();
       it != h.timeline().end(); ++it)
    timeline.push_back(
        {{"unix_ms", it->unix_ms}, {"round", it->round}, {"kind", it->kind}, {"text", it->text}});
  out["timeline"] = timeline;
  json lines = json::array();
  for (auto it = part ? newer(h.lines(), h.lines_added(), since.lines) : h.lines().begin();
       it != h.lines().end(); ++it)
    lines.push_back({{"unix_ms", it->first}, {"line", it->second}});
  out["log"] = lines;
  return out;
}

json field_keys() {
  return {{"report", schema::keys<Report>()},
          {"step", schema::keys<schema::Step>()},
          {"derived", {kRoundBytes, kTokens}}};
}

std::string prometheus_text(const ClusterStatus& st, const std::vector<JobInfo>& jobs,
                            const std::map<std::string, JobHistory>& histories) {
  PromWriter w;
  std::map<std::string, int> node_states = {{"alive", 0}, {"dead", 0}, {"left", 0}};
  for (const NodeStatus& n : st.nodes) ++node_states[to_string(n.node.state)];
  w.family("loco_nodes", "gauge", "Nodes the head knows, by state.");
  for (const auto& [s, k] : node_states) w.sample("loco_nodes", {{"state", s}}, k);
  w.family("loco_node_heartbeat_misses", "gauge",
           "Nodes declared dead because their heartbeats stopped for the detection time.");
  w.sample("loco_node_heartbeat_misses", {}, node_states["dead"]);
  // Each watched node's heartbeat health (FailureDetector::Health, on the head's clock).
  struct HeartbeatFamily {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const NodeStatus&);
  };
  static constexpr HeartbeatFamily kHeartbeats[] = {
      {"loco_node_heartbeat_silence_seconds", "gauge",
       "Since the node's heartbeat last changed, on the head's clock (alive nodes).",
       [](const NodeStatus& n) { return double(n.heartbeat_silent_ms) / 1000.0; }},
      {"loco_node_heartbeat_late_total", "counter",
       "Times the node's heartbeat came back after half the detection time or more of "
       "silence (late, not declared dead).",
       [](const NodeStatus& n) { return double(n.heartbeat_late); }},
      {"loco_node_heartbeat_longest_silence_seconds", "gauge",
       "The longest silence the node's heartbeat came back from.",
       [](const NodeStatus& n) { return double(n.heartbeat_longest_ms) / 1000.0; }},
  };
  for (const HeartbeatFamily& f : kHeartbeats) {
    w.family(f.name, f.type, f.help);
    for (const NodeStatus& n : st.nodes)
      if (n.heartbeat_silent_ms >= 0) w.sample(f.name, {{"node", n.node.id}}, f.value(n));
  }
  w.family("loco_node_up", "gauge", "1 while the node is alive.");
  for (const NodeStatus& n : st.nodes)
    w.sample("loco_node_up", {{"node", n.node.id}, {"address", n.node.address}},
             n.node.state == NodeState::alive);
  // A gauge: not "_total", which Prometheus keeps for counters (`promtool check metrics`).
  w.family("loco_node_resource_capacity", "gauge", "A node's resources.");
  for (const NodeStatus& n : st.nodes)
    for (const auto& [k, v] : n.node.resources)
      w.sample("loco_node_resource_capacity", {{"node", n.node.id}, {"resource", k}}, v);
  w.family("loco_node_resource_used", "gauge", "A node's resources held by actors.");
  for (const NodeStatus& n : st.nodes)
    for (const auto& [k, v] : n.node.resources) {
      auto u = n.used.find(k);
      (void)v;
      w.sample("loco_node_resource_used", {{"node", n.node.id}, {"resource", k}},
               u == n.used.end() ? 0 : u->second);
    }
  std::map<std::string, int> actor_states = {
      {"pending", 0}, {"alive", 0}, {"restarting", 0}, {"dead", 0}};
  int restarts = 0;
  for (const ActorInfo& a : st.actors) {
    ++actor_states[to_string(a.state)];
    restarts += a.restarts;
  }
  w.family("loco_actors", "gauge", "Actors, by state.");
  for (const auto& [s, k] : actor_states) w.sample("loco_actors", {{"state", s}}, k);
  w.family("loco_actor_restarts", "gauge", "Restarts of the actors the head knows, summed.");
  w.sample("loco_actor_restarts", {}, restarts);

  std::map<std::string, int> job_states = {
      {"running", 0}, {"succeeded", 0}, {"failed", 0}, {"cancelled", 0}};
  for (const JobInfo& j : jobs) ++job_states[to_string(j.state)];
  w.family("loco_jobs", "gauge", "Jobs, by state.");
  for (const auto& [s, k] : job_states) w.sample("loco_jobs", {{"state", s}}, k);

  // Per job, the newest report's figures: those it has (other entry actors report some only).
  struct Figure {
    const char* name;
    const char* field;  // a key of schema::Report; nullptr: the round or the rounds
    const char* type;
    const char* help;
  };
  static const Figure figures[] = {
      {"loco_job_round", nullptr, "gauge", "The last round the job completed."},
      {"loco_job_rounds", nullptr, "gauge", "The rounds the job is to run."},
      {"loco_job_loss", key(&Report::loss), "gauge",
       "Mean training loss of the last round's inner steps."},
      {"loco_job_val_loss", key(&Report::val_loss), "gauge", "The last validation loss."},
      {"loco_job_tokens_per_second", key(&Report::tokens_per_s), "gauge",
       "Tokens per second, all workers."},
      {"loco_job_utilization", key(&Report::utilization), "gauge",
       "Inner-step time over wall time, 0..1."},
      {"loco_job_workers", key(&Report::workers), "gauge", "Members of the last round."},
      {"loco_job_allreduce_bytes_per_worker_total", key(&Report::bytes_per_worker), "counter",
       "All-reduce bytes sent per worker over the rounds of the job's history."},
      {"loco_job_allreduce_attempt_bytes_per_worker_total", key(&Report::job_bytes_per_worker),
       "counter", "All-reduce bytes sent per worker over every attempt, failed ones included."},
      {"loco_job_left_out_total", key(&Report::left_out_total), "counter",
       "Members the guard left out of a round's average, summed over the rounds."},
      {"loco_job_allreduce_seconds_total", key(&Report::allreduce_seconds_total), "counter",
       "Seconds the job's rounds spent in their all-reduce."},
      {"loco_job_failed_attempts", key(&Report::failed_attempts), "gauge",
       "Failed all-reduce attempts of the last round."},
      {"loco_job_redo", key(&Report::redo), "gauge", "Times the job went back to a checkpoint."},
  };
  for (const Figure& f : figures) {
    bool any = false;
    for (const JobInfo& j : jobs) {
      auto h = histories.find(j.id);
      if (h == histories.end() || !h->second.last()) continue;
      const JobProgress& p = h->second.last()->progress;
      double v;
      if (f.field == nullptr)
        v = double(std::string(f.name) == "loco_job_round" ? p.step : p.total);
      else if (p.metrics.count(f.field))
        v = p.metrics.at(f.field);
      else
        continue;
      if (!any) w.family(f.name, f.type, f.help);
      any = true;
      w.sample(f.name, {{"job", j.id}, {"name", j.name}}, v);
    }
  }
  return w.str();
}

}  // namespace loco::dashboard
