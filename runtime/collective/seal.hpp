// End-to-end sealing of the messages two members exchange through a relay (relay.hpp): the
// relay forwards them, and must neither read nor forge them. Internal to the collective.
//
// Each communicator makes an ephemeral key-exchange pair (libsodium's crypto_kx) when it is
// built; its public half travels in the Member description (over the cluster's CURVE-secured
// runtime, which the relay is no part of). A pair of members derives two session keys from
// their pairs (crypto_kx_client/server_session_keys; the member whose public key sorts first
// is the "client"), one per direction. A sealed payload is
//   u64 sequence (little-endian) | 24-byte random nonce | XChaCha20-Poly1305 ciphertext + tag
// with the header frame, the channel, the sequence and the sender's name as associated data.
// The sequence, per direction and channel, strictly increases: a replayed or reordered message
// fails like a forged one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loco::collective::detail {

inline constexpr size_t kKxKeyBytes = 32;
// Bytes a sealed payload has beyond its plaintext: sequence, nonce, tag.
inline constexpr size_t kSealOverhead = 8 + 24 + 16;

struct KxKeyPair {
  std::array<uint8_t, kKxKeyBytes> public_key{};
  std::array<uint8_t, kKxKeyBytes> secret_key{};
  static KxKeyPair generate();
  std::string public_hex() const;  // 64 lowercase hex characters
};

// The 32 bytes of a public key in hex (Member::kx_public), or nullopt when it is not one.
std::optional<std::array<uint8_t, kKxKeyBytes>> parse_kx_public(std::string_view hex);

struct SessionKeys {
  std::array<uint8_t, 32> rx{};  // opens what the peer sealed
  std::array<uint8_t, 32> tx{};  // seals what goes to the peer
};
// Nullopt when the peer's key is unusable (libsodium refuses it) or is our own.
std::optional<SessionKeys> session_keys(const KxKeyPair& mine,
                                        const std::array<uint8_t, kKxKeyBytes>& theirs);

// Seals `plain` for the peer: the bytes to send as the payload frame.
std::vector<uint8_t> seal(const SessionKeys& keys, uint64_t sequence, uint8_t channel,
                          std::span<const uint8_t> header, std::string_view sender,
                          std::span<const uint8_t> plain);
// Opens a sealed payload into `plain`; false (and `plain` empty) when it is too short or does
// not authenticate with these keys and this associated data. `sequence` gets its sequence.
bool open(const SessionKeys& keys, uint8_t channel, std::span<const uint8_t> header,
          std::string_view sender, std::span<const uint8_t> sealed, uint64_t& sequence,
          std::vector<uint8_t>& plain);

}  // namespace loco::collective::detail
