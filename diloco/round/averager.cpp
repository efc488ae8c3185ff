#include "diloco/round/averager.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/collective/local.hpp"

namespace loco::diloco {

void codec_roundtrip(std::span<float> x, collective::Codec c) { collective::codec_roundtrip(c, x); }

std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, collective::Codec c) {
  return collective::allreduce_payload_bytes(n, k, c);
}

std::vector<LeftOut> left_outs(int fragment, std::span<const std::string> names,
                               std::span<const guard::Verdict> verdicts) {
  std::vector<LeftOut> out;
  for (std::size_t i = 0; i < verdicts.size(); ++i)
    if (verdicts[i].left_out)
      out.push_back({i < names.size() ? names[i] : std::to_string(i), fragment, verdicts[i].rule,
                     verdicts[i].why});
  return out;
}

void GuardLog::add(int fragment, std::span<const std::string> names,
                   std::span<const guard::Verdict> verdicts) {
  std::vector<LeftOut> left = left_outs(fragment, names, verdicts);
  std::lock_guard<std::mutex> lock(mu_);
  items_.insert(items_.end(), std::make_move_iterator(left.begin()),
                std::make_move_iterator(left.end()));
  for (const guard::Verdict& v : verdicts) {
    if (v.left_out) continue;
    margins_.norm_ratio = std::max(margins_.norm_ratio, v.norm_ratio);
    if (v.relative_agreement != 0)
      margins_.agreement = std::min(margins_.agreement.value_or(v.relative_agreement),
                                    v.relative_agreement);
  }
}

void GuardLog::add_seconds(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  seconds_ += s;
}

double GuardLog::take_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(seconds_, 0.0);
}

GuardLog::Margins GuardLog::take_margins() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(margins_, {});
}

void GuardLog::add(LeftOut l) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back(std::move(l));
}

std::vector<LeftOut> GuardLog::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(items_, {});
}

}  // namespace loco::diloco
