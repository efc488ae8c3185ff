// compression: auto (docs/decisions/0052-the-codec-that-fits-the-link.md): the codec of each
// round's averages, decided by the aggregator from what the round before measured, and the
// ladder it chooses from. No LibTorch here.
//
// A CodecChoice names the codec of one round's averages: a dense codec of the collective's
// all-reduce (fp32, bf16, int8), or topk with k entries per chunk gathered (the chunk, bits and
// β of the job's compression settings). It travels with the round's plan (ReduceRequest,
// StreamRequest) as its name: "fp32", "bf16", "int8", "topk:K", "topk:KqB-noef" (B bits a level,
// no error feedback).
//
// The rule (CodecPlanner::decide): the least lossy rung of the ladder whose exchange fits the
// window (a rung need not send fewer bytes than those above it), where
//   - an exchange's time is its bytes per member over the measured rate (bytes over seconds of
//     the last round's exchanges, the fastest member's: the others' include waits for it);
//   - the window is, in blocking rounds, `share` of the round (the inner steps' seconds over
//     1 − share); in streaming and eager, the time a fragment's average has before it is
//     needed (the overlap's steps at the measured seconds per step).
// Hysteresis: another rung is taken at once when the current one does not fit; a less lossy
// one only when it fits within `margin` of the window for `patience` rounds in a row. An
// exchange of less than kProbeBytes a member is mostly latency and understates the link: after
// `patience` rounds of those without a climb, the next round tries the rung above (a probe);
// a probe that does not fit doubles the wait before the next (at most 16 rounds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diloco/job/codec_choice.hpp"
#include "diloco/job/config.hpp"
#include "runtime/collective/types.hpp"

namespace loco::diloco {

// The choice a job without `compression: auto` runs every round: its codec, or its topk k.
CodecChoice fixed_choice(const JobConfig& cfg);

// The rungs `compression: auto` chooses from, least lossy first: fp32, bf16, int8, then (with
// `sparse` allowed) topk at a tenth of each chunk and kTenthBits without error feedback (where
// the job's k is below it), and topk at the job's k and bits with it.
inline constexpr std::uint32_t kTenthBits = 4;
std::vector<CodecChoice> codec_ladder(const JobConfig& cfg);

// Bytes one member sends for an average of n values among k members under `c`: the butterfly's
// 2 (k − 1)/k of the encoded vector, or its sparse code to each of the k − 1 others.
std::uint64_t choice_bytes(const CodecChoice& c, std::size_t n, int k, const TopkConfig& topk);

// A codec trace (`loco-train --codec-trace`): round r's codec at [r]. `text` is a job's
// metrics.jsonl (each line with "codec" gives round "round" − 1 its codec; lines without one are
// skipped) or one name a line, round 0 first. Every name is checked (parse_choice); a round a
// metrics file leaves out takes the one before's. Throws std::invalid_argument naming the line.
std::vector<std::string> read_codec_trace(const std::string& text);

// What one round measured, for the next round's decision.
struct LinkSample {
  std::uint64_t bytes = 0;  // sent by the member measured, in the round's exchanges
  double seconds = 0;       // that member's seconds in them
  double step_seconds = 0;  // the members' median seconds per inner step
};

struct CodecDecision {
  int round = 0;  // the round it is for (1-based, as logs count)
  CodecChoice from, to;
  std::string reason;  // "2.1 MB at 4.8 Mbit/s would take 3.5 s, the window is 1.9 s"
  bool changed() const { return !(from == to); }
};

class CodecPlanner {
 public:
  static constexpr std::uint64_t kProbeBytes = 1'000'000;
  // `n`: the values one average carries (blocking: θ; streaming: the largest fragment).
  CodecPlanner(const JobConfig& cfg, std::size_t n);
  // Round `round`'s codec (0-based), from the round before's sample among `members` members
  // (none: keep the current codec).
  CodecDecision decide(std::int64_t round, const std::optional<LinkSample>& last, int members);
  const CodecChoice& current() const { return ladder_[static_cast<std::size_t>(rung_)]; }
  // A resumed job's: the codec its checkpoint's round ran (the ladder's nearest rung).
  void resume(const CodecChoice& c);
  // The window the rule compares with, in seconds, for a round whose steps take `step_seconds`.
  double window(double step_seconds) const;

 private:
  JobConfig cfg_;
  std::size_t n_;
  std::vector<CodecChoice> ladder_;
  int rung_ = 0;
  int fits_above_ = 0;    // rounds in a row the rung above fitted within the margin
  int small_rounds_ = 0;  // rounds in a row measured on fewer than kProbeBytes
  int probe_wait_ = 1;    // such rounds before a probe: patience, doubled by each failed probe
  bool probing_ = false;  // the current rung is a probe's
};

}  // namespace loco::diloco
