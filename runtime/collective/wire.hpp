// The collective's wire format, apart from any transport. Internal to the collective.
//
// A message is three parts: a fixed binary Header, the sender's member name, and a payload
// (one encoded chunk, an abort notice, or nothing for a keepalive). Every field of a received
// header is checked against the operation before it is used; parse_header() only checks that
// the bytes are a header of this version at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "runtime/collective/types.hpp"

namespace loco::collective::detail {

inline constexpr uint32_t kMagic = 0x52414f4cu;  // "LOAR"
// 3: keepalives and aborts travel on a connection of their own (see liveness.hpp).
// 4: each operation opens with a hello on the data connection.
inline constexpr uint8_t kVersion = 4;

// reduce_scatter, all_gather: the all-reduce's chunks (butterfly.hpp); their offset and count
// are floats, total_n the vector's length. keepalive: "still in this operation", sent to every
// peer every peer_timeout / 4 on the control connection. hello: the first message of an
// operation on the data connection, ahead of the data: it tells the receiver which connection
// carries the sender's data, whose bytes then prove the sender alive before a whole chunk has
// arrived (liveness.hpp). blob: a piece of the sender's blob in an all-gather (gather.hpp):
// bytes [offset, offset + count) of total_n; an empty blob is one piece of none.
enum class MsgType : uint8_t {
  reduce_scatter = 1,
  all_gather = 2,
  abort = 3,
  keepalive = 4,
  hello = 5,
  blob = 6
};
// Why an operation was aborted; peer_lost names a member that is gone, mismatch one whose
// vector, codec or chunking differs from the group's.
enum class AbortKind : uint8_t { error = 0, peer_lost = 1, mismatch = 2 };

#pragma pack(push, 1)
struct Header {
  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  MsgType type = MsgType::keepalive;
  Codec codec = Codec::fp32;
  uint8_t reserved = 0;
  uint32_t sender_rank = 0;
  uint32_t part = 0;
  uint64_t group_fp = 0;  // fingerprint() of the sender's group
  uint64_t round_id = 0;
  uint64_t total_n = 0;  // length of the sender's whole vector, in floats (a blob: bytes)
  uint64_t offset = 0;   // first float of the chunk, relative to the part (a blob: byte)
  uint64_t count = 0;    // floats in the chunk (a blob: bytes)
};
#pragma pack(pop)

// The header in `bytes`, or nullopt when they are not a header of this magic and version.
std::optional<Header> parse_header(std::span<const uint8_t> bytes);

// Bounds on what a received message may hold, whatever its operation.
inline constexpr size_t kMaxSenderBytes = 256;              // a member's name
inline constexpr size_t kMaxAbortBytes = size_t(64) << 10;  // an abort notice
inline constexpr uint64_t kMaxChunkFloats = uint64_t(1) << 30;
inline constexpr uint64_t kMaxPieceBytes = uint64_t(1) << 32;  // of a blob
// What can be checked of a received message without its operation: a known type and codec,
// a short sender name, a chunk of at most kMaxChunkFloats (a piece of a blob: kMaxPieceBytes,
// none only for an empty blob) within its vector or blob, whose payload has exactly the bytes
// its header promises, an abort of at most kMaxAbortBytes, nothing in a keepalive or hello.
// "" when all hold, else the first that does not (for a log line; such a message is dropped:
// nothing in it can be trusted, not even the name of the member it claims to come from).
std::string check_message(const Header& h, size_t sender_bytes, size_t payload_bytes);

// Identifies a group: members (names and endpoints, in order), part weights and who is left
// out of the mean. Members of different groups that happen to share a round id never mix
// their data.
uint64_t fingerprint(const Group& g);

struct Abort {
  AbortKind kind = AbortKind::error;
  std::string culprit;  // the member at fault, "" when none is known
  std::string message;
};
std::string encode_abort(const Abort& a);
// nullopt for an empty payload or an unknown kind.
std::optional<Abort> decode_abort(std::span<const uint8_t> bytes);

}  // namespace loco::collective::detail
