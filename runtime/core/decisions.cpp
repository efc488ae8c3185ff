#include "runtime/core/decisions.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "runtime/core/util.hpp"

namespace loco {
namespace {

double get(const Resources& r, const std::string& k) {
  auto it = r.find(k);
  return it == r.end() ? 0.0 : it->second;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

namespace {
void count(NodeView& v, const ActorInfo& a) {
  for (auto& [k, amount] : a.resources)
    if (k != "gpu") v.used[k] += amount;
  if (!a.gpus.empty()) v.gpus.push_back({a.gpus, a.share_gpus});
  v.actors++;
}
void count_gpus(NodeView& v) {
  std::set<int> held;
  for (const GpuHold& h : v.gpus) held.insert(h.indices.begin(), h.indices.end());
  if (!held.empty()) v.used["gpu"] = double(held.size());
}
}  // namespace

std::vector<NodeView> node_views(const std::vector<NodeRecord>& nodes,
                                 const std::vector<ActorInfo>& actors) {
  std::vector<NodeView> out;
  std::map<std::string, size_t> at;
  for (const NodeRecord& n : nodes) {
    at[n.id] = out.size();
    out.push_back(NodeView{n.id, n.resources, {}, 0, {}, !behind_nat(n.reachability)});
  }
  for (const ActorInfo& a : actors) {
    auto it = at.find(a.node_id);
    if (it == at.end() || (a.state != ActorState::alive && a.state != ActorState::pending))
      continue;
    count(out[it->second], a);
  }
  for (NodeView& v : out) count_gpus(v);
  return out;
}

void occupy(std::vector<NodeView>& views, const ActorInfo& actor) {
  for (NodeView& v : views)
    if (v.id == actor.node_id) {
      count(v, actor);
      count_gpus(v);
      return;
    }
}

Placement place_reachable(const std::vector<NodeView>& nodes, const Resources& demand,
                          const std::set<std::string>& suspects,
                          const std::function<bool(const std::string&)>& connected,
                          bool share_gpus) {
  std::set<std::string> unconnected;
  for (const NodeView& v : nodes)
    if (!v.direct && !connected(v.id)) unconnected.insert(v.id);
  std::set<std::string> exclude = suspects;
  exclude.insert(unconnected.begin(), unconnected.end());
  Placement where = place(nodes, demand, exclude, share_gpus);
  if (!where.node) where = place(nodes, demand, unconnected, share_gpus);
  if (!where.node && !unconnected.empty())
    where.reason += " (" + std::to_string(unconnected.size()) +
                    " node(s) behind NAT not connected to the head yet)";
  return where;
}

std::optional<std::vector<int>> assign_gpus(int total, const std::vector<GpuHold>& held, int count,
                                            bool shared) {
  if (count <= 0) return std::vector<int>{};
  std::vector<int> sharers(size_t(std::max(0, total)), 0);
  std::vector<bool> exclusive(sharers.size(), false);
  for (const GpuHold& h : held)
    for (int i : h.indices) {
      if (i < 0 || i >= total) continue;
      if (h.shared)
        sharers[size_t(i)]++;
      else
        exclusive[size_t(i)] = true;
    }
  std::vector<int> candidates;
  for (int i = 0; i < total; ++i)
    if (!exclusive[size_t(i)] && (shared || sharers[size_t(i)] == 0)) candidates.push_back(i);
  if (int(candidates.size()) < count) return std::nullopt;
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int a, int b) { return sharers[size_t(a)] < sharers[size_t(b)]; });
  candidates.resize(size_t(count));
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

Placement place(const std::vector<NodeView>& nodes, const Resources& demand,
                const std::set<std::string>& exclude, bool share_gpus) {
  const double gpu_need = get(demand, "gpu");
  if (gpu_need > 0 && gpu_need != std::floor(gpu_need))
    return {std::nullopt, "gpu: whole GPUs only, got " + num(gpu_need), {}};
  // Counted as an int below (found by fuzz_spawn_request: 2.8e14 shared GPUs overflowed it).
  if (gpu_need > kMaxGpusPerActor)
    return {std::nullopt,
            "gpu: at most " + std::to_string(kMaxGpusPerActor) + " per actor, got " + num(gpu_need),
            {}};
  const NodeView* best = nullptr;
  std::vector<int> best_gpus;
  double best_cpu = -std::numeric_limits<double>::infinity();
  for (const NodeView& n : nodes) {
    if (exclude.count(n.id)) continue;
    bool fits = true;
    for (auto& [k, need] : demand)
      if (need > 0 && !(k == "gpu" && share_gpus) && get(n.total, k) - get(n.used, k) + 1e-9 < need)
        fits = false;
    if (!fits) continue;
    std::optional<std::vector<int>> gpus;
    if (gpu_need > 0) {
      gpus = assign_gpus(int(std::floor(get(n.total, "gpu") + 1e-9)), n.gpus, int(gpu_need),
                         share_gpus);
      if (!gpus) continue;
    }
    double cpu_left = get(n.total, "cpu") - get(n.used, "cpu") - get(demand, "cpu");
    bool better = !best || cpu_left > best_cpu ||
                  (cpu_left == best_cpu &&
                   (n.direct > best->direct ||
                    (n.direct == best->direct &&
                     (n.actors < best->actors || (n.actors == best->actors && n.id < best->id)))));
    if (better) {
      best = &n;
      best_cpu = cpu_left;
      best_gpus = gpus.value_or(std::vector<int>{});
    }
  }
  if (best) return {best->id, "", best_gpus};

  int live = 0;
  for (const NodeView& n : nodes) live += exclude.count(n.id) ? 0 : 1;
  if (live == 0) return {std::nullopt, "no live node in the cluster", {}};
  // Name every resource that no single node has enough of.
  std::string reason;
  for (auto& [k, need] : demand) {
    if (need <= 0 || (k == "gpu" && share_gpus)) continue;
    double largest = 0, total = 0;
    std::string where;
    for (const NodeView& n : nodes) {
      if (exclude.count(n.id)) continue;
      double free = get(n.total, k) - get(n.used, k);
      total += get(n.total, k);
      if (free > largest || where.empty()) {
        largest = std::max(largest, free);
        where = n.id;
      }
    }
    if (largest + 1e-9 >= need) continue;
    if (!reason.empty()) reason += "; ";
    reason += "no node has " + num(need) + " free " + k + " (most free: " + num(largest) + " on " +
              where + ", cluster total " + num(total) + ")";
  }
  if (reason.empty() && gpu_need > 0 && share_gpus)
    reason = "no node has " + num(gpu_need) + " gpu free or shared (not held by an actor that " +
             "does not share)";
  if (reason.empty()) reason = "no single node has all of " + format_resources(demand) + " free";
  return {std::nullopt, reason, {}};
}

void FailureDetector::observe(const std::string& node, const std::optional<std::string>& heartbeat,
                              int64_t now) {
  auto it = seen_.find(node);
  if (it == seen_.end()) {
    seen_[node] = Seen{heartbeat, now};
    return;
  }
  Seen& s = it->second;
  if (heartbeat && heartbeat != s.heartbeat) {
    const int64_t silence = now - s.changed_at;
    if (silence >= timeout_ms_ / 2) ++s.late;
    s.longest_ms = std::max(s.longest_ms, silence);
    s.changed_at = now;
  }
  s.heartbeat = heartbeat;
}

std::optional<FailureDetector::Health> FailureDetector::health(const std::string& node,
                                                               int64_t now) const {
  auto it = seen_.find(node);
  if (it == seen_.end()) return std::nullopt;
  return Health{now - it->second.changed_at, it->second.late, it->second.longest_ms};
}

void FailureDetector::forget(const std::string& node) { seen_.erase(node); }

void FailureDetector::grace(int64_t now) {
  for (auto& [_, s] : seen_) s.changed_at = now;
}

int64_t FailureDetector::window_of(const Seen& s) const {
  return std::clamp(2 * s.longest_ms, timeout_ms_, 4 * timeout_ms_);
}

int64_t FailureDetector::window_ms(const std::string& node) const {
  auto it = seen_.find(node);
  return it == seen_.end() ? timeout_ms_ : window_of(it->second);
}

std::vector<FailureDetector::Verdict> FailureDetector::dead(int64_t now) const {
  std::vector<Verdict> out;
  for (auto& [node, s] : seen_) {
    const int64_t silent = now - s.changed_at;
    const int64_t window = window_of(s);
    if (silent < window) continue;
    std::string reason = "missed heartbeats for " + human_ms(silent);
    if (window > timeout_ms_)
      reason += " (its window " + human_ms(window) + ": it came back from " +
                human_ms(s.longest_ms) + " before)";
    out.push_back({node, reason});
  }
  return out;
}

std::set<std::string> FailureDetector::suspects(int64_t now) const {
  std::set<std::string> out;
  for (auto& [node, s] : seen_)
    if (now - s.changed_at >= window_of(s) / 2) out.insert(node);
  return out;
}

Resources parse_resources(const std::string& text) {
  Resources r;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string part =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() : comma + 1;
    if (part.empty()) continue;
    size_t eq = part.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument("resource '" + part + "': expected NAME=AMOUNT, e.g. cpu=2");
    std::string name = part.substr(0, eq);
    std::string amount = part.substr(eq + 1);
    char* end = nullptr;
    double v = std::strtod(amount.c_str(), &end);
    if (amount.empty() || *end != '\0' || v < 0)
      throw std::invalid_argument("resource '" + name + "': amount must be a number >= 0, got '" +
                                  amount + "'");
    r[name] = v;
  }
  return r;
}

std::string format_gpus(const std::vector<int>& gpus) {
  std::string out;
  for (int g : gpus) out += (out.empty() ? "" : ",") + std::to_string(g);
  return out.empty() ? "-" : out;
}

std::string format_resources(const Resources& r) {
  std::string out;
  for (auto& [k, v] : r) {
    std::string amount = num(v);
    if ((k == "memory" || k == "gpu_memory") && v >= (1 << 20)) {  // bytes, for people
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1fGiB", v / double(1 << 30));
      amount = buf;
    }
    out += (out.empty() ? "" : ",") + k + "=" + amount;
  }
  return out.empty() ? "none" : out;
}

std::string check_resources(const Resources& demand, const std::set<std::string>& declared) {
  for (const auto& [name, amount] : demand) {
    const std::string what = "resource '" + name.substr(0, 64) + "'";
    if (!kBuiltinResources.count(name) && !declared.count(name))
      return what + " is not one that any node declares (cpu, gpu, memory, gpu_memory, or a "
                    "node's --resources)";
    if (!std::isfinite(amount)) return what + " is not a finite number";
    if (amount < 0) return what + " is negative (" + num(amount) + ")";
    if (amount > 1e15) return what + " is larger than 1e15 (" + num(amount) + ")";
    // GPUs are handed out by index: a whole number a node could have.
    if (name == "gpu" && (amount != std::floor(amount) || amount > kMaxGpusPerActor))
      return what + " must be a whole number of GPUs, at most " +
             std::to_string(kMaxGpusPerActor) + " (got " + num(amount) + ")";
  }
  return {};
}

std::string size_over(const std::string& field, size_t bytes, size_t limit) {
  if (bytes <= limit) return {};
  return field + ": " + std::to_string(bytes) + " bytes, more than the limit of " +
         std::to_string(limit) + " bytes";
}

std::string check_spawn_request(const SpawnRequest& req, const std::set<std::string>* declared) {
  constexpr size_t kMaxCtorArgsBytes = size_t(16) << 20;
  for (std::string over : {size_over("class name", req.class_name.size(), kMaxJobNameBytes),
                           size_over("actor name", req.name.size(), kMaxJobNameBytes),
                           size_over("constructor arguments", req.ctor_args.size(),
                                     kMaxCtorArgsBytes)})
    if (!over.empty()) return over;
  if (req.class_name.empty()) return "empty actor class name";
  if (req.max_restarts < 0 || req.max_restarts > 1000)
    return "max_restarts " + std::to_string(req.max_restarts) + " is outside 0..1000";
  if (declared) return check_resources(req.resources, *declared);
  std::set<std::string> any;  // every name known: only the amounts are checked
  for (const auto& [name, amount] : req.resources) any.insert(name);
  return check_resources(req.resources, any);
}

bool class_matches(const std::vector<std::string>& patterns, const std::string& class_name) {
  for (const std::string& p : patterns) {
    if (!p.empty() && p.back() == '*') {
      if (class_name.compare(0, p.size() - 1, p, 0, p.size() - 1) == 0) return true;
    } else if (p == class_name) {
      return true;
    }
  }
  return false;
}

std::string check_scale(int workers, int job_max, int cluster_max) {
  if (workers < 1) return "a job needs at least 1 worker, not " + std::to_string(workers);
  if (job_max > 0 && workers > job_max)
    return std::to_string(workers) + " workers is more than the job's workers.max of " +
           std::to_string(job_max);
  if (workers > cluster_max)
    return std::to_string(workers) + " workers is more than this cluster allows a job (" +
           std::to_string(cluster_max) + ", the head's --max-job-workers)";
  return {};
}

std::string SubmissionLimits::admit(const std::string& key, const std::string& name, int running,
                                    int64_t now_ms) {
  for (auto it = recent_.begin(); it != recent_.end();) {
    auto& times = it->second;
    times.erase(times.begin(), std::lower_bound(times.begin(), times.end(), now_ms - 59999));
    it = times.empty() ? recent_.erase(it) : std::next(it);
  }
  if (running >= max_running_)
    return name + " has " + std::to_string(running) + " jobs running, the most one key may (" +
           std::to_string(max_running_) + "); wait for one to end or cancel one";
  auto& times = recent_[key];
  if (int(times.size()) >= per_minute_)
    return name + " submitted " + std::to_string(times.size()) +
           " jobs in the last minute, the most one key may (" + std::to_string(per_minute_) +
           "); try again in " + std::to_string((times.front() + 60000 - now_ms + 999) / 1000) +
           " s";
  times.push_back(now_ms);
  return {};
}

}  // namespace loco
