// Robust averaging (job file `guard:`, config.hpp's GuardConfig;
// docs/decisions/0039-robust-averaging.md): which members' pseudo-gradients are left out of a
// round's mean. No LibTorch, no sockets: a pure rule over what every member knows, so that every
// member, and the simulator, leaves out the same members and the outer state stays
// bit-identical.
//
// Before a fragment's average (blocking rounds: all of θ as fragment 0) every member makes a
// Summary of its Δ and the members exchange them (Communicator::allgather, a few KB against
// the payload's MBs). With compression topk no summary travels: every member holds every
// member's code anyway, and judges what the codes decode to (sparse_facts()).
//
// The rule (judge()), in order, over the members of the operation:
//   0. a summary (or topk code) that does not decode is malformed: its member is left out;
//   1. a member whose inner steps diverged abstains (it sends nothing), and a Δ that is not
//      finite is left out: "non-finite";
//   2. among the rest, with at least 3 of them: a norm above max_norm_ratio × their median:
//      "norm";
//   3. among the rest that have a direction (a nonzero Δ), with at least 3 of them: each
//      member's agreement, the upper median of its cosines with the others (from the sketches'
//      Gram matrix: sampled values, the same indices on every member), below −opposed ×
//      the members' median agreement less the sketch's noise (3/√m for m sampled values):
//      "direction"; only where that median is above twice the noise (the members agree on a
//      direction at all). A flipped sign agrees as negatively as the honest members agree
//      positively: it is left out; noise of an honest norm agrees about zero: it is not (it
//      pushes nowhere, and its share is diluted by K); an honest member that agrees little, or
//      a little negatively (a small fragment sometimes does), is not either. While the honest
//      ones are a majority, one faulty member cannot pull an honest one's upper median down.
// With fewer than 3 members the norm and direction rules cannot tell who is wrong and apply to
// nobody. The rest are averaged with equal weights (collective::Group::left_out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"
#include "runtime/collective/sparse.hpp"

namespace loco::diloco::guard {

// A summary that is not what summarize() makes for the receiver's sketch size: wrong length,
// bad magic or version, unknown flags. what() names the problem.
class SummaryError : public std::runtime_error {
 public:
  explicit SummaryError(const std::string& what) : std::runtime_error(what) {}
};

struct Summary {
  bool abstain = false;       // its inner steps diverged: it sends no Δ this round
  bool finite = true;         // every value of Δ is finite
  double norm = 0;            // ‖Δ‖₂ (0 when not finite or abstaining)
  std::vector<float> sketch;  // Δ at sketch_indices(n, m) (zeros when not finite)
};

// The values a summary of n values samples when asked for m: min(n, m).
inline std::size_t sketch_size(std::size_t n, std::size_t m) { return n < m ? n : m; }

// The m indices of n that a summary samples: one in each of m equal strides, at a fixed
// pseudo-random offset inside it (all of 0..n-1 when n <= m). The same on every member.
std::vector<std::size_t> sketch_indices(std::size_t n, std::size_t m);

// Δ's summary with a sketch of `m` sampled values. ‖Δ‖ is summed in double, in index order.
Summary summarize(std::span<const float> delta, std::size_t m);
// The summary of a member that sends nothing this round.
Summary abstaining(std::size_t n, std::size_t m);

// Wire form, little-endian: "LOGS", u8 version (1), u8 flags (bit 0 abstain, bit 1 finite),
// u16 0, u32 sketch length, f64 norm, then the sketch's f32 values.
std::vector<std::uint8_t> encode(const Summary& s);
std::size_t encoded_bytes(std::size_t sketch);
// Checks the length first (it must be encoded_bytes(sketch), before anything is allocated),
// then the header; a norm or sketch value that is not finite or negative norm in a summary
// that says finite makes it a non-finite one. Throws SummaryError.
Summary decode(std::span<const std::uint8_t> bytes, std::size_t sketch);

// Gram matrix (row-major K × K, double) of the members' sketches.
std::vector<double> sketch_gram(std::span<const Summary> summaries);

struct Verdict {
  bool left_out = false;
  std::string rule;  // "", "malformed", "abstained", "non-finite", "norm", "direction"
  std::string why;           // for logs: "norm 41.3 is 96.2 x the median 0.43 (at most 3)"
  double norm_ratio = 0;     // its norm over the median (0 where not computed)
  double agreement = 0;      // its agreement (0 where not computed)
  // Its agreement over the members' median agreement (what −opposed bounds, before the
  // noise; 0 where not computed).
  double relative_agreement = 0;
};

// What the rule needs of every member, in member order: abstain and finite flags, norms, and
// the Gram matrix of the vectors the directions are judged on (K × K), with `noise` the
// agreement's sampling noise (3/√m for sketches of m values; 0 for exact vectors).
struct Facts {
  std::vector<std::string> malformed;  // "" or why its summary or code could not be read
  std::vector<bool> abstain;
  std::vector<bool> finite;
  std::vector<double> norms;
  std::vector<double> gram;
  // K × K cosines to judge directions by, when not those of `gram` (compression topk: over the
  // entries both codes sent); empty: from `gram`.
  std::vector<double> cosine;
  double noise = 0;
};
Facts facts_of(std::span<const Summary> summaries);
// From the members' summaries as received (encode()'s bytes), in member order: one that does
// not decode for a sketch of m values is malformed (its member is left out, named).
Facts facts_of(std::span<const std::vector<std::uint8_t>> summaries, std::size_t m);
// compression topk: from the members' codes (an empty one: the member abstains), exact: each
// code decoded once into a scratch of n floats, its nonzeros kept, then the norms, and the
// pairwise cosines over the entries both codes sent (two codes share few entries: over all of
// θ their cosine is small even between honest members), with noise 3/√(shared entries, the
// pairs' median). A code that does not decode is malformed.
Facts sparse_facts(std::span<const std::span<const std::uint8_t>> codes,
                   const collective::sparse::Params& p, std::size_t n);

// The rule itself: pure, the same on every member.
std::vector<Verdict> judge(const Facts& facts, const GuardConfig& cfg);

// One byte per member, nonzero where left out (collective::Group::left_out).
std::vector<std::uint8_t> mask_of(std::span<const Verdict> verdicts);

// ---- Faults, for tests and studies -------------------------------------------------------
// What a broken or hostile worker sends instead of its Δ: `loco-train --corrupt R:K:KIND` in the
// simulator, the job tests' fault injection on a worker (tests/actors/fault_injection.cpp).
//   nan:   one value (the middle one) becomes NaN, as a bit flip or an overflow makes it;
//   scale: Δ × 100;
//   flip:  −Δ;
//   noise: Gaussian noise of Δ's norm, from `seed` (the same values everywhere).
enum class Fault { nan, scale, flip, noise };
// "nan", "scale", "flip", "noise"; throws std::invalid_argument naming the others.
Fault parse_fault(const std::string& name);
void corrupt(std::span<float> delta, Fault fault, std::uint64_t seed);

}  // namespace loco::diloco::guard
