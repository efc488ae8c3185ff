#include "diloco/job/codec_choice.hpp"

#include <algorithm>
#include <charconv>

namespace loco::diloco {

namespace {
constexpr std::string_view kTopk = "topk:";
}  // namespace

std::string CodecChoice::name() const {
  if (sparse()) return std::string(kTopk) + std::to_string(topk_k);
  return std::string(collective::to_string(dense));
}

std::optional<CodecChoice> parse_choice(std::string_view name) {
  if (name.size() > 16) return std::nullopt;
  if (name.starts_with(kTopk)) {
    const std::string_view digits = name.substr(kTopk.size());
    std::uint32_t k = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || k < 1 ||
        k > 65536)
      return std::nullopt;
    return CodecChoice{collective::Codec::fp32, k};
  }
  if (auto c = collective::parse_codec(name)) return CodecChoice{*c, 0};
  return std::nullopt;
}

collective::sparse::Params sparse_params(const TopkConfig& topk, std::uint32_t k) {
  collective::sparse::Params p;
  p.chunk = static_cast<std::uint32_t>(topk.chunk);
  p.k = std::min(k > 0 ? k : static_cast<std::uint32_t>(topk.k), p.chunk);
  p.bits = static_cast<std::uint32_t>(topk.bits);
  return p;
}

}  // namespace loco::diloco
