// What the activation-checkpointing tests of each arch share (train_test, arch_test): one
// backward pass of a model with and without checkpointing, compared.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "diloco/model/model.hpp"

namespace loco::diloco::testing {

struct Backward {
  torch::Tensor loss;                // its graph, for counting nodes
  std::vector<torch::Tensor> grads;  // the parameters', in order
};

// A model of `model` (vocabulary 256, weights from seed 7) on `idx` [B, T + 1]: the loss of
// predicting idx[:, 1:] from idx[:, :T] under bf16 autocast or not, and its gradients.
inline Backward backward_of(const ModelConfig& model, const torch::Tensor& idx, bool bf16) {
  Gpt m(model, 256);
  m->init_weights(7);
  const auto t = idx.size(1) - 1;
  Backward out;
  {
    AutocastGuard autocast(at::kCPU, bf16);
    out.loss = m->loss(idx.slice(1, 0, t), idx.slice(1, 1, t + 1));
  }
  out.loss.backward();
  for (const auto& p : m->parameters()) {
    EXPECT_TRUE(p.grad().defined());
    out.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  }
  return out;
}

// `model` with and without activation checkpointing gives the same loss and gradients (to
// 1e-6 relative): the pair, for further checks.
inline std::pair<Backward, Backward> expect_checkpointing_changes_nothing(ModelConfig model,
                                                                          const torch::Tensor& idx,
                                                                          bool bf16) {
  model.activation_checkpointing = false;
  Backward kept = backward_of(model, idx, bf16);
  model.activation_checkpointing = true;
  Backward recomputed = backward_of(model, idx, bf16);
  EXPECT_EQ(kept.loss.item<double>(), recomputed.loss.item<double>());
  EXPECT_EQ(kept.grads.size(), recomputed.grads.size());
  for (std::size_t i = 0; i < kept.grads.size() && i < recomputed.grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(kept.grads[i], recomputed.grads[i], 1e-6, 1e-9))
        << i << ": max |difference| "
        << (kept.grads[i] - recomputed.grads[i]).abs().max().item<double>();
  return {kept, recomputed};
}

}  // namespace loco::diloco::testing
