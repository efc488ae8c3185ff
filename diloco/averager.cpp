#include "diloco/averager.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/collective/local.hpp"

namespace loco::diloco {

void codec_roundtrip(std::span<float> x, collective::Codec c) { collective::codec_roundtrip(c, x); }

std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, collective::Codec c) {
  return collective::allreduce_payload_bytes(n, k, c);
}

std::vector<LeftOut> left_outs(int fragment, std::span<const std::string> names,
                               std::span<const guard::Verdict> verdicts) {
  std::vector<LeftOut> out;
  for (std::size_t i = 0; i < verdicts.size(); ++i)
    if (verdicts[i].left_out)
      out.push_back({i < names.size() ? names[i] : std::to_string(i), fragment, verdicts[i].rule,
                     verdicts[i].why});
  return out;
}

void GuardLog::add(int fragment, std::span<const std::string> names,
                   std::span<const guard::Verdict> verdicts) {
  std::vector<LeftOut> left = left_outs(fragment, names, verdicts);
  std::lock_guard<std::mutex> lock(mu_);
  items_.insert(items_.end(), std::make_move_iterator(left.begin()),
                std::make_move_iterator(left.end()));
  for (const guard::Verdict& v : verdicts) {
    if (v.left_out) continue;
    margins_.norm_ratio = std::max(margins_.norm_ratio, v.norm_ratio);
    if (v.relative_agreement != 0)
      margins_.agreement = std::min(margins_.agreement.value_or(v.relative_agreement),
                                    v.relative_agreement);
  }
}

void GuardLog::add_seconds(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  seconds_ += s;
}

double GuardLog::take_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(seconds_, 0.0);
}

GuardLog::Margins GuardLog::take_margins() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(margins_, {});
}

void GuardLog::add(LeftOut l) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back(std::move(l));
}

std::vector<LeftOut> GuardLog::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(items_, {});
}

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
  std::vector<std::span<const float>> inputs(locals.begin(), locals.end());
  mean_.resize(n);
  options_.codec = c;
  std::vector<std::uint8_t> mask;
  if (guard_.on) {
    // What each worker's summary says, exchanged and judged as the workers do.
    std::vector<guard::Summary> summaries;
    for (const auto& in : inputs)
      summaries.push_back(guard::summarize(in, std::size_t(guard_.sketch)));
    const auto verdicts = guard::judge(guard::facts_of(summaries), guard_);
    mask = guard::mask_of(verdicts);
    if (log_) log_->add(fragment, {}, verdicts);  // members named by their index
  }
  collective::local_allreduce(inputs, mean_, options_, mask);
  for (const auto& l : locals) std::copy(mean_.begin(), mean_.end(), l.begin());
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

}  // namespace loco::diloco
