// The sparse top-k codec (runtime/collective/sparse.hpp): the selection against a full sort,
// the binning, the wire format as documented, error feedback over rounds, and decode_add's
// checks of hostile bytes.
#include "runtime/collective/sparse.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "tests/collective/test_util.hpp"

namespace loco::collective::sparse {
namespace {

using collective::testing::make_data;

struct Encoded {
  std::vector<uint8_t> bytes;
  std::vector<float> sent;
};

Encoded encode_of(const std::vector<float>& x, const Params& p, bool simd = true) {
  Encoded e;
  e.sent.assign(x.size(), -7.0f);  // encode must overwrite every entry
  e.bytes = detail::encode(x, p, e.sent, simd);
  return e;
}

std::vector<float> decoded(const std::vector<uint8_t>& bytes, const Params& p, size_t n) {
  std::vector<float> acc(n, 0.0f);
  decode_add(bytes, p, 1.0f, acc);
  return acc;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

// The wire format as sparse.hpp documents it, read and written independently of sparse.cpp.
struct Entry {
  uint32_t index, level;
};
struct WireChunk {
  std::vector<float> reps;
  std::vector<Entry> entries;
};
struct Wire {
  std::vector<uint8_t> header;
  std::vector<WireChunk> chunks;
};

uint32_t index_bits(const Params& p) { return std::bit_width(p.chunk - 1); }

Wire parse(const std::vector<uint8_t>& bytes, const Params& p, size_t n) {
  Wire w;
  w.header.assign(bytes.begin(), bytes.begin() + 24);
  size_t at = 24;
  const uint32_t ib = index_bits(p), width = ib + p.bits;
  for (size_t o = 0; o < n; o += p.chunk) {
    const size_t len = std::min<size_t>(p.chunk, n - o);
    const uint32_t k = std::min<size_t>(p.k, len), m = std::min(1u << p.bits, k);
    WireChunk c;
    c.reps.resize(m);
    std::memcpy(c.reps.data(), bytes.data() + at, 4 * m);
    at += 4 * m;
    for (uint32_t j = 0; j < k; ++j) {
      uint32_t v = 0;
      for (uint32_t b = 0; b < width; ++b) {
        const size_t bit = size_t{j} * width + b;
        v |= ((bytes[at + bit / 8] >> (bit % 8)) & 1u) << b;
      }
      c.entries.push_back({v & ((1u << ib) - 1), v >> ib});
    }
    at += (size_t{k} * width + 7) / 8;
    w.chunks.push_back(std::move(c));
  }
  EXPECT_EQ(at, bytes.size());
  return w;
}

std::vector<uint8_t> pack(const Wire& w, const Params& p, uint8_t padding = 0) {
  std::vector<uint8_t> out = w.header;
  const uint32_t ib = index_bits(p), width = ib + p.bits;
  for (const WireChunk& c : w.chunks) {
    const size_t at = out.size();
    out.resize(at + 4 * c.reps.size());
    std::memcpy(out.data() + at, c.reps.data(), 4 * c.reps.size());
    std::vector<uint8_t> bits((c.entries.size() * width + 7) / 8, 0);
    for (size_t j = 0; j < c.entries.size(); ++j) {
      const uint32_t v = c.entries[j].index | (c.entries[j].level << ib);
      for (uint32_t b = 0; b < width; ++b) {
        const size_t bit = j * width + b;
        bits[bit / 8] |= static_cast<uint8_t>(((v >> b) & 1u) << (bit % 8));
      }
    }
    const size_t used = c.entries.size() * width % 8;
    if (used != 0) bits.back() |= static_cast<uint8_t>(padding << used);
    out.insert(out.end(), bits.begin(), bits.end());
  }
  return out;
}

// The rule, by a full sort: per chunk, the k' indices of largest |x|, ties to the lower one.
std::vector<size_t> reference_top(const std::vector<float>& x, const Params& p) {
  std::vector<size_t> out;
  for (size_t o = 0; o < x.size(); o += p.chunk) {
    const size_t len = std::min<size_t>(p.chunk, x.size() - o);
    std::vector<size_t> order(len);
    std::iota(order.begin(), order.end(), o);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    order.resize(std::min<size_t>(p.k, len));
    std::sort(order.begin(), order.end());
    out.insert(out.end(), order.begin(), order.end());
  }
  return out;
}

std::vector<size_t> sent_indices(const std::vector<uint8_t>& bytes, const Params& p, size_t n) {
  std::vector<size_t> out;
  const Wire w = parse(bytes, p, n);
  for (size_t c = 0; c < w.chunks.size(); ++c)
    for (const Entry& e : w.chunks[c].entries) out.push_back(c * p.chunk + e.index);
  return out;
}

// Gradient-like data: roughly normal (a sum of four uniforms), scaled.
std::vector<float> normal_data(uint64_t seed, size_t n, float scale = 1e-3f) {
  std::vector<float> x(n, 0.0f);
  for (int r = 0; r < 4; ++r) {
    const auto u = make_data(seed, r, n);
    for (size_t i = 0; i < n; ++i) x[i] += u[i] * scale;
  }
  return x;
}

const Params kShapes[] = {{4096, 64, 2}, {256, 16, 3}, {100, 7, 1}, {2, 1, 1}, {65536, 300, 8}};

TEST(SparseCodec, RoundTripIsSentBitForBit) {
  for (const Params& p : kShapes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{p.chunk}, size_t{3} * p.chunk + 5}) {
      const auto x = normal_data(n + p.chunk, n);
      const Encoded e = encode_of(x, p);
      EXPECT_TRUE(same_bits(decoded(e.bytes, p, n), e.sent))
          << "chunk " << p.chunk << " k " << p.k << " bits " << p.bits << " n " << n;
      // The same bytes again, and from the scalar selection.
      const Encoded again = encode_of(x, p), scalar = encode_of(x, p, false);
      EXPECT_EQ(again.bytes, e.bytes);
      EXPECT_EQ(scalar.bytes, e.bytes);
      EXPECT_TRUE(same_bits(scalar.sent, e.sent));
      // `sent` is 0 off the chosen entries.
      const auto chosen = sent_indices(e.bytes, p, n);
      std::set<size_t> on(chosen.begin(), chosen.end());
      for (size_t i = 0; i < n; ++i)
        if (!on.count(i)) {
          ASSERT_EQ(std::bit_cast<uint32_t>(e.sent[i]), 0u) << i;
        }
    }
  }
}

TEST(SparseCodec, WireHeaderIsAsDocumented) {
  const Params p{256, 16, 3};
  const Encoded e = encode_of(normal_data(1, 1000), p);
  ASSERT_GE(e.bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(e.bytes.data(), "LOSP", 4), 0);
  EXPECT_EQ(e.bytes[4], 1);  // version
  EXPECT_EQ(e.bytes[5], 3);  // bits
  EXPECT_EQ(e.bytes[6] | e.bytes[7], 0);
  uint32_t chunk, k;
  uint64_t n;
  std::memcpy(&chunk, e.bytes.data() + 8, 4);
  std::memcpy(&k, e.bytes.data() + 12, 4);
  std::memcpy(&n, e.bytes.data() + 16, 8);
  EXPECT_EQ(chunk, 256u);
  EXPECT_EQ(k, 16u);
  EXPECT_EQ(n, 1000u);
  const Wire w = parse(e.bytes, p, 1000);
  EXPECT_EQ(pack(w, p), e.bytes);
  for (const WireChunk& c : w.chunks) EXPECT_TRUE(std::is_sorted(c.reps.begin(), c.reps.end()));
}

TEST(SparseCodec, TopKPicksTheLargestMagnitudesPerChunkTiesToTheLowerIndex) {
  // By hand: |x| = 1 3 2 3 2 .5 3 1 in a chunk of 8.
  const std::vector<float> x = {1, -3, 2, 3, -2, 0.5f, 3, 1};
  EXPECT_EQ(sent_indices(encode_of(x, {8, 3, 2}).bytes, {8, 3, 2}, 8),
            (std::vector<size_t>{1, 3, 6}));
  EXPECT_EQ(sent_indices(encode_of(x, {8, 4, 2}).bytes, {8, 4, 2}, 8),
            (std::vector<size_t>{1, 2, 3, 6}));
  EXPECT_EQ(sent_indices(encode_of(x, {4, 1, 1}).bytes, {4, 1, 1}, 8), (std::vector<size_t>{1, 6}));

  // Against a full sort, on data that takes each of the selection's ways.
  std::vector<std::pair<const char*, std::vector<float>>> cases;
  cases.push_back({"normal", normal_data(7, 20000)});
  std::vector<float> ties(20000);  // 11 magnitudes: ties everywhere
  for (size_t i = 0; i < ties.size(); ++i) ties[i] = static_cast<float>(int(i * 37 % 11) - 5);
  cases.push_back({"ties", ties});
  cases.push_back({"equal", std::vector<float>(20000, -0.25f)});
  cases.push_back({"zeros", std::vector<float>(20000, 0.0f)});
  std::vector<float> octaves(20000);  // one entry per octave: the threshold search gives up
  for (size_t i = 0; i < octaves.size(); ++i)
    octaves[i] = std::ldexp(i % 2 ? 1.0f : -1.0f, -static_cast<int>(i % 200) / 2);
  cases.push_back({"octaves", octaves});
  std::vector<float> spikes(20000, 1e-6f);  // a few huge entries, the rest tiny
  for (size_t i = 0; i < spikes.size(); i += 977) spikes[i] = 1e6f;
  cases.push_back({"spikes", spikes});
  for (const auto& [name, data] : cases) {
    for (const Params& p : {Params{4096, 64, 2}, Params{256, 31, 2}, Params{1000, 999, 4}}) {
      const Encoded e = encode_of(data, p), scalar = encode_of(data, p, false);
      EXPECT_EQ(sent_indices(e.bytes, p, data.size()), reference_top(data, p))
          << name << " chunk " << p.chunk << " k " << p.k;
      EXPECT_EQ(scalar.bytes, e.bytes) << name;
    }
  }
}

TEST(SparseCodec, AShorterLastChunkSendsMinOfKAndItsLength) {
  const Params p{64, 16, 2};
  for (size_t tail : {1, 10, 16, 40, 63}) {
    const size_t n = 3 * 64 + tail;
    const auto x = normal_data(tail, n);
    const Encoded e = encode_of(x, p);
    const Wire w = parse(e.bytes, p, n);
    ASSERT_EQ(w.chunks.size(), 4u);
    const WireChunk& last = w.chunks.back();
    EXPECT_EQ(last.entries.size(), std::min<size_t>(16, tail));
    EXPECT_EQ(last.reps.size(), std::min<size_t>(4, last.entries.size()));
    for (const Entry& entry : last.entries) EXPECT_LT(entry.index, tail);
    EXPECT_EQ(sent_indices(e.bytes, p, n), reference_top(x, p));
    EXPECT_TRUE(same_bits(decoded(e.bytes, p, n), e.sent));
  }
}

TEST(SparseCodec, EveryBitWidthQuantizesToItsLevelsAndKeepsSigns) {
  const size_t n = 4 * 512 + 100;
  const auto x = normal_data(3, n);
  double last_error = std::numeric_limits<double>::infinity();
  for (uint32_t bits = 1; bits <= 8; ++bits) {
    const Params p{512, 64, bits};
    const Encoded e = encode_of(x, p);
    EXPECT_TRUE(same_bits(decoded(e.bytes, p, n), e.sent)) << bits;
    const auto chosen = sent_indices(e.bytes, p, n);
    EXPECT_EQ(chosen, reference_top(x, p));
    double error = 0;
    for (size_t c = 0; c * p.chunk < n; ++c) {
      std::set<float> values;
      for (size_t i : chosen) {
        if (i / p.chunk != c) continue;
        values.insert(e.sent[i]);
        EXPECT_EQ(std::signbit(e.sent[i]), std::signbit(x[i]))
            << "bits " << bits << " x[" << i << "]";
        error += (double{x[i]} - e.sent[i]) * (double{x[i]} - e.sent[i]);
      }
      EXPECT_LE(values.size(), size_t{1} << bits) << "bits " << bits << " chunk " << c;
    }
    EXPECT_LE(error, last_error) << "bits " << bits;  // more levels, no worse
    last_error = error;
    if (bits >= 6) {
      EXPECT_EQ(error, 0.0) << "bits " << bits << ": a level per value";
    }
  }
}

TEST(SparseCodec, DenseKEqualsChunkSendsEveryEntryQuantized) {
  const Params p{128, 128, 2};
  const size_t n = 128 * 5 + 17;
  const auto x = normal_data(11, n);
  const Encoded e = encode_of(x, p);
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sent_indices(e.bytes, p, n), all);
  for (size_t o = 0; o < n; o += p.chunk) {
    std::set<float> values;
    for (size_t i = o; i < std::min(n, o + p.chunk); ++i) {
      values.insert(e.sent[i]);
      EXPECT_EQ(std::signbit(e.sent[i]), std::signbit(x[i])) << i;
    }
    EXPECT_LE(values.size(), 4u);
  }
  EXPECT_TRUE(same_bits(decoded(e.bytes, p, n), e.sent));
  EXPECT_EQ(e.bytes.size(), 24 + 5 * (16 + 128 * 9 / 8) + (16 + (17 * 9 + 7) / 8));
}

// A fixed vector v sent every round with error feedback (e <- e + v; send encode(e);
// e <- e - sent): what was sent in total approaches rounds x v, as the error stays bounded.
TEST(SparseCodec, ErrorFeedbackSendsTheVectorOverRounds) {
  const Params p{256, 32, 2};  // 1/8 of the entries, 2 bits
  const size_t n = 256 * 16;
  const auto v = normal_data(5, n);
  std::vector<float> e(n, 0.0f), total(n, 0.0f), sent(n);
  auto rel_error = [&](int rounds) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = double{v[i]} * rounds;
      num += (total[i] - want) * (total[i] - want);
      den += want * want;
    }
    return std::sqrt(num / den);
  };
  double at_10 = 0;
  for (int round = 1; round <= 50; ++round) {
    for (size_t i = 0; i < n; ++i) e[i] += v[i];
    (void)encode(e, p, sent);
    for (size_t i = 0; i < n; ++i) {
      e[i] -= sent[i];
      total[i] += sent[i];
    }
    if (round == 10) at_10 = rel_error(10);
  }
  const double with_feedback = rel_error(50);
  // Without feedback each round sends the same 1/8 of v: most of v is never sent.
  std::fill(total.begin(), total.end(), 0.0f);
  (void)encode(v, p, sent);
  for (size_t i = 0; i < n; ++i) total[i] = 50 * sent[i];
  const double without = rel_error(50);
  // The error left is e's, which stays bounded: it shrinks as 1 / rounds (0.064 when written).
  EXPECT_LT(with_feedback, 0.08) << "after 10 rounds " << at_10;
  EXPECT_LT(with_feedback, at_10 / 3);
  EXPECT_GT(without, 0.5);
  std::printf("error feedback: relative error %.4f after 10 rounds, %.4f after 50; %.4f without\n",
              at_10, with_feedback, without);
}

TEST(SparseCodec, EncodedBytesIsExact) {
  for (const Params& p : kShapes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{p.chunk} - 1, size_t{p.chunk},
                     size_t{p.chunk} + 1, size_t{7} * p.chunk + 3}) {
      std::vector<float> x = normal_data(n, n), sent(n);
      EXPECT_EQ(encode(x, p, sent).size(), encoded_bytes(n, p))
          << "chunk " << p.chunk << " k " << p.k << " bits " << p.bits << " n " << n;
    }
  }
  // The default: 4 f32 representatives and 64 x (12 + 2) bits, 128 bytes per 4096 floats.
  EXPECT_EQ(encoded_bytes(4096 * 30000, Params{}), 24u + 128u * 30000);
  EXPECT_EQ(encoded_bytes(4096 * 2 + 1, Params{}), 24u + 2 * 128 + (4 + 2));
}

// Every worker decodes all members' bytes in member order, scaled by 1/K, into one vector.
TEST(SparseCodec, DecodeAddScalesAndAddsInOrder) {
  const Params p{512, 32, 2};
  const size_t n = 2000;
  const float scale = 1.0f / 3;
  std::vector<float> want(n, 0.0f), acc(n, 0.0f);
  for (int member = 0; member < 3; ++member) {
    const Encoded e = encode_of(normal_data(100 + member, n), p);
    for (size_t i = 0; i < n; ++i) want[i] += scale * e.sent[i];
    decode_add(e.bytes, p, scale, acc);
  }
  EXPECT_TRUE(same_bits(acc, want));
}

// compression.mean: senders counts, per entry, the codes that sent it; decoding is unchanged.
TEST(SparseCodec, DecodeAddCountsTheSendersOfEachEntry) {
  const Params p{512, 32, 2};
  const size_t n = 2000;
  std::vector<float> plain(n, 0.0f), counted(n, 0.0f);
  std::vector<uint16_t> senders(n, 0), want(n, 0);
  for (int member = 0; member < 3; ++member) {
    const Encoded e = encode_of(normal_data(200 + member, n), p);
    for (size_t i = 0; i < n; ++i) want[i] += e.sent[i] != 0.0f ? 1 : 0;
    decode_add(e.bytes, p, 1.0f, plain);
    decode_add(e.bytes, p, 1.0f, counted, senders);
  }
  EXPECT_TRUE(same_bits(plain, counted));
  EXPECT_EQ(senders, want);
  EXPECT_GT(*std::max_element(want.begin(), want.end()), 1);  // some entries overlap
  std::vector<uint16_t> short_counts(n - 1, 0);
  const Encoded e = encode_of(normal_data(7, n), p);
  EXPECT_THROW(decode_add(e.bytes, p, 1.0f, counted, short_counts), std::invalid_argument);
}

TEST(SparseCodec, ParamsAndInputsAreValidated) {
  auto names = [](const Params& p, const char* field) {
    try {
      p.validate();
      ADD_FAILURE() << "no throw for " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  names({1, 1, 2}, "chunk");
  names({65537, 64, 2}, "chunk");
  names({4096, 0, 2}, "k");
  names({4096, 4097, 2}, "k");
  names({4096, 64, 0}, "bits");
  names({4096, 64, 9}, "bits");
  EXPECT_NO_THROW((Params{2, 2, 1}.validate()));
  EXPECT_NO_THROW((Params{65536, 65536, 8}.validate()));

  std::vector<float> x(300, 1.0f), sent(300), shorter(299);
  EXPECT_THROW(encode(x, Params{}, shorter), std::invalid_argument);
  x[257] = std::numeric_limits<float>::quiet_NaN();
  try {
    (void)encode(x, Params{128, 4, 2}, sent);
    ADD_FAILURE() << "NaN encoded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("x[257] is NaN"), std::string::npos) << e.what();
  }
  x[257] = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(encode(x, Params{128, 128, 2}, sent), std::invalid_argument);
}

// Hostile bytes: each is refused with a CodecError naming the problem, before acc is touched.
TEST(SparseCodec, MalformedInputIsRefusedNamingTheProblem) {
  const Params p{100, 8, 2};  // 7 index bits; a last chunk of 2: 2 entries, 2 levels
  const size_t n = 302;
  const Encoded good = encode_of(normal_data(9, n), p);
  const Wire wire = parse(good.bytes, p, n);
  auto refused = [&](const std::vector<uint8_t>& bytes, const std::string& what,
                     Params q = Params{100, 8, 2}, size_t size = 302) {
    std::vector<float> acc(size, 1.5f);
    try {
      decode_add(bytes, q, 0.5f, acc);
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const CodecError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    for (float a : acc) ASSERT_EQ(a, 1.5f) << what << ": acc changed";
  };
  auto edited = [&](auto edit) {
    Wire w = wire;
    edit(w);
    return pack(w, p);
  };

  {
    std::vector<float> acc(n, 0.0f);
    ASSERT_NO_THROW(decode_add(pack(wire, p), p, 1.0f, acc));  // the unedited bytes
  }
  auto bytes = good.bytes;
  refused({bytes.begin(), bytes.begin() + 10},
          "truncated: 10 bytes, shorter than the 24-byte header");
  refused({bytes.begin(), bytes.end() - 1}, "truncated");
  refused({bytes.begin(), bytes.begin() + 24}, "truncated");
  refused({}, "truncated");
  auto longer = bytes;
  longer.push_back(0);
  refused(longer, "trailing bytes");
  refused(bytes, "wrong n: the payload holds 302 floats, expected 303", p, 303);
  refused(bytes, "wrong n", p, 0);
  refused(bytes, "wrong params", Params{100, 9, 2});
  refused(bytes, "wrong params", Params{128, 8, 2});
  refused(bytes, "wrong params", Params{100, 8, 3});
  auto header = [&](size_t at, uint8_t v) {
    auto b = bytes;
    b[at] = v;
    return b;
  };
  refused(header(0, 'X'), "bad magic");
  refused(header(4, 2), "version 2");
  refused(header(7, 1), "reserved");
  refused(header(16, 0x2f), "wrong n");  // n = 303 in the header
  refused(header(8, 101), "wrong params");

  refused(edited([](Wire& w) { w.chunks[1].entries[3].index = 100; }),
          "chunk 1: index 100 out of range (chunk length 100)");
  refused(edited([](Wire& w) { w.chunks[3].entries[1].index = 2; }),
          "chunk 3: index 2 out of range (chunk length 2)");
  refused(edited([](Wire& w) { w.chunks[0].entries[5].index = w.chunks[0].entries[4].index; }),
          "chunk 0: duplicate index");
  refused(edited([](Wire& w) { std::swap(w.chunks[2].entries[0], w.chunks[2].entries[7]); }),
          "chunk 2: indices out of order");
  refused(edited([](Wire& w) { w.chunks[2].reps[1] = std::numeric_limits<float>::quiet_NaN(); }),
          "chunk 2: representative 1 is NaN");
  refused(edited([](Wire& w) { w.chunks[0].reps[3] = std::numeric_limits<float>::infinity(); }),
          "chunk 0: representative 3 is infinite");
  refused(edited([](Wire& w) { w.chunks[3].entries[1].level = 2; }),
          "chunk 3: level 2 out of range (2 levels)");
  // 8 entries of 9 bits fill 9 bytes; the last chunk's 2 entries leave 6 padding bits.
  {
    Params q{100, 8, 2};
    auto b = pack(wire, q, 1);
    refused(b, "chunk 3: nonzero padding bits");
  }
}

}  // namespace
}  // namespace loco::collective::sparse
