#include "runtime/collective/local.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/collective/codec.hpp"

namespace loco::collective {

namespace {

size_t chunk_floats(size_t chunk_bytes) { return std::max<size_t>(1, chunk_bytes / sizeof(float)); }

// [begin, end) of part p of n floats among k members, as allreduce.cpp cuts them.
size_t part_begin(size_t n, size_t k, size_t p) { return p * n / k; }

// Encoded bytes of `len` floats sent as chunks of `chunk` floats.
uint64_t encoded_in_chunks(Codec codec, size_t len, size_t chunk) {
  if (len == 0) return 0;
  const size_t full = len / chunk, rest = len % chunk;
  return full * encoded_bytes(codec, chunk) + (rest ? encoded_bytes(codec, rest) : 0);
}

}  // namespace

void local_allreduce(std::span<const std::span<const float>> inputs, std::span<float> out,
                     const Options& options) {
  const size_t k = inputs.size();
  const size_t n = out.size();
  if (k == 0) throw CollectiveError("local_allreduce: no members");
  for (size_t r = 0; r < k; ++r)
    if (inputs[r].size() != n)
      throw CollectiveError("local_allreduce: member " + std::to_string(r) + " has " +
                            std::to_string(inputs[r].size()) + " floats, the output " +
                            std::to_string(n));
  if (k == 1) {
    std::copy(inputs[0].begin(), inputs[0].end(), out.begin());
    return;
  }
  const Codec codec = options.codec;
  const size_t chunk = chunk_floats(options.chunk_bytes);
  std::vector<std::vector<uint8_t>> wires(k, std::vector<uint8_t>(encoded_bytes(codec, chunk)));
  std::vector<detail::Addend> addends(k);
  for (size_t p = 0; p < k; ++p) {
    const size_t end = part_begin(n, k, p + 1);
    for (size_t begin = part_begin(n, k, p); begin < end; begin += chunk) {
      const size_t len = std::min(chunk, end - begin);
      float* acc = out.data() + begin;
      for (size_t r = 0; r < k; ++r) {
        const float* in = inputs[r].data() + begin;
        if (r == p) {  // the owner's own values travel nowhere
          addends[r] = {in, true};
        } else {
          detail::encode(codec, in, len, wires[r].data());
          addends[r] = {wires[r].data(), false};
        }
      }
      detail::mean_of(codec, addends, len, acc);
      if (options.reject_nonfinite && !detail::all_finite(acc, len)) {
        for (size_t r = 0; r < k; ++r) {
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
  uint64_t encoded = 0;  // the whole vector, part by part, chunk by chunk
  for (size_t p = 0; p < kk; ++p)
    encoded += encoded_in_chunks(codec, part_begin(n, kk, p + 1) - part_begin(n, kk, p), chunk);
  return 2 * (kk - 1) * encoded / kk;
}

}  // namespace loco::collective
