#include "runtime/collective/wire.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <string_view>

namespace loco::collective::detail {

std::optional<Header> parse_header(std::span<const uint8_t> bytes) {
  if (bytes.size() != sizeof(Header)) return std::nullopt;
  Header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kMagic || h.version != kVersion) return std::nullopt;
  return h;
}

std::string check_message(const Header& h, size_t sender_bytes, size_t payload_bytes) {
  if (sender_bytes == 0 || sender_bytes > kMaxSenderBytes)
    return "a sender name of " + std::to_string(sender_bytes) + " bytes (1 to " +
           std::to_string(kMaxSenderBytes) + " allowed)";
  if (static_cast<uint8_t>(h.codec) > static_cast<uint8_t>(Codec::int8))
    return "unknown codec " + std::to_string(static_cast<unsigned>(h.codec));
  switch (h.type) {
    case MsgType::reduce_scatter:
    case MsgType::all_gather:
      if (h.count == 0 || h.count > kMaxChunkFloats)
        return "a chunk of " + std::to_string(h.count) + " floats (1 to " +
               std::to_string(kMaxChunkFloats) + " allowed)";
      if (h.offset > h.total_n || h.count > h.total_n - h.offset)
        return "a chunk of " + std::to_string(h.count) + " floats at " + std::to_string(h.offset) +
               " past the end of a vector of " + std::to_string(h.total_n);
      if (payload_bytes != encoded_bytes(h.codec, h.count))
        return "a chunk of " + std::to_string(h.count) + " floats in " +
               std::to_string(payload_bytes) + " bytes, expected " +
               std::to_string(encoded_bytes(h.codec, h.count));
      return "";
    case MsgType::blob:
      if (h.count > kMaxPieceBytes || (h.count == 0 && h.total_n != 0))
        return "a piece of " + std::to_string(h.count) + " bytes of a blob of " +
               std::to_string(h.total_n) + " (1 to " + std::to_string(kMaxPieceBytes) +
               " allowed; 0 only for an empty blob)";
      if (h.offset > h.total_n || h.count > h.total_n - h.offset)
        return "a piece of " + std::to_string(h.count) + " bytes at " + std::to_string(h.offset) +
               " past the end of a blob of " + std::to_string(h.total_n);
      if (payload_bytes != h.count)
        return "a piece of " + std::to_string(h.count) + " bytes in " +
               std::to_string(payload_bytes) + " bytes";
      return "";
    case MsgType::abort:
      if (payload_bytes == 0 || payload_bytes > kMaxAbortBytes)
        return "an abort notice of " + std::to_string(payload_bytes) + " bytes (1 to " +
               std::to_string(kMaxAbortBytes) + " allowed)";
      return "";
    case MsgType::keepalive:
    case MsgType::hello:
      if (payload_bytes != 0)
        return "a payload of " + std::to_string(payload_bytes) + " bytes in a keepalive or hello";
      return "";
  }
  return "unknown message type " + std::to_string(static_cast<unsigned>(h.type));
}

uint64_t fingerprint(const Group& g) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
  };
  mix(std::to_string(g.members.size()));
  for (const Member& m : g.members) {
    mix(m.name);
    mix(m.endpoint);
  }
  for (double w : g.part_weights) {
    uint64_t bits = std::bit_cast<uint64_t>(w);
    mix(std::string_view(reinterpret_cast<const char*>(&bits), sizeof bits));
  }
  // Only a mask that leaves someone out changes the fingerprint: an empty one and one of
  // zeros are the same group, and both keep the fingerprint of groups without the field.
  if (std::any_of(g.left_out.begin(), g.left_out.end(), [](uint8_t f) { return f != 0; })) {
    std::string flags = "left_out:";
    for (uint8_t f : g.left_out) flags.push_back(f != 0 ? '1' : '0');
    mix(flags);
  }
  return h;
}

std::string encode_abort(const Abort& a) {
  std::string body(1, static_cast<char>(a.kind));
  body += a.culprit;
  body.push_back('\0');
  body += a.message;
  return body;
}

std::optional<Abort> decode_abort(std::span<const uint8_t> bytes) {
  if (bytes.empty() || bytes[0] > static_cast<uint8_t>(AbortKind::mismatch)) return std::nullopt;
  std::string_view body(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  Abort a;
  a.kind = static_cast<AbortKind>(bytes[0]);
  size_t z = body.find('\0', 1);
  if (z == std::string_view::npos) {
    a.message = body.substr(1);
  } else {
    a.culprit = body.substr(1, z - 1);
    a.message = body.substr(z + 1);
  }
  return a;
}

}  // namespace loco::collective::detail
