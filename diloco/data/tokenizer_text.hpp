// UTF-8 and GPT-2's byte<->unicode map, for the tokenizer.json encoder (tokenizer_json.cpp,
// bpe_model.cpp). Internal. No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loco::diloco::detail {

// Not a code point: an invalid byte b of a text reads as kInvalidByte + b.
inline constexpr std::uint32_t kInvalidByte = 0x110000;

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// The length of a well-formed UTF-8 sequence that starts with c; 0 when none does.
inline std::size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c < 0xc2) return 0;
  if (c < 0xe0) return 2;
  if (c < 0xf0) return 3;
  return c < 0xf5 ? 4 : 0;
}

// Whether cp, read from n bytes, is neither overlong nor a surrogate nor past U+10FFFF.
inline bool well_formed(std::uint32_t cp, std::size_t n) {
  const std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  return cp >= least[n] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
}

// The code point at s[i], advancing i past it. A byte that does not start a well-formed
// sequence (a corpus file need not be UTF-8) reads as kInvalidByte + byte, one byte long.
inline std::uint32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t n = utf8_length(c);
  std::uint32_t cp = n == 1 ? c : (c & (0x7fu >> n));
  bool ok = n != 0 && i + n <= s.size();
  for (std::size_t k = 1; ok && k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    ok = (d & 0xc0) == 0x80;
    cp = (cp << 6) | (d & 0x3fu);
  }
  if (!ok || !well_formed(cp, n)) {
    ++i;
    return kInvalidByte + c;
  }
  i += n;
  return cp;
}

// GPT-2's byte <-> unicode map: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100 onwards, in byte order; no byte becomes whitespace or a control.
struct ByteMap {
  std::string utf8[256];     // byte -> its character, UTF-8
  std::vector<int> byte_of;  // code point -> byte, -1 when none (code points < 324)
  ByteMap() : byte_of(324, -1) {
    std::uint32_t extra = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      const std::uint32_t cp = self ? b : extra++;
      append_utf8(utf8[b], cp);
      byte_of[cp] = static_cast<int>(b);
    }
  }
};

inline const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace loco::diloco::detail
