#include "diloco/round/codec_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "diloco/round/averager.hpp"
#include "runtime/collective/sparse.hpp"

namespace loco::diloco {

namespace {

// "2.1 MB", "640 kB": bytes as the log says them.
std::string megabytes(double bytes) {
  char buf[32];
  if (bytes >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.0f kB", bytes / 1e3);
  return buf;
}

std::string fixed(double x, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

CodecChoice fixed_choice(const JobConfig& cfg) {
  if (cfg.topk.on) return CodecChoice{collective::Codec::fp32, static_cast<std::uint32_t>(cfg.topk.k)};
  return CodecChoice{cfg.compression, 0};
}

std::vector<CodecChoice> codec_ladder(const JobConfig& cfg) {
  using collective::Codec;
  std::vector<CodecChoice> ladder = {{Codec::fp32, 0}, {Codec::bf16, 0}, {Codec::int8, 0}};
  if (!cfg.auto_sparse()) return ladder;
  // Two sparse rungs. First a tenth of each chunk at kTenthBits, Δ's own code, the error feedback
  // left for the last rung: under the job's Nesterov step it ended below fp32 DiLoCo on the WAN
  // bench's job, and 35 % above it through the feedback (docs/results.md, "A tenth, without
  // error feedback"); among fewer than 10 members it sends less than int8. Then the job's k and
  // bits through the feedback: a larger k at 2 bits quantizes more values to a chunk's 4 levels
  // and lost more, not less ("Where sparse is safe").
  const auto chunk = static_cast<std::uint32_t>(cfg.topk.chunk);
  const std::uint32_t k = std::min(static_cast<std::uint32_t>(cfg.topk.k), chunk);
  const std::uint32_t tenth = (chunk + 9) / 10;
  if (k < tenth) ladder.push_back({Codec::fp32, tenth, kTenthBits, false});
  ladder.push_back({Codec::fp32, k});
  return ladder;
}

std::uint64_t choice_bytes(const CodecChoice& c, std::size_t n, int k, const TopkConfig& topk) {
  if (k <= 1) return 0;
  if (!c.sparse()) return allreduce_bytes_per_member(n, k, c.dense);
  return static_cast<std::uint64_t>(k - 1) *
         collective::sparse::encoded_bytes(n, sparse_params(topk, c));
}

namespace {

// fn(line, first, bad) for each line of a codec trace that is not blank: `first` its first
// character that is not a space, bad(why) the error naming the line.
template <class Fn>
void for_each_trace_line(const std::string& text, Fn fn) {
  std::istringstream in(text);
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto bad = [no](const std::string& why) {
      return std::invalid_argument("codec trace, line " + std::to_string(no) + ": " + why);
    };
    fn(line, first, bad);
  }
}

}  // namespace

std::vector<std::string> read_codec_trace(const std::string& text) {
  constexpr int kMaxRounds = 1 << 20;
  std::vector<std::string> trace;
  for_each_trace_line(text, [&](const std::string& line, std::size_t first, const auto& bad) {
    std::string name;
    std::int64_t round = static_cast<std::int64_t>(trace.size()) + 1;
    if (line[first] == '{') {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
      const auto c = j.find("codec");
      if (c == j.end()) return;  // round 0's line, or a job without compression auto
      const auto r = j.find("round");
      if (!c->is_string() || r == j.end() || !r->is_number_integer())
        throw bad("\"codec\" must be a string and \"round\" an integer");
      name = c->get<std::string>();
      round = r->get<std::int64_t>();
    } else {
      const auto last = line.find_last_not_of(" \t\r");
      name = line.substr(first, last - first + 1);
    }
    if (!parse_choice(name))
      throw bad("'" + name.substr(0, 24) +
                "' is not a codec (fp32|fp16|bf16|int8|topk:K[qB][-noef])");
    if (round < 1 || round > kMaxRounds)
      throw bad("round " + std::to_string(round) + " out of [1, " + std::to_string(kMaxRounds) + "]");
    const auto at = static_cast<std::size_t>(round - 1);
    if (trace.size() <= at) trace.resize(at + 1, trace.empty() ? name : trace.back());
    trace[at] = name;
  });
  if (trace.empty()) throw std::invalid_argument("codec trace: no codec in it");
  return trace;
}

CodecPlanner::CodecPlanner(const JobConfig& cfg, std::size_t n, int per_round)
    : cfg_(cfg), n_(n), ladder_(codec_ladder(cfg)), probe_cap_(16 * std::max(1, per_round)) {
  const auto start = parse_choice(cfg.autocodec.start);
  resume(start ? *start : ladder_.front());
}

void CodecPlanner::resume(const CodecChoice& c) {
  // The rung that sends at least as few bytes as `c`: the first, from the least lossy, whose
  // bytes are no more than c's.
  const std::uint64_t want = choice_bytes(c, n_, 2, cfg_.topk);
  rung_ = static_cast<int>(ladder_.size()) - 1;
  for (std::size_t i = 0; i < ladder_.size(); ++i)
    if (choice_bytes(ladder_[i], n_, 2, cfg_.topk) <= want) {
      rung_ = static_cast<int>(i);
      break;
    }
  fits_above_ = small_rounds_ = 0;
  probing_ = false;
  probe_wait_ = std::max(1, cfg_.autocodec.patience);
}

double CodecPlanner::window(double step_seconds) const {
  const SyncConfig& s = cfg_.sync;
  if (s.mode == SyncMode::blocking) {
    const double share = std::clamp(cfg_.autocodec.share, 1e-6, 0.99);
    return share / (1 - share) * step_seconds * cfg_.inner.steps;
  }
  // A fragment's average has τ steps before it lands; in streaming the next fragment's starts
  // H/P steps after it, on the same communicator.
  int steps = std::max(1, s.overlap_steps);
  if (s.mode == SyncMode::streaming) steps = std::min(steps, cfg_.inner.steps / std::max(1, s.fragments));
  return std::max(1, steps) * step_seconds;
}

std::string CodecPlanner::reading(int rung, double rate, double window, int members,
                                  const char* verb) const {
  const double b =
      double(choice_bytes(ladder_[static_cast<std::size_t>(rung)], n_, members, cfg_.topk));
  return megabytes(b) + " at " + fixed(rate * 8 / 1e6, 1) + " Mbit/s " + verb + " " +
         fixed(rate > 0 ? b / rate : 0.0, 2) + " s, the window is " + fixed(window, 2) + " s";
}

void CodecPlanner::adopt(int rung) {
  rung = std::clamp(rung, 0, static_cast<int>(ladder_.size()) - 1);
  if (rung == rung_) return;
  rung_ = rung;
  fits_above_ = 0;
  probing_ = false;
}

CodecDecision CodecPlanner::decide(std::int64_t round, const std::optional<LinkSample>& last,
                                   int members) {
  CodecDecision d;
  d.round = static_cast<int>(round + 1);
  d.from = current();
  if (!last || last->bytes == 0 || last->seconds <= 0 || last->step_seconds <= 0 || members < 2) {
    d.to = current();
    d.reason = round == 0 ? "the first round's codec (compression.start)"
                          : "nothing measured in the round before: kept";
    return d;
  }
  const double rate = double(last->bytes) / last->seconds;  // bytes per second
  const double win = window(last->step_seconds);
  const auto takes = [&](int rung) {
    return double(choice_bytes(ladder_[static_cast<std::size_t>(rung)], n_, members, cfg_.topk)) /
           rate;
  };
  const auto why = [&](int rung, const char* verb) {
    return reading(rung, rate, win, members, verb);
  };
  const int top = static_cast<int>(ladder_.size()) - 1;
  // A small exchange's rate is a lower bound (latency): it cannot show that a rung sending more
  // than it does not fit. With rounds sent one ahead, a probe's rung is judged on the round
  // before it until its own measurement comes.
  const bool bound_only =
      last->bytes < kProbeBytes &&
      double(choice_bytes(current(), n_, members, cfg_.topk)) > double(last->bytes) * 1.5;
  if (bound_only) {
    d.to = current();
    d.reason = "kept: " + megabytes(double(last->bytes)) + " in " + fixed(last->seconds, 3) +
               " s cannot judge " + current().name() + "'s " +
               megabytes(double(choice_bytes(current(), n_, members, cfg_.topk)));
    return d;
  }
  // The least lossy rung whose exchange fits `limit` (the lossiest when none does). A rung need
  // not send fewer bytes than every rung above it (the tenth's code goes to each member, int8's
  // butterfly does not), so this is the first that fits from the top, not the next one down.
  const auto first_fit = [&](double limit) {
    for (int i = 0; i < top; ++i)
      if (takes(i) <= limit) return i;
    return top;
  };
  if (takes(rung_) > win && first_fit(win) != rung_) {
    // At once, to the least lossy rung that fits.
    const int was = rung_;
    rung_ = first_fit(win);
    fits_above_ = 0;
    // A probe that did not fit: the next one waits twice as long (at most 16 rounds).
    if (std::exchange(probing_, false)) probe_wait_ = std::min(probe_cap_, 2 * probe_wait_);
    d.to = current();
    d.reason = why(was, "would take") + (takes(rung_) > win ? "; none fits: the lossiest" : "");
    return d;
  }
  // Up only after `patience` rounds in a row in which a rung above fitted within the margin;
  // then to the least lossy that does.
  const double roomy = win * std::clamp(cfg_.autocodec.margin, 0.01, 1.0);
  const int patience = std::max(1, cfg_.autocodec.patience);
  if (std::exchange(probing_, false)) probe_wait_ = patience;  // the probe's rung fitted
  if (const int up = first_fit(roomy); up < rung_) {
    if (++fits_above_ >= patience) {
      rung_ = up;
      fits_above_ = 0;
      d.to = current();
      d.reason = why(rung_, "would take");
      return d;
    }
  } else {
    fits_above_ = 0;
    // A small exchange's time is mostly latency, so its bytes over seconds understate the link:
    // after `patience` such rounds, try the rung above once (a probe), whose larger exchange
    // measures it; a probe that does not fit goes back down the round after, and the next
    // probe waits twice as long.
    if (rung_ > 0 && last->bytes < kProbeBytes && ++small_rounds_ >= probe_wait_) {
      small_rounds_ = 0;
      probing_ = true;
      --rung_;
      d.to = current();
      d.reason = "a probe: " + megabytes(double(last->bytes)) + " in " +
                 fixed(last->seconds, 3) + " s says little of the link; " + why(rung_ + 1, "takes");
      return d;
    }
  }
  if (last->bytes >= kProbeBytes) small_rounds_ = 0;
  d.to = current();
  d.reason = why(rung_, "takes");
  return d;
}

FragmentCodecTrace read_fragment_codec_trace(const std::string& text) {
  constexpr std::int64_t kMaxRounds = 1 << 20;
  constexpr int kMaxFragments = 1 << 12;
  FragmentCodecTrace trace;
  for_each_trace_line(text, [&](const std::string& line, std::size_t first, const auto& bad) {
    if (line[first] != '{' || line.find("\"fragment_codecs\"") == std::string::npos) return;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    const auto f = j.find("fragment_codecs");
    if (f == j.end()) return;
    if (!f->is_array()) throw bad("\"fragment_codecs\" must be an array");
    for (const auto& e : *f) {
      const auto r = e.is_object() ? e.find("round") : e.end();
      const auto g = e.is_object() ? e.find("fragment") : e.end();
      const auto c = e.is_object() ? e.find("codec") : e.end();
      if (r == e.end() || g == e.end() || c == e.end() || !r->is_number_integer() ||
          !g->is_number_integer() || !c->is_string())
        throw bad("each of \"fragment_codecs\" must be {round, fragment, codec}");
      const auto round = r->get<std::int64_t>();
      const auto fragment = g->get<std::int64_t>();
      const auto name = c->get<std::string>();
      if (round < 1 || round > kMaxRounds || fragment < 0 || fragment >= kMaxFragments)
        throw bad("round " + std::to_string(round) + " fragment " + std::to_string(fragment) +
                  " out of range");
      if (!parse_choice(name))
        throw bad("'" + name.substr(0, 24) +
                  "' is not a codec (fp32|fp16|bf16|int8|topk:K[qB][-noef])");
      trace[{round - 1, static_cast<int>(fragment)}] = name;
    }
  });
  return trace;
}

std::vector<std::uint8_t> encode_proposal(const CodecProposal& p) {
  std::vector<std::uint8_t> out(kProposalBytes);
  out[0] = p.rung;
  out[1] = p.current;
  std::memcpy(out.data() + 2, &p.rate, 4);
  std::memcpy(out.data() + 6, &p.window, 4);
  out[10] = p.probe ? 1 : 0;
  return out;
}

std::optional<CodecProposal> decode_proposal(std::span<const std::uint8_t> bytes,
                                             std::size_t rungs) {
  if (bytes.size() != kProposalBytes) return std::nullopt;
  CodecProposal p;
  p.rung = bytes[0];
  p.current = bytes[1];
  std::memcpy(&p.rate, bytes.data() + 2, 4);
  std::memcpy(&p.window, bytes.data() + 6, 4);
  if (bytes[10] > 1) return std::nullopt;
  p.probe = bytes[10] == 1;
  const auto fine = [](float x) { return std::isfinite(x) && x >= 0; };
  if ((p.rung != CodecProposal::kAbstain && p.rung >= rungs) || p.current >= rungs ||
      !fine(p.rate) || !fine(p.window))
    return std::nullopt;
  return p;
}

CodecAgreement agree_codec(std::span<const std::vector<std::uint8_t>> payloads, std::size_t rungs) {
  std::optional<CodecAgreement> proposed, standing;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    const auto p = decode_proposal(payloads[i], rungs);
    if (!p) continue;
    if (p->rung != CodecProposal::kAbstain && (!proposed || p->rung < proposed->rung))
      proposed = CodecAgreement{p->rung, static_cast<int>(i), *p};
    if (!standing || p->current < standing->rung) standing = CodecAgreement{p->current, -1, {}};
  }
  if (proposed) return *proposed;
  if (standing) return *standing;
  throw std::invalid_argument("codec plan: none of the " + std::to_string(payloads.size()) +
                              " members sent a proposal (" + std::to_string(kProposalBytes) +
                              " bytes, a rung of " + std::to_string(rungs) + ")");
}

namespace {

// Operations a round: streaming's fragments, eager's one.
int operations(const JobConfig& cfg) {
  return cfg.sync.mode == SyncMode::streaming ? std::max(1, cfg.sync.fragments) : 1;
}

// The rule's patience counted in operations.
JobConfig per_operation(JobConfig cfg) {
  cfg.autocodec.patience = std::max(1, cfg.autocodec.patience) * operations(cfg);
  return cfg;
}

}  // namespace

FragmentCodecPlanner::FragmentCodecPlanner(const JobConfig& cfg, std::size_t n)
    : planner_(per_operation(cfg), n, operations(cfg)) {}

void FragmentCodecPlanner::seed(const CodecChoice& c) {
  // Before any measurement the hysteresis holds nothing that resuming would lose.
  if (!seeded_by_measure_) planner_.resume(c);
}

CodecProposal FragmentCodecPlanner::propose(int members, double step_seconds) {
  CodecProposal p;
  p.current = static_cast<std::uint8_t>(planner_.rung());
  // Each reading is used once: an operation that measured nothing (its group new) abstains.
  const std::optional<LinkSample> last = std::exchange(last_, std::nullopt);
  if (!last || members < 2 || !(step_seconds > 0)) return p;
  LinkSample s = *last;
  s.step_seconds = step_seconds;
  planner_.decide(ops_++, s, members);
  p.rung = p.current = static_cast<std::uint8_t>(planner_.rung());
  p.probe = planner_.probing();
  p.rate = static_cast<float>(double(s.bytes) / s.seconds);
  p.window = static_cast<float>(planner_.window(step_seconds));
  return p;
}

void FragmentCodecPlanner::measured(std::uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0)) return;
  last_ = LinkSample{bytes, seconds, 0};
  seeded_by_measure_ = true;
}

}  // namespace loco::diloco
