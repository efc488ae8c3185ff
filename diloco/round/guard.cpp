#include "diloco/round/guard.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "diloco/data/data.hpp"

namespace loco::diloco::guard {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

namespace {

constexpr std::uint8_t kMagic[4] = {'L', 'O', 'G', 'S'};
constexpr std::uint8_t kVersion = 1;
constexpr std::uint8_t kAbstain = 1, kFinite = 2;
constexpr std::size_t kHeader = 20;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

std::string fixed(double v, int digits = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

std::vector<std::size_t> sketch_indices(std::size_t n, std::size_t m) {
  std::vector<std::size_t> out;
  if (n <= m) {
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  out.resize(m);
  for (std::size_t j = 0; j < m; ++j) {
    // Stride j is [j n / m, (j+1) n / m): not empty since n > m.
    const std::size_t lo = j * n / m, hi = (j + 1) * n / m;
    out[j] = lo + static_cast<std::size_t>(splitmix64(j) % (hi - lo));
  }
  return out;
}

Summary summarize(std::span<const float> delta, std::size_t m) {
  // Four partial sums: a fixed order, so the same double on every member, and ~4x faster.
  double acc[4] = {0, 0, 0, 0};
  const std::size_t n = delta.size(), n4 = n / 4 * 4;
  for (std::size_t i = 0; i < n4; i += 4)
    for (int l = 0; l < 4; ++l) acc[l] += double(delta[i + l]) * double(delta[i + l]);
  for (std::size_t i = n4; i < n; ++i) acc[i - n4] += double(delta[i]) * double(delta[i]);
  // A float squared fits a double, and so does any sum of them: the sum is finite exactly when
  // every value is.
  const double sq = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  Summary s;
  s.finite = std::isfinite(sq);
  s.norm = s.finite ? std::sqrt(sq) : 0.0;
  const auto idx = sketch_indices(n, m);
  s.sketch.resize(idx.size());
  for (std::size_t j = 0; j < idx.size(); ++j) s.sketch[j] = s.finite ? delta[idx[j]] : 0.0f;
  return s;
}

Summary abstaining(std::size_t n, std::size_t m) {
  Summary s;
  s.abstain = true;
  s.finite = false;
  s.sketch.assign(sketch_size(n, m), 0.0f);
  return s;
}

std::size_t encoded_bytes(std::size_t sketch) { return kHeader + 4 * sketch; }

std::vector<std::uint8_t> encode(const Summary& s) {
  std::vector<std::uint8_t> out(encoded_bytes(s.sketch.size()));
  std::uint8_t* d = out.data();
  std::memcpy(d, kMagic, 4);
  d[4] = kVersion;
  d[5] = static_cast<std::uint8_t>((s.abstain ? kAbstain : 0) | (s.finite ? kFinite : 0));
  const auto m = static_cast<std::uint32_t>(s.sketch.size());
  std::memcpy(d + 8, &m, 4);
  std::memcpy(d + 12, &s.norm, 8);
  if (m) std::memcpy(d + kHeader, s.sketch.data(), 4 * std::size_t{m});
  return out;
}

Summary decode(std::span<const std::uint8_t> bytes, std::size_t sketch) {
  if (bytes.size() != encoded_bytes(sketch))
    throw SummaryError("a summary of " + std::to_string(bytes.size()) + " bytes, expected " +
                       std::to_string(encoded_bytes(sketch)) + " (a sketch of " +
                       std::to_string(sketch) + " values)");
  const std::uint8_t* d = bytes.data();
  if (std::memcmp(d, kMagic, 4) != 0) throw SummaryError("a summary without its magic 'LOGS'");
  if (d[4] != kVersion)
    throw SummaryError("a summary of version " + std::to_string(d[4]) + ", expected " +
                       std::to_string(kVersion));
  if ((d[5] & ~(kAbstain | kFinite)) != 0 || d[6] != 0 || d[7] != 0)
    throw SummaryError("a summary with unknown flags");
  std::uint32_t m;
  std::memcpy(&m, d + 8, 4);
  if (m != sketch)
    throw SummaryError("a summary with a sketch of " + std::to_string(m) + " values, expected " +
                       std::to_string(sketch));
  Summary s;
  s.abstain = (d[5] & kAbstain) != 0;
  s.finite = !s.abstain && (d[5] & kFinite) != 0;
  std::memcpy(&s.norm, d + 12, 8);
  s.sketch.resize(m);
  if (m) std::memcpy(s.sketch.data(), d + kHeader, 4 * std::size_t{m});
  // A summary that says finite holds finite numbers, or it is a non-finite one.
  bool ok = std::isfinite(s.norm) && s.norm >= 0;
  for (float v : s.sketch) ok = ok && std::isfinite(v);
  if (!ok) s.finite = false;
  if (!s.finite) {
    s.norm = 0;
    std::fill(s.sketch.begin(), s.sketch.end(), 0.0f);
  }
  return s;
}

std::vector<double> sketch_gram(std::span<const Summary> summaries) {
  const std::size_t k = summaries.size();
  std::vector<double> g(k * k, 0.0);
  for (std::size_t i = 0; i < k; ++i)
    for (std::size_t j = i; j < k; ++j) {
      const auto& a = summaries[i].sketch;
      const auto& b = summaries[j].sketch;
      double s = 0;
      for (std::size_t t = 0; t < std::min(a.size(), b.size()); ++t) s += double(a[t]) * b[t];
      g[i * k + j] = g[j * k + i] = s;
    }
  return g;
}

Facts facts_of(std::span<const Summary> summaries) {
  Facts f;
  for (const Summary& s : summaries) {
    f.abstain.push_back(s.abstain);
    f.finite.push_back(s.finite);
    f.norms.push_back(s.norm);
  }
  f.gram = sketch_gram(summaries);
  const std::size_t m = summaries.empty() ? 0 : summaries[0].sketch.size();
  f.noise = m ? 3.0 / std::sqrt(double(m)) : 0.0;
  return f;
}

Facts facts_of(std::span<const std::vector<std::uint8_t>> summaries, std::size_t m) {
  std::vector<Summary> read;
  std::vector<std::string> malformed;
  for (const auto& bytes : summaries) {
    try {
      read.push_back(decode(bytes, m));
      malformed.emplace_back();
    } catch (const SummaryError& e) {
      read.push_back(abstaining(m, m));
      read.back().abstain = false;
      malformed.emplace_back(e.what());
    }
  }
  Facts f = facts_of(read);
  f.malformed = std::move(malformed);
  return f;
}

Facts sparse_facts(std::span<const std::span<const std::uint8_t>> codes,
                   const collective::sparse::Params& p, std::size_t n) {
  const std::size_t k = codes.size();
  std::vector<float> scratch(n, 0.0f);
  std::vector<std::vector<std::pair<std::uint32_t, float>>> entries(k);
  Facts f;
  f.malformed.assign(k, "");
  f.abstain.assign(k, false);
  f.finite.assign(k, true);
  f.norms.assign(k, 0.0);
  for (std::size_t i = 0; i < k; ++i) {
    if (codes[i].empty()) {  // sends nothing: its Δ was not finite
      f.abstain[i] = true;
      continue;
    }
    try {
      collective::sparse::decode_add(codes[i], p, 1.0f, scratch);  // unchanged on a throw
    } catch (const collective::sparse::CodecError& e) {
      f.malformed[i] = e.what();
      continue;
    }
    double sq = 0;
    for (std::size_t t = 0; t < n; ++t)
      if (scratch[t] != 0.0f) {
        entries[i].emplace_back(static_cast<std::uint32_t>(t), scratch[t]);
        sq += double(scratch[t]) * scratch[t];
        scratch[t] = 0.0f;
      }
    f.norms[i] = std::sqrt(sq);
  }
  // Two codes share few of their entries (each keeps its own top k of a chunk, out of its own
  // error feedback), so their cosine over all of θ is small even between honest members and
  // tells little. Their direction is judged where both sent something: the cosine over the
  // shared entries, whose noise is 3/√(shared entries) (the members' median count of them).
  f.gram.assign(k * k, 0.0);
  f.cosine.assign(k * k, 0.0);
  std::vector<double> shared;
  for (std::size_t i = 0; i < k; ++i) {
    double aa = 0;
    for (const auto& e : entries[i]) aa += double(e.second) * e.second;
    f.gram[i * k + i] = aa;
    f.cosine[i * k + i] = aa > 0 ? 1.0 : 0.0;
    for (std::size_t j = i + 1; j < k; ++j) {
      double ab = 0, sa = 0, sb = 0;
      std::size_t n_shared = 0;
      const auto& a = entries[i];
      const auto& b = entries[j];
      for (std::size_t x = 0, y = 0; x < a.size() && y < b.size();) {
        if (a[x].first < b[y].first) {
          ++x;
        } else if (b[y].first < a[x].first) {
          ++y;
        } else {
          ab += double(a[x].second) * b[y].second;
          sa += double(a[x].second) * a[x].second;
          sb += double(b[y].second) * b[y].second;
          ++n_shared, ++x, ++y;
        }
      }
      f.gram[i * k + j] = f.gram[j * k + i] = ab;
      f.cosine[i * k + j] = f.cosine[j * k + i] = sa > 0 && sb > 0 ? ab / std::sqrt(sa * sb) : 0.0;
      if (!a.empty() && !b.empty()) shared.push_back(double(n_shared));
    }
  }
  const double m = median(shared);
  f.noise = m > 0 ? 3.0 / std::sqrt(m) : 1.0;
  return f;
}

namespace {

// Rule 2 over `rest` (at least 3): a norm above max_norm_ratio × their median. Returns those
// kept.
std::vector<std::size_t> by_norm(const Facts& facts, const GuardConfig& cfg,
                                 const std::vector<std::size_t>& rest, std::vector<Verdict>& v) {
  std::vector<double> norms;
  for (std::size_t i : rest) norms.push_back(facts.norms[i]);
  const double med = median(norms);
  std::vector<std::size_t> kept;
  for (std::size_t i : rest) {
    const double r = med > 0 ? facts.norms[i] / med
                             : (facts.norms[i] > 0 ? std::numeric_limits<double>::infinity() : 1);
    v[i].norm_ratio = r;
    if (r <= cfg.max_norm_ratio) {
      kept.push_back(i);
      continue;
    }
    v[i].left_out = true;
    v[i].rule = "norm";
    v[i].why = "its norm " + fixed(facts.norms[i]) + " is " + fixed(r) + " x the median " +
               fixed(med) + " (at most " + fixed(cfg.max_norm_ratio) + ")";
  }
  return kept;
}

// Rule 3 over `judged` (at least 3, each with a direction). Each member's agreement: the upper
// median of its cosines with the others. While the honest members are a majority, an honest
// one agrees with most others (a flipped or noisy one among them does not pull it down), and a
// faulty one with none.
void by_direction(const Facts& facts, const GuardConfig& cfg,
                  const std::vector<std::size_t>& judged, std::vector<Verdict>& v) {
  const std::size_t k = facts.norms.size();
  const auto g = [&](std::size_t i, std::size_t j) { return facts.gram[i * k + j]; };
  std::vector<double> agree;
  for (std::size_t i : judged) {
    std::vector<double> cos;
    for (std::size_t j : judged)
      if (j != i)
        cos.push_back(facts.cosine.empty() ? g(i, j) / std::sqrt(g(i, i) * g(j, j))
                                           : facts.cosine[i * k + j]);
    std::sort(cos.begin(), cos.end());
    agree.push_back(cos[cos.size() / 2]);
    v[i].agreement = agree.back();
  }
  // Only where the members agree clearly (their median at least twice the noise) is there a
  // direction to hold a member to: otherwise (their updates unrelated, or opposed, as small
  // fragments of a small model can be) the rule does not guess.
  const double med = median(agree);
  if (med <= 2 * facts.noise) return;
  // Left out: clearly opposed to the others, not merely unaligned (an honest worker's fragment
  // sometimes agrees little, or a little negatively; a flipped one as negatively as the honest
  // ones agree positively).
  const double floor = -cfg.opposed * med - facts.noise;
  for (std::size_t t = 0; t < judged.size(); ++t) {
    Verdict& x = v[judged[t]];
    x.relative_agreement = agree[t] / med;
    if (agree[t] >= floor) continue;
    x.left_out = true;
    x.rule = "direction";
    x.why = "its agreement with the others " + fixed(agree[t]) + " is below -" +
            fixed(cfg.opposed) + " x their median " + fixed(med) + " less the noise " +
            fixed(facts.noise);
  }
}

}  // namespace

std::vector<Verdict> judge(const Facts& facts, const GuardConfig& cfg) {
  const std::size_t k = facts.norms.size();
  std::vector<Verdict> v(k);
  if (!cfg.on) return v;
  std::vector<std::size_t> rest;
  for (std::size_t i = 0; i < k; ++i) {
    if (i < facts.malformed.size() && !facts.malformed[i].empty()) {
      v[i] = {true, "malformed", facts.malformed[i], 0, 0, 0};
    } else if (facts.abstain[i]) {
      v[i] = {true, "abstained",
              "it sent nothing (its inner steps diverged, or its Δ was not finite)", 0, 0, 0};
    } else if (!facts.finite[i]) {
      v[i] = {true, "non-finite", "its Δ holds NaN or Inf", 0, 0, 0};
    } else {
      rest.push_back(i);
    }
  }
  if (rest.size() >= 3) rest = by_norm(facts, cfg, rest, v);
  // Direction: only members with a direction (a zero Δ, a joiner's first fragment, has none
  // and adds nothing).
  std::vector<std::size_t> judged;
  for (std::size_t i : rest)
    if (facts.gram[i * k + i] > 0) judged.push_back(i);
  if (judged.size() >= 3 && cfg.opposed > 0) by_direction(facts, cfg, judged, v);
  return v;
}

std::vector<std::uint8_t> mask_of(std::span<const Verdict> verdicts) {
  std::vector<std::uint8_t> m(verdicts.size(), 0);
  for (std::size_t i = 0; i < verdicts.size(); ++i) m[i] = verdicts[i].left_out ? 1 : 0;
  return m;
}

Fault parse_fault(const std::string& name) {
  if (name == "nan") return Fault::nan;
  if (name == "scale") return Fault::scale;
  if (name == "flip") return Fault::flip;
  if (name == "noise") return Fault::noise;
  throw std::invalid_argument("a fault is nan, scale, flip or noise, not '" + name + "'");
}

void corrupt(std::span<float> delta, Fault fault, std::uint64_t seed) {
  if (delta.empty()) return;
  switch (fault) {
    case Fault::nan:
      delta[delta.size() / 2] = std::numeric_limits<float>::quiet_NaN();
      break;
    case Fault::scale:
      for (float& v : delta) v *= 100.0f;
      break;
    case Fault::flip:
      for (float& v : delta) v = -v;
      break;
    case Fault::noise: {
      double sq = 0;
      for (float v : delta) sq += double(v) * v;
      std::mt19937_64 rng(splitmix64(seed));
      // Box–Muller on the generator's bits by hand: the standard distributions' values may
      // differ between libraries.
      const auto u = [](std::mt19937_64& r) { return double(r() >> 11) * 0x1.0p-53; };
      std::vector<double> z(delta.size());
      double zq = 0;
      for (std::size_t i = 0; i < z.size(); ++i) {
        const double a = std::max(u(rng), 1e-300), b = u(rng);
        z[i] = std::sqrt(-2.0 * std::log(a)) * std::cos(6.283185307179586 * b);
        zq += z[i] * z[i];
      }
      const double scale = zq > 0 ? std::sqrt(sq / zq) : 0.0;
      for (std::size_t i = 0; i < z.size(); ++i) delta[i] = static_cast<float>(z[i] * scale);
      break;
    }
  }
}

}  // namespace loco::diloco::guard
