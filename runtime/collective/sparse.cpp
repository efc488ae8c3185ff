#include "runtime/collective/sparse.hpp"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>

namespace loco::collective::sparse {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

namespace {

constexpr uint8_t kMagic[4] = {'L', 'O', 'S', 'P'};
constexpr uint8_t kVersion = 1;
constexpr uint32_t kMaxLevels = 256;           // 2^8
constexpr uint32_t kNonFinite = 0x7f800000u;   // a key at or above it is Inf or NaN
constexpr uint32_t kThresholdStep = 1u << 21;  // a quarter octave of |x|
constexpr int kThresholdSteps = 16;            // then every entry is a candidate
constexpr int kBisections = 4;                 // of the last quarter octave, at most

// Entries sent, and levels, of a chunk of `len` floats.
uint32_t kept(const Params& p, size_t len) {
  return static_cast<uint32_t>(std::min<size_t>(p.k, len));
}
uint32_t levels(const Params& p, uint32_t kept) { return std::min(1u << p.bits, kept); }
uint32_t index_bits(const Params& p) { return static_cast<uint32_t>(std::bit_width(p.chunk - 1)); }
size_t chunk_bytes(const Params& p, size_t len) {
  const size_t k = kept(p, len);
  return 4 * size_t{levels(p, static_cast<uint32_t>(k))} + (k * (index_bits(p) + p.bits) + 7) / 8;
}

// |x|'s bits: for finite floats they order as |x| does, as integers (and as signed ones: < 2^31).
inline uint32_t key_of(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// The selection's passes over a chunk, on integer keys: exact, so that the AVX2 and scalar
// paths agree bit for bit.
uint32_t max_key_scalar(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, key_of(x[i]));
  return m;
}
size_t count_at_least_scalar(const float* x, size_t n, uint32_t t) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) c += key_of(x[i]) >= t;
  return c;
}
size_t gather_scalar(const float* x, size_t n, uint32_t t, uint32_t* idx, uint32_t* key) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = key_of(x[i]);
    if (k >= t) {
      idx[c] = static_cast<uint32_t>(i);
      key[c++] = k;
    }
  }
  return c;
}

__attribute__((target("avx2"))) inline __m256i keys8(const float* x) {
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)),
                          _mm256_set1_epi32(0x7fffffff));
}

__attribute__((target("avx2"))) uint32_t max_key_avx2(const float* x, size_t n) {
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_epi32(m0, keys8(x + i));
    m1 = _mm256_max_epi32(m1, keys8(x + i + 8));
  }
  alignas(32) uint32_t a[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), _mm256_max_epi32(m0, m1));
  uint32_t m = *std::max_element(a, a + 8);
  return std::max(m, max_key_scalar(x + i, n - i));
}

__attribute__((target("avx2"))) size_t count_at_least_avx2(const float* x, size_t n, uint32_t t) {
  const __m256i below = _mm256_set1_epi32(static_cast<int>(t) - 1);  // t <= 2^31 - 1
  __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {  // a true compare is -1
    c0 = _mm256_sub_epi32(c0, _mm256_cmpgt_epi32(keys8(x + i), below));
    c1 = _mm256_sub_epi32(c1, _mm256_cmpgt_epi32(keys8(x + i + 8), below));
  }
  alignas(32) uint32_t a[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), _mm256_add_epi32(c0, c1));
  size_t c = 0;
  for (uint32_t v : a) c += v;
  return c + count_at_least_scalar(x + i, n - i, t);
}

// For each 8-bit mask, the lanes whose bit is set, first: a permutation that packs them.
struct PackTable {
  alignas(32) uint32_t lanes[256][8];
  constexpr PackTable() : lanes{} {
    for (uint32_t m = 0; m < 256; ++m) {
      uint32_t c = 0;
      for (uint32_t j = 0; j < 8; ++j)
        if (m & (1u << j)) lanes[m][c++] = j;
    }
  }
};
constexpr PackTable kPack;

// Branch-free: every block of 8 stores 8 lanes, of which the candidates come first; idx and
// key need 7 entries of room past the last candidate.
__attribute__((target("avx2"))) size_t gather_avx2(const float* x, size_t n, uint32_t t,
                                                   uint32_t* idx, uint32_t* key) {
  const __m256i below = _mm256_set1_epi32(static_cast<int>(t) - 1);
  __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  size_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8, lane = _mm256_add_epi32(lane, eight)) {
    const __m256i k = keys8(x + i);
    const unsigned mask = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below))));
    const __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPack.lanes[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + c),
                        _mm256_permutevar8x32_epi32(lane, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(key + c), _mm256_permutevar8x32_epi32(k, perm));
    c += static_cast<size_t>(std::popcount(mask));
  }
  for (; i < n; ++i) {
    const uint32_t k = key_of(x[i]);
    if (k >= t) {
      idx[c] = static_cast<uint32_t>(i);
      key[c++] = k;
    }
  }
  return c;
}

struct Scratch {
  explicit Scratch(const Params& p)
      : cand_idx(p.chunk + 8),
        cand_key(p.chunk + 8),
        tmp(p.chunk),
        sel(p.k),
        val(p.k),
        side_key(2 * size_t{p.k}),
        side_entry(2 * size_t{p.k}),
        rank(p.k),
        order(p.k),
        code(p.k) {}
  std::vector<uint32_t> cand_idx, cand_key, tmp;  // a chunk's candidates
  std::vector<uint32_t> sel;                      // the chosen indices, ascending
  std::vector<float> val;                         // their values
  // quantize(): the keys and entries of each sign ([0, k) negative, [k, 2k) the others), their
  // ranks, and the sort of a sign with too many to rank pairwise.
  std::vector<uint32_t> side_key, side_entry, rank;
  std::vector<uint64_t> order;
  std::vector<uint8_t> code;  // the entries' levels
};

// s.sel[0, k) <- the k indices of x[0, len) of largest |x|, ties to the lower index, ascending.
// A threshold t with at least k keys at or above it is found by counting passes (cheap,
// vectorized): down from |x|'s maximum by quarter octaves, then bisecting until few more than
// k remain; those candidates are gathered, and the k-th largest key among them decides
// exactly. Gradient-like data takes ~6 counting passes and ~1.1 k candidates. How t is found
// changes the speed, never the result: the result is the rule's.
void select_top(const float* x, uint32_t len, uint32_t k, uint32_t top, bool simd, Scratch& s) {
  if (k == len) {
    for (uint32_t i = 0; i < len; ++i) s.sel[i] = i;
    return;
  }
  auto count = [&](uint32_t at) {
    return simd ? count_at_least_avx2(x, len, at) : count_at_least_scalar(x, len, at);
  };
  // count(t) >= k > count(hi).
  uint32_t t = top & ~(kThresholdStep - 1), hi = top + 1;
  size_t c = 0;
  for (int step = 0;; ++step) {
    c = count(t);
    if (c >= k) break;
    hi = t;
    if (step == kThresholdSteps || t < kThresholdStep) {
      t = 0;
      c = len;
      break;
    }
    t -= kThresholdStep;
  }
  for (int step = 0; step < kBisections && c > k + k / 8 && hi - t > 1; ++step) {
    const uint32_t mid = t + (hi - t) / 2;
    const size_t cm = count(mid);
    if (cm >= k) {
      t = mid;
      c = cm;
    } else {
      hi = mid;
    }
  }
  uint32_t* idx = s.cand_idx.data();
  uint32_t* key = s.cand_key.data();
  c = simd ? gather_avx2(x, len, t, idx, key) : gather_scalar(x, len, t, idx, key);
  if (c == k) {
    std::copy(idx, idx + k, s.sel.data());
    return;
  }
  // Every key above the k-th largest is taken; of those equal to it, the lowest indices.
  std::copy(key, key + c, s.tmp.data());
  std::nth_element(s.tmp.data(), s.tmp.data() + (k - 1), s.tmp.data() + c, std::greater<>());
  const uint32_t kth = s.tmp[k - 1];
  size_t ties = k;
  for (size_t j = 0; j < c; ++j) ties -= key[j] > kth;
  for (size_t j = 0, out = 0; j < c; ++j) {
    if (key[j] > kth) {
      s.sel[out++] = idx[j];
    } else if (key[j] == kth && ties > 0) {
      s.sel[out++] = idx[j];
      --ties;
    }
  }
}

constexpr uint32_t kPairwiseRank = 128;  // more: sort

// rank[q] <- the place of (key[q], q) among the (key[i], i), i < c, in ascending order. Keys
// are < 2^31, so signed compares are the unsigned ones. Branch-free: the order is random.
void rank_scalar(const uint32_t* key, uint32_t c, uint32_t* rank) {
  for (uint32_t q = 0; q < c; ++q) {
    uint32_t r = 0;
    for (uint32_t i = 0; i < c; ++i) r += (key[i] < key[q]) | ((key[i] == key[q]) & (i < q));
    rank[q] = r;
  }
}

__attribute__((target("avx2"))) void rank_avx2(const uint32_t* key, uint32_t c, uint32_t* rank) {
  const __m256i first_lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  for (uint32_t q = 0; q < c; ++q) {
    const __m256i kq = _mm256_set1_epi32(static_cast<int>(key[q]));
    const __m256i vq = _mm256_set1_epi32(static_cast<int>(q));
    __m256i below = _mm256_setzero_si256(), lane = first_lanes;
    uint32_t i = 0;
    for (; i + 8 <= c; i += 8, lane = _mm256_add_epi32(lane, eight)) {
      const __m256i ki = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i));
      const __m256i tie_before =
          _mm256_and_si256(_mm256_cmpeq_epi32(kq, ki), _mm256_cmpgt_epi32(vq, lane));
      below = _mm256_sub_epi32(below, _mm256_or_si256(_mm256_cmpgt_epi32(kq, ki), tie_before));
    }
    alignas(32) uint32_t a[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(a), below);
    uint32_t r = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    for (; i < c; ++i) r += (key[i] < key[q]) | ((key[i] == key[q]) & (i < q));
    rank[q] = r;
  }
}

void rank_of(const uint32_t* key, uint32_t c, bool simd, Scratch& s) {
  if (c > kPairwiseRank) {
    uint64_t* order = s.order.data();
    for (uint32_t q = 0; q < c; ++q) order[q] = (uint64_t{key[q]} << 32) | q;
    std::sort(order, order + c);
    for (uint32_t r = 0; r < c; ++r) s.rank[static_cast<uint32_t>(order[r])] = r;
  } else if (simd) {
    rank_avx2(key, c, s.rank.data());
  } else {
    rank_scalar(key, c, s.rank.data());
  }
}

// The binning. s.code[j] <- the level of v[j] (j < k), rep[0, m) <- the levels'
// representatives, ascending. Negative and non-negative values are binned apart: the m levels
// are shared between the two signs in proportion to their counts (at least one each when both
// occur), and each sign's values, ordered by (|v|, index), are cut into bins of equal counts
// (bin b of c values in l bins: the places [b c / l, (b + 1) c / l)) whose representative is
// the mean of its values (summed in index order, in double).
// Why: top-k values are two clusters, far from 0, one per sign; a bin that straddled 0 (as
// plain quantile bins of the signed values do when the signs are unbalanced) would send its
// entries as ~0, and a representative of the wrong sign would push them away from their
// value. The mean is the representative of least squared error for its bin (Lloyd's
// condition) and keeps each bin's sum, so the error that feedback carries over sums to 0 per
// bin; equal counts make the bins the quantiles of the selected magnitudes, which needs a
// rank per value and no iteration (k-means would, and its result would depend on its start).
// With m >= k (bits = 8 for k <= 256) every value is its own level: the values are sent exactly.
void quantize(const float* v, uint32_t k, uint32_t m, bool simd, Scratch& s, float* rep) {
  // Each sign's keys, ascending with |v| for the others and descending for the negative
  // ones (so that the levels ascend with the value). Branch-free: the signs are random.
  uint32_t* neg_key = s.side_key.data();
  uint32_t* pos_key = neg_key + k;
  uint32_t* neg_entry = s.side_entry.data();
  uint32_t* pos_entry = neg_entry + k;
  uint32_t neg = 0, pos = 0;
  for (uint32_t j = 0; j < k; ++j) {
    const uint32_t key = key_of(v[j]), is_neg = v[j] < 0;
    neg_key[neg] = 0x7fffffffu - key;
    neg_entry[neg] = j;
    pos_key[pos] = key;
    pos_entry[pos] = j;
    neg += is_neg;
    pos += 1 - is_neg;
  }
  uint32_t neg_levels = 0;
  if (neg == k) {
    neg_levels = m;
  } else if (neg > 0) {
    // Both signs, so k >= 2 and m >= 2. As m <= k, the rounding keeps neg_levels <= neg and
    // m - neg_levels <= pos: no bin is empty.
    neg_levels = std::clamp((m * neg + k / 2) / k, 1u, m - 1);
  }
  auto bin = [&](const uint32_t* key, const uint32_t* entry, uint32_t count, uint32_t bins,
                 uint32_t first_level) {
    if (count == 0) return;
    rank_of(key, count, simd, s);
    // The bin b with b count / bins <= rank < (b + 1) count / bins (floors).
    for (uint32_t q = 0; q < count; ++q)
      s.code[entry[q]] =
          static_cast<uint8_t>(first_level + ((s.rank[q] + 1) * bins + count - 1) / count - 1);
  };
  bin(neg_key, neg_entry, neg, neg_levels, 0);
  bin(pos_key, pos_entry, pos, m - neg_levels, neg_levels);
  double sum[kMaxLevels];
  uint32_t in[kMaxLevels];
  std::fill(sum, sum + m, 0.0);
  std::fill(in, in + m, 0u);
  for (uint32_t j = 0; j < k; ++j) {
    sum[s.code[j]] += v[j];
    ++in[s.code[j]];
  }
  for (uint32_t b = 0; b < m; ++b) rep[b] = static_cast<float>(sum[b] / in[b]);
}

struct BitWriter {
  uint8_t* p;
  uint64_t buf = 0;
  uint32_t have = 0;
  void put(uint32_t v, uint32_t w) {  // w <= 24
    buf |= uint64_t{v} << have;
    have += w;
    for (; have >= 8; have -= 8, buf >>= 8) *p++ = static_cast<uint8_t>(buf);
  }
  void flush() {
    if (have > 0) *p++ = static_cast<uint8_t>(buf);
  }
};

// Reads only the bytes the values taken need: after k values of w bits, ceil(k w / 8) bytes.
struct BitReader {
  const uint8_t* p;
  uint64_t buf = 0;
  uint32_t have = 0;
  uint32_t get(uint32_t w) {  // w <= 24
    for (; have < w; have += 8) buf |= uint64_t{*p++} << have;
    const uint32_t v = static_cast<uint32_t>(buf) & ((1u << w) - 1);
    buf >>= w;
    have -= w;
    return v;
  }
};

[[noreturn]] void fail(const std::string& what) { throw CodecError("sparse codec: " + what); }

// Walks the chunks of a payload whose total size has been checked: kCheck checks every field
// and touches nothing; otherwise it adds (and checks nothing).
template <bool kCheck>
void walk(const uint8_t* src, const Params& p, float scale, float* acc, size_t n,
          uint16_t* senders) {
  const uint32_t ib = index_bits(p), w = ib + p.bits;
  const uint32_t index_mask = (1u << ib) - 1;
  float rep[kMaxLevels];
  for (size_t o = 0, c = 0; o < n; o += p.chunk, ++c) {
    const size_t len = std::min<size_t>(p.chunk, n - o);
    const uint32_t k = kept(p, len), m = levels(p, k);
    std::memcpy(rep, src, 4 * size_t{m});
    src += 4 * size_t{m};
    if constexpr (kCheck) {
      for (uint32_t j = 0; j < m; ++j) {
        if (!std::isfinite(rep[j]))
          fail("chunk " + std::to_string(c) + ": representative " + std::to_string(j) + " is " +
               (std::isnan(rep[j]) ? "NaN" : "infinite"));
      }
    } else {
      for (uint32_t j = 0; j < m; ++j) rep[j] = scale * rep[j];
    }
    BitReader r{src};
    int64_t prev = -1;
    for (uint32_t j = 0; j < k; ++j) {
      const uint32_t v = r.get(w);
      const uint32_t i = v & index_mask, level = v >> ib;
      if constexpr (kCheck) {
        auto at = [c] { return "chunk " + std::to_string(c) + ": "; };
        if (i >= len)
          fail(at() + "index " + std::to_string(i) + " out of range (chunk length " +
               std::to_string(len) + ")");
        if (static_cast<int64_t>(i) == prev) fail(at() + "duplicate index " + std::to_string(i));
        if (static_cast<int64_t>(i) < prev)
          fail(at() + "indices out of order (" + std::to_string(i) + " after " +
               std::to_string(prev) + ")");
        if (level >= m)
          fail(at() + "level " + std::to_string(level) + " out of range (" + std::to_string(m) +
               " levels)");
        prev = i;
      } else {
        acc[o + i] += rep[level];
        if (senders) ++senders[o + i];
      }
    }
    if constexpr (kCheck) {
      if (r.buf != 0) fail("chunk " + std::to_string(c) + ": nonzero padding bits");
    }
    src += (size_t{k} * w + 7) / 8;
  }
}

}  // namespace

void Params::validate() const {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("sparse::Params: " + what);
  };
  if (chunk < 2 || chunk > 65536) bad("chunk " + std::to_string(chunk) + " is outside [2, 65536]");
  if (k < 1 || k > chunk)
    bad("k " + std::to_string(k) + " is outside [1, chunk = " + std::to_string(chunk) + "]");
  if (bits < 1 || bits > 8) bad("bits " + std::to_string(bits) + " is outside [1, 8]");
}

size_t encoded_bytes(size_t n, const Params& p) {
  p.validate();
  const size_t rest = n % p.chunk;
  return kHeaderBytes + n / p.chunk * chunk_bytes(p, p.chunk) + (rest ? chunk_bytes(p, rest) : 0);
}

namespace detail {

std::vector<uint8_t> encode(std::span<const float> x, const Params& p, std::span<float> sent,
                            bool use_simd) {
  p.validate();
  if (sent.size() != x.size())
    throw std::invalid_argument("sparse::encode: sent has " + std::to_string(sent.size()) +
                                " floats, x " + std::to_string(x.size()));
  const bool simd = use_simd && has_avx2();
  const size_t n = x.size();
  std::vector<uint8_t> out(encoded_bytes(n, p));
  uint8_t* dst = out.data();
  std::memcpy(dst, kMagic, 4);
  dst[4] = kVersion;
  dst[5] = static_cast<uint8_t>(p.bits);
  std::memcpy(dst + 8, &p.chunk, 4);
  std::memcpy(dst + 12, &p.k, 4);
  const uint64_t n64 = n;
  std::memcpy(dst + 16, &n64, 8);
  dst += kHeaderBytes;

  Scratch s(p);
  const uint32_t ib = index_bits(p);
  float rep[kMaxLevels];
  for (size_t o = 0; o < n; o += p.chunk) {
    const float* xc = x.data() + o;
    const uint32_t len = static_cast<uint32_t>(std::min<size_t>(p.chunk, n - o));
    const uint32_t k = kept(p, len), m = levels(p, k);
    // NaN and Inf have the largest keys: the maximum shows whether the chunk has one.
    const uint32_t top = simd ? max_key_avx2(xc, len) : max_key_scalar(xc, len);
    if (top >= kNonFinite) {
      size_t i = 0;
      while (key_of(xc[i]) < kNonFinite) ++i;
      throw std::invalid_argument("sparse::encode: x[" + std::to_string(o + i) + "] is " +
                                  (std::isnan(xc[i]) ? "NaN" : "infinite"));
    }
    select_top(xc, len, k, top, simd, s);
    for (uint32_t j = 0; j < k; ++j) s.val[j] = xc[s.sel[j]];
    quantize(s.val.data(), k, m, simd, s, rep);

    std::memcpy(dst, rep, 4 * size_t{m});
    dst += 4 * size_t{m};
    BitWriter bw{dst};
    for (uint32_t j = 0; j < k; ++j) bw.put(s.sel[j] | (uint32_t{s.code[j]} << ib), ib + p.bits);
    bw.flush();
    dst = bw.p;

    float* sc = sent.data() + o;
    std::fill(sc, sc + len, 0.0f);
    for (uint32_t j = 0; j < k; ++j) sc[s.sel[j]] = rep[s.code[j]];
  }
  return out;
}

}  // namespace detail

std::vector<uint8_t> encode(std::span<const float> x, const Params& p, std::span<float> sent) {
  return detail::encode(x, p, sent, true);
}

void decode_add(std::span<const uint8_t> bytes, const Params& p, float scale,
                std::span<float> acc, std::span<uint16_t> senders) {
  p.validate();
  const size_t n = acc.size();
  const uint8_t* b = bytes.data();
  if (bytes.size() < kHeaderBytes)
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
         std::to_string(kHeaderBytes) + "-byte header");
  if (std::memcmp(b, kMagic, 4) != 0) fail("bad magic: not a sparse-codec payload");
  if (b[4] != kVersion)
    fail("version " + std::to_string(b[4]) + ", this build reads " + std::to_string(kVersion));
  if (b[6] != 0 || b[7] != 0) fail("nonzero reserved header bytes");
  const uint64_t their_n = load_u64(b + 16);
  if (their_n != n)
    fail("wrong n: the payload holds " + std::to_string(their_n) + " floats, expected " +
         std::to_string(n));
  const uint32_t bits = b[5], chunk = load_u32(b + 8), k = load_u32(b + 12);
  if (chunk != p.chunk || k != p.k || bits != p.bits)
    fail("wrong params: the payload has chunk " + std::to_string(chunk) + " k " +
         std::to_string(k) + " bits " + std::to_string(bits) + ", expected chunk " +
         std::to_string(p.chunk) + " k " + std::to_string(p.k) + " bits " + std::to_string(p.bits));
  const size_t expected = encoded_bytes(n, p);
  if (bytes.size() < expected)
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, expected " +
         std::to_string(expected));
  if (bytes.size() > expected)
    fail("trailing bytes: " + std::to_string(bytes.size()) + " bytes, expected " +
         std::to_string(expected));
  if (!senders.empty() && senders.size() != n)
    throw std::invalid_argument("decode_add: " + std::to_string(senders.size()) +
                                " sender counts for " + std::to_string(n) + " values");
  walk<true>(b + kHeaderBytes, p, scale, acc.data(), n, nullptr);
  walk<false>(b + kHeaderBytes, p, scale, acc.data(), n,
              senders.empty() ? nullptr : senders.data());
}

}  // namespace loco::collective::sparse
