#include "diloco/averager.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "runtime/collective/local.hpp"

namespace loco::diloco {

void codec_roundtrip(std::span<float> x, collective::Codec c) { collective::codec_roundtrip(c, x); }

std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, collective::Codec c) {
  return collective::allreduce_payload_bytes(n, k, c);
}

AverageStats LocalAverager::average(std::span<const std::span<float>> locals, collective::Codec c) {
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
  collective::local_allreduce(inputs, mean_, options_);
  for (const auto& l : locals) std::copy(mean_.begin(), mean_.end(), l.begin());
  return stats;
}

std::shared_future<std::uint64_t> LocalAverager::start(
    std::uint64_t /*op*/, int /*fragment*/, std::span<const std::span<const float>> deltas,
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
  done.set_value(average(means, options_.codec).bytes_sent);
  return done.get_future().share();
}

}  // namespace loco::diloco
