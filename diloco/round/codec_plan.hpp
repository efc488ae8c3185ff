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
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
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

// The codecs a job's fragment operations agreed on (sync.mode streaming and eager, compression
// auto): (round, fragment) → name, both 0-based, from the metrics.jsonl lines' "fragment_codecs"
// ({"round" as logs count it, "fragment", "codec"} each; a later line's wins). Every name is
// checked; throws std::invalid_argument naming the line. Empty for a trace with none.
using FragmentCodecTrace = std::map<std::pair<std::int64_t, int>, std::string>;
FragmentCodecTrace read_fragment_codec_trace(const std::string& text);

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
  // `per_round`: decisions a round (a FragmentCodecPlanner's: the round's operations), which
  // the longest wait between probes, 16 rounds, is counted in.
  CodecPlanner(const JobConfig& cfg, std::size_t n, int per_round = 1);
  // Round `round`'s codec (0-based), from the round before's sample among `members` members
  // (none: keep the current codec).
  CodecDecision decide(std::int64_t round, const std::optional<LinkSample>& last, int members);
  const CodecChoice& current() const { return ladder_[static_cast<std::size_t>(rung_)]; }
  bool probing() const { return probing_; }  // the current rung is a probe's
  // A resumed job's: the codec its checkpoint's round ran (the ladder's nearest rung).
  void resume(const CodecChoice& c);
  // The window the rule compares with, in seconds, for a round whose steps take `step_seconds`.
  double window(double step_seconds) const;
  const std::vector<CodecChoice>& ladder() const { return ladder_; }
  int rung() const { return rung_; }
  // The rung the members agreed on (a fragment's operation, agree_codec): the planner stands
  // there; a climb it was waiting for starts again.
  void adopt(int rung);
  // "2.1 MB at 4.8 Mbit/s would take 3.5 s, the window is 1.9 s": `rung`'s exchange among
  // `members` at `rate` bytes a second against `window` seconds.
  std::string reading(int rung, double rate, double window, int members, const char* verb) const;

 private:
  JobConfig cfg_;
  std::size_t n_;
  std::vector<CodecChoice> ladder_;
  int rung_ = 0;
  int fits_above_ = 0;    // rounds in a row the rung above fitted within the margin
  int small_rounds_ = 0;  // rounds in a row measured on fewer than kProbeBytes
  int probe_cap_ = 16;    // the longest wait between probes: 16 rounds
  int probe_wait_ = 1;    // such rounds before a probe: patience, doubled by each failed probe
  bool probing_ = false;  // the current rung is a probe's
};

// sync.mode streaming and eager with compression auto: each fragment's operation runs the codec
// its members agree on as it begins (decision 0052), not the round's. A codec decided per round
// is decided a round ahead (streaming sends rounds ahead), so a link that drops carried two
// rounds of the old codec's fragments, queued one behind another; an operation begins only once
// the one before it has ended, so its members have measured that one, on every link.
//
// Each member proposes a rung from its own last operation (a FragmentCodecPlanner: the rule
// and hysteresis of CodecPlanner, its patience counted in operations, `fragments` to a round);
// the proposals are all-gathered in the operation's plan exchange (plan_round) and the least
// lossy is taken, which is the fastest member's reading, as in the aggregator's rule for
// blocking rounds. A member that measured nothing of its own (its first operation, or one whose
// group it had not met: new connections are not the link) abstains; when all do, the least
// lossy rung any of them stands at is taken. A member retrying an operation without a lost
// member proposes what it agreed on before: every proposal was at least as lossy, so the
// survivors agree on the same codec again when any of them had agreed.
struct CodecProposal {
  static constexpr std::uint8_t kAbstain = 255;
  std::uint8_t rung = kAbstain;  // the proposal, a rung of the ladder (kAbstain: none)
  std::uint8_t current = 0;      // the rung the member's planner stands at
  float rate = 0;                // bytes a second its last operation measured
  float window = 0;              // seconds: the window it compared with
  bool probe = false;            // the proposal is a probe's (CodecPlanner: a small exchange)
};
inline constexpr std::size_t kProposalBytes = 11;
std::vector<std::uint8_t> encode_proposal(const CodecProposal& p);
// nullopt unless `bytes` is one proposal for a ladder of `rungs`: kProposalBytes, a rung of it
// (or kAbstain), finite non-negative figures (the bytes come from the network).
std::optional<CodecProposal> decode_proposal(std::span<const std::uint8_t> bytes,
                                             std::size_t rungs);

struct CodecAgreement {
  int rung = 0;
  int proposer = -1;  // the member whose proposal it is; -1: none proposed (every one abstained)
  CodecProposal reading;  // the proposer's
};
// The rung every member takes: the least lossy proposal, else the least lossy rung the members
// stand at. A payload that is not a proposal (decode_proposal) counts as abstaining; throws
// std::invalid_argument when none is one.
CodecAgreement agree_codec(std::span<const std::vector<std::uint8_t>> payloads, std::size_t rungs);

class FragmentCodecPlanner {
 public:
  // `n`: the values of the largest fragment.
  FragmentCodecPlanner(const JobConfig& cfg, std::size_t n);
  // The codec the round's plan carries: where the planner stands while it has measured nothing.
  void seed(const CodecChoice& c);
  // This member's proposal for an operation among `members`, its steps taking `step_seconds`.
  CodecProposal propose(int members, double step_seconds);
  // The operation agreed on `rung`.
  void agreed(int rung) { planner_.adopt(rung); }
  // This member's last operation: its bytes and seconds, the next proposal's reading.
  void measured(std::uint64_t bytes, double seconds);
  const CodecPlanner& planner() const { return planner_; }

 private:
  CodecPlanner planner_;
  std::optional<LinkSample> last_;
  bool seeded_by_measure_ = false;  // measured once: seeds no longer move it
  std::int64_t ops_ = 0;
};

}  // namespace loco::diloco
