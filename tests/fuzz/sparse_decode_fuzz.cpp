// The sparse codec's decoder of network input (runtime/collective/sparse.cpp, decode_add). The
// input is a payload; it is decoded twice: with the n and params its own header claims (when
// they are valid and n <= 2^16), so that the fuzzer gets past the header to the chunks, and
// with fixed ones, as a receiver that expects something else. Either decode succeeds, adding
// at most one finite value per entry (so a zeroed vector stays finite), or it throws a
// CodecError and leaves the vector as it was.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/collective/sparse.hpp"

using namespace loco::collective;

namespace {

void decode(std::span<const uint8_t> bytes, const sparse::Params& p, size_t n) {
  std::vector<float> acc(n, 0.0f);
  try {
    sparse::decode_add(bytes, p, 0.5f, acc);
  } catch (const sparse::CodecError&) {
    for (float a : acc)
      if (a != 0.0f) __builtin_trap();  // a refused payload changed the vector
    return;
  }
  if (bytes.size() != sparse::encoded_bytes(n, p)) __builtin_trap();
  for (float a : acc)
    if (!std::isfinite(a)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  if (size >= sparse::kHeaderBytes) {
    sparse::Params p;
    uint64_t n;
    p.bits = data[5];
    std::memcpy(&p.chunk, data + 8, 4);
    std::memcpy(&p.k, data + 12, 4);
    std::memcpy(&n, data + 16, 8);
    try {
      p.validate();
      if (n <= (1u << 16)) decode(bytes, p, n);
    } catch (const std::invalid_argument&) {
    }
  }
  decode(bytes, sparse::Params{64, 8, 2}, 200);
  return 0;
}
