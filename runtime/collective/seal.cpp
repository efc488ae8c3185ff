#include "runtime/collective/seal.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace loco::collective::detail {
namespace {

void init_sodium() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("collective: libsodium failed to initialize");
}

constexpr size_t kNonce = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
constexpr size_t kTag = crypto_aead_xchacha20poly1305_ietf_ABYTES;
static_assert(kSealOverhead == 8 + kNonce + kTag);
static_assert(kKxKeyBytes == crypto_kx_PUBLICKEYBYTES && kKxKeyBytes == crypto_kx_SECRETKEYBYTES);

std::vector<uint8_t> associated(uint8_t channel, std::span<const uint8_t> header,
                                std::string_view sender, uint64_t sequence) {
  std::vector<uint8_t> ad;
  ad.reserve(header.size() + 1 + 8 + sender.size());
  ad.insert(ad.end(), header.begin(), header.end());
  ad.push_back(channel);
  for (int i = 0; i < 8; ++i) ad.push_back(static_cast<uint8_t>(sequence >> (8 * i)));
  ad.insert(ad.end(), sender.begin(), sender.end());
  return ad;
}

}  // namespace

KxKeyPair KxKeyPair::generate() {
  init_sodium();
  KxKeyPair k;
  crypto_kx_keypair(k.public_key.data(), k.secret_key.data());
  return k;
}

std::string KxKeyPair::public_hex() const {
  std::string hex(2 * kKxKeyBytes + 1, '\0');
  sodium_bin2hex(hex.data(), hex.size(), public_key.data(), public_key.size());
  hex.pop_back();
  return hex;
}

std::optional<std::array<uint8_t, kKxKeyBytes>> parse_kx_public(std::string_view hex) {
  if (hex.size() != 2 * kKxKeyBytes) return std::nullopt;
  std::array<uint8_t, kKxKeyBytes> key{};
  for (size_t i = 0; i < kKxKeyBytes; ++i) {
    auto nibble = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    key[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return key;
}

std::optional<SessionKeys> session_keys(const KxKeyPair& mine,
                                        const std::array<uint8_t, kKxKeyBytes>& theirs) {
  init_sodium();
  const int order = std::memcmp(mine.public_key.data(), theirs.data(), kKxKeyBytes);
  if (order == 0) return std::nullopt;
  SessionKeys k;
  const int rc = order < 0 ? crypto_kx_client_session_keys(k.rx.data(), k.tx.data(),
                                                           mine.public_key.data(),
                                                           mine.secret_key.data(), theirs.data())
                           : crypto_kx_server_session_keys(k.rx.data(), k.tx.data(),
                                                           mine.public_key.data(),
                                                           mine.secret_key.data(), theirs.data());
  if (rc != 0) return std::nullopt;
  return k;
}

std::vector<uint8_t> seal(const SessionKeys& keys, uint64_t sequence, uint8_t channel,
                          std::span<const uint8_t> header, std::string_view sender,
                          std::span<const uint8_t> plain) {
  std::vector<uint8_t> out(kSealOverhead + plain.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(sequence >> (8 * i));
  uint8_t* nonce = out.data() + 8;
  randombytes_buf(nonce, kNonce);
  const auto ad = associated(channel, header, sender, sequence);
  unsigned long long len = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(out.data() + 8 + kNonce, &len, plain.data(),
                                             plain.size(), ad.data(), ad.size(), nullptr, nonce,
                                             keys.tx.data());
  out.resize(8 + kNonce + len);
  return out;
}

bool open(const SessionKeys& keys, uint8_t channel, std::span<const uint8_t> header,
          std::string_view sender, std::span<const uint8_t> sealed, uint64_t& sequence,
          std::vector<uint8_t>& plain) {
  plain.clear();
  if (sealed.size() < kSealOverhead) return false;
  sequence = 0;
  for (int i = 0; i < 8; ++i) sequence |= uint64_t(sealed[i]) << (8 * i);
  const uint8_t* nonce = sealed.data() + 8;
  const auto ad = associated(channel, header, sender, sequence);
  plain.resize(sealed.size() - kSealOverhead);
  unsigned long long len = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(plain.data(), &len, nullptr, nonce + kNonce,
                                                 sealed.size() - 8 - kNonce, ad.data(), ad.size(),
                                                 nonce, keys.rx.data()) != 0) {
    plain.clear();
    return false;
  }
  plain.resize(len);
  return true;
}

}  // namespace loco::collective::detail
