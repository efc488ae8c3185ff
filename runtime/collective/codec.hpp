// Encoding of float chunks for the wire. Internal to the collective.
//
// Contract: decode(encode(x)) is a pure function of x and the codec, so members that decode
// the same bytes get bit-identical floats. Encoded buffers need no alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "runtime/collective/types.hpp"

namespace loco::collective::detail {

// int8: [float lo][float scale][count x uint8], x ~ lo + q * scale (min-max, 255 steps).
// A chunk holding NaN/Inf gets lo = NaN, so that it decodes to NaN and is detected.
inline constexpr size_t kInt8Header = 2 * sizeof(float);

void encode(Codec codec, const float* src, size_t count, uint8_t* dst);
void decode(Codec codec, const uint8_t* src, size_t count, float* dst);

// One member's contribution to a reduced chunk: `count` raw floats (the owner's own values),
// or `count` values encoded with the codec (what a peer sent).
struct Addend {
  const void* data = nullptr;
  bool raw = false;
};
// out[i] = (x_0[i] + x_1[i] + ... + x_{m-1}[i]) / m, added in the order given, so that the
// result depends on the values and their order only (not on which arrived first). Reads each
// addend once; the same floats as adding them one by one into `out` and dividing. No addends
// (every member left out of the mean, Group::left_out): zeros.
void mean_of(Codec codec, std::span<const Addend> addends, size_t count, float* out);
// True when every value is finite.
bool all_finite(const float* data, size_t count);
// Index of the first non-finite value, or count.
size_t first_nonfinite(const float* data, size_t count);

}  // namespace loco::collective::detail
