#include "client/client.hpp"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "diloco/job/job_schema.hpp"

namespace loco {

JobSpec JobSpec::from_yaml(const std::string& text) {
  JobSpec spec;
  spec.text = text;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument("job file is not valid YAML: " + std::string(e.what()));
  }
  if (!root.IsMap())
    throw std::invalid_argument("job file: expected a mapping of fields at the top");
  if (root["name"]) spec.name = root["name"].as<std::string>();
  return spec;
}

JobSpec JobSpec::from_yaml_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("cannot read job file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    JobSpec spec = from_yaml(ss.str());
    spec.path = path;
    return spec;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

RoundReport RoundReport::from(const JobProgress& p) {
  static_assert(std::is_same_v<decltype(p.metrics), diloco::schema::Metrics>);
  const auto f = diloco::schema::from_metrics<diloco::schema::Report>(p.metrics);
  RoundReport r;
  r.round = int(p.step);
  r.rounds = int(p.total);
  r.inner_step = int(f.inner_step);
  r.loss = f.loss;
  r.val_loss = f.val_loss.value_or(0);
  r.val_ppl = f.val_ppl.value_or(0);
  r.tokens_per_s = f.tokens_per_s;
  r.bytes_per_worker = double(f.bytes_per_worker);
  r.job_bytes_per_worker = double(f.job_bytes_per_worker);
  r.failed_attempts = f.failed_attempts;
  r.redo = int(f.redo);
  r.utilization = f.utilization;
  r.workers = f.workers;
  r.late = f.late.value_or(0);
  r.note = p.note;
  return r;
}

JobEvents JobHandle::poll(std::string& cursor, int max) {
  JobEvents ev = rt_.job_events(id_, cursor, max);
  if (!ev.events.empty()) cursor = ev.events.back().id;
  return ev;
}

std::optional<JobHandle::Update> JobHandle::decode(const JobEvent& e) {
  Update u;
  if (e.kind == "report") {
    // Written by the job's own actors only (the head checks), but decoded like network input:
    // bounded, and a report that does not decode is a line that says so, not the watcher's end.
    try {
      JobProgress p = unpack_checked<JobProgress>(e.data, "a job's progress report");
      u.report = RoundReport::from(p);
      u.figures = std::move(p.metrics);
      u.figures["round"] = double(p.step);
      u.figures["rounds"] = double(p.total);
    } catch (const std::exception& ex) {
      u.line = "skipped a malformed progress report (event " + escape_remote(e.id, 40) +
               "): " + escape_remote(ex.what(), 200);
    }
  } else if (e.kind == "log") {
    u.line = e.data;
  } else {
    return std::nullopt;
  }
  return u;
}

std::vector<std::string> JobHandle::logs() {
  std::vector<std::string> out;
  for (Update& u : updates_so_far())
    if (!u.report) out.push_back(std::move(u.line));
  return out;
}

std::vector<std::map<std::string, double>> JobHandle::metrics() {
  std::vector<std::map<std::string, double>> rows;
  for (Update& u : updates_so_far())
    if (u.report) rows.push_back(std::move(u.figures));
  return rows;
}

std::vector<JobHandle::Update> JobHandle::updates_so_far() {
  std::vector<Update> out;
  std::string cursor;
  while (true) {
    JobEvents ev = poll(cursor);
    if (ev.events.empty()) return out;
    for (const JobEvent& e : ev.events)
      if (auto u = decode(e)) out.push_back(std::move(*u));
  }
}

std::optional<JobHandle::Update> JobHandle::Watch::next_update() {
  Backoff idle(Millis(50), Millis(500));
  while (true) {
    if (pos_ < pending_.size()) {
      if (auto u = decode(pending_[pos_++])) return u;
      continue;
    }
    if (ended_ || (stop_ && stop_->load())) return std::nullopt;
    pending_.clear();
    pos_ = 0;
    JobEvents ev = job_->poll(job_->cursor_);
    pending_ = std::move(ev.events);
    if (pending_.empty()) {
      if (ev.job.finished()) {
        ended_ = std::move(ev.job);
        return std::nullopt;
      }
      std::this_thread::sleep_for(idle.next());
    } else {
      idle.reset();
    }
  }
}

std::optional<RoundReport> JobHandle::Watch::next() {
  while (auto u = next_update())
    if (u->report) return std::move(u->report);
  return std::nullopt;
}

JobHandle::Watch::iterator& JobHandle::Watch::iterator::operator++() {
  auto r = w_ ? w_->next() : std::nullopt;
  if (r)
    current_ = *r;
  else
    w_ = nullptr;
  return *this;
}

JobInfo JobHandle::info() { return rt_.job(id_); }

JobInfo JobHandle::scale(int workers) { return rt_.scale_job(id_, workers); }

JobInfo JobHandle::wait(Millis timeout) {
  int64_t deadline = now_ms() + timeout.count();
  Backoff idle(Millis(50), Millis(1000));
  while (true) {
    JobInfo j = info();
    if (j.finished()) return j;
    if (now_ms() >= deadline)
      throw TimeoutError("job " + id_ + " still " + to_string(j.state) + " after " +
                         human_ms(timeout.count()));
    std::this_thread::sleep_for(idle.next());
  }
}

JobInfo JobHandle::cancel() { return rt_.cancel_job(id_); }

Client::Client(const std::string& head_address, ConnectOptions opts)
    : rt_(Runtime::connect(head_address, opts)) {}

JobHandle Client::submit(const JobSpec& spec) {
  JobSubmission sub;
  sub.name = spec.name;
  sub.entry_class = spec.entry_class;
  sub.spec = spec.text;
  sub.resources = {{"cpu", 0}};
  sub.max_restarts = spec.max_restarts;
  sub.max_workers = spec.max_workers;
  JobInfo info = rt_.submit_job(sub);
  return JobHandle(rt_, info.id);
}

}  // namespace loco
