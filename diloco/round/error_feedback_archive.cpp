// ErrorFeedback's buffers in checkpoints and inner states: the LibTorch part of
// error_feedback.hpp (the rest is torch-free, in loco_diloco_core).
#include <torch/torch.h>

#include "diloco/round/error_feedback.hpp"

namespace loco::diloco {

void ErrorFeedback::save(torch::serialize::OutputArchive& ar, const std::string& prefix,
                         std::size_t replica) const {
  const auto& r = buffers_.at(replica);
  for (std::size_t f = 0; f < r.size(); ++f)
    ar.write(prefix + std::to_string(f),
             torch::from_blob(const_cast<float*>(r[f].data()),
                              {static_cast<std::int64_t>(r[f].size())})
                 .clone());
}

void ErrorFeedback::load(torch::serialize::InputArchive& ar, const std::string& prefix,
                         std::size_t replica) {
  auto& r = buffers_.at(replica);
  for (std::size_t f = 0; f < r.size(); ++f) {
    torch::Tensor t;
    if (!ar.try_read(prefix + std::to_string(f), t)) {
      std::fill(r[f].begin(), r[f].end(), 0.0f);
      continue;
    }
    t = t.to(torch::kFloat32).contiguous();
    if (t.numel() != static_cast<std::int64_t>(r[f].size()))
      throw std::runtime_error("the error feedback of fragment " + std::to_string(f) + " holds " +
                               std::to_string(t.numel()) + " values, not " +
                               std::to_string(r[f].size()));
    std::copy(t.data_ptr<float>(), t.data_ptr<float>() + t.numel(), r[f].begin());
  }
}

}  // namespace loco::diloco
