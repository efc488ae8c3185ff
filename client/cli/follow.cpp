#include "client/cli/follow.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "client/cli/common.hpp"

namespace loco::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string progress_line(const RoundReport& r) {
  const int width = 20;
  int filled = r.rounds > 0 ? int(double(r.round) / r.rounds * width + 0.5) : 0;
  std::string bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  std::string extra;
  if (r.failed_attempts > 0)
    extra += "  " + std::to_string(r.failed_attempts) + " failed all-reduce attempt" +
             (r.failed_attempts > 1 ? "s" : "");
  if (r.redo > 0) extra += "  redone (" + std::to_string(r.redo) + ")";
  if (r.late > 0)
    extra += "  " + std::to_string(r.late) + " late (straggler" + (r.late > 1 ? "s" : "") + ")";
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "%s round %d/%d  step %d  loss %.3f%s  %.1fk tok/s  sent %s/worker  util %.0f%%  workers "
      "%d%s",
      bar.c_str(), r.round, r.rounds, r.inner_step, r.loss,
      r.val_loss > 0 ? ("  val ppl " + std::to_string(r.val_ppl).substr(0, 6)).c_str() : "",
      r.tokens_per_s / 1000, human_bytes(r.bytes_per_worker).c_str(), r.utilization * 100,
      r.workers, extra.c_str());
  return buf;
}

}  // namespace

std::optional<JobInfo> follow(JobHandle& job, bool progress) {
  bool tty = ::isatty(1);
  bool bar_shown = false;
  JobHandle::Watch watch = job.watch(&stop_requested());
  while (std::optional<JobHandle::Update> u = watch.next_update()) {
    if (u->report) {
      if (!progress) continue;
      std::string line = progress_line(*u->report);
      if (tty) {
        std::printf("\r\033[K%s", line.c_str());
        bar_shown = true;
      } else {
        std::printf("%s\n", line.c_str());
      }
    } else {
      if (bar_shown) std::printf("\r\033[K");
      std::printf("%s\n", u->line.c_str());
      bar_shown = false;
    }
    std::fflush(stdout);
  }
  if (bar_shown) std::printf("\n");
  return watch.ended();
}

}  // namespace loco::cli
