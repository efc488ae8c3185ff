#include "tests/runtime/core/test_actors.hpp"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <numeric>
#include <stdexcept>
#include <thread>

namespace loco::testing {

int Counter::add(int n) { return value_ += n; }

int Counter::busy(int ms) {
  int at_once = ++running_;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  --running_;
  return at_once;
}

int Counter::sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return ms;
}

int Counter::wait_for_stop(std::string marker, int max_ms, bool listen) {
  std::ofstream(marker) << "running\n";
  if (!listen) return sleep_ms(max_ms);
  std::unique_lock<std::mutex> lock(stop_mu_);
  if (stop_cv_.wait_for(lock, std::chrono::milliseconds(max_ms), [&] { return stopped_; }))
    throw std::runtime_error("asked to stop");
  return max_ms;
}

void Counter::stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stopped_ = true;
  stop_cv_.notify_all();
}

bool Counter::wait_for_poke(int max_ms) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  return stop_cv_.wait_for(lock, std::chrono::milliseconds(max_ms), [&] { return pokes_ > 0; });
}

int Counter::poke() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stop_cv_.notify_all();
  return ++pokes_;
}

double Counter::sum(Blob b) {
  auto f = b.as<float>();
  return std::accumulate(f.begin(), f.end(), 0.0);
}

int Counter::fail(std::string message) { throw std::runtime_error(message); }

std::string Counter::whoami() const { return std::to_string(::getpid()); }

std::vector<int> Counter::gpus() const {
  if (this_actor().gpus != gpus_at_construction_)
    throw std::logic_error("this_actor().gpus differs between constructor and method");
  return this_actor().gpus;
}

LOCO_REGISTER(Counter, loco::ActorClass<Counter>("test.Counter")
                           .constructor<int>()
                           .on_stop(&Counter::stop)
                           .method("add", &Counter::add)
                           .method("get", &Counter::get)
                           .method("record", &Counter::record)
                           .method("log", &Counter::log)
                           .method("busy", &Counter::busy)
                           .method("sleep_ms", &Counter::sleep_ms)
                           .method("echo", &Counter::echo)
                           .method("sum", &Counter::sum)
                           .method("fail", &Counter::fail)
                           .method("whoami", &Counter::whoami)
                           .method("gpus", &Counter::gpus)
                           .method("wait_for_stop", &Counter::wait_for_stop)
                           .method("wait_for_poke", &Counter::wait_for_poke)
                           .concurrent_method("poke", &Counter::poke)
                           .method("add_to", &Counter::add_to)
                           .internal_method("reset", &Counter::reset));

}  // namespace loco::testing

#include <sstream>

#include "runtime/core/runtime.hpp"

namespace loco::testing {

FakeJob::FakeJob(std::string job_id, std::string spec) : job_id_(std::move(job_id)) {
  std::istringstream in(spec);
  std::string word;
  in >> word >> rounds_;
  if (!word.empty() && word.back() == ':') word.pop_back();  // YAML form "rounds: N"
  if (word != "rounds")
    throw std::invalid_argument("FakeJob spec: expected 'rounds N', got " + spec);
  fail_ = spec.find("fail") != std::string::npos;
  bad_report_ = spec.find("bad-report") != std::string::npos;
  with_steps_ = spec.find("with-steps") != std::string::npos;
  // "crash-on-start": the constructor takes its node down (a file that crashes its reader).
  if (spec.find("crash-on-start") != std::string::npos) ::raise(SIGKILL);
  // "slow-start PATH MS": writes PATH, then takes MS to construct (a constructor that spins).
  if (auto at = spec.find("slow-start "); at != std::string::npos) {
    std::istringstream slow(spec.substr(at + 11));
    std::string marker;
    int ms = 0;
    slow >> marker >> ms;
    std::ofstream(marker) << "constructing\n";
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  Runtime rt = Runtime::current();
  thread_ = std::thread([this, rt]() mutable {
    try {
      // A report that does not decode as one (its watchers must skip it, not stop).
      if (bad_report_) rt.job_record(job_id_, "report", std::string("\xc1 not msgpack", 14));
      for (int r = 1; r <= rounds_ && !stop_; ++r) {
        if (with_steps_) {
          // 4 inner steps a round, as the DiLoCo aggregator records them for the dashboard.
          std::vector<JobProgress> steps(4);
          for (int i = 0; i < 4; ++i) {
            steps[size_t(i)].step = (r - 1) * 4 + i + 1;
            steps[size_t(i)].metrics = {{"loss", 10.0 / r}, {"lr", 0.001}, {"grad_norm", 1.0}};
          }
          msgpack::sbuffer buf;
          msgpack::pack(buf, steps);
          rt.job_record(job_id_, "steps", std::string(buf.data(), buf.size()));
        }
        JobProgress p;
        p.step = r;
        p.total = rounds_;
        p.metrics["loss"] = 10.0 / r;
        p.metrics["workers"] = 2;
        p.metrics["inner_step"] = 4.0 * r;
        rt.job_progress(job_id_, p);
        done_ = r;
        if (rounds_ > 100) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (stop_) return;
      // A typed record of the job's own, as the DiLoCo aggregator writes for checkpoints:
      // in the event log, not for people (clients skip it).
      rt.job_record(job_id_, "fake-record", "FAKE-RECORD-DATA");
      rt.job_log(job_id_, "fake job done");
      if (fail_)
        rt.job_finished(job_id_, JobState::failed, "asked to fail");
      else
        rt.job_finished(job_id_, JobState::succeeded, "");
    } catch (const std::exception& e) {
      if (!stop_) rt.job_finished(job_id_, JobState::failed, e.what());
    }
  });
}

FakeJob::~FakeJob() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

LOCO_REGISTER(FakeJob, loco::ActorClass<FakeJob>("test.FakeJob")
                           .constructor<std::string, std::string>()
                           .method("rounds_done", &FakeJob::rounds_done));

int Counter::add_to(std::string name, int n, int blob_floats) {
  auto other = Runtime::current().get_actor<Counter>(name);
  other.tell(&Counter::add, n);
  const int value = other.call(&Counter::add, n).get(Millis(30000));
  std::vector<float> v(size_t(std::max(0, blob_floats)), 0.5f);
  Blob back = other.call(&Counter::echo, Blob::from_values(std::move(v))).get(Millis(30000));
  if (back.as<float>().size() != size_t(std::max(0, blob_floats))) return -1;
  for (float x : back.as<float>())
    if (x != 0.5f) return -1;
  return value;
}

}  // namespace loco::testing
