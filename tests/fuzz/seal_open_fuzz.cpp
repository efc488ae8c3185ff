// The end-to-end sealing of relayed messages (runtime/collective/seal.cpp, open): what a hostile
// relay hands a member. Each input is used twice:
//   1. as a sealed payload itself: it must never open (forging needs the pair's key), and a
//      refused payload leaves the plaintext empty;
//   2. as a tamper mask over a message sealed here (XORed onto its bytes, its tail appended):
//      the message opens exactly when the mask changed nothing, and then to what was sealed,
//      under its sequence.
#include <sodium.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/collective/seal.hpp"

using namespace loco::collective::detail;

namespace {

struct Pair {
  SessionKeys sender, receiver;
};

KxKeyPair seeded(uint8_t seed) {
  KxKeyPair k;
  std::array<uint8_t, crypto_kx_SEEDBYTES> s{};
  s.fill(seed);
  crypto_kx_seed_keypair(k.public_key.data(), k.secret_key.data(), s.data());
  return k;
}

const Pair& keys() {
  static const Pair p = [] {
    if (sodium_init() < 0) __builtin_trap();
    const KxKeyPair a = seeded(1), b = seeded(2);
    auto ab = session_keys(a, b.public_key), ba = session_keys(b, a.public_key);
    if (!ab || !ba) __builtin_trap();
    return Pair{*ab, *ba};
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Pair& k = keys();
  const std::vector<uint8_t> header = {'L', 'C', 1, 0, 9, 9, 9, 9};
  const std::string_view sender = "w0";
  const std::span<const uint8_t> input(data, size);
  uint64_t sequence = 0;
  std::vector<uint8_t> plain = {1};
  if (open(k.receiver, 0, header, sender, input, sequence, plain)) __builtin_trap();
  if (!plain.empty()) __builtin_trap();

  const std::vector<uint8_t> message = {'r', 'o', 'u', 'n', 'd', ' ', 'd', 'a', 't', 'a'};
  std::vector<uint8_t> sealed = seal(k.sender, 7, 0, header, sender, message);
  bool changed = size > sealed.size();
  for (size_t i = 0; i < std::min(size, sealed.size()); ++i) {
    sealed[i] ^= data[i];
    changed = changed || data[i] != 0;
  }
  if (size > sealed.size()) sealed.insert(sealed.end(), data + sealed.size(), data + size);
  const bool opened = open(k.receiver, 0, header, sender, sealed, sequence, plain);
  if (opened == changed) __builtin_trap();
  if (opened && (sequence != 7 || plain != message)) __builtin_trap();
  return 0;
}
