// SparseLoCo-style compression of pseudo-gradients (arXiv 2508.15706): per chunk, the top-k
// entries by magnitude, their values quantized to 2^bits levels. Library loco_collective_codec:
// no sockets, no threads, no LibTorch.
//
// How it is meant to be used (by the averaging code): each worker keeps an error-feedback
// buffer e (e <- beta e + delta, the caller's), encodes e, subtracts what was sent (`sent`)
// from e, and all workers exchange the encoded bytes; every worker then decode_add()s all of
// them, in member order and with scale 1/K, into the same zeroed vector: the same mean,
// bit for bit, everywhere.
//
// Contract: encode() is a pure function of (x, params): the same bytes and the same `sent` on
// every machine (integer selection, a fixed summation order, no threads). decode_add() of
// those bytes into zeros with scale 1 gives `sent` bit for bit.
//
// Wire format (little-endian), header then one section per chunk:
//   header, 24 bytes: "LOSP", u8 version (1), u8 bits, u16 0, u32 chunk, u32 k, u64 n
//   chunk c (length L = min(chunk, n - c chunk), k' = min(k, L), m = min(2^bits, k') levels):
//     m f32 representatives (levels 0..m-1, ascending), then ceil(k' (ib + bits) / 8) bytes:
//     k' entries in ascending index order, each its index in the chunk (ib =
//     ceil(log2(chunk)) bits) then its level (bits bits), packed least significant bit
//     first; the padding bits are 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace loco::collective::sparse {

struct Params {
  uint32_t chunk = 4096;  // entries per chunk, [2, 65536]
  uint32_t k = 64;        // entries sent per chunk, [1, chunk] (a shorter last chunk: all of it)
  uint32_t bits = 2;      // per entry's level: 2^bits representatives per chunk, [1, 8]
  // Throws std::invalid_argument naming the field that is out of range.
  void validate() const;
};

// Bytes that were not produced by encode() with the receiver's n and params: truncated, for
// another n or params, an index out of range or repeated, a representative that is not
// finite, trailing bytes. what() names the problem (and the chunk).
class CodecError : public std::runtime_error {
 public:
  explicit CodecError(const std::string& what) : std::runtime_error(what) {}
};

inline constexpr size_t kHeaderBytes = 24;

// Encodes x chunk by chunk: in each, the k' entries of largest |x| (ties: the lower index),
// their values quantized to the chunk's levels (see sparse.cpp for the binning). Writes into
// `sent` (x.size() floats) the decoded vector: 0 except at the chosen entries, which hold
// their representatives. Throws std::invalid_argument for bad params, `sent` of another size,
// or a NaN/Inf in x (nothing non-finite is ever encoded; x[i] is named); `sent` may then be
// partly written.
std::vector<uint8_t> encode(std::span<const float> x, const Params& p, std::span<float> sent);

// The exact size encode() produces for n floats. Throws std::invalid_argument for bad params.
size_t encoded_bytes(size_t n, const Params& p);

// acc[i] += scale * decoded[i] where something was sent (n = acc.size()). `bytes` are checked
// whole before acc is touched: on a throw (CodecError; std::invalid_argument for bad local
// params) acc is unchanged. Allocates nothing; every size it uses comes from n and p.
// `senders`, when not empty (n counters), counts each entry this code sent: senders[i] += 1.
void decode_add(std::span<const uint8_t> bytes, const Params& p, float scale, std::span<float> acc,
                std::span<uint16_t> senders = {});

namespace detail {
// encode() with the AVX2 selection off (use_simd = false) or on where the CPU has it: the
// two give the same bytes (tests compare them).
std::vector<uint8_t> encode(std::span<const float> x, const Params& p, std::span<float> sent,
                            bool use_simd);
}  // namespace detail

}  // namespace loco::collective::sparse
