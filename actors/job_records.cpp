#include "actors/job_records.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace loco::actors {

namespace fs = std::filesystem;

namespace {

int64_t int_field(const std::string& line, const std::string& key, int64_t fallback = 0) {
  const std::string v = json_field(line, key);
  try {
    return v.empty() || v == "null" ? fallback : std::stoll(v);
  } catch (const std::exception&) {
    return fallback;
  }
}

double double_field(const std::string& line, const std::string& key) {
  const std::string v = json_field(line, key);
  try {
    return v.empty() || v == "null" ? 0.0 : std::stod(v);
  } catch (const std::exception&) {
    return 0.0;
  }
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

void append(const std::string& path, const std::string& line) {
  std::ofstream(path, std::ios::app) << line << "\n";
}

}  // namespace

std::string json_field(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  auto at = line.find(tag);
  if (at == std::string::npos) return "";
  at += tag.size();
  return line.substr(at, line.find_first_of(",}", at) - at);
}

JobRecords::JobRecords(std::string folder, int64_t from)
    : metrics_path_(folder + "/metrics.jsonl"), attempts_path_(folder + "/attempts.jsonl") {
  // Records already there: the aggregator was restarted, and goes back.
  int64_t last = -1;
  for (const std::string& l : read_json_lines(attempts_path_)) {
    last = std::max(last, int_field(l, "redo"));
    job_bytes_ += uint64_t(int_field(l, "bytes_per_worker"));
  }
  for (const std::string& l : read_json_lines(metrics_path_))
    last = std::max(last, int_field(l, "redo"));
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
    const int64_t r = int_field(l, "round", -1);
    if (r > round || r < 0) continue;
    kept += l + "\n";
    bytes_ = uint64_t(int_field(l, "bytes"));
    seconds_ = double_field(l, "time");
  }
  const std::string tmp = metrics_path_ + ".tmp";
  std::ofstream(tmp, std::ios::trunc) << kept;
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
  std::ostringstream s;
  s << std::setprecision(6) << "{\"round\":" << a.round << ",\"redo\":" << redo_
    << ",\"attempt\":" << attempts_ << ",\"workers\":" << a.members.size() << ",\"members\":[";
  for (size_t i = 0; i < a.members.size(); ++i) s << (i ? "," : "") << a.members[i];
  s << "],\"outcome\":\"" << (ok ? "ok" : "failed") << "\",\"seconds\":" << a.seconds
    << ",\"bytes\":[";
  for (size_t i = 0; i < a.bytes.size(); ++i) {
    s << (i ? "," : "");
    if (a.bytes[i]) {
      s << *a.bytes[i];
      known += *a.bytes[i];
      any = true;
    } else {
      s << "null";
    }
  }
  const uint64_t per_worker = known / std::max<uint64_t>(1, a.members.size());
  s << "],\"bytes_per_worker\":";
  if (any)
    s << per_worker;
  else
    s << "null";
  s << ",\"errors\":[";
  for (size_t i = 0; i < a.errors.size(); ++i)
    s << (i ? "," : "") << "{\"worker\":" << a.errors[i].worker
      << ",\"lost\":" << (a.errors[i].lost ? "true" : "false")
      << ",\"error\":" << quoted(a.errors[i].message) << "}";
  s << "]}";
  job_bytes_ += per_worker;
  if (ok) ok_bytes_ = per_worker;
  append(attempts_path_, s.str());
  return s.str();
}

std::string JobRecords::round(diloco::RoundMetrics m, const RoundFigures& f) {
  const uint64_t round_bytes = m.round > 0 ? ok_bytes_ : 0;
  const double round_time = m.round > 0 ? f.round_time : 0;
  bytes_ += round_bytes;
  seconds_ += round_time;
  m.bytes_per_worker = bytes_;
  m.seconds = seconds_;
  std::string line = m.to_json();
  line.pop_back();  // the closing brace: the job's fields follow
  std::ostringstream s;
  s << std::setprecision(8) << line << std::fixed << std::setprecision(4)
    << ",\"utilization\":" << f.utilization << ",\"workers\":" << f.workers
    << ",\"round_bytes\":" << round_bytes << ",\"round_time\":" << round_time
    << ",\"failed_attempts\":" << failed_ << ",\"redo\":" << redo_
    << ",\"job_bytes\":" << job_bytes_ << ",\"job_time\":" << std::setprecision(3) << f.job_time;
  if (m.round > 0) {
    s << ",\"members\":[";
    for (size_t i = 0; i < f.members.size(); ++i)
      s << (i ? "," : "") << "{\"worker\":" << f.members[i].worker
        << ",\"steps\":" << f.members[i].steps << ",\"tokens\":" << f.members[i].tokens
        << ",\"seconds\":" << f.members[i].seconds
        << ",\"wait\":" << std::max(0.0, round_time - f.members[i].seconds) << "}";
    s << "],\"late\":[";
    for (size_t i = 0; i < f.late.size(); ++i) s << (i ? "," : "") << f.late[i];
    s << "]";
  }
  s << "}";
  append(metrics_path_, s.str());
  attempts_ = failed_ = 0;
  ok_bytes_ = 0;
  return s.str();
}

std::vector<std::string> read_json_lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace loco::actors
