#include "runtime/collective/codec.hpp"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace loco::collective {

std::optional<Codec> parse_codec(std::string_view name) {
  if (name == "fp32") return Codec::fp32;
  if (name == "fp16") return Codec::fp16;
  if (name == "bf16") return Codec::bf16;
  if (name == "int8") return Codec::int8;
  return std::nullopt;
}

std::string_view to_string(Codec codec) {
  switch (codec) {
    case Codec::fp32:
      return "fp32";
    case Codec::fp16:
      return "fp16";
    case Codec::bf16:
      return "bf16";
    case Codec::int8:
      return "int8";
  }
  return "?";
}

size_t encoded_bytes(Codec codec, size_t count) {
  switch (codec) {
    case Codec::fp32:
      return 4 * count;
    case Codec::fp16:
    case Codec::bf16:
      return 2 * count;
    case Codec::int8:
      return detail::kInt8Header + count;
  }
  return 0;
}

namespace detail {
namespace {

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// IEEE half <-> float, round to nearest even; the F16C paths below give the same bits.
uint16_t float_to_half_scalar(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {                                               // subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float half_to_float_scalar(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {  // subnormal: normalize
    e = 113;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(x);
}

bool has_f16c() {
  // CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }();
  return yes;
}

__attribute__((target("avx,f16c"))) void encode_fp16_f16c(const float* src, size_t n,
                                                          uint8_t* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) {
    uint16_t h = float_to_half_scalar(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

template <bool kAdd>
__attribute__((target("avx,f16c"))) void decode_fp16_f16c(const uint8_t* src, size_t n,
                                                          float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
    if constexpr (kAdd) f = _mm256_add_ps(_mm256_loadu_ps(dst + i), f);
    _mm256_storeu_ps(dst + i, f);
  }
  for (; i < n; ++i) {
    float f = half_to_float_scalar(load_u16(src + 2 * i));
    if constexpr (kAdd) {
      dst[i] += f;
    } else {
      dst[i] = f;
    }
  }
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// One pass: min, max and whether anything is NaN (Inf shows in min/max).
__attribute__((target("avx2"))) void int8_minmax_avx2(const float* src, size_t n, float& mn,
                                                      float& mx, bool& nan) {
  __m256 vmin = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 vnan = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(src + i);
    vmin = _mm256_min_ps(vmin, x);
    vmax = _mm256_max_ps(vmax, x);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, vmin);
  _mm256_store_ps(b, vmax);
  nan = _mm256_movemask_ps(vnan) != 0;
  mn = a[0];
  mx = b[0];
  for (int j = 1; j < 8; ++j) {
    mn = std::min(mn, a[j]);
    mx = std::max(mx, b[j]);
  }
  for (; i < n; ++i) {
    mn = std::min(mn, src[i]);
    mx = std::max(mx, src[i]);
    nan |= std::isnan(src[i]);
  }
}

// q = trunc(clamp((x - lo) * inv + 0.5, 0, 255)), exactly as the scalar loop (no FMA).
__attribute__((target("avx2"))) size_t int8_quantize_avx2(const float* src, size_t n, float lo,
                                                          float inv, uint8_t* q) {
  const __m256 vlo = _mm256_set1_ps(lo), vinv = _mm256_set1_ps(inv);
  const __m256 half = _mm256_set1_ps(0.5f), zero = _mm256_setzero_ps();
  const __m256 top = _mm256_set1_ps(255.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      __m256 x = _mm256_loadu_ps(src + i + 8 * j);
      x = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, vlo), vinv), half);
      x = _mm256_min_ps(_mm256_max_ps(x, zero), top);
      v[j] = _mm256_cvttps_epi32(x);
    }
    __m256i w =
        _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(w, order));
  }
  return i;
}

void int8_range(const float* src, size_t n, float& lo, float& scale) {
  float mn = std::numeric_limits<float>::infinity();
  float mx = -mn;
  bool finite = true;
  if (has_avx2()) {
    bool nan = false;
    int8_minmax_avx2(src, n, mn, mx, nan);
    finite = !nan && (n == 0 || (std::isfinite(mn) && std::isfinite(mx)));
  } else {
    for (size_t i = 0; i < n; ++i) {
      mn = std::min(mn, src[i]);
      mx = std::max(mx, src[i]);
    }
    finite = all_finite(src, n);
  }
  if (!finite) {
    lo = std::numeric_limits<float>::quiet_NaN();
    scale = 0;
    return;
  }
  if (n == 0) mn = mx = 0;
  lo = mn;
  scale = (mx - mn) / 255.0f;
  if (!(scale > 0) || !std::isfinite(scale)) scale = 0;
}

// Values [begin, begin + n) of an int8 chunk.
template <bool kAdd>
void decode_int8(const uint8_t* src, size_t begin, size_t n, float* dst) {
  float lo = load_f32(src);
  float scale = load_f32(src + 4);
  const uint8_t* q = src + kInt8Header + begin;
  for (size_t i = 0; i < n; ++i) {
    float f = lo + static_cast<float>(q[i]) * scale;
    if constexpr (kAdd) {
      dst[i] += f;
    } else {
      dst[i] = f;
    }
  }
}

// dst = (or +=) the values [begin, begin + n) of an encoded chunk.
template <bool kAdd>
void decode_range(Codec codec, const uint8_t* src, size_t begin, size_t n, float* dst) {
  switch (codec) {
    case Codec::fp32:
      src += 4 * begin;
      if constexpr (kAdd) {
        for (size_t i = 0; i < n; ++i) dst[i] += load_f32(src + 4 * i);
      } else {
        std::memcpy(dst, src, 4 * n);
      }
      return;
    case Codec::fp16:
      src += 2 * begin;
      if (has_f16c()) {
        decode_fp16_f16c<kAdd>(src, n, dst);
        return;
      }
      for (size_t i = 0; i < n; ++i) {
        float f = half_to_float_scalar(load_u16(src + 2 * i));
        dst[i] = kAdd ? dst[i] + f : f;
      }
      return;
    case Codec::bf16:
      src += 2 * begin;
      for (size_t i = 0; i < n; ++i) {
        float f = bf16_to_float(load_u16(src + 2 * i));
        dst[i] = kAdd ? dst[i] + f : f;
      }
      return;
    case Codec::int8:
      decode_int8<kAdd>(src, begin, n, dst);
      return;
  }
}

bool has_avx() {
  static const bool yes = __builtin_cpu_supports("avx");
  return yes;
}

// mean_of for fp32 in one pass: each output is summed in a register. No FMA and the same
// order as the blocked path, so the floats are the same.
__attribute__((target("avx"))) void mean_fp32_avx(const float* const* src, size_t m, size_t n,
                                                  float* out) {
  const __m256 vk = _mm256_set1_ps(static_cast<float>(m));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 s = _mm256_loadu_ps(src[0] + i);
    for (size_t r = 1; r < m; ++r) s = _mm256_add_ps(s, _mm256_loadu_ps(src[r] + i));
    _mm256_storeu_ps(out + i, _mm256_div_ps(s, vk));
  }
  const float k = static_cast<float>(m);
  for (; i < n; ++i) {
    float s = load_f32(reinterpret_cast<const uint8_t*>(src[0] + i));
    for (size_t r = 1; r < m; ++r) s += load_f32(reinterpret_cast<const uint8_t*>(src[r] + i));
    out[i] = s / k;
  }
}

}  // namespace

bool all_finite(const float* data, size_t count) {
  // Branch-free so that it vectorizes; a NaN fails the comparison.
  int ok = 1;
  constexpr float kMax = std::numeric_limits<float>::max();
  for (size_t i = 0; i < count; ++i) ok &= (std::fabs(data[i]) <= kMax);
  return ok != 0;
}

size_t first_nonfinite(const float* data, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(data[i])) return i;
  return count;
}

void encode(Codec codec, const float* src, size_t n, uint8_t* dst) {
  switch (codec) {
    case Codec::fp32:
      std::memcpy(dst, src, 4 * n);
      return;
    case Codec::fp16:
      if (has_f16c()) {
        encode_fp16_f16c(src, n, dst);
      } else {
        for (size_t i = 0; i < n; ++i) {
          uint16_t h = float_to_half_scalar(src[i]);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      }
      return;
    case Codec::bf16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = float_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case Codec::int8: {
      float lo, scale;
      int8_range(src, n, lo, scale);
      std::memcpy(dst, &lo, 4);
      std::memcpy(dst + 4, &scale, 4);
      uint8_t* q = dst + kInt8Header;
      float inv = scale > 0 ? 1.0f / scale : 0.0f;
      size_t i = 0;
      if (has_avx2() && lo == lo) i = int8_quantize_avx2(src, n, lo, inv, q);
      for (; i < n; ++i) {
        float v = (src[i] - lo) * inv + 0.5f;
        v = std::min(std::max(v, 0.0f), 255.0f);  // also maps NaN to 0 (lo is NaN then)
        q[i] = static_cast<uint8_t>(static_cast<int>(v));
      }
      return;
    }
  }
}

void decode(Codec codec, const uint8_t* src, size_t n, float* dst) {
  decode_range<false>(codec, src, 0, n, dst);
}

void mean_of(Codec codec, std::span<const Addend> addends, size_t n, float* out) {
  const size_t m = addends.size();
  if (m == 0) {
    std::fill(out, out + n, 0.0f);
    return;
  }
  constexpr size_t kMaxFused = 64;
  if (codec == Codec::fp32 && m <= kMaxFused && has_avx()) {
    const float* src[kMaxFused];
    for (size_t r = 0; r < m; ++r) src[r] = static_cast<const float*>(addends[r].data);
    mean_fp32_avx(src, m, n, out);
    return;
  }
  // Block by block, so that the partial sums stay in L1 while every addend streams by once.
  constexpr size_t kBlock = 2048;
  const float k = static_cast<float>(m);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    float* acc = out + b;
    for (size_t r = 0; r < m; ++r) {
      const Addend& a = addends[r];
      if (a.raw) {
        const float* x = static_cast<const float*>(a.data) + b;
        if (r == 0) {
          std::memcpy(acc, x, len * sizeof(float));
        } else {
          for (size_t i = 0; i < len; ++i) acc[i] += x[i];
        }
      } else if (r == 0) {
        decode_range<false>(codec, static_cast<const uint8_t*>(a.data), b, len, acc);
      } else {
        decode_range<true>(codec, static_cast<const uint8_t*>(a.data), b, len, acc);
      }
    }
    for (size_t i = 0; i < len; ++i) acc[i] = acc[i] / k;
  }
}

}  // namespace detail

namespace {
void require_half(Codec codec, const char* what) {
  if (codec != Codec::fp16 && codec != Codec::bf16)
    throw std::invalid_argument(std::string(what) + ": " + std::string(to_string(codec)) +
                                " is not a 2-byte float type");
}
}  // namespace

void encode_half(Codec codec, const float* src, size_t count, uint8_t* dst) {
  require_half(codec, "encode_half");
  detail::encode(codec, src, count, dst);
}

void decode_half(Codec codec, const uint8_t* src, size_t count, float* dst) {
  require_half(codec, "decode_half");
  detail::decode(codec, src, count, dst);
}

}  // namespace loco::collective
