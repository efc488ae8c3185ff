// The wire compression of the all-reduce, on its own so that a job's configuration can name
// it without depending on the rest of the collective's types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loco::collective {

enum class Codec : uint8_t { fp32, fp16, bf16, int8 };

// "fp32" | "fp16" | "bf16" | "int8"; std::nullopt for anything else.
std::optional<Codec> parse_codec(std::string_view name);
std::string_view to_string(Codec codec);
// Encoded bytes for `count` floats (int8 adds a per-chunk header).
size_t encoded_bytes(Codec codec, size_t count);
// `count` floats to IEEE half (fp16) or bfloat16 (bf16), round to nearest even, NaN kept
// quiet, little-endian (2 bytes each), and back: the all-reduce's own conversions, for files
// that store these types (safetensors). Throws std::invalid_argument for fp32 and int8.
void encode_half(Codec codec, const float* src, size_t count, uint8_t* dst);
void decode_half(Codec codec, const uint8_t* src, size_t count, float* dst);

}  // namespace loco::collective
