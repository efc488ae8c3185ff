#include "actors/outer_aggregator.hpp"


#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "actors/inner_worker.hpp"
#include "diloco/averager.hpp"
#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "diloco/simulator.hpp"
#include "runtime/core/runtime.hpp"

namespace loco::actors {

namespace dl = loco::diloco;
namespace fs = std::filesystem;

namespace {

std::vector<int> members_all(int k) {
  std::vector<int> v(k);
  for (int i = 0; i < k; ++i) v[i] = i;
  return v;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits for all futures; returns, per index, the value or the error message.
template <class T>
std::vector<std::optional<T>> gather(std::vector<Future<T>>& fs, std::vector<std::string>& errors,
                                     Millis timeout) {
  std::vector<std::optional<T>> out(fs.size());
  errors.assign(fs.size(), "");
  for (size_t i = 0; i < fs.size(); ++i) {
    try {
      out[i] = fs[i].get(timeout);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  return out;
}

}  // namespace

struct OuterAggregator::State {
  std::string job_id;
  dl::JobConfig cfg;
  Runtime rt;
  std::string folder;
  std::atomic<int64_t> round{0};
  std::atomic<bool> stop{false};
  std::thread thread;

  State(std::string id, const std::string& spec)
      : job_id(std::move(id)), cfg(dl::JobConfig::from_yaml(spec)), rt(Runtime::current()) {
    folder = fs::absolute(fs::path(cfg.checkpoint.dir) / job_id).string();
  }

  void log(const std::string& line) {
    log_info(job_id + ": " + line);
    rt.job_log(job_id, line);
  }

  void run();
  void plot(const std::string& jsonl, const std::string& png);
};

void OuterAggregator::State::run() {
  const int k = cfg.workers.count;
  const int rounds = cfg.total_rounds();
  const int64_t total_steps = int64_t(rounds) * cfg.inner.steps;
  fs::create_directories(folder);
  std::ofstream metrics(folder + "/metrics.jsonl", std::ios::app);
  log("job " + cfg.name + ": " + std::to_string(k) + " workers, H=" + std::to_string(cfg.inner.steps) +
      ", " + std::to_string(rounds) + " rounds, compression " + dl::to_string(cfg.compression) +
      "; folder " + folder);

  // Workers, one per slot, placed by the head.
  std::vector<ActorHandle<InnerWorker>> workers;
  std::vector<std::string> names, endpoints;
  std::vector<std::vector<int>> shards(k);  // each slot's data shards
  for (int i = 0; i < k; ++i) {
    std::string name = job_id + ".worker-" + std::to_string(i);
    workers.push_back(rt.spawn<InnerWorker>(
        ActorOptions().with_name(name).with_resources({{"cpu", 1}}), job_id,
        std::string(cfg.to_yaml()), i));
    names.push_back(name);
  }
  std::vector<Future<int64_t>> inits;
  for (int i = 0; i < k; ++i) {
    endpoints.push_back(workers[i].call(&InnerWorker::endpoint).get(Millis(30000)));
    WorkerInit wi;
    wi.index = i;
    wi.shards = shards[i] = dl::round_robin_shards(cfg.data.shards, i, k);
    wi.stream = uint64_t(i);
    wi.total_steps = total_steps;
    inits.push_back(workers[i].call(&InnerWorker::init, wi));
  }
  int64_t params = 0;
  for (auto& f : inits) params = f.get(Millis(300000));
  log("model: " + std::to_string(params) + " parameters; workers on " +
      [&] {
        std::string s;
        for (auto& w : workers) s += (s.empty() ? "" : ", ") + w.address();
        return s;
      }());

  auto report = [&](int r, int64_t step, double loss, std::optional<double> val, double tok_s,
                    double bytes, double util, int members, double secs, uint64_t hash) {
    JobProgress p;
    p.step = r;
    p.total = rounds;
    p.metrics["inner_step"] = double(step);
    p.metrics["loss"] = loss;
    if (val) {
      p.metrics["val_loss"] = *val;
      p.metrics["val_ppl"] = std::exp(*val);
    }
    p.metrics["tokens_per_s"] = tok_s;
    p.metrics["bytes_sent"] = bytes;
    p.metrics["utilization"] = util;
    p.metrics["workers"] = members;
    rt.job_progress(job_id, p);
    // The simulator's line format (loco-train writes the same), plus utilization.
    dl::RoundMetrics m;
    m.round = r;
    m.inner_steps = step;
    m.tokens_per_worker = step * cfg.tokens_per_inner_step();
    m.tokens_total = m.tokens_per_worker * members;
    m.train_loss = loss;
    m.val_loss = val;
    m.bytes_per_worker = uint64_t(bytes / std::max(1, members));
    m.seconds = secs;
    m.theta_hash = hash;
    std::string line = m.to_json();
    line.pop_back();
    char extra[96];
    std::snprintf(extra, sizeof extra, ",\"utilization\":%.4f,\"workers\":%d}", util, members);
    metrics << line << extra << "\n";
    metrics.flush();
  };

  // Validation loss of θ (the same on every member), the windows shared out by
  // whole batches so that each member evaluates about 1/K of them.
  const int64_t windows = workers[0].call(&InnerWorker::validation_windows).get(Millis(60000));
  auto evaluate = [&](const std::vector<int>& group) {
    const int64_t bs = cfg.inner.batch_size;
    const int64_t batches = (windows + bs - 1) / bs;
    const int64_t per = (batches + int64_t(group.size()) - 1) / int64_t(group.size());
    std::vector<std::pair<int64_t, Future<double>>> parts;
    for (size_t i = 0; i < group.size(); ++i) {
      int64_t b = int64_t(i) * per * bs, e = std::min(windows, (int64_t(i) + 1) * per * bs);
      if (b < e)
        parts.emplace_back(e - b, workers[group[i]].call(&InnerWorker::evaluate_windows, b, e));
    }
    double sum = 0;
    for (auto& [count, f] : parts) sum += f.get(Millis(300000)) * double(count);
    return sum / double(windows);
  };
  const double t_start = now_s();
  double val0 = evaluate(members_all(k));
  report(0, 0, 0, val0, 0, 0, 0, k, 0, workers[0].call(&InnerWorker::theta_hash).get(Millis(60000)));
  double bytes = 0, last_val = val0;
  // Whole-job utilization: time in inner steps over the time the members were
  // in the job, all rounds, checkpoints and evaluations included.
  double inner_total = 0, member_seconds = 0;
  double prev_end = now_s();
  int members_before = k;
  int64_t steps_since_eval = 0;
  std::vector<int> members = members_all(k);

  for (int r = 0; r < rounds && !stop; ++r) {
    const double t_round = now_s();
    // 1-2. Every member runs its H inner steps.
    std::vector<Future<InnerResult>> inner;
    for (int m : members) inner.push_back(workers[m].call(&InnerWorker::inner, int64_t(r)));
    std::vector<std::string> errors;
    auto results = gather(inner, errors, Millis(3600 * 1000));
    std::vector<int> ready;
    double loss = 0, inner_secs = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (results[i]) {
        ready.push_back(members[i]);
        loss += results[i]->mean_loss;
        inner_secs += results[i]->seconds;
      } else {
        log("worker " + std::to_string(members[i]) + " failed in round " + std::to_string(r + 1) +
            ": " + errors[i]);
      }
    }
    if (int(ready.size()) < std::max(1, cfg.workers.min))
      throw std::runtime_error("round " + std::to_string(r + 1) + ": " + std::to_string(ready.size()) +
                               " workers left, below workers.min = " + std::to_string(cfg.workers.min));
    loss /= double(ready.size());
    // 3-5. The group averages Δ and steps; every member reports θ's hash.
    std::vector<int> group = ready;
    std::optional<uint64_t> agreed;
    double reduce_bytes = 0;
    for (uint64_t attempt = 0; !agreed; ++attempt) {
      ReduceRequest req;
      req.round = r;
      req.attempt = attempt;
      for (int m : group) {
        req.names.push_back(names[m]);
        req.endpoints.push_back(endpoints[m]);
      }
      std::vector<Future<ReduceResult>> red;
      for (size_t i = 0; i < group.size(); ++i) {
        req.rank = int(i);
        red.push_back(workers[group[i]].call(&InnerWorker::reduce, req));
      }
      auto rr = gather(red, errors, Millis(600 * 1000));
      std::vector<int> alive;
      bool all_ok = true;
      for (size_t i = 0; i < group.size(); ++i) {
        if (rr[i]) {
          alive.push_back(group[i]);
          continue;
        }
        all_ok = false;
        bool died = errors[i].find("ActorDied") != std::string::npos ||
                    errors[i].find("died or is unreachable") != std::string::npos ||
                    errors[i].find("is dead") != std::string::npos;
        log("worker " + std::to_string(group[i]) + " failed the all-reduce of round " +
            std::to_string(r + 1) + ": " + errors[i]);
        if (!died) alive.push_back(group[i]);  // a survivor that saw a peer go: retry it
      }
      if (all_ok) {
        uint64_t h0 = rr[0]->theta_hash;
        for (size_t i = 0; i < group.size(); ++i) {
          reduce_bytes += double(rr[i]->bytes_sent);
          if (rr[i]->theta_hash != h0)
            throw std::runtime_error("round " + std::to_string(r + 1) + ": worker " +
                                     std::to_string(group[i]) + " holds a different θ (hash " +
                                     std::to_string(rr[i]->theta_hash) + " vs " + std::to_string(h0) + ")");
        }
        agreed = h0;
        break;
      }
      if (alive.size() == group.size() || attempt >= 3 || int(alive.size()) < std::max(1, cfg.workers.min))
        throw std::runtime_error("round " + std::to_string(r + 1) + ": the all-reduce failed " +
                                 std::to_string(attempt + 1) + " times; last: " + errors[0]);
      log("round " + std::to_string(r + 1) + " re-formed with " + std::to_string(alive.size()) + " workers");
      group = alive;
    }
    if (group.size() < members.size()) {
      // Workers were lost: hand their shards to the survivors, so that no part
      // of the data goes unread (round-robin over the survivors, in slot order).
      std::vector<int> lost;
      for (int m : members)
        if (std::find(group.begin(), group.end(), m) == group.end()) lost.push_back(m);
      std::vector<std::vector<int>> next(group.size());
      for (size_t i = 0; i < group.size(); ++i) next[i] = shards[group[i]];
      size_t turn = 0;
      for (int m : lost)
        for (int sh : shards[m]) next[turn++ % group.size()].push_back(sh);
      std::vector<Future<void>> sets;
      for (size_t i = 0; i < group.size(); ++i) {
        shards[group[i]] = next[i];
        sets.push_back(workers[group[i]].call(&InnerWorker::set_shards, next[i]));
      }
      for (auto& f : sets) f.get(Millis(60000));
      std::string who;
      for (int m : lost) who += (who.empty() ? "" : ", ") + std::to_string(m);
      log("round " + std::to_string(r + 1) + ": lost worker(s) " + who + "; their shards went to the " +
          std::to_string(group.size()) + " others; going on with " + std::to_string(group.size()) +
          " workers");
    }
    members = group;
    bytes += reduce_bytes;
    round = r + 1;
    steps_since_eval += cfg.inner.steps;
    std::optional<double> val;
    if (steps_since_eval >= cfg.eval.every || r + 1 == rounds) {
      val = evaluate(members);
      last_val = *val;
      steps_since_eval = 0;
    }
    const double wall = now_s() - t_round;
    inner_total += inner_secs;
    member_seconds += double(members_before) * (now_s() - prev_end);
    prev_end = now_s();
    members_before = int(members.size());
    const double util = inner_secs / (double(ready.size()) * wall);
    const double tok_s = double(ready.size()) * double(cfg.inner.steps) *
                         double(cfg.tokens_per_inner_step()) / wall;
    report(r + 1, int64_t(r + 1) * cfg.inner.steps, loss, val, tok_s, bytes, util, int(members.size()),
           now_s() - t_start, *agreed);
    if (cfg.checkpoint.every > 0 && (r + 1) % cfg.checkpoint.every == 0 && r + 1 < rounds) {
      std::string path = workers[members[0]]
                             .call(&InnerWorker::save_checkpoint,
                                   folder + "/ckpt-round-" + std::to_string(r + 1) + ".pt")
                             .get(Millis(300000));
      log("checkpoint: " + path);
    }
  }
  if (stop) return;
  std::string final_path =
      workers[members[0]].call(&InnerWorker::save_checkpoint, folder + "/final.pt").get(Millis(300000));
  metrics.close();
  log("checkpoint: " + final_path);
  plot(folder + "/metrics.jsonl", folder + "/loss.png");
  char msg[192];
  std::snprintf(msg, sizeof msg,
                "validation loss %.4f (perplexity %.2f) after %d rounds; compute utilization %.1f%%",
                last_val, std::exp(last_val), rounds, 100.0 * inner_total / std::max(1e-9, member_seconds));
  rt.job_finished(job_id, "succeeded", msg);
}

// A PNG of the training and validation loss, drawn by gnuplot.
void OuterAggregator::State::plot(const std::string& jsonl, const std::string& png) {
  std::string dat = folder + "/loss.dat";
  {
    std::ifstream in(jsonl);
    std::ofstream out(dat);
    std::string line;
    auto field = [&](const std::string& l, const std::string& key) -> std::string {
      auto at = l.find("\"" + key + "\":");
      if (at == std::string::npos) return "";
      at += key.size() + 3;
      return l.substr(at, l.find_first_of(",}", at) - at);
    };
    while (std::getline(in, line)) {
      std::string v = field(line, "val_loss");
      out << field(line, "tokens") << " " << field(line, "train_loss") << " "
          << (v == "null" ? "NaN" : v) << "\n";
    }
  }
  std::string script = folder + "/loss.gp";
  std::ofstream(script) << "set terminal pngcairo size 900,540\nset output '" << png
                        << "'\nset title 'DiLoCo job " << job_id
                        << "'\nset xlabel 'tokens per worker'\nset ylabel 'loss'\nset grid\n"
                        << "set datafile missing 'NaN'\n"
                        << "plot '" << dat << "' using 1:2 every ::1 with lines title 'train', '"
                        << dat << "' using 1:3 with linespoints title 'validation'\n";
  if (std::system(("gnuplot '" + script + "' 2>/dev/null").c_str()) == 0 && fs::exists(png))
    log("plot: " + png);
  else
    log("plot: gnuplot is not installed or failed; metrics are in " + jsonl);
}

OuterAggregator::OuterAggregator(std::string job_id, std::string spec)
    : s_(std::make_shared<State>(std::move(job_id), spec)) {
  s_->cfg.validate();
  dl::TokenStore::open(s_->cfg.data);  // a missing corpus fails the submission, not round 1
  auto s = s_;
  s_->thread = std::thread([s] {
    try {
      s->run();
    } catch (const std::exception& e) {
      if (s->stop) return;
      log_error(s->job_id + ": " + e.what());
      try {
        s->rt.job_finished(s->job_id, "failed", e.what());
      } catch (const std::exception& e2) {
        log_error(s->job_id + ": could not report the failure: " + e2.what());
      }
    }
  });
}

OuterAggregator::~OuterAggregator() {
  s_->stop = true;
  if (s_->thread.joinable()) s_->thread.join();
}

int64_t OuterAggregator::round() const { return s_->round; }
std::string OuterAggregator::folder() const { return s_->folder; }

LOCO_REGISTER(OuterAggregator, loco::ActorClass<OuterAggregator>("diloco.OuterAggregator")
                                   .constructor<std::string, std::string>()
                                   .method("round", &OuterAggregator::round)
                                   .method("folder", &OuterAggregator::folder));

}  // namespace loco::actors
