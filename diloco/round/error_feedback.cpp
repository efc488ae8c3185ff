#include "diloco/round/error_feedback.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "runtime/collective/local.hpp"

namespace loco::diloco {

ErrorFeedback::ErrorFeedback(const TopkConfig& cfg, std::vector<std::size_t> sizes,
                             std::size_t replicas)
    : topk_(cfg),
      params_(sparse_params(cfg)),
      beta_(static_cast<float>(cfg.error_feedback)),
      over_senders_(cfg.mean == SparseMean::senders),
      sizes_(std::move(sizes)) {
  params_.validate();
  buffers_.resize(replicas);
  for (auto& r : buffers_)
    for (std::size_t n : sizes_) r.emplace_back(n, 0.0f);
}

collective::sparse::Params ErrorFeedback::params(const CodecChoice& c) const {
  return sparse_params(topk_, c);
}

std::size_t ErrorFeedback::bytes(int fragment, const CodecChoice& c) const {
  return collective::sparse::encoded_bytes(sizes_.at(static_cast<std::size_t>(fragment)),
                                           params(c));
}

void ErrorFeedback::dense(std::size_t replica, int fragment, std::span<const float> delta,
                          std::span<float> out, bool flush) {
  std::vector<float>& e = buffers_.at(replica).at(static_cast<std::size_t>(fragment));
  if (delta.size() != e.size() || out.size() != e.size())
    throw std::invalid_argument("ErrorFeedback::dense: Δ of fragment " +
                                std::to_string(fragment) + " has " +
                                std::to_string(delta.size()) + " values, its buffer " +
                                std::to_string(e.size()));
  const bool finite = std::all_of(delta.begin(), delta.end(), [](float v) { return std::isfinite(v); });
  if (!flush || !finite) {
    if (out.data() != delta.data()) std::copy(delta.begin(), delta.end(), out.begin());
    return;
  }
  for (std::size_t i = 0; i < e.size(); ++i) {
    out[i] = beta_ * e[i] + delta[i];
    e[i] = 0.0f;
  }
}

std::vector<std::uint8_t> ErrorFeedback::encode(std::size_t replica, int fragment,
                                                std::span<const float> delta,
                                                const CodecChoice& c) {
  std::vector<float>& e = buffers_.at(replica).at(static_cast<std::size_t>(fragment));
  if (delta.size() != e.size())
    throw std::invalid_argument("ErrorFeedback::encode: Δ of fragment " +
                                std::to_string(fragment) + " has " +
                                std::to_string(delta.size()) + " values, its buffer " +
                                std::to_string(e.size()));
  for (float v : delta)
    if (!std::isfinite(v)) return {};
  sent_.resize(e.size());
  if (!c.feedback) return collective::sparse::encode(delta, params(c), sent_);  // e as it was
  for (std::size_t i = 0; i < e.size(); ++i) e[i] = beta_ * e[i] + delta[i];
  std::vector<std::uint8_t> code = collective::sparse::encode(e, params(c), sent_);
  for (std::size_t i = 0; i < e.size(); ++i) e[i] -= sent_[i];
  return code;
}

void ErrorFeedback::mean(int fragment, std::span<const std::span<const std::uint8_t>> codes,
                         std::span<float> out, std::span<const std::uint8_t> left_out,
                         const CodecChoice& c) const {
  if (out.size() != sizes_.at(static_cast<std::size_t>(fragment)))
    throw std::invalid_argument("ErrorFeedback::mean: " + std::to_string(out.size()) +
                                " values for fragment " + std::to_string(fragment) + " of " +
                                std::to_string(sizes_[static_cast<std::size_t>(fragment)]));
  if (codes.empty()) throw std::invalid_argument("ErrorFeedback::mean: no member");
  if (!left_out.empty() && left_out.size() != codes.size())
    throw std::invalid_argument("ErrorFeedback::mean: a mask of " +
                                std::to_string(left_out.size()) + " for " +
                                std::to_string(codes.size()) + " members");
  std::fill(out.begin(), out.end(), 0.0f);
  std::size_t in = 0;
  for (std::size_t m = 0; m < codes.size(); ++m) in += collective::is_left_out(left_out, m) ? 0 : 1;
  if (in == 0) return;
  // members: Σ/K as it goes; senders: Σ first, then each entry over the members that sent it.
  std::vector<std::uint16_t> senders(over_senders_ ? out.size() : 0, 0);
  const float scale = over_senders_ ? 1.0f : 1.0f / static_cast<float>(in);
  const collective::sparse::Params p = params(c);
  for (std::size_t m = 0; m < codes.size(); ++m) {
    if (collective::is_left_out(left_out, m)) continue;
    try {
      collective::sparse::decode_add(codes[m], p, scale, out, senders);
    } catch (const collective::sparse::CodecError& e) {
      throw collective::sparse::CodecError("the sparse code of member " + std::to_string(m) +
                                           " of fragment " + std::to_string(fragment) + ": " +
                                           e.what());
    }
  }
  for (std::size_t i = 0; i < senders.size(); ++i)
    if (senders[i] > 1) out[i] /= static_cast<float>(senders[i]);
}

void ErrorFeedback::clear(std::size_t replica) {
  for (auto& b : buffers_.at(replica)) std::fill(b.begin(), b.end(), 0.0f);
}

std::vector<guard::Verdict> judge_codes(const ErrorFeedback& feedback, int fragment,
                                        std::span<const std::span<const std::uint8_t>> codes,
                                        const GuardConfig& guard, const CodecChoice& c) {
  if (!guard.on) return {};
  return guard::judge(guard::sparse_facts(codes, feedback.params(c), feedback.size(fragment)),
                      guard);
}

}  // namespace loco::diloco
