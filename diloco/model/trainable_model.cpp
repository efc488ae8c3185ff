#include "diloco/model/trainable_model.hpp"

#include <cmath>
#include <limits>

#include "diloco/model/torchscript_model.hpp"

namespace loco::diloco {

std::vector<torch::Tensor> TrainableModel::parameters() {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> GptModel::named_parameters() {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : gpt_->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

std::unique_ptr<TrainableModel> make_model(const JobConfig& cfg, ModelInit init) {
  if (cfg.model.is_torchscript())
    return std::make_unique<TorchScriptModel>(cfg.model, cfg.vocab_size());
  if (init == ModelInit::seed) {
    Gpt gpt(cfg.model, cfg.vocab_size());
    gpt->init_weights(cfg.seed);  // on the CPU: the same weights on every device
    return std::make_unique<GptModel>(std::move(gpt));
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor state = gen.get_state();
  Gpt gpt(cfg.model, cfg.vocab_size());
  gen.set_state(state);
  return std::make_unique<GptModel>(std::move(gpt));
}

std::vector<std::vector<Range>> contiguous_fragments(const std::vector<std::int64_t>& sizes,
                                                     int count) {
  const auto tensors = static_cast<int>(sizes.size());
  if (count < 1 || count > tensors)
    throw std::invalid_argument("sync.fragments: " + std::to_string(count) +
                                " fragments of a module of " + std::to_string(tensors) +
                                " parameter tensors (a fragment holds whole tensors)");
  std::vector<std::int64_t> at(sizes.size() + 1, 0);  // at[i]: where tensor i begins
  for (std::size_t i = 0; i < sizes.size(); ++i) at[i + 1] = at[i] + sizes[i];
  const double total = static_cast<double>(at.back());
  std::vector<std::vector<Range>> out;
  int cut = 0;  // tensors before the current fragment
  for (int f = 1; f <= count; ++f) {
    int next = tensors;
    if (f < count) {
      // The boundary nearest to f/count of the vector that leaves each fragment a tensor.
      const double target = total * f / count;
      double best = std::numeric_limits<double>::infinity();
      for (int i = cut + 1; i <= tensors - (count - f); ++i) {
        const double d = std::abs(static_cast<double>(at[static_cast<std::size_t>(i)]) - target);
        if (d < best) best = d, next = i;
      }
    }
    out.push_back({{at[static_cast<std::size_t>(cut)], at[static_cast<std::size_t>(next)]}});
    cut = next;
  }
  return out;
}

}  // namespace loco::diloco
