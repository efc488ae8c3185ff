// The OuterAggregator: the actor, and its State's loop over the job's rounds (run) with what
// it does around them: the job's start or resume, its reports and log, evaluation,
// checkpoints and its end. The rounds themselves, and who takes part in them, are in
// aggregator_blocking.cpp, aggregator_streaming.cpp and aggregator_membership.cpp.
#include "actors/outer_aggregator.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <tuple>

#include "actors/outer_aggregator_state.hpp"
#include "diloco/data/bounded_file.hpp"
#include "diloco/data/data.hpp"
#include "diloco/job/job_schema.hpp"
#include "diloco/model/hf_format.hpp"
#include "diloco/model/torchscript_model.hpp"
#include "diloco/round/simulator.hpp"
#include "runtime/core/job_event_id.hpp"

namespace loco::actors {

namespace dl = loco::diloco;
namespace schema = loco::diloco::schema;
namespace fs = std::filesystem;

namespace {

// The job's log says "checkpoint: PATH (round N)" for people; a restarted aggregator reads
// the typed CheckpointRecord events (messages.hpp) that go beside those lines.
constexpr const char* kCheckpointLine = "checkpoint: ";

}  // namespace

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

std::string inner_state_path(const std::string& checkpoint, int slot) {
  std::string base = checkpoint.substr(0, checkpoint.size() - 3);
  return base + ".worker-" + std::to_string(slot) + ".pt";
}

std::string non_finite_of(int member, const InnerResult& r, int of_steps) {
  std::vector<StepHealth> health;
  for (const StepFigures& f : r.per_step) health.push_back({f.loss, f.grad_norm});
  return non_finite_inner(member, r.mean_loss, health, of_steps);
}

OuterAggregator::State::RoundOutcome OuterAggregator::State::failure(RoundOutcome::Kind k,
                                                                     std::string why,
                                                                     std::string fix) {
  RoundOutcome o;
  o.kind = k;
  o.why = std::move(why);
  o.fix = std::move(fix);
  return o;
}

std::string OuterAggregator::State::checkpoint_file(int64_t r) const {
  return folder + "/ckpt-round-" + std::to_string(r) + ".pt";
}

std::string OuterAggregator::State::resume_point() const {
  return resume_from.empty() ? std::string("its start")
                             : "its checkpoint of round " + std::to_string(resume_round);
}

std::vector<int> OuterAggregator::State::active() const {
  std::vector<int> v;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].active) v.push_back(int(i));
  return v;
}

OuterAggregator::State::State(std::string id, const std::string& spec)
    : job_id(std::move(id)),
      cfg(dl::JobConfig::from_yaml(spec)),
      rt(Runtime::current()),
      roots(this_actor().roots) {
  // A model from a Hugging Face folder is read here, once, under this node's data root: the
  // workers get every field (and init: hf:DIR) in the job this aggregator hands them.
  if (!cfg.model.hf.empty())
    dl::resolve_hf_model(cfg, resolve_data_path(roots, cfg.model.hf, "model.hf"));
  resolve_checkpoint_path(roots, cfg.checkpoint.dir, "checkpoint.dir");
  folder = resolve_checkpoint_path(roots, (fs::path(cfg.checkpoint.dir) / job_id).string(),
                                   "checkpoint.dir/" + job_id);
  // Refused at submission when the file is not there; what it holds is read by run().
  if (!cfg.checkpoint.resume.empty()) {
    resume_file = resolve_checkpoint_path(roots, cfg.checkpoint.resume, "checkpoint.resume");
    require_resume_file();
  }
  target = cfg.workers.count;
}

void OuterAggregator::State::round_failed(int64_t r, const std::string& why,
                                          const std::string& fix) {
  const RedoDecision d = redos.failed(r, why, fix);
  if (d.give_up) throw std::runtime_error(d.message);
  log("round " + std::to_string(r + 1) + " failed: " + why + "; it is redone (" +
      std::to_string(d.redo) + " of at most " + std::to_string(kMaxRoundRedos) + ")");
}

void OuterAggregator::State::publish(std::function<void()> f) {
  outbox.push_back(std::move(f));
  flush();
}

bool OuterAggregator::State::flush() {
  while (!outbox.empty()) {
    try {
      outbox.front()();
    } catch (const std::exception& e) {
      if (!outbox_stuck) log_warn(job_id + ": reports wait for the head: " + e.what());
      outbox_stuck = true;
      return false;
    }
    outbox.pop_front();
  }
  if (outbox_stuck) log_info(job_id + ": the head takes reports again");
  outbox_stuck = false;
  return true;
}

void OuterAggregator::State::pause(Millis d) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, wake.get_token(), d, [] { return false; });
}

void OuterAggregator::State::log(const std::string& line) {
  log_info(job_id + ": " + line);
  publish([this, line] { rt.job_log(job_id, line); });
}

std::string OuterAggregator::State::plan_codec(int64_t r, int members) {
  if (!planner) return "";
  if (auto it = decisions.find(r); it != decisions.end()) return it->second.to.name();
  dl::CodecDecision d;
  if (cfg.sync.mode != dl::SyncMode::blocking) {
    // Each fragment's operation agrees on its own codec as it begins: the round carries where
    // the members' planners start, the codec the last operation agreed on.
    d.round = int(r + 1);
    const auto now = dl::parse_choice(fragment_codec);
    d.from = d.to = now ? *now : planner->current();
    d.reason = "each fragment's codec is agreed by its members as its operation begins";
  } else {
    d = planner->decide(r, link, members);
    if (link && r > 0) d.reason += " (measured in " + link_from + ")";
  }
  decisions[r] = d;
  while (decisions.size() > 16) decisions.erase(decisions.begin());
  if (d.changed()) {
    const std::string text = d.from.name() + " → " + d.to.name() + ": " + d.reason;
    log("round " + std::to_string(r + 1) + ": " + text);
    record_line(kCodecRecord, text, r + 1);  // the dashboard's timeline
  }
  return d.to.name();
}

void OuterAggregator::State::fragment_codec_notes(const std::vector<const StreamResult*>& results) {
  if (!planner || cfg.sync.mode == dl::SyncMode::blocking) return;
  // Each operation's newest report: a worker reports what its operations agreed since its last
  // call that succeeded (a failed attempt's too), and a round redone runs its fragments again
  // under higher operation ids. The last few rounds' worth of each member's reports (the rest
  // is not what a worker sends).
  std::map<std::pair<int64_t, int>, const FragmentCodecNote*> got;
  const size_t most = 4 * size_t(std::max(1, cfg.sync.fragments)) + 8;
  for (const StreamResult* res : results) {
    if (!res) continue;
    const size_t from = res->codecs.size() > most ? res->codecs.size() - most : 0;
    for (size_t i = from; i < res->codecs.size(); ++i) {
      const FragmentCodecNote& n = res->codecs[i];
      if (n.fragment < 0 || n.fragment >= std::max(1, cfg.sync.fragments) || n.round < 0 ||
          n.round > round + 1 || !dl::parse_choice(n.codec))
        continue;
      const FragmentCodecNote*& newest = got[{n.round, n.fragment}];
      if (!newest || n.op > newest->op) newest = &n;
    }
  }
  for (const auto& [at, n] : got) {
    const auto was = fragment_codec_ops.find(at);
    if (was != fragment_codec_ops.end() && was->second >= n->op) continue;
    fragment_codec_ops[at] = n->op;
    while (fragment_codec_ops.size() > 4 * most)
      fragment_codec_ops.erase(fragment_codec_ops.begin());
    round_fragment_codecs.push_back({int(at.first + 1), at.second, n->codec, std::nullopt});
    if (!fragment_codec.empty() && fragment_codec != n->codec) {
      const std::string why = escape_remote(n->reason, 300);
      const std::string text = "round " + std::to_string(at.first + 1) + " fragment " +
                               std::to_string(at.second) + ": " + fragment_codec + " → " +
                               n->codec + ": " + why;
      round_fragment_codecs.back().reason = why;
      log(text);
      record_line(kCodecRecord, text, at.first + 1);  // the dashboard's timeline
    }
    fragment_codec = n->codec;
  }
}

void OuterAggregator::State::log_join(int i, int64_t r, const std::string& line) {
  log(line);
  Slot& s = slots[size_t(i)];
  const std::string where = s.handle ? s.handle->address() : std::string();
  const bool same = !s.left && !s.placed.empty() && s.placed == where;
  s.placed = where;
  s.left = false;
  if (!same) record_line(kJoinRecord, line, r);
}

void OuterAggregator::State::log_left(const std::string& line) {
  log(line);
  record_line(kLeftRecord, line, round + 1);
}

void OuterAggregator::State::record_line(const char* kind, const std::string& line, int64_t r) {
  msgpack::sbuffer b;
  msgpack::pack(b, LineRecord{line, r});
  publish(
      [this, kind, data = std::string(b.data(), b.size())] { rt.job_record(job_id, kind, data); });
}

void OuterAggregator::State::note_link(const std::vector<std::pair<uint64_t, double>>& exchanges,
                                       std::vector<double> step_secs, std::string from) {
  if (!planner) return;
  // The member with the highest rate: every member sends about as much, and a member's time
  // includes its wait for the others to enter each operation (in streaming up to a fragment
  // interval), so the last to enter measured the exchange itself; a slow link slows every
  // member's exchange, that one's too.
  std::optional<dl::LinkSample> best;
  for (const auto& [bytes, seconds] : exchanges) {
    if (bytes == 0 || !(seconds > 0)) continue;
    if (!best || double(bytes) / seconds > double(best->bytes) / best->seconds)
      best = dl::LinkSample{bytes, seconds, 0};
  }
  std::erase_if(step_secs, [](double x) { return !(x > 0) || !std::isfinite(x); });
  if (!best || step_secs.empty()) return;  // nothing sent, or no steps: the last sample stands
  best->step_seconds = median(std::move(step_secs));
  link = best;
  link_from = std::move(from);
}

void OuterAggregator::State::record_checkpoint(const std::string& path, int64_t r) {
  resume_from = path;
  resume_round = r;
  log(kCheckpointLine + path + " (round " + std::to_string(r) + ")");
  msgpack::sbuffer b;
  // compression auto: the codec of the round the checkpoint ends, which a resumed job starts at.
  const auto ran = decisions.find(r - 1);
  const auto tokens = tokens_after.find(r);
  msgpack::pack(b, CheckpointRecord{path, r, ran != decisions.end() ? ran->second.to.name() : "",
                                    tokens != tokens_after.end() ? tokens->second : 0});
  publish([this, data = std::string(b.data(), b.size())] {
    rt.job_record(job_id, kCheckpointRecord, data);
  });
  prune_checkpoints();
}

void OuterAggregator::State::publish_steps(int64_t r, const std::vector<StepFigures>& steps) {
  const size_t stride = (steps.size() + 499) / 500;
  std::vector<JobProgress> out;
  for (size_t i = 0; i < steps.size(); i += stride) {
    JobProgress p;
    p.step = (r - 1) * cfg.inner.steps + int64_t(i) + 1;
    p.total = total_steps;
    schema::Step s = step_report(steps[i]);
    s.tokens.reset();  // metrics.jsonl's only
    s.cpu_s.reset();
    p.metrics = schema::to_metrics(s);
    out.push_back(std::move(p));
  }
  msgpack::sbuffer buf;
  msgpack::pack(buf, out);
  std::string data(buf.data(), buf.size());
  publish([this, data] { rt.job_record(job_id, schema::record::kSteps, data); });
}

void OuterAggregator::State::require_resume_file() const {
  if (!fs::is_regular_file(resume_file))
    throw std::invalid_argument("checkpoint.resume: there is no checkpoint file " + resume_file);
}

void OuterAggregator::State::note_removed(const std::string& data) {
  LineRecord rec;
  try {
    rec = unpack_checked<LineRecord>(data, "a departure record");
  } catch (const std::exception&) {
    return;  // not one of ours: nothing to keep
  }
  const std::string head = "worker ", tail = kRemovedLine;
  const size_t end = rec.text.find(tail);
  if (rec.text.rfind(head, 0) != 0 || end == std::string::npos || end <= head.size() ||
      end - head.size() > 4)
    return;
  int slot = 0;
  for (size_t i = head.size(); i < end; ++i) {
    if (rec.text[i] < '0' || rec.text[i] > '9') return;
    slot = slot * 10 + (rec.text[i] - '0');
  }
  if (slot >= dl::kMaxWorkers) return;
  if (slots.size() <= size_t(slot)) slots.resize(size_t(slot) + 1);
  slots[size_t(slot)].removed = rec.text.substr(end + tail.size(), 400);
}

// The last checkpoint this job recorded, when the aggregator was restarted; and the slots the
// guard removed before (note_removed).
void OuterAggregator::State::find_checkpoint() {
  std::string cursor;
  for (;;) {
    JobEvents ev = rt.job_events(job_id, cursor, 1000);
    if (ev.events.empty()) break;
    cursor = ev.events.back().id;
    for (const JobEvent& e : ev.events) {
      // The cluster records after the last round reported go in the next one's metrics.
      if (e.kind == "report") events_cursor = e.id;
      if (e.kind == kLeftRecord) note_removed(e.data);
      if (e.kind != kCheckpointRecord) continue;
      CheckpointRecord rec;
      try {
        // Anyone who can reach the head can append to a job's log: bounded like network input.
        rec = unpack_checked<CheckpointRecord>(e.data, "a checkpoint record");
      } catch (const std::exception& err) {
        log("ignoring a malformed checkpoint record: " + std::string(err.what()));
        continue;
      }
      // Only a checkpoint in this job's folder: a record is not a way to read other files.
      try {
        rec.path = resolve_checkpoint_path(roots, rec.path, "checkpoint record");
      } catch (const PathError& err) {
        log("ignoring a checkpoint record: " + std::string(err.what()));
        continue;
      }
      if (rec.path.rfind(folder + "/", 0) != 0 || !fs::exists(rec.path)) continue;
      resume_from = rec.path;
      resume_round = rec.round;
      resume_codec = rec.codec;
      resume_tokens = rec.tokens;
    }
  }
}

// checkpoint.resume, for a job that has recorded no checkpoint of its own yet: it starts where
// that file left off (a checkpoint of any job or of the simulator, on any cluster), with each
// worker's inner state where the file's job wrote one beside it.
void OuterAggregator::State::take_resume(int rounds) {
  require_resume_file();  // it was there at submission; it may have gone since
  const std::string& path = resume_file;
  dl::CheckpointInfo info;
  try {
    info = dl::checkpoint_info(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument("checkpoint.resume: " + path +
                                " is not a loco checkpoint: " + e.what());
  }
  if (!info.outer_state)
    throw std::invalid_argument("checkpoint.resume: " + path +
                                " holds no outer state (a single or ddp baseline's checkpoint?)");
  if (const std::string d = dl::model_difference(info.config.model, cfg.model); !d.empty())
    throw std::invalid_argument("checkpoint.resume: the model of " + path +
                                " differs from the job's in " + d);
  if (info.config.vocab_size() != cfg.vocab_size())
    throw std::invalid_argument("checkpoint.resume: the vocabulary of " + path + " has " +
                                std::to_string(info.config.vocab_size()) + " tokens, the job's " +
                                std::to_string(cfg.vocab_size()));
  if (info.round >= rounds)
    throw std::invalid_argument(
        "checkpoint.resume: " + path + " is of round " + std::to_string(info.round) +
        " and the job ends at round " + std::to_string(rounds) +
        ": give it more rounds (loco submit --set rounds=N)");
  resume_from = path;
  resume_round = info.round;
  resume_codec = info.codec;
}

namespace {
// The job folder's round checkpoints (ckpt-round-R.pt and its workers' ckpt-round-R.worker-N.pt),
// newest first, and the bytes of every file in the folder.
struct CheckpointFiles {
  struct Round {
    std::vector<fs::path> files;
    double bytes = 0;
    bool whole = false;  // its checkpoint file is there, not only workers' files
  };
  double bytes = 0;
  std::map<int64_t, Round, std::greater<>> rounds;
};

CheckpointFiles scan_checkpoints(const std::string& folder) {
  static const std::regex name(R"(ckpt-round-([0-9]{1,9})(\.worker-[0-9]+)?\.pt)");
  CheckpointFiles out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const double bytes = e.is_regular_file(ec) ? double(e.file_size(ec)) : 0;
    out.bytes += bytes;
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    CheckpointFiles::Round& round = out.rounds[std::stoll(m[1].str())];
    round.files.push_back(e.path());
    round.bytes += bytes;
    round.whole = round.whole || !m[2].matched;
  }
  return out;
}

// Bytes for people: "3.6 MiB", "1.2 GiB".
std::string bytes_text(double b) {
  char out[32];
  if (b >= double(1 << 30))
    std::snprintf(out, sizeof out, "%.1f GiB", b / double(1 << 30));
  else
    std::snprintf(out, sizeof out, "%.1f MiB", b / double(1 << 20));
  return out;
}
}  // namespace

bool OuterAggregator::State::room_for_checkpoint(int64_t r, const std::string& what) {
  const CheckpointFiles files = scan_checkpoints(folder);
  // The newest whole checkpoint's size; before the first, θ and momentum (8P) and each
  // worker's inner state (θ and AdamW's moments: 12P).
  double estimate = 0;
  const auto newest = std::find_if(files.rounds.begin(), files.rounds.end(),
                                   [](const auto& round) { return round.second.whole; });
  if (newest != files.rounds.end()) {
    estimate = newest->second.bytes;
  } else if (cfg.model.torchscript.empty()) {
    const double p = double(cfg.model.parameter_count(cfg.vocab_size()));
    estimate = p * (8.0 + 12.0 * double(std::max(1, cfg.workers.count)));
  }
  const double held = files.bytes;
  const std::string which =
      what.empty() ? "the checkpoint of round " + std::to_string(r) : std::string(what);
  const double quota = cfg.checkpoint.quota_gib * double(1 << 30);
  if (quota > 0 && held + estimate > quota) {
    log(which + " is not written: the job's folder holds " + bytes_text(held) +
        " and it would add " + "about " + bytes_text(estimate) + ", past checkpoint.quota_gib (" +
        bytes_text(quota) + "); keep fewer (checkpoint.keep " +
        std::to_string(cfg.checkpoint.keep) + ") or raise the quota");
    return false;
  }
  struct statvfs fsinfo {};
  if (::statvfs(folder.c_str(), &fsinfo) == 0) {
    const double free = double(fsinfo.f_bavail) * double(fsinfo.f_frsize);
    constexpr double kReserve = double(1 << 30);
    if (free < estimate + kReserve) {
      log(which + " is not written: the file system of " + folder + " has " + bytes_text(free) +
          " free, and it needs about " + bytes_text(estimate) + " with 1 GiB to spare");
      return false;
    }
  }
  return true;
}

// checkpoint.keep: the newest `keep` round checkpoints of the job's folder stay, with their
// workers' inner states, and so does the one the job would go back to; older ones go.
void OuterAggregator::State::prune_checkpoints() {
  if (cfg.checkpoint.keep <= 0) return;
  int kept = 0;
  bool whole_seen = false;
  std::error_code ec;
  for (const auto& [r, round] : scan_checkpoints(folder).rounds) {
    // Newer than every whole checkpoint: being written (in streaming, the workers' files of
    // round r + 1 land before its checkpoint file does).
    if (!round.whole && !whole_seen) continue;
    whole_seen = whole_seen || round.whole;
    if (round.whole && kept < cfg.checkpoint.keep) {
      ++kept;
      continue;
    }
    if (round.whole && r == resume_round) continue;
    for (const fs::path& p : round.files) fs::remove(p, ec);
    log("checkpoint.keep: removed the checkpoint of round " + std::to_string(r));
  }
}

// Validation loss of θ (the same on every member), the windows shared out by
// whole batches so that each member evaluates about 1/K of them. A member lost
// meanwhile leaves the round's members and the others share the work again;
// nothing when none is left.
std::optional<double> OuterAggregator::State::evaluate(int64_t windows) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<int> group = active();
    if (group.empty()) return std::nullopt;
    std::vector<int64_t> counts;
    std::vector<int> who;
    std::vector<Future<double>> parts;
    // inner.budget: time, every member's speed known: shared by speed, so that a straggler's
    // equal share does not hold the round up.
    std::vector<double> speeds;
    if (cfg.inner.budget == dl::InnerBudget::time)
      for (double s : step_seconds_of_members(group)) {
        if (!(s > 0)) break;
        speeds.push_back(1.0 / s);
      }
    const std::vector<EvalPart> split =
        speeds.size() == group.size()
            ? evaluation_split(windows, cfg.inner.batch_size, speeds)
            : evaluation_split(windows, cfg.inner.batch_size, int(group.size()));
    for (const EvalPart& p : split) {
      counts.push_back(p.end - p.begin);
      who.push_back(group[size_t(p.member)]);
      parts.push_back(
          worker(group[size_t(p.member)]).call(&InnerWorker::evaluate_windows, p.begin, p.end));
    }
    std::vector<Failure> errors;
    auto got = gather(parts, errors, kEvaluateCall);
    double sum = 0;
    bool complete = true;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (got[i]) {
        sum += *got[i] * double(counts[i]);
      } else {
        complete = false;
        release(who[i], "failed while evaluating: " + errors[i].message);
      }
    }
    if (complete) return sum / double(windows);
  }
  return std::nullopt;
}

std::optional<double> OuterAggregator::State::evaluation_of(int64_t completed,
                                                            const std::vector<EvalPart>& parts) {
  std::vector<Future<double>> asked;
  for (const EvalPart& p : parts) {
    if (!slots[size_t(p.member)].handle) {  // removed by the guard as the round ended
      log("round " + std::to_string(completed) + ": worker " + std::to_string(p.member) +
          " held a share of θ's evaluation and left the job; evaluated later");
      return std::nullopt;
    }
    asked.push_back(worker(p.member).call(&InnerWorker::evaluation, completed));
  }
  std::vector<Failure> errors;
  auto got = gather(asked, errors, kEvaluationCall);
  double sum = 0;
  int64_t count = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!got[i]) {
      log("round " + std::to_string(completed) + ": worker " + std::to_string(parts[i].member) +
          "'s share of θ's evaluation is missing: " + errors[i].message);
      return std::nullopt;
    }
    sum += *got[i] * double(parts[i].end - parts[i].begin);
    count += parts[i].end - parts[i].begin;
  }
  if (count != windows) return std::nullopt;
  return sum / double(windows);
}

// Asks the active members in turn until one answers; a member that fails leaves.
template <class T>
std::optional<T> OuterAggregator::State::ask_any(
    const std::string& what, const std::function<Future<T>(ActorHandle<InnerWorker>&)>& call) {
  for (int m : active()) {
    try {
      return call(worker(m)).get(kCheckpointWrite);
    } catch (const std::exception& e) {
      release(m, "failed " + what + ": " + e.what());
    }
  }
  return std::nullopt;
}

// The job's rounds as a loop over decisions: each round is reconciled, run (blocking or
// streaming), and its outcome applied: recorded and checkpointed, done again (round_failed),
// or, when its members hold different θ (a bug), the job failed with the error (thrown).
void OuterAggregator::State::run() {
  if (!start()) return;
  int64_t r = resume_round;
  round = r;
  prepare(r);
  bool failed_before = false;  // the pass before counted round r's failure (round_failed)
  while (r < total_rounds && !stop) {
    // A round sent ahead went out with round r - 1's members, and nothing could change them
    // since (pipeline_next): no reconcile between the two.
    const bool sent_ahead = ahead && ahead->round == r;
    const double t_round = sent_ahead ? ahead_since : now_s();
    // Round r's failure in the pass before was counted there: the rewind it leads to is part
    // of it. A rewind for any other reason (members lost between rounds) counts now.
    const bool counted = std::exchange(failed_before, false);
    if (!sent_ahead && !reconcile(r)) {
      if (!counted) round_failed(r, "no worker holds the outer state any more");
      r = go_back();
      continue;
    }
    const std::vector<int> members = sent_ahead ? ahead->members : active();
    if (!sent_ahead) end_by_time(r);
    round_members.clear();
    round_late.clear();
    round_left_out.clear();
    round_guard_seconds = -1;
    round_steps.clear();
    RoundOutcome o = cfg.sync.mode != dl::SyncMode::blocking
                         ? stream_round(r, members, t_round, sent_ahead)
                         : blocking_round(r, members);
    if (o.kind == RoundOutcome::Kind::diverged) throw std::runtime_error(o.why);
    if (o.kind != RoundOutcome::Kind::completed) {
      round_failed(r, o.why, o.fix);
      failed_before = true;
      if (o.kind == RoundOutcome::Kind::rewind) r = go_back();
      continue;
    }
    if (o.group.size() < o.members.size()) deal_shards();  // the lost ones were released
    redos.completed(r);
    evict_left_out(r, o.members);
    r += 1;
    round = r;
    resuming = false;
    if (cfg.ends_at_tokens()) count_tokens(r, o.group);
    end_round(r, o, t_round);
  }
  if (stop) return;
  finish(r);
}

bool OuterAggregator::State::start() {
  // Restarted by the head after the job ended (its node died late): nothing to do.
  const JobInfo info = rt.job(job_id);
  if (info.finished()) return false;
  submitted_unix_ms = info.submitted_unix_ms;
  total_rounds = cfg.total_rounds();
  total_steps = int64_t(total_rounds) * cfg.inner.steps;
  fs::create_directories(folder);
  find_checkpoint();
  // Restarted (its node died): the slots the guard removed before stay removed.
  for (size_t i = 0; i < slots.size(); ++i)
    if (!slots[i].removed.empty())
      log("worker " + std::to_string(i) + " stays removed from the job: " + slots[i].removed);
  if (resume_from.empty() && !cfg.checkpoint.resume.empty())
    take_resume(cfg.ends_at_tokens() ? dl::kMaxRounds : total_rounds);
  if (cfg.ends_at_tokens()) {
    // Counted from the checkpoint's record (0 from a checkpoint.resume file: its job's tokens
    // are not this job's); the rounds are an estimate until the tokens are in.
    tokens_after[resume_from.empty() ? 0 : resume_round] = resume_from.empty() ? 0 : resume_tokens;
    const int64_t per_round = cfg.tokens_per_inner_step() * cfg.inner.steps * cfg.workers.count;
    total_rounds = rounds_estimate(resume_from.empty() ? 0 : resume_round,
                                   cfg.token_target() - tokens_done(), per_round, dl::kMaxRounds);
  }
  {
    // The job file beside its checkpoints: `loco submit --resume CKPT` needs no other.
    const std::string tmp = folder + "/job.yaml.tmp";
    *dl::open_job_stream(tmp, std::ios::out) << cfg.to_yaml() << "\n";
    fs::rename(tmp, folder + "/job.yaml");
  }
  if (cfg.autocodec.on) {
    // What one average carries: all of θ, or (streaming) about one fragment of it.
    const double n = double(cfg.model.parameter_count(cfg.vocab_size()));
    const int parts = cfg.sync.mode == dl::SyncMode::streaming ? std::max(1, cfg.sync.fragments) : 1;
    planner.emplace(cfg, size_t(std::ceil(n / parts)));
    if (auto c = dl::parse_choice(resume_codec); c && !resume_from.empty()) planner->resume(*c);
  }
  // The rounds after the checkpoint are redone (without one, round 0 too): their lines go.
  records.emplace(folder, resume_from.empty() ? -1 : resume_round);
  if (!resume_from.empty()) {
    log("resuming from " + resume_from + ": round " + std::to_string(resume_round) + " of " +
        std::to_string(total_rounds));
  } else {
    log("job " + cfg.name + ": " + std::to_string(cfg.workers.count) + " workers (min " +
        std::to_string(cfg.workers.min) + "), H=" + std::to_string(cfg.inner.steps) + ", " +
        std::to_string(total_rounds) + " rounds, compression " +
        cfg.compression_name() + "; folder " + folder);
  }
  // Said at submission: what a fixed sparse codec has cost where loco measured it.
  if (cfg.topk.on)
    log("compression topk: what sparse pseudo-gradients cost depends on the data more than on "
        "the model's size: from -9 % to +3.7 % of fp32 DiLoCo's loss on a corpus seen less than "
        "once (1 M to 25 M parameters, 10 to 40 rounds), up to +38 % on a 150 kB corpus seen "
        "many times (1 M, 20 rounds) in loco's runs (docs/results.md, \"Where sparse is safe\"); "
        "compression: auto sends it only when no dense codec fits the link");
  return true;
}

void OuterAggregator::State::prepare(int64_t r) {
  resuming = !resume_from.empty();
  (void)reconcile(r);
  while (!windows) {
    auto w = ask_any<int64_t>("to count the validation windows",
                              [](auto& h) { return h.call(&InnerWorker::validation_windows); });
    if (w)
      windows = *w;
    else
      (void)reconcile(r);
  }
  if (r == 0) {
    auto v = evaluate(windows);
    auto h =
        ask_any<uint64_t>("to hash θ", [](auto& w) { return w.call(&InnerWorker::theta_hash); });
    if (v) last_val = *v;
    report(0, 0, v, 0, 0, int(active().size()), 0, h.value_or(0));
  }
}

double OuterAggregator::State::job_time() const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return double(ms - submitted_unix_ms) / 1000.0;
}

// The head's cluster records since the last round's (none while the head is away: they come
// with a later round).
std::vector<dl::schema::ClusterLine> OuterAggregator::State::cluster_notes() {
  std::vector<dl::schema::ClusterLine> out;
  try {
    for (;;) {
      JobEvents ev = rt.job_events(job_id, events_cursor, 1000);
      for (const JobEvent& e : ev.events) {
        events_cursor = e.id;
        if (e.kind != kClusterRecord) continue;
        try {
          auto [text, what] =
              unpack_checked<std::tuple<std::string, std::string>>(e.data, "a cluster record");
          out.push_back({event_unix_ms(e.id), what.substr(0, 32), text.substr(0, 400)});
        } catch (const std::exception&) {
          // Not the head's: skipped.
        }
      }
      if (ev.events.size() < 1000) break;
    }
  } catch (const std::exception&) {
  }
  return out;
}

void OuterAggregator::State::report(int64_t r, double loss, std::optional<double> val, double tok_s,
                                    double util, int members, double round_time, uint64_t hash) {
  // The simulator's line format (loco-train writes the same), plus the job's figures.
  dl::RoundMetrics m;
  m.round = int(r);
  m.inner_steps = r * cfg.inner.steps;
  m.tokens_per_worker = m.inner_steps * cfg.tokens_per_inner_step();
  m.tokens_total = m.tokens_per_worker * members;
  m.train_loss = loss;
  m.val_loss = val;
  m.theta_hash = hash;
  if (!round_left_out.empty()) m.left_out = round_left_out;
  if (auto notes = cluster_notes(); !notes.empty()) m.cluster = std::move(notes);
  if (auto d = decisions.find(r - 1); d != decisions.end()) {
    m.codec = d->second.to.name();
    m.codec_reason = d->second.reason;
  }
  if (!round_fragment_codecs.empty()) m.fragment_codecs = std::exchange(round_fragment_codecs, {});
  const int failed = records->failed_attempts();
  const double job_seconds = job_time();
  const std::vector<StepFigures> steps = per_step_means(round_steps);
  records->round(
      m, RoundFigures{util, members, round_time, job_seconds, round_members, round_late, steps,
                      cfg.guard.on && !cfg.topk.on ? round_guard_seconds : -1});
  if (!steps.empty()) publish_steps(r, steps);
  JobProgress p;
  p.step = r;
  p.total = total_rounds;
  schema::Report rep;
  rep.inner_step = r * cfg.inner.steps;
  rep.loss = loss;
  if (val) {
    rep.val_loss = *val;
    rep.val_ppl = std::exp(*val);
  }
  rep.tokens_per_s = tok_s;
  rep.bytes_per_worker = records->bytes_per_worker();
  rep.job_bytes_per_worker = records->job_bytes_per_worker();
  rep.failed_attempts = failed;
  rep.redo = records->redo();
  rep.utilization = util;
  rep.workers = members;
  if (!round_late.empty()) rep.late = int(round_late.size());
  if (!round_left_out.empty()) {
    std::vector<int> who;
    for (const auto& l : round_left_out)
      if (std::find(who.begin(), who.end(), l.worker) == who.end()) who.push_back(l.worker);
    rep.left_out = int(who.size());
  }
  rep.left_out_total = double(left_out_total);
  // For the dashboard's axes and /metrics: the tokens the round's members processed, the
  // round's and the job's seconds.
  int64_t round_tokens = 0;
  for (const MemberFigures& f : round_members) round_tokens += f.tokens;
  // A round without its members' figures: H steps each.
  if (round_members.empty() && r > 0)
    round_tokens = int64_t(members) * cfg.inner.steps * int64_t(cfg.tokens_per_inner_step());
  rep.round_tokens = round_tokens;
  rep.round_time = round_time;
  rep.job_time = job_seconds;
  rep.allreduce_seconds_total = allreduce_total;
  p.metrics = schema::to_metrics(rep);
  publish([this, p] { rt.job_progress(job_id, p); });
}

void OuterAggregator::State::count_tokens(int64_t r, const std::vector<int>& group) {
  int64_t sum = 0;
  for (int m : group) sum += tokens_of[m];
  const int64_t averaged = tokens_done() + sum;
  tokens_after[r] = averaged;
  const int64_t remaining = cfg.token_target() - averaged;
  total_rounds = tokens_reached(remaining, cfg.tokens_per_inner_step(), int(group.size()),
                                last_by_tokens == r - 1, sum)
                     ? int(r)
                     : rounds_estimate(r, remaining, sum, dl::kMaxRounds);
  total_rounds = std::min(total_rounds, time_cap);
}

void OuterAggregator::State::end_by_time(int64_t next) {
  if (cfg.time_limit_minutes <= 0 || next + 1 >= total_rounds) return;
  const double minutes = job_time() / 60.0;
  if (minutes < cfg.time_limit_minutes) return;
  time_cap = int(next + 1);
  total_rounds = time_cap;
  char line[200];
  std::snprintf(line, sizeof line,
                "round %lld is the last: %.1f minutes since the job's submission, its "
                "time_limit_minutes %g",
                static_cast<long long>(next + 1), minutes, cfg.time_limit_minutes);
  log(line);
}

// Every member re-reads the checkpoint, and the rounds after it are redone, their records
// replaced. At the resume round nobody is asked to rewind again.
int64_t OuterAggregator::State::go_back() {
  pending_checkpoint.reset();  // not recorded: it may hold a round that is undone now
  const int64_t r = resume_round;
  // The rounds undone: their tokens too (resume_round is the start's or a completed round's).
  tokens_after.erase(tokens_after.upper_bound(r), tokens_after.end());
  round = r;
  resuming = true;
  records->go_back(r);
  // The undone rounds' operations run again, agreeing on codecs of their own (their reports
  // come under higher operation ids; those of the undone ones went with the workers' state).
  fragment_codec_ops.clear();
  round_fragment_codecs.clear();
  for (Slot& s : slots) s.active = false;
  (void)reconcile(r);
  return r;
}

void OuterAggregator::State::end_round(int64_t r, const RoundOutcome& o, double t_round) {
  std::vector<int> members = o.group;
  steps_since_eval += cfg.inner.steps;
  std::optional<double> val;
  if (evaluation_due(steps_since_eval, cfg.eval.every, r, total_rounds)) {
    // Streaming: evaluated by the members in the background as the round ended. Without all of
    // its parts, here and now, unless the next round already runs on the members (sent ahead):
    // then at the next round's end instead.
    if (!o.eval.empty())
      val = evaluation_of(r, o.eval);
    if (!val && !ahead) val = evaluate(windows);
    if (val) {
      last_val = *val;
      steps_since_eval = 0;
    } else {
      log("round " + std::to_string(r) + ": no worker left to evaluate θ; evaluated later");
    }
    members = active();
  }
  // With the next round sent ahead, this one ended as its results were in: what follows here
  // runs under the next round's inner steps, and counts in its time.
  const double round_end = ahead ? o.results_in : now_s();
  const double wall = round_end - t_round;
  inner_total += o.inner_secs;
  const double util = o.inner_secs / (double(o.ready.size()) * wall);
  const double tok_s =
      double(o.ready.size()) * double(cfg.inner.steps) * double(cfg.tokens_per_inner_step()) / wall;
  report(r, o.loss, val, tok_s, util, int(members.size()), wall - o.failed_secs, o.theta_hash);
  // Streaming and eager decided when they sent the round (send_stream's asked members).
  if (checkpoint_due(r, cfg.checkpoint.every, total_rounds) &&
      (cfg.sync.mode != dl::SyncMode::blocking || room_for_checkpoint(r)))
    checkpoint_round(r, members, o.asked_checkpoint);
  member_seconds += double(members.size()) * ((ahead ? o.results_in : now_s()) - t_round);
  flush();
}

void OuterAggregator::State::checkpoint_round(int64_t r, const std::vector<int>& members,
                                              const std::vector<int>& asked_checkpoint) {
  if (cfg.sync.mode != dl::SyncMode::blocking) {
    // Asked with the round's calls (send_stream): its members write it under the next round's
    // inner steps, and it is recorded after that round (settle_checkpoint). Members lost in
    // the round wrote nothing; those that finished it say when their files are written.
    if (asked_checkpoint.empty()) return;  // not asked: no room for it (room_for_checkpoint)
    PendingCheckpoint pc;
    pc.round = r;
    for (int m : asked_checkpoint)
      // Not a member the guard removed as the round ended: it writes nothing more.
      if (std::find(members.begin(), members.end(), m) != members.end() &&
          slots[size_t(m)].handle) {
        pc.members.push_back(m);
        pc.written.push_back(worker(m).call(&InnerWorker::checkpoint_written, r));
      }
    pending_checkpoint = std::move(pc);
    return;
  }
  const std::string file = checkpoint_file(r);
  std::vector<Future<std::string>> inner_files;
  for (int m : members)
    inner_files.push_back(
        worker(m).call(&InnerWorker::save_inner_state, inner_state_path(file, m)));
  auto path = ask_any<std::string>("to write a checkpoint", [&](auto& w) {
    return w.call(&InnerWorker::save_checkpoint, file);
  });
  std::vector<Failure> errors;
  gather(inner_files, errors,
         kCheckpointWrite);  // a worker without its file starts afresh on resume
  if (path) record_checkpoint(*path, r);
}

void OuterAggregator::State::finish(int64_t r) {
  // The end: θ's validation loss (if the last evaluation was lost) and final.pt,
  // from whichever workers are there.
  std::optional<std::string> final_path;
  for (int attempt = 0; !final_path; ++attempt) {
    if (attempt > 0) {
      if (attempt > 3) throw std::runtime_error("no worker could write the final checkpoint");
      for (Slot& s : slots) s.active = s.active && s.handle;
      (void)reconcile(r);  // no rewind after the last round: what is left writes final.pt
    }
    if (steps_since_eval > 0) {
      if (auto v = evaluate(windows)) {
        last_val = *v;
        steps_since_eval = 0;
      }
    }
    if (!room_for_checkpoint(r, "final.pt")) break;
    final_path = ask_any<std::string>("to write the final checkpoint", [&](auto& w) {
      return w.call(&InnerWorker::save_checkpoint, folder + "/final.pt");
    });
  }
  if (final_path) log(kCheckpointLine + *final_path);
  // A finished job holds no cpus.
  for (Slot& s : slots) {
    if (!s.handle) continue;
    try {
      rt.kill(s.handle->id());
    } catch (const std::exception& e) {
      log_warn(job_id + ": stopping " + s.name + ": " + e.what());
    }
  }
  // Plots are drawn outside the job, by whoever wants them (no program runs here).
  log("plots: loco plot " + job_id + " (while the cluster runs), or loco plot --metrics " +
      records->metrics_path());
  char msg[192];
  std::snprintf(
      msg, sizeof msg,
      "validation loss %.4f (perplexity %.2f) after %d rounds; compute utilization %.1f%%",
      last_val, std::exp(last_val), total_rounds,
      100.0 * inner_total / std::max(1e-9, member_seconds));
  // The end must reach the head: wait out a Redis restart (bounded).
  for (const double give_up = now_s() + double(kReportEnd.count());;) {
    try {
      if (flush()) {
        rt.job_finished(job_id, JobState::succeeded, msg);
        break;
      }
    } catch (const std::exception& e) {
      if (now_s() > give_up) throw;
    }
    if (now_s() > give_up)
      throw std::runtime_error("could not report the end of the job to the head");
    std::this_thread::sleep_for(kReportEndRetry);  // a retry of the head, not a wait on calls
  }
}

OuterAggregator::OuterAggregator(std::string job_id, std::string spec)
    : s_((begin_job_actor("diloco.OuterAggregator", job_id),
          std::make_shared<State>(std::move(job_id), spec))) {
  s_->cfg.validate();
  if (s_->cfg.sync.mode != dl::SyncMode::blocking &&
      (s_->cfg.ranks_per_worker(false) > 1 || s_->cfg.workers.gpus > 1))
    throw dl::ConfigError(
        "sync.mode: streaming and eager run one local rank per worker on a cluster for now "
        "(workers.local_ranks and workers.gpus must be 1)");
  // A corpus outside the node's data root, or missing, fails the submission, not round 1.
  dl::TokenStore::open(resolve_job_data(s_->roots, s_->cfg.data), s_->cfg.vocab_size());
  // So does an `init: hf:DIR` folder outside the data root, missing, or of another model.
  if (!s_->cfg.init.empty())
    dl::check_hf_folder(resolve_data_path(s_->roots, dl::hf_init_dir(s_->cfg.init), "init"),
                        s_->cfg.model, s_->cfg.vocab_size());
  // A TorchScript module is loaded and probed here, and its hash and size written into the job
  // the workers get (each checks its own file against them) and into its checkpoints.
  if (s_->cfg.model.is_torchscript()) {
    dl::require_code_models_allowed();
    s_->cfg.model.torchscript_file =
        resolve_data_path(s_->roots, s_->cfg.model.torchscript, "model.torchscript");
    dl::describe_torchscript(s_->cfg);
  }
  s_->check_memory();
  auto s = s_;
  s_->thread = std::thread([s] {
    try {
      s->run();
    } catch (const std::exception& e) {
      if (!s->stop) {
        log_error(s->job_id + ": " + e.what());
        try {
          s->rt.job_finished(s->job_id, JobState::failed, e.what());
        } catch (const std::exception& e2) {
          log_error(s->job_id + ": could not report the failure: " + e2.what());
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(s->done_mu);
      s->done = true;
    }
    s->done_cv.notify_all();
  });
}

// Killed (job cancelled or finished, or its node leaving): the loop stops at its
// next step. It may be waiting on a call (a reduce, a call to the head that is
// itself waiting on this node), so the node is not held up past a short grace:
// the thread is let go and ends on its own; it holds its State.
OuterAggregator::~OuterAggregator() {
  s_->stop = true;
  s_->wake.request_stop();
  {
    std::unique_lock<std::mutex> lock(s_->done_mu);
    s_->done_cv.wait_for(lock, kStopGrace, [&] { return s_->done.load(); });
  }
  if (s_->done)
    s_->thread.join();
  else
    s_->thread.detach();
}

int64_t OuterAggregator::round() const { return s_->round; }
std::string OuterAggregator::folder() const { return s_->folder; }

LOCO_REGISTER(OuterAggregator, loco::ActorClass<OuterAggregator>("diloco.OuterAggregator")
                                   .constructor<std::string, std::string>()
                                   .method("round", &OuterAggregator::round)
                                   .method("folder", &OuterAggregator::folder));

}  // namespace loco::actors
