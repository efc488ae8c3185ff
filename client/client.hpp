#pragma once
// The client API: submit DiLoCo jobs to a cluster and follow them.
//
//   loco::Client client("hostA:7070");
//   loco::JobHandle job = client.submit(loco::JobSpec::from_yaml_file("job.yaml"));
//   for (const loco::RoundReport& r : job.watch()) { ... }
//   job.wait();
#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../runtime/core/runtime.hpp"

namespace loco {

// A job file. The text is what the cluster gets; the client checks only that
// it is YAML with a name, the cluster's aggregator validates every field.
struct JobSpec {
  std::string text;
  std::string name;
  std::string path;  // where it was read from, for messages
  // The actor class that runs the job; DiLoCo's aggregator unless a test or
  // another application says otherwise.
  std::string entry_class = "diloco.OuterAggregator";
  // How often the entry actor is restarted when its node dies.
  int max_restarts = 3;
  // The most workers `loco scale` may ask for (the job file's workers.max; 0: the cluster's cap).
  int max_workers = 0;
  static JobSpec from_yaml(const std::string& text);
  static JobSpec from_yaml_file(const std::string& path);
};

// One round of a DiLoCo job as its aggregator reported it.
struct RoundReport {
  int round = 0;
  int rounds = 0;
  int inner_step = 0;   // inner steps done per worker so far
  double loss = 0;      // mean training loss of the round's inner steps
  double val_loss = 0;  // 0 when not evaluated this round
  double val_ppl = 0;
  double tokens_per_s = 0;  // all workers together
  // All-reduce bytes sent per worker, cumulative: over the rounds of θ's history
  // (metrics.jsonl's "bytes"), and over every attempt, failed ones and rounds
  // redone included ("job_bytes"; see actors/job_records.hpp).
  double bytes_per_worker = 0;
  double job_bytes_per_worker = 0;
  int failed_attempts = 0;  // all-reduce attempts of this round that failed
  int redo = 0;             // times the job had gone back to a checkpoint (0: never)
  double utilization = 0;   // time in inner steps / wall time, 0..1
  int workers = 0;
  int late = 0;  // members that missed the round's deadline (stragglers, sitting it out)
  std::string note;
  static RoundReport from(const JobProgress& p);
};

class JobHandle {
 public:
  JobHandle(Runtime rt, std::string id) : rt_(std::move(rt)), id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // One entry of the job's event log, decoded: a round's report, or a line
  // of its log.
  struct Update {
    std::optional<RoundReport> report;  // set for a report
    // With a report: its figures as sent ("round", "rounds" and the metrics map: loss,
    // val_loss, tokens_per_s, bytes_per_worker, workers, ...).
    std::map<std::string, double> figures;
    std::string line;                   // the log line otherwise
  };

  // The job's events as they come, until the job ends or `*stop` (when given)
  // becomes true; it is read between polls. Iterating gives the reports only;
  // next_update() gives log lines too. Single pass.
  class Watch {
   public:
    class iterator {
     public:
      using value_type = RoundReport;
      iterator() = default;
      explicit iterator(Watch* w) : w_(w) { ++*this; }
      const RoundReport& operator*() const { return current_; }
      const RoundReport* operator->() const { return &current_; }
      iterator& operator++();
      bool operator==(const iterator& o) const { return w_ == o.w_; }

     private:
      Watch* w_ = nullptr;
      RoundReport current_;
    };
    explicit Watch(JobHandle* job, const std::atomic<bool>* stop = nullptr)
        : job_(job), stop_(stop) {}
    iterator begin() { return iterator(this); }
    iterator end() { return iterator(); }

    // The next report or log line; nullopt once the job has ended (ended()
    // then holds its final record) or `*stop` became true.
    std::optional<Update> next_update();
    // The job's final record once the watch has seen it end; nullopt before,
    // and when it was stopped first.
    const std::optional<JobInfo>& ended() const { return ended_; }

   private:
    friend class iterator;
    std::optional<RoundReport> next();
    JobHandle* job_;
    const std::atomic<bool>* stop_;
    std::vector<JobEvent> pending_;
    size_t pos_ = 0;
    std::optional<JobInfo> ended_;
  };
  Watch watch(const std::atomic<bool>* stop = nullptr) { return Watch(this, stop); }

  // Log lines and reports since `cursor` (advanced); the job's current record.
  JobEvents poll(std::string& cursor, int max = 1000);
  // Everything the job's event log holds now, decoded, without waiting for more.
  std::vector<Update> updates_so_far();
  // The job's log lines so far.
  std::vector<std::string> logs();
  // One row per round reported so far: "round", "rounds" and the report's figures (loss,
  // val_loss, val_ppl, tokens_per_s, bytes_per_worker, workers, ...: what the dashboard plots).
  std::vector<std::map<std::string, double>> metrics();
  // One event of the log, decoded (a report, or a line of the log); nullopt for the job's own
  // typed records (other kinds), which are not for people.
  static std::optional<Update> decode(const JobEvent& e);
  // Waits for the end; throws TimeoutError after `timeout`. Returns the final record.
  JobInfo wait(Millis timeout = Millis(24LL * 3600 * 1000));
  JobInfo info();
  // Asks the job for `workers` workers from its next round on (DiLoCo: new
  // workers copy the outer state from a live one; surplus workers leave).
  JobInfo scale(int workers);
  JobInfo cancel();

 private:
  Runtime rt_;
  std::string id_;
  std::string cursor_;  // of watch()
};

class Client {
 public:
  explicit Client(const std::string& head_address, ConnectOptions opts = {});
  // Submits a DiLoCo job: the head starts its OuterAggregator.
  JobHandle submit(const JobSpec& spec);
  JobHandle job(const std::string& id) { return JobHandle(rt_, id); }
  std::vector<JobInfo> jobs() { return rt_.list_jobs(); }
  Runtime& runtime() { return rt_; }

 private:
  Runtime rt_;
};

}  // namespace loco
