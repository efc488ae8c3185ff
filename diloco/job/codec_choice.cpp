#include "diloco/job/codec_choice.hpp"

#include <algorithm>
#include <charconv>

namespace loco::diloco {

namespace {
constexpr std::string_view kTopk = "topk:";
constexpr std::string_view kNoFeedback = "-noef";
}  // namespace

std::string CodecChoice::name() const {
  if (sparse())
    return std::string(kTopk) + std::to_string(topk_k) +
           (topk_bits > 0 ? "q" + std::to_string(topk_bits) : "") +
           (feedback ? "" : std::string(kNoFeedback));
  return std::string(collective::to_string(dense));
}

std::optional<CodecChoice> parse_choice(std::string_view name) {
  if (name.size() > 24) return std::nullopt;
  if (name.starts_with(kTopk)) {
    std::string_view digits = name.substr(kTopk.size());
    const bool feedback = !digits.ends_with(kNoFeedback);
    if (!feedback) digits.remove_suffix(kNoFeedback.size());
    std::uint32_t bits = 0;
    if (const auto q = digits.find('q'); q != std::string_view::npos) {
      // One digit of bits: "q4".
      const std::string_view b = digits.substr(q + 1);
      if (b.size() != 1 || b[0] < '1' || b[0] > '8') return std::nullopt;
      bits = static_cast<std::uint32_t>(b[0] - '0');
      digits = digits.substr(0, q);
    }
    std::uint32_t k = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
        digits[0] == '0' || k < 1 || k > 65536)
      return std::nullopt;
    return CodecChoice{collective::Codec::fp32, k, bits, feedback};
  }
  if (auto c = collective::parse_codec(name)) return CodecChoice{*c, 0};
  return std::nullopt;
}

collective::sparse::Params sparse_params(const TopkConfig& topk, const CodecChoice& c) {
  collective::sparse::Params p;
  p.chunk = static_cast<std::uint32_t>(topk.chunk);
  p.k = std::min(c.topk_k > 0 ? c.topk_k : static_cast<std::uint32_t>(topk.k), p.chunk);
  p.bits = c.topk_bits > 0 ? c.topk_bits : static_cast<std::uint32_t>(topk.bits);
  return p;
}

}  // namespace loco::diloco
