// The llama arch in LibTorch: its parameters are the layout hf_format.hpp exports, its attention
// is causal and grouped as HF's repeat_kv, it trains, checkpoints its activations and cuts into
// Streaming DiLoCo's fragments as gpt2 does; and a job starts from an exported folder (hf:DIR).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diloco/model/hf_format.hpp"
#include "diloco/round/simulator.hpp"
#include "tests/diloco/checkpointing_check.hpp"
#include "tests/diloco/corpus_suite.hpp"
#include "tests/diloco/test_corpus.hpp"

using namespace loco::diloco;

namespace {

class ArchTest : public loco::diloco::testing::CorpusSuite<ArchTest> {
 public:
  static constexpr const char* kCorpus = "arch";

 protected:
  // The tests' small job as a llama: 2 layers of width 32, 4 heads over 2 key/value heads.
  static JobConfig llama_job() {
    JobConfig c = loco::diloco::testing::small_job(*dir_);
    c.model.arch = Arch::llama;
    c.model.heads = 4;
    c.model.kv_heads = 2;
    c.model.mlp_hidden = 48;
    c.validate();
    return c;
  }
};

torch::Tensor flat(Gpt& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m->parameters()) parts.push_back(p.detach().reshape({-1}));
  return torch::cat(parts);
}

}  // namespace

// parameter_layout (torch-free: what export and import use) is the model's parameters, name
// by name, shape by shape, for every arch, tied or not, with and without GQA, and for the
// rotary archs with a head_dim other than width / heads (qwen2: with its q/k/v bias).
TEST_F(ArchTest, LayoutIsTheModelsParameters) {
  auto c = llama_job();
  for (Arch a : {Arch::gpt2, Arch::llama, Arch::mistral, Arch::qwen2})
    for (bool tied : {true, false})
      for (int kv : {0, 2}) {
        if (a == Arch::gpt2 && kv) continue;
        c.model.arch = a;
        c.model.tied_embeddings = tied;
        c.model.kv_heads = kv;
        c.model.explicit_head_dim = a == Arch::gpt2 || a == Arch::llama ? 0 : 12;
        SCOPED_TRACE(std::string(to_string(a)) + (tied ? " tied" : " untied") + " kv " +
                     std::to_string(kv));
        Gpt m(c.model, 256);
        const auto layout = parameter_layout(c.model, 256);
        const auto named = m->named_parameters();
        ASSERT_EQ(layout.size(), named.size());
        std::int64_t at = 0;
        for (std::size_t i = 0; i < layout.size(); ++i) {
          EXPECT_EQ(layout[i].name, named[i].key());
          EXPECT_EQ(layout[i].shape, named[i].value().sizes().vec()) << layout[i].name;
          EXPECT_EQ(layout[i].offset, at);
          at += named[i].value().numel();
        }
        EXPECT_EQ(m->parameter_count(), c.model.parameter_count(256));
      }
}

TEST_F(ArchTest, LlamaIsSeededCausalAndHasNoBiasesNorPositionTable) {
  const auto c = llama_job();
  Gpt a(c.model, 256), b(c.model, 256), other(c.model, 256);
  a->init_weights(1);
  b->init_weights(1);
  other->init_weights(2);
  EXPECT_TRUE(torch::equal(flat(a), flat(b)));
  EXPECT_FALSE(torch::equal(flat(a), flat(other)));
  for (const auto& item : a->named_parameters()) {
    EXPECT_FALSE(item.key().ends_with(".bias")) << item.key();
    if (item.key().find("ln") != std::string::npos) {
      EXPECT_TRUE(torch::equal(item.value(), torch::ones_like(item.value()))) << item.key();
    }
  }
  EXPECT_FALSE(a->wpe);
  torch::NoGradGuard g;
  auto x = torch::randint(0, 256, {2, 16}, torch::kInt64);
  auto y = x.clone();
  y[0][10] = (x[0][10].item<std::int64_t>() + 1) % 256;
  const auto la = a->forward(x), lb = a->forward(y);
  EXPECT_EQ(la.sizes(), (std::vector<std::int64_t>{2, 16, 256}));
  EXPECT_TRUE(torch::equal(la.slice(1, 0, 10), lb.slice(1, 0, 10)));
  EXPECT_FALSE(torch::allclose(la[0].slice(0, 10, 16), lb[0].slice(0, 10, 16)));
  EXPECT_TRUE(torch::equal(la[1], lb[1]));
  // Rotary positions: without them, the last position's attention over {a, b, c} would not
  // see the order of a and b (there is no position table); with them it does.
  const auto abc = a->forward(torch::tensor({{3, 9, 5}}, torch::kInt64));
  const auto bac = a->forward(torch::tensor({{9, 3, 5}}, torch::kInt64));
  EXPECT_FALSE(torch::allclose(abc[0][2], bac[0][2]));
}

// Grouped-query attention is multi-head attention whose key/value heads repeat: a GQA model
// (4 heads over 2 key/value heads) equals a full one (4 and 4) whose key/value head h is the
// GQA model's head h / 2, as HF's repeat_kv pairs them.
TEST_F(ArchTest, GroupedQueryAttentionIsMultiHeadWithRepeatedKeyValueHeads) {
  auto c = llama_job();
  Gpt gqa(c.model, 256);
  gqa->init_weights(3);
  c.model.kv_heads = 4;
  Gpt full(c.model, 256);
  torch::NoGradGuard g;
  const std::int64_t hd = 8, q = 4 * hd, kv = 2 * hd;
  auto src = gqa->named_parameters(), dst = full->named_parameters();
  for (const auto& item : dst) {
    const auto& from = src[item.key()];
    if (!item.key().ends_with("attn.qkv.weight")) {
      item.value().copy_(from);
      continue;
    }
    auto to = item.value();  // [q + 2 · 4 hd, d]
    to.slice(0, 0, q).copy_(from.slice(0, 0, q));
    for (int part = 0; part < 2; ++part)  // k, v
      for (int h = 0; h < 4; ++h)
        to.slice(0, q + part * q + h * hd, q + part * q + (h + 1) * hd)
            .copy_(from.slice(0, q + part * kv + (h / 2) * hd, q + part * kv + (h / 2 + 1) * hd));
  }
  const auto x = torch::randint(0, 256, {2, 16}, torch::kInt64);
  const auto a = gqa->forward(x), b = full->forward(x);
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6))
      << "max |difference| " << (a - b).abs().max().item<double>();
}

// mistral's sliding window: a token attends to itself and the w − 1 before it, so through 2
// layers position i sees tokens i − 2(w − 1) … i: a change at token 0 reaches positions up to
// 2(w − 1) and no further. Without the window it reaches every position.
TEST_F(ArchTest, MistralsSlidingWindowLimitsWhatEachLayerSees) {
  auto c = llama_job();
  c.model.arch = Arch::mistral;
  c.model.sliding_window = 4;
  c.validate();
  for (const int window : {4, 0}) {
    c.model.sliding_window = window;
    Gpt m(c.model, 256);
    m->init_weights(3);
    torch::NoGradGuard no_grad;
    auto idx = torch::randint(1, 256, {1, 16}, torch::kInt64);
    const auto before = m->forward(idx);
    idx[0][0] = 0;
    const auto moved = (m->forward(idx) - before).abs().amax(-1)[0];  // per position
    const int reach = window ? 2 * (window - 1) : 15;
    for (int i = 0; i < 16; ++i)
      if (i <= reach)
        EXPECT_GT(moved[i].item<double>(), 0) << "window " << window << " position " << i;
      else
        EXPECT_EQ(moved[i].item<double>(), 0) << "window " << window << " position " << i;
  }
}

// For llama, and for mistral with a sliding window shorter than the sequence (its mask goes
// through the recomputation too), with a head_dim of its own and Llama 3's rope scaling.
TEST_F(ArchTest, LlamaActivationCheckpointingGivesTheSameGradients) {
  auto idx = torch::randint(0, 256, {3, 17}, torch::kInt64);
  for (const bool bf16 : {false, true})
    for (const Arch arch : {Arch::llama, Arch::mistral}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16 " : "fp32 ") + to_string(arch));
      auto c = llama_job();
      c.model.arch = arch;
      if (arch == Arch::mistral) {
        c.model.sliding_window = 5;
        c.model.explicit_head_dim = 12;
        c.model.rope_scaling.llama3 = true;
        c.model.rope_scaling.original_context = 16;
        c.validate();
      }
      loco::diloco::testing::expect_checkpointing_changes_nothing(c.model, idx, bf16);
    }
}

TEST_F(ArchTest, LlamaFragmentsCoverTheVectorOnce) {
  auto c = llama_job();
  c.model.layers = 4;
  Gpt model(c.model, c.vocab_size());
  const auto frags = parameter_fragments(model, 2);
  std::vector<int> owner(static_cast<std::size_t>(model->parameter_count()), -1);
  for (int f = 0; f < 2; ++f)
    for (const Range& r : frags[static_cast<std::size_t>(f)])
      for (auto i = r.begin; i < r.end; ++i) {
        ASSERT_EQ(owner[static_cast<std::size_t>(i)], -1) << i;
        owner[static_cast<std::size_t>(i)] = f;
      }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
  std::int64_t at = 0;
  for (const auto& item : model->named_parameters()) {
    const bool block = item.key().rfind("blocks.", 0) == 0;
    EXPECT_EQ(owner[static_cast<std::size_t>(at)], block ? std::stoi(item.key().substr(7)) % 2 : 0)
        << item.key();
    at += item.value().numel();
  }
}

// A llama job trains (the loss falls), checkpoints, and a second job started from the folder
// `export` writes of that checkpoint (hf:DIR) starts from the same θ, bit for bit.
TEST_F(ArchTest, LlamaTrainsAndAJobStartsFromItsExportedFolder) {
  const auto c = llama_job();
  const auto ckpt = (std::filesystem::path(c.data.dir) / "ck" / "llama.pt").string();
  const auto hf = (std::filesystem::path(c.data.dir) / "llama-hf").string();
  Simulator pre(c, SimulateOptions{.workers = 2, .mode = Mode::diloco, .rounds = 3});
  const double before = pre.initial_metrics().val_loss.value();
  while (!pre.done()) pre.run_round();
  EXPECT_LT(pre.evaluate(), before - 0.1);
  pre.save_checkpoint(ckpt);
  const torch::Tensor theta = checkpoint_theta(ckpt);
  export_hf(c.model, c.vocab_size(), theta.data_ptr<float>(),
            static_cast<std::size_t>(theta.numel()), hf, StDtype::f32, true);
  EXPECT_TRUE(torch::equal(initial_theta("hf:" + hf, c), theta));
  Simulator from_hf(c, SimulateOptions{.workers = 2, .mode = Mode::diloco, .rounds = 1});
  from_hf.init_parameters("hf:" + hf);
  EXPECT_EQ(from_hf.initial_metrics().theta_hash, pre.theta_hash());
  // Another job's model is refused, naming the field.
  auto other = c;
  other.model.layers = 3;
  try {
    initial_theta("hf:" + hf, other);
    FAIL() << "a folder of another model was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_hidden_layers is 2, but the job's model.layers is 3"),
              std::string::npos)
        << e.what();
  }
}
