// The model as InnerTrainer and Evaluator see it (docs/design.md, "The model interface"): the
// built-in decoder (model.arch, model.hpp) or a TorchScript module of the user's own
// (model.torchscript, torchscript_model.hpp). The trainer needs no more of a model than this:
//
//   params = model.named_parameters();   // fixed order: the flat vector's
//   loss = model.loss(tokens, targets);  // a scalar; backward() fills the parameters' grads
//   model.train(false); model.to(device);
//   fragments = model.fragments(P);      // Streaming DiLoCo's cut of the flat vector
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/model/model.hpp"

namespace loco::diloco {

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  // Every parameter once (a tied one under its first name), in an order that is the same on
  // every call and in every process: the flat vector's.
  virtual std::vector<std::pair<std::string, torch::Tensor>> named_parameters() = 0;
  std::vector<torch::Tensor> parameters();
  // The mean loss of predicting `targets` [B, T] from `tokens` [B, T] (both int64; targets are
  // the tokens shifted by one): a scalar on the model's device.
  virtual torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) = 0;
  virtual void train(bool on) = 0;
  virtual void to(torch::Device device) = 0;
  // The flat vector cut into `count` fragments for Streaming DiLoCo (each a list of ranges in
  // the vector's order; together they cover it once). Throws std::invalid_argument naming
  // sync.fragments when the model cannot be cut so.
  virtual std::vector<std::vector<Range>> fragments(int count) = 0;
  // After inner steps: throws if the model did something that the workers could not keep
  // equal (a TorchScript module that changed one of its buffers). Nothing by default.
  virtual void check_after_steps() {}
};

// The built-in decoder behind the interface: Gpt's parameters in its registration order, its
// loss, and parameter_fragments (blocks strided over depth).
class GptModel final : public TrainableModel {
 public:
  explicit GptModel(Gpt gpt) : gpt_(std::move(gpt)) {}
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() override;
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    return gpt_->loss(tokens, targets);
  }
  void train(bool on) override { gpt_->train(on); }
  void to(torch::Device device) override { gpt_->to(device); }
  std::vector<std::vector<Range>> fragments(int count) override {
    return parameter_fragments(gpt_, count);
  }
  Gpt& gpt() { return gpt_; }

 private:
  Gpt gpt_;
};

// How make_model leaves the built-in model's weights.
enum class ModelInit {
  seed,     // init_weights(cfg.seed): θ0 of a job (the global RNG is used by the constructor)
  keep_rng  // as constructed, the global torch RNG put back as it was: a model whose weights
            // are about to be overwritten (Evaluator)
};

// The job's model on the CPU: cfg.model's decoder, or the TorchScript module at
// cfg.model.torchscript (its weights are the file's either way `init` says; checked against
// the hash and parameter count the job records, when it records them).
std::unique_ptr<TrainableModel> make_model(const JobConfig& cfg, ModelInit init);

// A module's flat vector of parameter tensors of `sizes` (elements, in order) cut into `count`
// fragments of whole tensors, each one contiguous range, the cuts at the tensor boundaries
// nearest to equal shares. Throws std::invalid_argument naming sync.fragments when there are
// fewer tensors than fragments.
std::vector<std::vector<Range>> contiguous_fragments(const std::vector<std::int64_t>& sizes,
                                                     int count);

}  // namespace loco::diloco
