#pragma once
// Shared by the DiLoCo job tests: a small job file, clusters of one-cpu nodes
// that load the DiLoCo plugin, and readers of a job's metrics and log.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "actors/job_records.hpp"
#include "client/client.hpp"
#include "tests/diloco/test_corpus.hpp"
#include "tests/runtime/core/cluster.hpp"

namespace loco::testing {

// A GPT of 2 layers x 64 on the test corpus: a round of 10 inner steps takes
// well under a second.
struct TestJob {
  std::string data, ckpt;
  int workers = 4, min = 4, rounds = 3, steps = 10, checkpoint_every = 0;
  int checkpoint_keep = 0;  // checkpoint.keep; 0: not in the file (keep every checkpoint)
  int max_restarts = 3, eval_batches = 4;
  int layers = 2;
  int eval_every = 0;  // eval.every; 0: H (θ evaluated after every round)
  double wait_s = 60;
  std::string compression = "fp32";
  uint64_t seed = 7;
  std::string device;  // "": the job file does not say (cpu)
  bool share_gpu = false;
  int local_ranks = 0;     // 0: the job file does not say (one rank per worker on the CPU)
  std::string sync;        // the `sync:` mapping, e.g. "{mode: streaming, fragments: 2}"; "": none
  double grace_max_s = 0;  // workers.grace_max_s; 0: not in the file (wait for every member)
  std::string budget;      // inner.budget ("steps" or "time"); "": not in the file
  int64_t token_budget = 0;  // > 0: `rounds: 0` and this token_budget (tokens per worker)
  double time_limit_minutes = 0;   // > 0: in the file
  std::string tokenizer = "byte";  // data.tokenizer: byte | bpe | a tokenizer.json
  int vocab = 0;                   // model.vocab; 0: not in the file (from the tokenizer)
  std::string lr = "0.003";        // inner.lr, as written in the file
  std::string guard;               // the `guard:` mapping, e.g. "{evict_after: 2}"; "": none
  std::string torchscript;         // model.torchscript (then the model is that module); "": the GPT

  std::string yaml() const {
    return "name: test\nseed: " + std::to_string(seed) + "\nthreads: 1\n" +
           (device.empty() ? "" : "device: " + device + "\n") +
           (torchscript.empty()
                ? "model: {layers: " + std::to_string(layers) + ", width: 64, heads: 2, context: 32"
                : "model: {torchscript: " + torchscript + ", context: 32") +
           (vocab ? ", vocab: " + std::to_string(vocab) : "") +
           "}\n"
           "data: {dir: " +
           data + ", tokenizer: " + tokenizer +
           ", shards: 16, val_fraction: 0.05}\n"
           "workers: {count: " +
           std::to_string(workers) + ", min: " + std::to_string(min) +
           ", max_restarts: " + std::to_string(max_restarts) +
           ", wait_s: " + std::to_string(wait_s) + (share_gpu ? ", share_gpu: true" : "") +
           (local_ranks ? ", local_ranks: " + std::to_string(local_ranks) : "") +
           (grace_max_s > 0 ? ", grace_max_s: " + std::to_string(grace_max_s) : "") +
           "}\n"
           "inner: {steps: " +
           std::to_string(steps) + ", batch_size: 8, lr: " + lr + ", warmup: 5" +
           (budget.empty() ? "" : ", budget: " + budget) +
           "}\n"
           "outer: {lr: 0.7, momentum: 0.9, nesterov: true}\n"
           "compression: " +
           compression + "\nrounds: " + std::to_string(token_budget > 0 ? 0 : rounds) +
           (token_budget > 0 ? "\ntoken_budget: " + std::to_string(token_budget) : "") +
           (time_limit_minutes > 0 ? "\ntime_limit_minutes: " + std::to_string(time_limit_minutes)
                                   : "") +
           "\n"
           "checkpoint: {every: " +
           std::to_string(checkpoint_every) + ", dir: " + ckpt +
           (checkpoint_keep ? ", keep: " + std::to_string(checkpoint_keep) : "") +
           "}\n"
           "eval: {every: " +
           std::to_string(eval_every ? eval_every : steps) +
           ", batches: " + std::to_string(eval_batches) + "}\n" +
           (sync.empty() ? "" : "sync: " + sync + "\n") +
           (guard.empty() ? "" : "guard: " + guard + "\n");
  }
};

// Sets an environment variable for the node processes started while it lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

// n nodes with one cpu each, loading the DiLoCo plugin: one worker per node.
inline ClusterOptions one_worker_per_node(int n) {
  ClusterOptions co;
  co.nodes = n;
  co.node_resources = "cpu=1";
  co.plugins = LOCO_PLUGIN_DIR_STR;
  return co;
}

// The same nodes loading the fault-injection plugin too (tests/actors/fault_injection.cpp),
// which acts on $LOCO_FAULT as the nodes see it: set it before the cluster starts.
inline ClusterOptions with_fault_injection(ClusterOptions co) {
  co.plugins += ":" LOCO_TEST_PLUGIN_DIR_STR "/libloco_fault_injection.so";
  return co;
}

// round -> val_loss, from a metrics.jsonl of loco-train or of a job.
inline std::map<int, double> val_losses(const std::string& path) {
  std::map<int, double> out;
  for (const std::string& line : actors::read_json_lines(path)) {
    const std::string r = actors::json_field(line, "round");
    const std::string v = actors::json_field(line, "val_loss");
    if (r.empty() || v.empty() || v == "null") continue;
    out[std::stoi(r)] = std::stod(v);
  }
  return out;
}

inline std::vector<std::string> jsonl(const std::string& path) {
  return actors::read_json_lines(path);
}

// round -> number of lines of metrics.jsonl that have it.
inline std::map<int, int> round_counts(const std::string& metrics) {
  std::map<int, int> out;
  for (const std::string& l : jsonl(metrics)) ++out[std::stoi(actors::json_field(l, "round"))];
  return out;
}

// Every round 0..last exactly once in metrics.jsonl; returns the last round.
inline int expect_each_round_once(const std::string& metrics) {
  auto counts = round_counts(metrics);
  int last = counts.empty() ? -1 : counts.rbegin()->first;
  for (int r = 0; r <= last; ++r) EXPECT_EQ(counts[r], 1) << "round " << r << " in " << metrics;
  return last;
}

// The job's log lines so far, each with the unix ms of its Redis stream id.
inline std::vector<std::pair<int64_t, std::string>> log_lines(JobHandle& job) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::string cursor;
  for (;;) {
    JobEvents ev = job.poll(cursor, 1000);
    if (ev.events.empty()) break;
    for (auto& e : ev.events)
      if (e.kind == "log") out.emplace_back(std::stoll(e.id.substr(0, e.id.find('-'))), e.data);
  }
  return out;
}

inline std::string log_text(JobHandle& job) {
  std::string s;
  for (auto& [ms, line] : log_lines(job)) s += line + "\n";
  return s;
}

class DilocoJob : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = diloco::testing::make_corpus_dir("job");
    char tmpl[] = "/tmp/loco-jobtest-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override {
    diloco::remove_tree(dir_);  // as data_: not libtorch.so's remove_all (diloco::remove_tree)
    diloco::remove_tree(data_);
  }
  TestJob job(int workers, int min, int rounds) const {
    TestJob j;
    j.data = data_;
    j.ckpt = dir_ + "/ckpt";
    j.workers = workers;
    j.min = min;
    j.rounds = rounds;
    return j;
  }
  std::string data_, dir_;
};

}  // namespace loco::testing
