// compression: {kind: topk}: SparseLoCo's error feedback and the sparse mean (config.hpp,
// TopkConfig). Each member keeps, per fragment (blocking: one, all of θ), a buffer e of what
// it has not yet sent: e ← β·e + Δ; it sends the sparse code of e (runtime/collective/sparse.hpp)
// and takes off e what that code decodes to. The round's mean is every member's code decoded in
// member order, (1/K)·Σ decode(bytes_k): the same bytes in the same order on every member, so
// the same floats everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/round/averager.hpp"
#include "diloco/round/codec_plan.hpp"
#include "runtime/collective/sparse.hpp"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace loco::diloco {

class ErrorFeedback {
 public:
  // sizes[f]: fragment f's length; `replicas`: the members this process holds (the
  // simulator's K, a worker's one). Every buffer starts at zero.
  ErrorFeedback(const TopkConfig& cfg, std::vector<std::size_t> sizes, std::size_t replicas);

  // The code's parameters; under a choice, its k and bits where it names them instead of the
  // job's (compression auto chooses them each round: diloco/round/codec_plan.hpp).
  const collective::sparse::Params& params() const { return params_; }
  collective::sparse::Params params(const CodecChoice& c) const;
  // The bytes of fragment f's code: what a member may send for it, exactly.
  std::size_t bytes(int fragment, const CodecChoice& c = {}) const;
  // Fragment f's length.
  std::size_t size(int fragment) const { return sizes_.at(static_cast<std::size_t>(fragment)); }
  // e ← β·e + delta; returns the code of e and takes what it sent off e (a choice without
  // feedback: delta's own code, e as it was). A delta that is not finite leaves e as it was and
  // gives an empty code: the member sends nothing (the guard leaves it out; without the guard
  // the mean refuses the empty code).
  std::vector<std::uint8_t> encode(std::size_t replica, int fragment,
                                   std::span<const float> delta, const CodecChoice& c = {});
  // compression auto, a dense round with feedback: flush: e ← β·e + delta, out = e, e ← 0 (topk's
  // rule with every entry sent); keep: out = delta, e as it was. A delta that is not finite is
  // copied as it is (the guard or the collective refuses it) and leaves e as it was.
  void dense(std::size_t replica, int fragment, std::span<const float> delta, std::span<float> out,
             bool flush);
  // out = (1/K)·Σ_k decode(codes[k]), k in member order, over the K members that `left_out`
  // (one byte each, or empty: none) does not name; with mean: senders, each entry's sum over
  // the members whose code sent it instead of K. A code that is not fragment f's
  // (collective::sparse::CodecError) is named by its member's position. All left out: zeros.
  void mean(int fragment, std::span<const std::span<const std::uint8_t>> codes,
            std::span<float> out, std::span<const std::uint8_t> left_out = {},
            const CodecChoice& c = {}) const;
  // A replica's buffers under "PREFIX<f>" (checkpoints and inner states); load() leaves zeros
  // where the archive has none (a checkpoint written without topk) and checks sizes.
  void save(torch::serialize::OutputArchive& ar, const std::string& prefix,
            std::size_t replica) const;
  void load(torch::serialize::InputArchive& ar, const std::string& prefix, std::size_t replica);
  // Zero: a member that joins starts with nothing unsent (its own past is not in the job).
  void clear(std::size_t replica);

 private:
  TopkConfig topk_;  // the job's code: a choice's k and bits override it (sparse_params)
  collective::sparse::Params params_;
  float beta_;
  bool over_senders_;  // TopkConfig::mean is senders
  std::vector<std::size_t> sizes_;
  std::vector<std::vector<std::vector<float>>> buffers_;  // [replica][fragment]
  std::vector<float> sent_;                               // scratch
};

// The simulator's sparse averaging: every member a local replica, as a FragmentAverager (the
// handle is ready at once): DeltaAverager's policy over LocalMembers (delta_averager.cpp). bytes sent per member: its code to each of the K − 1 others. With
// the guard on, the codes are judged (guard::sparse_facts) as the workers judge them.
class LocalSparseAverager final : public FragmentAverager {
 public:
  explicit LocalSparseAverager(ErrorFeedback& feedback, GuardConfig guard = GuardConfig{false},
                               GuardLog* log = nullptr)
      : feedback_(feedback), guard_(guard), log_(log) {}
  // compression auto: the codec of the averages from now on (default: topk at the feedback's k),
  // and what a dense one does with the buffer (ErrorFeedback::dense).
  void choose(CodecChoice choice, bool flush) { choice_ = choice, flush_ = flush; }
  std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                          std::span<const std::span<const float>> deltas,
                                          std::span<const std::span<float>> means) override;

 private:
  ErrorFeedback& feedback_;
  GuardConfig guard_;
  GuardLog* log_;
  CodecChoice choice_{collective::Codec::fp32, feedback_.params().k};
  bool flush_ = true;
};

// compression topk's guard: the verdicts on the gathered codes, in member order (none when the
// guard is off).
std::vector<guard::Verdict> judge_codes(const ErrorFeedback& feedback, int fragment,
                                        std::span<const std::span<const std::uint8_t>> codes,
                                        const GuardConfig& guard, const CodecChoice& c = {});

}  // namespace loco::diloco
