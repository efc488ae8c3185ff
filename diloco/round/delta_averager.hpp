// Averaging one fragment's pseudo-gradient (all of θ as fragment 0 in a blocking round) over
// the members of one operation: the policy every average of loco runs, in the simulator and in
// a worker, in blocking, streaming and eager rounds (issue 22). No LibTorch here.
//
//   1. prepare: what this process sends, made from its Δ on the stepping thread: compression
//      topk's code of the error-feedback buffer (ErrorFeedback::encode), else, with the guard
//      on, the Δ's summary (guard::summarize); a member whose inner steps diverged abstains
//      (an empty code, an abstaining summary);
//   2. judge: the codes or the summaries all-gathered and judged by the guard, the same on every
//      member (none for a group of one, or with the guard off and no codes);
//   3. the caller adjusts the left-out mask if it must (a joiner's zero Δ, the tokens' weights);
//   4. reduce: topk's codes decoded into the mean over the members not left out
//      (ErrorFeedback::mean), else the Δs all-reduced under the job's codec.
//
// Where the members are is an AveragingGroup's: the worker's communicator (actors/), every
// member a local buffer in the simulator (LocalMembers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "diloco/round/codec_plan.hpp"
#include "diloco/round/error_feedback.hpp"
#include "diloco/round/guard.hpp"
#include "runtime/collective/types.hpp"

namespace loco::diloco {

// The members of one average and the two exchanges the policy makes over them. This process
// holds `local` of them (one in a worker, K in the simulator): a call takes one input (and one
// output) per local member.
class AveragingGroup {
 public:
  virtual ~AveragingGroup() = default;
  // Members in all.
  virtual std::size_t size() const = 0;
  // The members' names in member order, for the guard's log; empty: named by their index.
  virtual std::vector<std::string> names() const = 0;
  // Every member's bytes, in member order (`mine`: those of this process's members, each at
  // most max_bytes), under `round_id`. Returns the bytes this process sent.
  virtual std::uint64_t allgather(std::uint64_t round_id,
                                  std::span<const std::vector<std::uint8_t>> mine,
                                  std::size_t max_bytes,
                                  std::vector<std::vector<std::uint8_t>>& all) = 0;
  // out[i] = the mean of every member's input over those `left_out` does not name (one byte
  // each, or empty: none), computed as runtime/collective's all-reduce computes it; out[i] may
  // be in[i]. `codec`: the all-reduce's wire codec for this operation. Returns the bytes this
  // process sent.
  virtual std::uint64_t allreduce(std::uint64_t round_id, collective::Codec codec,
                                  std::span<const std::span<const float>> in,
                                  std::span<const std::span<float>> out,
                                  std::span<const std::uint8_t> left_out) = 0;
};

// The round ids of operation `op`'s three exchanges: compression auto's plan (the members'
// codec proposals, sync.mode streaming and eager: codec_plan.hpp's agree_codec), the guard's
// summaries (or topk's codes are the data), then the data. Ids of their own, in that order
// (collective/allreduce.hpp); an exchange an operation does not make costs nothing.
inline std::uint64_t plan_round(std::uint64_t op) { return 3 * op; }
inline std::uint64_t summary_round(std::uint64_t op) { return 3 * op + 1; }
inline std::uint64_t data_round(std::uint64_t op) { return 3 * op + 2; }
// The operation whose exchange `round_id` is. A worker that loses a member in any exchange runs
// them all again without it, from the plan: they are the phases of one operation to the
// collective (collective::Group::first_phase).
inline std::uint64_t op_of_round(std::uint64_t round_id) { return round_id / 3; }

class DeltaAverager {
 public:
  // `feedback`: the error feedback of compression topk or auto (its replica i is this process's
  // member i), or null. `choice`: this average's codec (codec_plan.hpp): topk (with feedback)
  // gathers codes; a dense one all-reduces, with feedback what ErrorFeedback::dense gives
  // (`flush`), else the Δs as they are.
  DeltaAverager(GuardConfig guard, ErrorFeedback* feedback, CodecChoice choice, bool flush = true)
      : guard_(guard), feedback_(feedback), choice_(choice), flush_(flush) {}

  // What this process sends for one average of `fragment`: one entry per local member.
  struct Sent {
    std::size_t n = 0;                                  // the fragment's length
    std::vector<std::vector<std::uint8_t>> codes;      // topk
    std::vector<std::vector<std::uint8_t>> summaries;  // dense, with the guard on
    std::vector<std::vector<float>> dense;              // dense with feedback: what is sent
  };
  // Step 1, on the stepping thread (topk: the error feedback changes). `abstain`: this
  // process's members send nothing this round (their inner steps diverged).
  Sent prepare(int fragment, std::span<const std::span<const float>> deltas, bool abstain = false);

  // Step 2's outcome: the verdicts (member order; empty: none judged) and every member's code
  // (topk), with the bytes and seconds of the exchange.
  struct Judged {
    std::vector<guard::Verdict> verdicts;
    std::vector<std::vector<std::uint8_t>> codes;
    std::uint64_t guard_bytes = 0;  // sent with the summaries
    double guard_seconds = 0;       // spent exchanging them
    std::uint64_t code_bytes = 0;   // sent with the codes (topk's data)
    // Dense with feedback: what the members of this process send (Sent::dense, which must
    // outlive it), in place of reduce()'s inputs.
    std::vector<std::span<const float>> inputs;
    std::vector<std::uint8_t> left_out() const { return guard::mask_of(verdicts); }
  };
  Judged judge(AveragingGroup& group, std::uint64_t op, int fragment, const Sent& sent) const;

  // Step 4: the means, one per local member, over the members `left_out` does not name; dense:
  // of `inputs` (the Δs, or the caller's weighted copies; with feedback, Judged::inputs).
  // Returns the data bytes sent.
  std::uint64_t reduce(AveragingGroup& group, std::uint64_t op, int fragment, const Judged& judged,
                       std::span<const std::uint8_t> left_out,
                       std::span<const std::span<const float>> inputs,
                       std::span<const std::span<float>> means) const;

  bool sparse() const { return feedback_ != nullptr && choice_.sparse(); }
  bool keeps_feedback() const { return feedback_ != nullptr; }
  const CodecChoice& choice() const { return choice_; }

 private:
  GuardConfig guard_;
  ErrorFeedback* feedback_;
  CodecChoice choice_;
  bool flush_;
};

// The simulator's group: every member a local buffer, averaged with collective::local_allreduce
// under `options`, i.e. with the numerics of a distributed run. Bytes as each member would send
// them: the butterfly's (allreduce_bytes_per_member), and K − 1 copies of a gathered code;
// summaries count none (the simulator's figures are the data's).
class LocalMembers final : public AveragingGroup {
 public:
  LocalMembers(std::size_t members, collective::Options options)
      : members_(members), options_(options) {}
  std::size_t size() const override { return members_; }
  std::vector<std::string> names() const override { return {}; }
  std::uint64_t allgather(std::uint64_t round_id, std::span<const std::vector<std::uint8_t>> mine,
                          std::size_t max_bytes,
                          std::vector<std::vector<std::uint8_t>>& all) override;
  std::uint64_t allreduce(std::uint64_t round_id, collective::Codec codec,
                          std::span<const std::span<const float>> in,
                          std::span<const std::span<float>> out,
                          std::span<const std::uint8_t> left_out) override;

 private:
  std::size_t members_;
  collective::Options options_;
  std::vector<float> mean_;  // reused across rounds
};

}  // namespace loco::diloco
