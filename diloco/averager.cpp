#include "diloco/averager.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "runtime/collective/local.hpp"

namespace loco::diloco {

collective::Codec codec_of(Compression c) {
  switch (c) {
    case Compression::fp32:
      return collective::Codec::fp32;
    case Compression::fp16:
      return collective::Codec::fp16;
    case Compression::bf16:
      return collective::Codec::bf16;
    case Compression::int8:
      return collective::Codec::int8;
  }
  throw std::invalid_argument("codec_of: unknown compression");
}

void codec_roundtrip(std::span<float> x, Compression c) {
  collective::codec_roundtrip(codec_of(c), x);
}

std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, Compression c) {
  return collective::allreduce_payload_bytes(n, k, codec_of(c));
}

AverageStats LocalAverager::average(std::span<const std::span<float>> locals, Compression c) {
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
  options_.codec = codec_of(c);
  collective::local_allreduce(inputs, mean_, options_);
  for (const auto& l : locals) std::copy(mean_.begin(), mean_.end(), l.begin());
  return stats;
}

}  // namespace loco::diloco
