#include "runtime/collective/local.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/collective/codec.hpp"

namespace loco::collective {

namespace {

size_t chunk_floats(size_t chunk_bytes) { return std::max<size_t>(1, chunk_bytes / sizeof(float)); }

// Encoded bytes of `len` floats sent as chunks of `chunk` floats.
uint64_t encoded_in_chunks(Codec codec, size_t len, size_t chunk) {
  if (len == 0) return 0;
  const size_t full = len / chunk, rest = len % chunk;
  return full * encoded_bytes(codec, chunk) + (rest ? encoded_bytes(codec, rest) : 0);
}

}  // namespace

void local_allreduce(std::span<const std::span<const float>> inputs, std::span<float> out,
                     const Options& options, std::span<const uint8_t> left_out) {
  const size_t k = inputs.size();
  const size_t n = out.size();
  if (k == 0) throw CollectiveError("local_allreduce: no members");
  check_left_out(left_out, k);
  for (size_t r = 0; r < k; ++r)
    if (inputs[r].size() != n)
      throw CollectiveError("local_allreduce: member " + std::to_string(r) + " has " +
                            std::to_string(inputs[r].size()) + " floats, the output " +
                            std::to_string(n));
  if (k == 1) {
    if (is_left_out(left_out, 0)) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else {
      std::copy(inputs[0].begin(), inputs[0].end(), out.begin());
    }
    return;
  }
  const Codec codec = options.codec;
  const size_t chunk = chunk_floats(options.chunk_bytes);
  std::vector<std::vector<uint8_t>> wires(k, std::vector<uint8_t>(encoded_bytes(codec, chunk)));
  std::vector<detail::Addend> addends;
  addends.reserve(k);
  const std::vector<size_t> bounds = part_bounds(n, k);
  for (size_t p = 0; p < k; ++p) {
    const size_t end = bounds[p + 1];
    for (size_t begin = bounds[p]; begin < end; begin += chunk) {
      const size_t len = std::min(chunk, end - begin);
      float* acc = out.data() + begin;
      addends.clear();
      for (size_t r = 0; r < k; ++r) {
        if (is_left_out(left_out, r)) continue;
        const float* in = inputs[r].data() + begin;
        if (r == p) {  // the owner's own values travel nowhere
          addends.push_back({in, true});
        } else {
          detail::encode(codec, in, len, wires[r].data());
          addends.push_back({wires[r].data(), false});
        }
      }
      detail::mean_of(codec, addends, len, acc);
      if (options.reject_nonfinite && !detail::all_finite(acc, len)) {
        for (size_t r = 0; r < k; ++r) {
          if (is_left_out(left_out, r)) continue;
          const size_t i = detail::first_nonfinite(inputs[r].data() + begin, len);
          if (i < len)
            throw CollectiveError("member " + std::to_string(r) + " sent NaN/Inf (element " +
                                      std::to_string(begin + i) + ")",
                                  std::to_string(r));
        }
        throw CollectiveError("the sum overflowed to Inf at element " +
                              std::to_string(begin + detail::first_nonfinite(acc, len)));
      }
      if (codec != Codec::fp32) {
        detail::encode(codec, acc, len, wires[p].data());
        detail::decode(codec, wires[p].data(), len, acc);
      }
    }
  }
}

void codec_roundtrip(Codec codec, std::span<float> x, size_t chunk_bytes) {
  if (codec == Codec::fp32) return;
  const size_t chunk = chunk_floats(chunk_bytes);
  std::vector<uint8_t> wire(encoded_bytes(codec, std::min(chunk, x.size())));
  for (size_t begin = 0; begin < x.size(); begin += chunk) {
    const size_t len = std::min(chunk, x.size() - begin);
    detail::encode(codec, x.data() + begin, len, wire.data());
    detail::decode(codec, wire.data(), len, x.data() + begin);
  }
}

uint64_t allreduce_payload_bytes(size_t n, int k, Codec codec, size_t chunk_bytes) {
  if (k <= 1) return 0;
  const size_t chunk = chunk_floats(chunk_bytes);
  const auto kk = static_cast<size_t>(k);
  const std::vector<size_t> bounds = part_bounds(n, kk);
  uint64_t encoded = 0;  // the whole vector, part by part, chunk by chunk
  for (size_t p = 0; p < kk; ++p)
    encoded += encoded_in_chunks(codec, bounds[p + 1] - bounds[p], chunk);
  return 2 * (kk - 1) * encoded / kk;
}

uint64_t allreduce_payload_bytes_of(size_t n, int k, int rank, Codec codec,
                                    std::span<const double> weights,
                                    std::span<const uint8_t> left_out, size_t chunk_bytes) {
  if (k <= 1) return 0;
  const size_t chunk = chunk_floats(chunk_bytes);
  const auto kk = static_cast<size_t>(k);
  const std::vector<size_t> bounds = part_bounds(n, kk, weights);
  check_left_out(left_out, kk);
  const bool contributes = !is_left_out(left_out, static_cast<size_t>(rank));
  uint64_t sent = 0;
  for (size_t p = 0; p < kk; ++p) {
    const uint64_t part = encoded_in_chunks(codec, bounds[p + 1] - bounds[p], chunk);
    // Others' parts once each (reduce-scatter, unless left out), the own part to each of the
    // k - 1 others.
    if (p == static_cast<size_t>(rank)) {
      sent += (kk - 1) * part;
    } else if (contributes) {
      sent += part;
    }
  }
  return sent;
}

void check_left_out(std::span<const uint8_t> left_out, size_t k) {
  if (!left_out.empty() && left_out.size() != k) {
    throw CollectiveError("left_out: " + std::to_string(left_out.size()) + " flags for " +
                          std::to_string(k) + " members (one per member, or none)");
  }
}

std::vector<size_t> part_bounds(size_t n, size_t k, std::span<const double> weights) {
  double total = 0;
  if (!weights.empty() && weights.size() != k) {
    throw CollectiveError("part weights: " + std::to_string(weights.size()) + " weights for " +
                          std::to_string(k) + " members");
  }
  for (size_t p = 0; p < weights.size(); ++p) {
    if (!std::isfinite(weights[p]) || weights[p] < 0) {
      throw CollectiveError("part weights: weight " + std::to_string(p) + " is " +
                            std::to_string(weights[p]) + "; weights must be finite and >= 0");
    }
    total += weights[p];
  }
  if (!weights.empty() && (!(total > 0) || !std::isfinite(total)))
    throw CollectiveError("part weights: they sum to " + std::to_string(total));
  std::vector<size_t> bounds(k + 1, 0);
  const bool equal =
      std::all_of(weights.begin(), weights.end(), [&](double w) { return w == weights[0]; });
  if (equal) {  // no weights, or all the same: exactly the unweighted cut
    for (size_t p = 0; p <= k; ++p) bounds[p] = p * n / k;
    return bounds;
  }
  double cumulative = 0;
  for (size_t p = 0; p < k; ++p) {
    bounds[p] = std::min(n, static_cast<size_t>(static_cast<double>(n) * (cumulative / total)));
    if (p > 0) bounds[p] = std::max(bounds[p], bounds[p - 1]);
    cumulative += weights[p];
  }
  bounds[0] = 0;
  bounds[k] = n;
  return bounds;
}

std::vector<double> part_weights_for_rates(std::span<const double> rates) {
  const size_t k = rates.size();
  std::vector<double> equal(k, 1.0);
  if (k <= 2) return equal;
  for (double r : rates)
    if (!std::isfinite(r) || !(r > 0)) return equal;
  // Rates measured on equal links differ by a few per cent; unequal parts would then only
  // make the largest part the slowest.
  const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
  if (*hi <= kEqualRates * *lo) return equal;
  // In units of n: the parts p_i = (T rate_i - 1) / (k - 2) of the members still in `in` sum to
  // 1 when T = (k - 2 + |in|) / (sum of their rates). A member whose p_i comes out negative
  // cannot send its share in time even with no part: drop it (p = 0) and solve again.
  std::vector<bool> in(k, true);
  std::vector<double> parts(k, 0.0);
  const double km2 = static_cast<double>(k - 2);
  for (bool changed = true; changed;) {
    changed = false;
    double sum = 0, count = 0;
    for (size_t i = 0; i < k; ++i) {
      if (in[i]) {
        sum += rates[i];
        count += 1;
      }
    }
    const double t = (km2 + count) / sum;
    for (size_t i = 0; i < k; ++i) {
      parts[i] = in[i] ? (t * rates[i] - 1.0) / km2 : 0.0;
      if (in[i] && parts[i] < 0) {
        in[i] = false;
        changed = true;
      }
    }
  }
  for (double& p : parts) p = std::max(0.0, p);
  return parts;
}

}  // namespace loco::collective
