#include "actors/job_records.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/bounded_json.hpp"
#include "diloco/job/job_schema.hpp"

namespace loco::actors {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
namespace schema = diloco::schema;
using schema::key;

namespace {

// A line read back; an object without fields when it is not JSON (a line cut by a crash) or
// passes the bounds of JSON from outside (a job folder another user could write into: nesting
// that json_field's dump() would recurse over, diloco/data/bounded_json.hpp).
json parse(const std::string& line) {
  try {
    json j = diloco::parse_bounded_json(line, "metrics.jsonl");
    return j.is_object() ? j : json::object();
  } catch (const std::runtime_error&) {
    return json::object();
  }
}

int64_t int_field(const json& j, const char* key, int64_t fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
}

double double_field(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// As an ofstream would: a line that cannot be written is lost, the job goes on.
void append(const std::string& path, const std::string& line) {
  try {
    *diloco::open_job_stream(path, std::ios::out | std::ios::app) << line << "\n";
  } catch (const std::runtime_error&) {
  }
}

}  // namespace

std::string json_field(const std::string& line, const std::string& key) {
  const json j = parse(line);
  auto it = j.find(key);
  return it == j.end() ? "" : it->dump();
}

std::vector<StepFigures> per_step_means(const std::vector<std::vector<StepFigures>>& members) {
  size_t steps = 0;
  for (const auto& m : members) steps = std::max(steps, m.size());
  std::vector<StepFigures> out(steps);
  for (size_t i = 0; i < steps; ++i) {
    int n = 0;
    // The step's MFU: the members' model FLOP/s over the peak of the devices they ran on,
    // each device once (workers sharing a GPU add their rates against one card's peak); with
    // a device each and equal peaks, the members' mean.
    double rate = 0, peak = 0;
    std::set<std::string> devices;
    for (const auto& m : members) {
      if (i >= m.size()) continue;
      ++n;
      out[i].loss += m[i].loss;
      out[i].lr += m[i].lr;
      out[i].grad_norm += m[i].grad_norm;
      out[i].tokens += m[i].tokens;
      out[i].seconds = std::max(out[i].seconds, m[i].seconds);
      out[i].flops += m[i].flops;
      if (m[i].mfu > 0 && m[i].seconds > 0) {
        const double r = m[i].flops / m[i].seconds;
        rate += r;
        if (m[i].device.empty() || devices.insert(m[i].device).second) peak += r / m[i].mfu;
      }
      out[i].memory_bytes = std::max(out[i].memory_bytes, m[i].memory_bytes);
      out[i].cpu_seconds += m[i].cpu_seconds;
      out[i].step_cpu_seconds += m[i].step_cpu_seconds;
    }
    out[i].loss /= n;
    out[i].lr /= n;
    out[i].grad_norm /= n;
    out[i].mfu = peak > 0 ? rate / peak : 0;
    out[i].cpu_seconds /= n;
    out[i].step_cpu_seconds /= n;
  }
  return out;
}

schema::Step step_report(const StepFigures& s) {
  schema::Step out{.loss = s.loss, .lr = s.lr, .grad_norm = s.grad_norm, .tokens = s.tokens};
  if (s.seconds > 0) {
    out.tokens_per_s = double(s.tokens) / s.seconds;
    // Model TFLOP/s of all the members, their mean MFU (where a peak is known) and the most
    // device memory any of them held (GPUs).
    if (s.flops > 0) out.tflops = s.flops / s.seconds / 1e12;
  }
  if (s.mfu > 0) out.mfu = s.mfu;
  if (s.memory_bytes > 0) out.memory_gb = double(s.memory_bytes) / 1e9;
  // The members' mean CPU seconds in the step: next to the slowest's wall seconds, how much of
  // the step was work (none from workers that do not report it).
  if (s.cpu_seconds > 0) out.cpu_s = s.cpu_seconds;
  return out;
}

MemberFigures member_figures(int worker, int steps, int64_t tokens, double seconds,
                             const std::vector<StepFigures>& per_step) {
  MemberFigures m{worker, steps, tokens, seconds};
  for (const StepFigures& f : per_step) {
    m.cpu_seconds += f.cpu_seconds;
    m.step_cpu_seconds += f.step_cpu_seconds;
  }
  return m;
}

JobRecords::JobRecords(std::string folder, int64_t from)
    : metrics_path_(folder + "/metrics.jsonl"), attempts_path_(folder + "/attempts.jsonl") {
  // Records already there: the aggregator was restarted, and goes back.
  int64_t last = -1;
  for (const std::string& l : read_json_lines(attempts_path_)) {
    const json j = parse(l);
    last = std::max(last, int_field(j, "redo"));
    job_bytes_ += uint64_t(int_field(j, "bytes_per_worker"));
  }
  for (const std::string& l : read_json_lines(metrics_path_))
    last = std::max(last, int_field(parse(l), key(&schema::JobMetricsLine::redo)));
  redo_ = last + 1;
  drop_after(from);
}

void JobRecords::go_back(int64_t round) {
  drop_after(round);
  ++redo_;
}

// Keeps the lines of rounds <= `round`; the sums restart from the last one kept.
void JobRecords::drop_after(int64_t round) {
  std::string kept;
  bytes_ = 0;
  seconds_ = 0;
  for (const std::string& l : read_json_lines(metrics_path_)) {
    const json j = parse(l);
    const int64_t r = int_field(j, key(&schema::MetricsLine::round), -1);
    if (r > round || r < 0) {
      if (auto c = schema::from_json<schema::MetricsLine>(j).cluster)
        carried_cluster_.insert(carried_cluster_.end(), c->begin(), c->end());
      continue;
    }
    kept += l + "\n";
    bytes_ = uint64_t(int_field(j, key(&schema::MetricsLine::bytes_per_worker)));
    seconds_ = double_field(j, key(&schema::MetricsLine::seconds));
  }
  const std::string tmp = metrics_path_ + ".tmp";
  *diloco::open_job_stream(tmp, std::ios::out) << kept;
  fs::rename(tmp, metrics_path_);
  attempts_ = failed_ = 0;
  ok_bytes_ = 0;
}

std::string JobRecords::attempt(const AttemptRecord& a) {
  ++attempts_;
  const bool ok = a.errors.empty();
  if (!ok) ++failed_;
  uint64_t known = 0;
  bool any = false;
  json bytes = json::array();
  for (const auto& b : a.bytes) {
    bytes.push_back(b ? json(*b) : json(nullptr));
    if (b) {
      known += *b;
      any = true;
    }
  }
  const uint64_t per_worker = known / std::max<uint64_t>(1, a.members.size());
  json errors = json::array();
  for (const auto& e : a.errors)
    errors.push_back({{"worker", e.worker}, {"lost", e.lost}, {"error", e.message}});
  const json j = {{"round", a.round},
                  {"redo", redo_},
                  {"attempt", attempts_},
                  {"workers", a.members.size()},
                  {"members", a.members},
                  {"outcome", ok ? "ok" : "failed"},
                  {"seconds", a.seconds},
                  {"bytes", bytes},
                  {"bytes_per_worker", any ? json(per_worker) : json(nullptr)},
                  {"errors", errors}};
  job_bytes_ += per_worker;
  if (ok) ok_bytes_ = per_worker;
  // Invalid UTF-8 in an error message is replaced, not a throw.
  const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace);
  append(attempts_path_, line);
  return line;
}

std::string JobRecords::round(diloco::RoundMetrics m, const RoundFigures& f) {
  const uint64_t round_bytes = m.round > 0 ? ok_bytes_ : 0;
  const double round_time = m.round > 0 ? f.round_time : 0;
  bytes_ += round_bytes;
  seconds_ += round_time;
  m.bytes_per_worker = bytes_;
  m.seconds = seconds_;
  if (!carried_cluster_.empty()) {  // the undone rounds' notes first, then this round's
    if (m.cluster)
      carried_cluster_.insert(carried_cluster_.end(), m.cluster->begin(), m.cluster->end());
    m.cluster = std::exchange(carried_cluster_, {});
  }
  // The simulator's fields (the same as `loco train` writes), then the job's.
  schema::JobMetricsLine l;
  static_cast<schema::MetricsLine&>(l) = m;
  l.utilization = f.utilization;
  l.workers = f.workers;
  l.round_bytes = round_bytes;
  l.round_time = round_time;
  l.failed_attempts = failed_;
  l.redo = redo_;
  l.job_bytes = job_bytes_;
  l.job_time = f.job_time;
  if (f.guard_time >= 0) l.guard_time = f.guard_time;
  if (m.round > 0) {
    l.members.emplace();
    for (const MemberFigures& x : f.members)
      l.members->push_back({x.worker, x.steps, x.tokens, x.seconds, x.cpu_seconds,
                            std::max(0.0, round_time - x.seconds), x.step_cpu_seconds});
    l.late = f.late;
    l.steps.emplace();
    for (const StepFigures& s : f.steps) l.steps->push_back(step_report(s));
  }
  const std::string line = schema::to_json<json>(l).dump();
  append(metrics_path_, line);
  attempts_ = failed_ = 0;
  ok_bytes_ = 0;
  return line;
}

std::vector<std::string> read_json_lines(const std::string& path) {
  std::vector<std::string> out;
  std::unique_ptr<std::iostream> file;
  try {
    file = diloco::open_job_stream(path, std::ios::in);
  } catch (const std::runtime_error&) {
    return out;  // none yet
  }
  std::string line;
  while (std::getline(*file, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace loco::actors
