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

}  // namespace loco::collective
