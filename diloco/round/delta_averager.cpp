#include "diloco/round/delta_averager.hpp"

#include <algorithm>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>

#include "diloco/round/averager.hpp"
#include "runtime/collective/local.hpp"

namespace loco::diloco {

DeltaAverager::Sent DeltaAverager::prepare(int fragment,
                                           std::span<const std::span<const float>> deltas,
                                           bool abstain) {
  Sent s;
  s.n = deltas.empty() ? 0 : deltas[0].size();
  const auto m = static_cast<std::size_t>(guard_.sketch);
  for (std::size_t i = 0; i < deltas.size(); ++i) {
    if (sparse()) {
      s.codes.push_back(abstain ? std::vector<std::uint8_t>{}
                                : feedback_->encode(i, fragment, deltas[i], choice_));
      continue;
    }
    std::span<const float> sent = deltas[i];
    if (feedback_) {
      // A member that abstains leaves its buffer as it is (its Δ is not sent).
      s.dense.emplace_back(sent.size());
      feedback_->dense(i, fragment, sent, s.dense.back(), flush_ && !abstain);
      sent = s.dense.back();
    }
    if (guard_.on)
      s.summaries.push_back(guard::encode(abstain ? guard::abstaining(sent.size(), m)
                                                  : guard::summarize(sent, m)));
  }
  return s;
}

DeltaAverager::Judged DeltaAverager::judge(AveragingGroup& group, std::uint64_t op, int fragment,
                                           const Sent& sent) const {
  Judged j;
  j.inputs.assign(sent.dense.begin(), sent.dense.end());
  if (sparse()) {
    // topk: the codes are the data; the guard judges what they decode to.
    j.code_bytes = group.allgather(data_round(op), sent.codes,
                                   feedback_->bytes(fragment, choice_), j.codes);
    const std::vector<std::span<const std::uint8_t>> views(j.codes.begin(), j.codes.end());
    j.verdicts = judge_codes(*feedback_, fragment, views, guard_, choice_);
  } else if (guard_.on && group.size() >= 2) {
    const std::size_t sketch = guard::sketch_size(sent.n, static_cast<std::size_t>(guard_.sketch));
    std::vector<std::vector<std::uint8_t>> all;
    const auto t0 = std::chrono::steady_clock::now();
    j.guard_bytes =
        group.allgather(summary_round(op), sent.summaries, guard::encoded_bytes(sketch), all);
    j.guard_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    j.verdicts = guard::judge(guard::facts_of(all, sketch), guard_);
  }
  return j;
}

std::uint64_t DeltaAverager::reduce(AveragingGroup& group, std::uint64_t op, int fragment,
                                    const Judged& judged, std::span<const std::uint8_t> left_out,
                                    std::span<const std::span<const float>> inputs,
                                    std::span<const std::span<float>> means) const {
  if (!sparse())
    return group.allreduce(data_round(op), choice_.dense,
                           judged.inputs.empty() ? inputs : std::span(judged.inputs), means,
                           left_out);
  if (means.empty()) return 0;
  const std::vector<std::span<const std::uint8_t>> views(judged.codes.begin(), judged.codes.end());
  feedback_->mean(fragment, views, means[0], left_out, choice_);
  for (std::size_t i = 1; i < means.size(); ++i)
    std::copy(means[0].begin(), means[0].end(), means[i].begin());
  return 0;  // the codes were the data: judged.code_bytes
}

std::uint64_t LocalMembers::allgather(std::uint64_t, std::span<const std::vector<std::uint8_t>> mine,
                                      std::size_t max_bytes,
                                      std::vector<std::vector<std::uint8_t>>& all) {
  if (mine.size() != members_)
    throw std::invalid_argument("LocalMembers::allgather: " + std::to_string(mine.size()) +
                                " contributions for " + std::to_string(members_) + " members");
  all.assign(mine.begin(), mine.end());
  return static_cast<std::uint64_t>(members_ - 1) * max_bytes;
}

std::uint64_t LocalMembers::allreduce(std::uint64_t, collective::Codec codec,
                                      std::span<const std::span<const float>> in,
                                      std::span<const std::span<float>> out,
                                      std::span<const std::uint8_t> left_out) {
  options_.codec = codec;
  if (in.size() != members_ || out.size() != members_)
    throw std::invalid_argument("LocalMembers::allreduce: " + std::to_string(in.size()) +
                                " inputs and " + std::to_string(out.size()) + " outputs for " +
                                std::to_string(members_) + " members");
  const std::size_t n = in.empty() ? 0 : in[0].size();
  for (std::size_t i = 0; i < members_; ++i)
    if (in[i].size() != n || out[i].size() != n)
      throw std::invalid_argument("LocalMembers::allreduce: buffers differ in length (" +
                                  std::to_string(in[i].size()) + ", " +
                                  std::to_string(out[i].size()) + " vs " + std::to_string(n) +
                                  ")");
  const auto bytes = allreduce_bytes_per_member(n, static_cast<int>(members_), options_.codec);
  if (members_ == 1) {
    // Nothing is sent: the worker keeps its exact pseudo-gradient.
    if (out[0].data() != in[0].data()) std::copy(in[0].begin(), in[0].end(), out[0].begin());
    return bytes;
  }
  mean_.resize(n);
  collective::local_allreduce(in, mean_, options_, left_out);
  for (const auto& o : out) std::copy(mean_.begin(), mean_.end(), o.begin());
  return bytes;
}

// ---- The simulator's averagers (averager.hpp, error_feedback.hpp): the policy over LocalMembers

AverageStats LocalAverager::average(std::span<const std::span<float>> locals, collective::Codec c) {
  return average(locals, c, 0);
}

AverageStats LocalAverager::average(std::span<const std::span<float>> locals, collective::Codec c,
                                    int fragment) {
  if (locals.empty()) throw std::invalid_argument("LocalAverager::average: no members");
  const std::size_t n = locals[0].size();
  for (const auto& l : locals)
    if (l.size() != n)
      throw std::invalid_argument("LocalAverager::average: buffers differ in length (" +
                                  std::to_string(l.size()) + " vs " + std::to_string(n) + ")");
  const int k = static_cast<int>(locals.size());
  AverageStats stats{k, allreduce_bytes_per_member(n, k, c)};
  if (k == 1) return stats;  // nothing is sent: the worker keeps its exact pseudo-gradient
  options_.codec = c;
  LocalMembers members(locals.size(), options_);
  DeltaAverager policy(guard_, nullptr, CodecChoice{c, 0});
  const std::vector<std::span<const float>> inputs(locals.begin(), locals.end());
  const auto judged = policy.judge(members, 0, fragment, policy.prepare(fragment, inputs));
  if (guard_.on && log_) log_->add(fragment, {}, judged.verdicts);  // named by their index
  policy.reduce(members, 0, fragment, judged, judged.left_out(), inputs, locals);
  return stats;
}

std::shared_future<std::uint64_t> LocalAverager::start(
    std::uint64_t /*op*/, int fragment, std::span<const std::span<const float>> deltas,
    std::span<const std::span<float>> means) {
  if (deltas.size() != means.size())
    throw std::invalid_argument("LocalAverager::start: " + std::to_string(deltas.size()) +
                                " inputs for " + std::to_string(means.size()) + " outputs");
  for (std::size_t i = 0; i < deltas.size(); ++i) {
    if (deltas[i].size() != means[i].size())
      throw std::invalid_argument("LocalAverager::start: an input and its output differ in length");
    std::copy(deltas[i].begin(), deltas[i].end(), means[i].begin());
  }
  std::promise<std::uint64_t> done;
  done.set_value(average(means, options_.codec, fragment).bytes_sent);
  return done.get_future().share();
}

std::shared_future<std::uint64_t> LocalSparseAverager::start(
    std::uint64_t op, int fragment, std::span<const std::span<const float>> deltas,
    std::span<const std::span<float>> means) {
  if (deltas.size() != means.size() || deltas.empty())
    throw std::invalid_argument("LocalSparseAverager::start: " + std::to_string(deltas.size()) +
                                " inputs for " + std::to_string(means.size()) + " outputs");
  // Every member's code first (prepare): a mean may be written over its own Δ (the blocking
  // round's).
  LocalMembers members(deltas.size(), {});
  DeltaAverager policy(guard_, &feedback_, choice_, flush_);
  // `sent` outlives `judged`: a dense average with feedback reduces what it holds.
  const DeltaAverager::Sent sent = policy.prepare(fragment, deltas);
  const auto judged = policy.judge(members, op, fragment, sent);
  if (log_) log_->add(fragment, {}, judged.verdicts);  // members named by their index
  const std::uint64_t data =
      policy.reduce(members, op, fragment, judged, judged.left_out(), deltas, means);
  std::promise<std::uint64_t> done;
  done.set_value(judged.code_bytes + data);
  return done.get_future().share();
}

}  // namespace loco::diloco
