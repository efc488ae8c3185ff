// Fault injection for the fault-tolerance tests: a test plugin (build/plugins-testing) that a
// test's nodes load by file name (job_util.hpp's with_fault_injection) and that nothing else
// loads. Loaded with $LOCO_FAULT set, its static initialiser installs round hooks
// (actors/round_hooks.hpp) that act on every InnerWorker of the process:
//
//   worker=I,round=R,at=inner    the process hosting worker I SIGKILLs itself halfway through
//                                round R's inner steps (R counted from 1)
//   worker=I,round=R,at=reduce   ... right after its first all-reduce message of round R
//   worker=I,round=R,at=stream   ... halfway through streaming round R, fragments in flight;
//                                with signal=term it SIGTERMs its node instead and waits
//                                (at most 30 s) until the node asks the worker to stop
//   worker=I,round=R,at=stall[,stall_s=S]   worker I sleeps S s (20) before round R's inner
//                                steps, its node still answering heartbeats (stuck, not dead)
//   worker=I,round=R,at=stream_stall[,stall_s=S]   worker I's stream() of round R sleeps S s
//                                (20) halfway through the round, before a fragment's average,
//                                its node still answering: the others wait for it in that
//                                fragment's operation
//   worker=I,round=R,at=after_allreduce     worker I's reduce of round R throws once after
//                                its all-reduce returned (the others took their outer step)
//   worker=I,round=R,at=fragment_fail   worker I's stream() of round R throws once as it
//                                starts fragment 1's average, fragment 0's still in flight: a
//                                member that fails a streaming round alive, the others in it
//                                and in the round sent ahead behind it
//   worker=I,round=R,at=end_stall[,stall_s=S]   worker I's stream() of round R sleeps S s (20)
//                                at the round's end, before its last fragment's average: the
//                                others hold that fragment in flight, waiting for it
//   worker=I,round=R,at=return_stall[,stall_s=S]   worker I's stream() of round R sleeps S s
//                                (20) once its events are done, before it returns: its last
//                                fragment's average goes on meanwhile
//   ...,until_file=PATH          any stall above ends early once PATH exists (a test releases
//                                it when what the stall was for has happened)
//   worker=I,round=R,at=mark     worker I's stream() of round R appends the moment as it ends
//   worker=I,delay_ms=D          worker I sleeps D ms after each of its inner steps, in every
//                                round (a slower worker); no `at` needed
//   worker=I,round=R,at=diverge  worker I's inner loss reads NaN at step H/2 of round R (as a
//                                step the trainer refused to take): it stops the round there
//   worker=I,round=R,corrupt=KIND   worker I's Δ corrupted (diloco::guard::corrupt: nan, scale,
//                                flip, noise) in every average from round R on: a broken or
//                                hostile worker, for the guard's tests; with rounds=N only in
//                                rounds R..R+N-1
//   ...,round_file=PATH          instead of round=R, in any plan above: R is the number PATH
//                                holds once it exists (the soak bench writes it when its
//                                schedule says so; a test arms a fault for a round redone)
//
// Several faults: their plans joined by ';' (each as above). A kill, stall, mark or SIGTERM
// appends the moment (unix ms) to $LOCO_FAULT_LOG and to $LOCO_FAULT_LOG.N (N: the plan's
// place, from 0), so that a test can time the detection or wait for one fault; with
// $LOCO_FAULT_LOG set, a fault fires once in the whole test (not again in the worker that
// replaces the victim, should the job redo that round).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "actors/round_hooks.hpp"
#include "diloco/round/guard.hpp"
#include "runtime/collective/types.hpp"
#include "runtime/core/util.hpp"

namespace loco::testing {
namespace {

using actors::RoundContext;
using actors::RoundPoint;

struct FaultPlan {
  int worker = -1;
  int64_t round = -1;  // from 1
  std::string at;
  double stall_s = 20;
  int delay_ms = 0;
  bool sigterm = false;
  std::optional<diloco::guard::Fault> corrupt;
  int64_t rounds = 0;  // corrupt: in this many rounds from `round` (0: every one)
  std::string round_file;
  std::string until_file;

  static FaultPlan parse(const std::string& s) {
    FaultPlan p;
    for (size_t at = 0; at < s.size();) {
      size_t end = s.find(',', at);
      std::string kv = s.substr(at, end == std::string::npos ? std::string::npos : end - at);
      auto eq = kv.find('=');
      if (eq != std::string::npos) {
        std::string k = kv.substr(0, eq), val = kv.substr(eq + 1);
        if (k == "worker") p.worker = std::stoi(val);
        if (k == "round") p.round = std::stoll(val);
        if (k == "at") p.at = val;
        if (k == "stall_s") p.stall_s = std::stod(val);
        if (k == "delay_ms") p.delay_ms = std::stoi(val);
        if (k == "signal") p.sigterm = val == "term";
        if (k == "corrupt") p.corrupt = diloco::guard::parse_fault(val);
        if (k == "rounds") p.rounds = std::stoll(val);
        if (k == "round_file") p.round_file = val;
        if (k == "until_file") p.until_file = val;
      }
      if (end == std::string::npos) break;
      at = end + 1;
    }
    return p;
  }
};

// $LOCO_FAULT_LOG's file for plan `index` (empty: none).
std::string plan_log(size_t index) {
  const char* log = std::getenv("LOCO_FAULT_LOG");
  return log ? std::string(log) + "." + std::to_string(index) : std::string();
}

void log_moment(size_t index) {
  const char* log = std::getenv("LOCO_FAULT_LOG");
  if (!log) return;
  const int64_t now = unix_ms();
  std::ofstream(log, std::ios::app) << now << "\n";
  std::ofstream(plan_log(index), std::ios::app) << now << "\n";
}

[[noreturn]] void die(size_t index) {
  log_moment(index);
  ::kill(::getpid(), SIGKILL);
  std::abort();
}

// Sleeps `seconds`, or less once `until_file` (when not empty) exists.
void stall(double seconds, const std::string& until_file) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(seconds * 1000));
  while (std::chrono::steady_clock::now() < end) {
    if (!until_file.empty() && std::filesystem::exists(until_file)) return;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(50), end - std::chrono::steady_clock::now()));
  }
}

// One plan's hooks.
class Fault {
 public:
  Fault(FaultPlan plan, size_t index) : plan_(std::move(plan)), index_(index) {}

  void at(RoundPoint point, const RoundContext& c) {
    if (c.worker != plan_.worker) return;
    switch (point) {
      case RoundPoint::before_inner_steps:
        if (!hits(c, "stall")) return;
        log_moment(index_);
        stall(plan_.stall_s, plan_.until_file);
        return;
      case RoundPoint::after_inner_step:
        if (c.step_loss && c.step == std::max(1, c.steps_per_round / 2) && hits(c, "diverge")) {
          *c.step_loss = std::numeric_limits<double>::quiet_NaN();
          return;
        }
        if (plan_.delay_ms > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(plan_.delay_ms));
          return;  // a slower worker is not killed in inner()
        }
        if (std::string_view(c.method) == "inner" && c.step == std::max(1, c.steps_per_round / 2) &&
            hits(c, "inner"))
          die(index_);
        return;
      case RoundPoint::stream_events:
        if (c.step >= c.steps_per_round / 2 && hits(c, "stream_stall") && !fired_.exchange(true)) {
          log_moment(index_);
          stall(plan_.stall_s, plan_.until_file);
          return;
        }
        if (c.step == c.steps_per_round && hits(c, "end_stall") && !fired_.exchange(true)) {
          log_moment(index_);
          stall(plan_.stall_s, plan_.until_file);
          return;
        }
        if (c.step < c.steps_per_round / 2 || !hits(c, "stream")) return;
        if (!plan_.sigterm) die(index_);
        log_moment(index_);
        ::kill(::getpid(), SIGTERM);
        // The node's stop reaches this worker within its next poll; a tiny test model could
        // otherwise finish the round first.
        for (int i = 0; i < 3000 && !c.stopping->load(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      case RoundPoint::stream_end:
        if (hits(c, "mark") && !fired_.exchange(true)) log_moment(index_);
        if (hits(c, "return_stall") && !fired_.exchange(true)) {
          log_moment(index_);
          stall(plan_.stall_s, plan_.until_file);
        }
        return;
      case RoundPoint::before_allreduce:
        if (hits(c, "reduce")) c.collective->after_send = [i = index_](uint64_t) { die(i); };
        return;
      case RoundPoint::after_allreduce:
        if (hits(c, "after_allreduce") && !fired_.exchange(true))
          throw std::runtime_error("injected fault: after the all-reduce of round " +
                                   std::to_string(c.round + 1));
        return;
      case RoundPoint::pseudo_gradient:
        if (c.step == 1 && std::string_view(c.method) == "stream" && hits(c, "fragment_fail") &&
            !fired_.exchange(true)) {
          log_moment(index_);
          throw std::runtime_error("injected fault: worker " + std::to_string(c.worker) +
                                   " fails fragment 1 of round " + std::to_string(c.round + 1));
        }
        if (plan_.corrupt && corrupts(c.round + 1))
          diloco::guard::corrupt(c.delta, *plan_.corrupt,
                                 (uint64_t(c.round) << 32) ^ (uint64_t(c.step) << 16) ^
                                     uint64_t(c.worker));
        return;
    }
  }

 private:
  // The plan's round (from 1): `round`, or the number round_file holds once it exists (-1:
  // not yet written).
  int64_t armed_round() const {
    if (plan_.round_file.empty()) return plan_.round;
    std::ifstream in(plan_.round_file);
    int64_t from = -1;
    return in >> from ? from : -1;
  }

  bool corrupts(int64_t round) const {
    const int64_t from = armed_round();
    return from > 0 && round >= from && (plan_.rounds <= 0 || round < from + plan_.rounds);
  }

  bool hits(const RoundContext& c, const char* where) const {
    // The point first: round_file is read only at the plan's own point.
    if (plan_.at != where || armed_round() != c.round + 1) return false;
    const std::string log = plan_log(index_);
    return log.empty() || !std::filesystem::exists(log);
  }

  const FaultPlan plan_;
  const size_t index_;
  // at=after_allreduce, fragment_fail, stream_stall, end_stall, return_stall, mark: once per
  // process
  std::atomic<bool> fired_{false};
};

class FaultInjection : public actors::RoundHooks {
 public:
  explicit FaultInjection(const std::string& plans) {
    for (size_t at = 0, i = 0; at <= plans.size(); ++i) {
      const size_t end = std::min(plans.find(';', at), plans.size());
      faults_.push_back(std::make_unique<Fault>(FaultPlan::parse(plans.substr(at, end - at)), i));
      at = end + 1;
    }
  }
  void at(RoundPoint point, const RoundContext& c) override {
    for (auto& f : faults_) f->at(point, c);
  }

 private:
  std::vector<std::unique_ptr<Fault>> faults_;
};

[[maybe_unused]] const bool installed = [] {
  const char* v = std::getenv("LOCO_FAULT");
  if (!v || !*v) return false;
  static FaultInjection hooks(v);
  actors::install_round_hooks(&hooks);
  log_info(std::string("fault injection installed: LOCO_FAULT=") + v);
  return true;
}();

}  // namespace
}  // namespace loco::testing
