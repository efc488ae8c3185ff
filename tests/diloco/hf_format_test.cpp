// Torch-free: model.arch and its fields in the job file, the presets' sizes, the safetensors
// reader and writer, and the Hugging Face folder's export and import (diloco/model/hf_format.hpp).
// The model itself against this layout: arch_test.cpp; against transformers: hf_export_test.py.
#include "diloco/model/hf_format.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "diloco/data/data.hpp"
#include "diloco/job/config.hpp"
#include "diloco/job/memory.hpp"
#include "diloco/model/safetensors.hpp"
#include "tests/diloco/config_util.hpp"

using namespace loco::diloco;
namespace fs = std::filesystem;

namespace {

const char* kLlama = R"(
name: t
model: {arch: llama, layers: 2, width: 32, heads: 4, kv_heads: 2, context: 16, tied_embeddings: false, mlp_hidden: 48}
data: {dir: /tmp/x}
rounds: 1
)";

using loco::diloco::testing::error_of;
using loco::diloco::testing::replace;

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              ("loco-hf-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    remove_tree(path_.string());
    fs::create_directories(path_);
  }
  ~TempDir() { remove_tree(path_.string()); }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<float> random_theta(const ModelConfig& m, int vocab, std::uint32_t seed) {
  const auto layout = parameter_layout(m, vocab);
  std::vector<float> theta(static_cast<std::size_t>(layout.back().offset + layout.back().numel));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : theta) x = normal(gen);
  return theta;
}

std::string import_error(const std::string& dir, const ModelConfig& m, int vocab) {
  try {
    import_hf(dir, m, vocab);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The header of a safetensors file as JSON, and the file rewritten with another header.
nlohmann::json header_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  return nlohmann::json::parse(text);
}

void rewrite_header(const fs::path& p, const nlohmann::json& header) {
  std::ifstream in(p, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  in.seekg(static_cast<std::streamoff>(8 + n));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  const std::uint64_t m = text.size();
  out.write(reinterpret_cast<const char*>(&m), 8);
  out << text << data;
}

}  // namespace

TEST(Arch, LlamaParsesValidatesAndRoundTrips) {
  const auto c = JobConfig::from_yaml(kLlama);
  EXPECT_EQ(c.model.arch, Arch::llama);
  EXPECT_EQ(c.model.kv_head_count(), 2);
  EXPECT_EQ(c.model.mlp_width(), 48);
  EXPECT_EQ(c.model.rope_theta, 10000);
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.to_yaml(), c.to_yaml());
  EXPECT_EQ(again.model.arch, Arch::llama);
  EXPECT_EQ(again.model.kv_heads, 2);
  // Defaults: gpt2, and Llama's MLP width rule (8/3 · d rounded up to 256) for llama.
  EXPECT_EQ(JobConfig::from_yaml(replace(replace(kLlama, "arch: llama, ", ""), "kv_heads: 2, ", ""))
                .model.arch,
            Arch::gpt2);
  const auto rule = JobConfig::from_yaml(replace(kLlama, ", mlp_hidden: 48", ""));
  EXPECT_EQ(rule.model.mlp_width(), 256);  // 2 · 4 · 32 / 3 = 85 -> 256
  ModelConfig wide;
  wide.arch = Arch::llama;
  wide.d_model = 4096;
  EXPECT_EQ(wide.mlp_width(), 11008);  // Llama 7B's intermediate size
  wide.arch = Arch::gpt2;
  EXPECT_EQ(wide.mlp_width(), 4 * 4096);
}

TEST(Arch, BadFieldsAreRefusedNamingThem) {
  EXPECT_EQ(error_of(replace(kLlama, "arch: llama", "arch: mamba")),
            "model.arch: expected one of gpt2|llama|mistral|qwen2, got 'mamba'");
  EXPECT_EQ(error_of(replace(kLlama, "kv_heads: 2", "kv_heads: 3")),
            "model.kv_heads: must be a divisor of model.heads (4), got 3");
  EXPECT_EQ(error_of(replace(kLlama, "kv_heads: 2", "kv_heads: 8")),
            "model.kv_heads: must be in [0, 4], got 8");
  EXPECT_NE(error_of(replace(kLlama, "width: 32, heads: 4", "width: 36, heads: 4"))
                .find("model.heads: must be such that d_model / heads is even"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(kLlama, "mlp_hidden: 48", "mlp_hidden: -1")),
            "model.mlp_hidden: must be in [0, 4194304], got -1");
  EXPECT_EQ(error_of(replace(kLlama, "mlp_hidden: 48", "norm_eps: 0")),
            "model.norm_eps: must be in (0, 1], got 0");
  EXPECT_EQ(error_of(replace(kLlama, "mlp_hidden: 48", "rope_theta: 0.5")),
            "model.rope_theta: must be > 1, got 0.5");
  EXPECT_EQ(error_of(replace(kLlama, "mlp_hidden: 48", "rope_theta: .nan")),
            "model.rope_theta: must be a finite number, got nan");
  // gpt2 refuses llama's fields rather than ignoring them.
  const std::string gpt2 = replace(kLlama, "arch: llama", "arch: gpt2");
  EXPECT_NE(error_of(gpt2).find("model.kv_heads: must be 0 or model.heads for arch gpt2"),
            std::string::npos);
  EXPECT_NE(error_of(replace(replace(gpt2, "kv_heads: 2", "kv_heads: 4"), "mlp_hidden: 48",
                             "rope_theta: 500000"))
                .find("model.rope_theta: must be unset for arch gpt2"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(gpt2, "kv_heads: 2", "kv_heads: 4")), "");
}

// The exact count (ModelConfig::parameter_count) is the layout's, and the presets have the
// sizes their comments and docs/guide/jobs.md give.
TEST(Arch, ParameterCountIsTheLayoutsAndThePresetsSizes) {
  for (const char* yaml : {kLlama}) {
    auto c = JobConfig::from_yaml(yaml);
    for (Arch a : {Arch::gpt2, Arch::llama})
      for (bool tied : {true, false}) {
        c.model.arch = a;
        c.model.tied_embeddings = tied;
        c.model.kv_heads = a == Arch::llama ? 2 : 0;
        const auto layout = parameter_layout(c.model, 256);
        EXPECT_EQ(c.model.parameter_count(256), layout.back().offset + layout.back().numel);
      }
  }
  const auto gpt2 = JobConfig::from_yaml_file(LOCO_SOURCE_DIR "/examples/gpt2-small.yaml");
  EXPECT_EQ(gpt2.model.arch, Arch::gpt2);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  // GPT-2 small as transformers counts it: 124,439,808.
  EXPECT_EQ(gpt2.model.parameter_count(gpt2.vocab_size()), 124439808);
  const auto llama = JobConfig::from_yaml_file(LOCO_SOURCE_DIR "/examples/llama-150m.yaml");
  EXPECT_EQ(llama.model.arch, Arch::llama);
  EXPECT_EQ(llama.vocab_size(), 32000);
  const std::int64_t d = 1024, v = 32000, mlp = 2688, layers = 12;
  EXPECT_EQ(llama.model.mlp_width(), mlp);
  EXPECT_EQ(llama.model.parameter_count(llama.vocab_size()),
            2 * v * d + layers * (4 * d * d + 3 * d * mlp + 2 * d) + d);
  // OpenDiLoCo's "150M": the parameters outside the embeddings.
  EXPECT_EQ(layers * (4 * d * d + 3 * d * mlp + 2 * d) + d, 149447680);
}

TEST(Safetensors, WritesAndReadsF32AndBf16) {
  TempDir dir;
  std::vector<std::pair<std::string, StTensor>> tensors;
  StTensor a, b;
  a.shape = {2, 3};
  a.values = {1.f, -2.5f, 3.25f, 1e-3f, 7.f, -0.f};
  b.shape = {3};  // 12 bytes: the next tensor starts unaligned, as the format allows
  b.values = {1.f / 3, 2.f / 3, 65504.f};
  tensors = {{"a", a}, {"b", b}};
  write_safetensors((dir / "f.safetensors").string(), tensors, StDtype::f32);
  // The data starts 8-byte aligned.
  const auto size = fs::file_size(dir / "f.safetensors");
  EXPECT_EQ((size - (6 + 3) * 4) % 8, 0u);
  auto back = read_safetensors((dir / "f.safetensors").string());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at("a").values, a.values);
  EXPECT_EQ(back.at("a").shape, a.shape);
  EXPECT_EQ(back.at("b").values, b.values);
  EXPECT_EQ(header_of(dir / "f.safetensors")["__metadata__"]["format"], "pt");

  write_safetensors((dir / "h.safetensors").string(), tensors, StDtype::bf16);
  back = read_safetensors((dir / "h.safetensors").string());
  EXPECT_EQ(back.at("a").stored, StDtype::bf16);
  for (std::size_t i = 0; i < a.values.size(); ++i)
    EXPECT_NEAR(back.at("a").values[i], a.values[i], std::abs(a.values[i]) / 128) << i;
  EXPECT_EQ(back.at("a").values[0], 1.f);  // exact in bf16
  // Round to nearest even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  StTensor tie;
  tie.shape = {2};
  tie.values = {1.f + 1.f / 256, 1.f + 3.f / 256};
  write_safetensors((dir / "t.safetensors").string(), {{"t", tie}}, StDtype::bf16);
  EXPECT_EQ(read_safetensors((dir / "t.safetensors").string()).at("t").values,
            (std::vector<float>{1.f, 1.f + 4.f / 256}));
}

TEST(Safetensors, ReadsF16) {
  TempDir dir;
  const auto p = dir / "f16.safetensors";
  const std::uint16_t halves[] = {0x3c00, 0xc000, 0x0001, 0x7bff};  // 1, -2, 2^-24, 65504
  nlohmann::json h = {{"x", {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {0, 8}}}}};
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  {
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << text;
    out.write(reinterpret_cast<const char*>(halves), sizeof halves);
  }
  EXPECT_EQ(read_safetensors(p.string()).at("x").values,
            (std::vector<float>{1.f, -2.f, std::ldexp(1.f, -24), 65504.f}));
}

TEST(Safetensors, CorruptFilesAreRefusedNamingTheProblem) {
  TempDir dir;
  const auto p = dir / "m.safetensors";
  StTensor a;
  a.shape = {4, 2};
  a.values.assign(8, 1.5f);
  StTensor b = a;
  const auto fresh = [&] { write_safetensors(p.string(), {{"a", a}, {"b", b}}, StDtype::f32); };
  const auto error = [&] {
    try {
      read_safetensors(p.string());
    } catch (const SafetensorsError& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
      return std::string(e.what());
    }
    return std::string();
  };
  fresh();
  const auto whole = fs::file_size(p);
  fs::resize_file(p, whole - 4);  // truncated in the last tensor
  EXPECT_NE(error().find("outside the"), std::string::npos) << error();
  fs::resize_file(p, 5);
  EXPECT_NE(error().find("no header"), std::string::npos) << error();
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = std::uint64_t(1) << 40;  // a header length from garbage
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(error().find("more than the 100000000 allowed"), std::string::npos) << error();
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = 8;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{\"a\": [[";
  }
  EXPECT_NE(error().find("header: not JSON (a syntax error at byte"), std::string::npos) << error();

  fresh();
  auto h = header_of(p);
  h["a"]["dtype"] = "I64";
  rewrite_header(p, h);
  EXPECT_NE(error().find("tensor 'a': dtype \"I64\""), std::string::npos) << error();
  fresh();
  h = header_of(p);
  h["a"]["shape"] = {4, 3};
  rewrite_header(p, h);
  EXPECT_NE(error().find("tensor 'a': 32 bytes for shape [4, 3] of F32"), std::string::npos)
      << error();
  fresh();
  h = header_of(p);
  h["b"]["data_offsets"] = {16, 48};  // overlaps a
  rewrite_header(p, h);
  EXPECT_NE(error().find("inside another tensor"), std::string::npos) << error();
  fresh();
  h = header_of(p);
  h.erase("b");  // b's bytes are unaccounted for
  rewrite_header(p, h);
  EXPECT_NE(error().find("32 bytes of data after the last tensor"), std::string::npos) << error();
  fresh();
  h = header_of(p);
  h["a"]["shape"] = {-4, 2};
  rewrite_header(p, h);
  EXPECT_NE(error().find("is not of sizes"), std::string::npos) << error();
}

// export_hf then import_hf gives θ back bit for bit, for both archs, tied or not, with GQA.
TEST(HfFormat, ExportThenImportIsBitExact) {
  auto c = JobConfig::from_yaml(kLlama);
  for (Arch a : {Arch::gpt2, Arch::llama})
    for (bool tied : {true, false}) {
      SCOPED_TRACE(std::string(to_string(a)) + (tied ? " tied" : " untied"));
      c.model.arch = a;
      c.model.tied_embeddings = tied;
      c.model.kv_heads = a == Arch::llama ? 2 : 0;
      c.validate();
      TempDir dir;
      const auto theta = random_theta(c.model, 256, 7);
      const auto out = (dir / "hf").string();
      export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::f32, false);
      EXPECT_TRUE(fs::exists(dir / "hf" / "config.json"));
      EXPECT_FALSE(fs::exists(dir / "hf.tmp-export"));
      EXPECT_EQ(import_hf(out, c.model, 256), theta);
      // bf16: every value rounded once, none moved by more than bf16's half step.
      export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::bf16, true);
      const auto rounded = import_hf(out, c.model, 256);
      ASSERT_EQ(rounded.size(), theta.size());
      for (std::size_t i = 0; i < theta.size(); ++i)
        ASSERT_LE(std::abs(rounded[i] - theta[i]), std::abs(theta[i]) / 256) << i;
      EXPECT_NE(rounded, theta);
    }
}

TEST(HfFormat, ExportRefusesANonEmptyFolderUnlessForcedAndAWrongLength) {
  auto c = JobConfig::from_yaml(kLlama);
  TempDir dir;
  const auto theta = random_theta(c.model, 256, 1);
  const auto out = (dir / "hf").string();
  fs::create_directories(out);  // empty: fine
  export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::f32, false);
  try {
    export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::f32, false);
    FAIL() << "overwrote a non-empty folder";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exists and is not empty (--force"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::f32, true));
  EXPECT_THROW(export_hf(c.model, 256, theta.data(), theta.size() - 1, out, StDtype::f32, true),
               std::runtime_error);
}

TEST(HfFormat, ImportRefusesAnotherModelNamingWhatDiffers) {
  auto c = JobConfig::from_yaml(kLlama);
  TempDir dir;
  const auto theta = random_theta(c.model, 256, 2);
  const auto out = (dir / "hf").string();
  export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::f32, false);
  auto other = c.model;
  other.d_model = 64;
  EXPECT_NE(
      import_error(out, other, 256).find("hidden_size is 32, but the job's model.d_model is 64"),
      std::string::npos)
      << import_error(out, other, 256);
  other = c.model;
  other.kv_heads = 4;
  EXPECT_NE(import_error(out, other, 256)
                .find("num_key_value_heads is 2, but the job's model.kv_heads is 4"),
            std::string::npos);
  EXPECT_NE(import_error(out, c.model, 300).find("vocab_size is 256"), std::string::npos);
  other = c.model;
  other.arch = Arch::gpt2;
  EXPECT_NE(
      import_error(out, other, 256).find("model_type is llama, but the job's model.arch is gpt2"),
      std::string::npos);
  other = c.model;
  other.rope_theta = 500000;
  EXPECT_NE(import_error(out, other, 256).find("rope_theta is 10000"), std::string::npos);
  EXPECT_NE(import_error((dir / "nowhere").string(), c.model, 256).find("no config.json"),
            std::string::npos);
}

TEST(HfFormat, ImportRefusesMissingMisshapenAndExtraTensorsNamingThem) {
  auto c = JobConfig::from_yaml(kLlama);
  TempDir dir;
  const auto theta = random_theta(c.model, 256, 3);
  const auto out = dir / "hf";
  const auto st = out / "model.safetensors";
  const auto fresh = [&] {
    export_hf(c.model, 256, theta.data(), theta.size(), out.string(), StDtype::f32, true);
  };
  // Tensors taken out, misshapen or added: rewritten through the writer.
  const auto edit = [&](const std::function<void(std::map<std::string, StTensor>&)>& change) {
    fresh();
    auto tensors = read_safetensors(st.string());
    change(tensors);
    std::vector<std::pair<std::string, StTensor>> list(tensors.begin(), tensors.end());
    write_safetensors(st.string(), list, StDtype::f32);
  };
  edit([](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); });
  EXPECT_NE(import_error(out.string(), c.model, 256)
                .find("missing 1 tensor(s) of the job's model: model.layers.1.mlp.up_proj.weight"),
            std::string::npos)
      << import_error(out.string(), c.model, 256);
  edit([](auto& t) {
    auto& k = t.at("model.layers.0.self_attn.k_proj.weight");
    k.shape = {8, 32};
    k.values.resize(8 * 32);
  });
  EXPECT_NE(import_error(out.string(), c.model, 256)
                .find("tensor model.layers.0.self_attn.k_proj.weight has shape [8, 32], the job's "
                      "model needs [16, 32]"),
            std::string::npos)
      << import_error(out.string(), c.model, 256);
  edit([](auto& t) {
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = t.at("model.norm.weight");
  });
  EXPECT_NE(import_error(out.string(), c.model, 256)
                .find("1 tensor(s) that the job's model does not have: "
                      "model.layers.0.self_attn.rotary_emb.inv_freq"),
            std::string::npos)
      << import_error(out.string(), c.model, 256);
  fresh();
  fs::resize_file(st, fs::file_size(st) - 1);
  EXPECT_NE(import_error(out.string(), c.model, 256).find("truncated"), std::string::npos);
}

// GPT-2 files as transformers' own older checkpoints are: names without "transformer." and
// the causal-mask buffers, which are skipped; a tied head stored anyway must equal wte.
TEST(HfFormat, ImportTakesOlderGpt2NamingAndARepeatedTiedHead) {
  auto c = JobConfig::from_yaml(replace(replace(kLlama, "arch: llama, ", ""), "kv_heads: 2, ", ""));
  c.model.tied_embeddings = true;
  c.validate();
  TempDir dir;
  const auto theta = random_theta(c.model, 256, 4);
  const auto out = dir / "hf";
  export_hf(c.model, 256, theta.data(), theta.size(), out.string(), StDtype::f32, false);
  const auto st = (out / "model.safetensors").string();
  auto tensors = read_safetensors(st);
  std::vector<std::pair<std::string, StTensor>> bare;
  for (auto& [name, t] : tensors) bare.emplace_back(name.substr(std::strlen("transformer.")), t);
  StTensor mask;
  mask.shape = {1, 1, 16, 16};
  mask.values.assign(256, 1.f);
  bare.emplace_back("h.0.attn.bias", mask);
  bare.emplace_back("lm_head.weight", tensors.at("transformer.wte.weight"));
  write_safetensors(st, bare, StDtype::f32);
  EXPECT_EQ(import_hf(out.string(), c.model, 256), theta);
  bare.back().second.values[3] += 1;
  write_safetensors(st, bare, StDtype::f32);
  EXPECT_NE(
      import_error(out.string(), c.model, 256).find("lm_head.weight differs from the embeddings"),
      std::string::npos);
}

TEST(HfFormat, InitNamesAFolderWithHfColon) {
  EXPECT_EQ(hf_init_dir("hf:/models/gpt2"), "/models/gpt2");
  EXPECT_EQ(hf_init_dir("runs/x/checkpoints/latest.pt"), "");
}

// ---- The Hugging Face families: config.json of each, shards, `model: {hf: DIR}` ----

namespace {

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

// config.json files as the public checkpoints have them (transformers 4.x's fields; the real
// models' shapes).
const char* kSmolLm2 = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
 "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu",
 "hidden_size": 576, "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
 "is_llama_config": true, "max_position_embeddings": 8192, "model_type": "llama",
 "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
 "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null,
 "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
 "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152})";
const char* kLlama32 = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
 "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64,
 "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
 "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
 "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
 "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
 "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
 "use_cache": true, "vocab_size": 128256})";
const char* kMistral7b = R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1,
 "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
 "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
 "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
 "vocab_size": 32000})";
const char* kQwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
 "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
 "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
 "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
 "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
 "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
 "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
 "vocab_size": 151936})";

HfModel read_config_text(const TempDir& dir, const std::string& text) {
  write_text(dir / "config.json", text);
  return read_hf_config((dir / "").string());
}

std::string config_error(const std::string& text,
                         const std::function<void(nlohmann::json&)>& edit) {
  TempDir dir;
  auto c = nlohmann::json::parse(text);
  edit(c);
  write_text(dir / "config.json", c.dump());
  try {
    read_hf_config((dir / "").string());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const char* kQwenJob = R"(
name: t
model: {arch: qwen2, layers: 2, width: 32, heads: 4, kv_heads: 2, head_dim: 12, context: 16, tied_embeddings: false, mlp_hidden: 48}
data: {dir: /tmp/x}
rounds: 1
)";

// θ of kQwenJob exported, and its model.safetensors cut into shards with an index, as
// save_pretrained(max_shard_size=...) writes them; returns θ.
std::vector<float> sharded_folder(const fs::path& out, const ModelConfig& m) {
  const auto theta = random_theta(m, 256, 9);
  export_hf(m, 256, theta.data(), theta.size(), out.string(), StDtype::f32, true);
  auto tensors = read_safetensors((out / "model.safetensors").string());
  fs::remove(out / "model.safetensors");
  std::vector<std::vector<std::pair<std::string, StTensor>>> shards(3);
  nlohmann::json map;
  std::size_t i = 0;
  for (auto& [name, t] : tensors) {
    const std::size_t s = i++ % 3;
    const std::string file = "model-0000" + std::to_string(s + 1) + "-of-00003.safetensors";
    map[name] = file;
    shards[s].emplace_back(name, t);
  }
  for (std::size_t s = 0; s < 3; ++s)
    write_safetensors(
        (out / ("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors")).string(),
        shards[s], StDtype::f32);
  write_text(out / "model.safetensors.index.json",
             nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
  return theta;
}

}  // namespace

// Each family's config.json as transformers reads it, down to the exact parameter count (as
// transformers counts the public models: 134,515,008 for SmolLM2-135M, 1,235,814,400 for
// Llama-3.2-1B, 7,241,732,096 for Mistral-7B, 494,032,768 for Qwen2.5-0.5B).
TEST(HfFamilies, EachFamilysConfigIsReadAsTransformersReadsIt) {
  TempDir dir;
  HfModel smol = read_config_text(dir, kSmolLm2);
  EXPECT_EQ(smol.model.arch, Arch::llama);
  EXPECT_EQ(smol.vocab, 49152);
  EXPECT_EQ(smol.model.d_model, 576);
  EXPECT_EQ(smol.model.kv_head_count(), 3);
  EXPECT_EQ(smol.model.head_dim(), 64);
  EXPECT_EQ(smol.model.explicit_head_dim, 0);
  EXPECT_EQ(smol.model.rope_theta, 100000);
  EXPECT_EQ(smol.model.norm_eps, 1e-5);
  EXPECT_TRUE(smol.model.tied_embeddings);
  EXPECT_FALSE(smol.model.rope_scaling.llama3);
  EXPECT_EQ(smol.model.max_positions, 8192);
  EXPECT_EQ(smol.model.parameter_count(smol.vocab), 134515008);

  HfModel llama = read_config_text(dir, kLlama32);
  EXPECT_TRUE(llama.model.rope_scaling.llama3);
  EXPECT_EQ(llama.model.rope_scaling.factor, 32);
  EXPECT_EQ(llama.model.rope_scaling.low_freq_factor, 1);
  EXPECT_EQ(llama.model.rope_scaling.high_freq_factor, 4);
  EXPECT_EQ(llama.model.rope_scaling.original_context, 8192);
  EXPECT_EQ(llama.model.rope_theta, 500000);
  EXPECT_EQ(llama.model.parameter_count(llama.vocab), 1235814400);

  HfModel mistral = read_config_text(dir, kMistral7b);
  EXPECT_EQ(mistral.model.arch, Arch::mistral);
  EXPECT_EQ(mistral.model.sliding_window, 4096);
  EXPECT_FALSE(mistral.model.tied_embeddings);
  EXPECT_EQ(mistral.model.parameter_count(mistral.vocab), 7241732096);

  HfModel qwen = read_config_text(dir, kQwen25);
  EXPECT_EQ(qwen.model.arch, Arch::qwen2);
  EXPECT_TRUE(qwen.model.qkv_bias());
  EXPECT_EQ(qwen.model.sliding_window, 0);  // use_sliding_window: false
  EXPECT_EQ(qwen.model.head_dim(), 64);
  EXPECT_EQ(qwen.model.parameter_count(qwen.vocab), 494032768);

  // transformers 5's own files: rope_parameters instead of rope_theta and rope_scaling.
  auto v5 = nlohmann::json::parse(kLlama32);
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 250000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  HfModel again = read_config_text(dir, v5.dump());
  EXPECT_EQ(again.model.rope_theta, 250000);
  EXPECT_EQ(again.model.rope_scaling.factor, 32);
  // A head_dim that is not hidden / heads (Mistral NeMo's, 5120 / 32 = 160 against 128).
  auto nemo = nlohmann::json::parse(kMistral7b);
  nemo["hidden_size"] = 5120;
  nemo["head_dim"] = 128;
  nemo["sliding_window"] = nullptr;
  HfModel wide = read_config_text(dir, nemo.dump());
  EXPECT_EQ(wide.model.explicit_head_dim, 128);
  EXPECT_EQ(wide.model.sliding_window, 0);
}

TEST(HfFamilies, WhatLocoDoesNotComputeIsRefusedNamingTheFieldAndValue) {
  using J = nlohmann::json;
  const std::vector<std::tuple<const char*, std::function<void(J&)>, std::string>> cases = {
      {kSmolLm2, [](J& c) { c["model_type"] = "gemma2"; }, "config.json: model_type: gemma2: "},
      {kSmolLm2, [](J& c) { c.erase("model_type"); }, "model_type missing"},
      {kLlama32, [](J& c) { c["rope_scaling"]["rope_type"] = "yarn"; },
       "rope_scaling.rope_type: yarn: "},
      {kLlama32,
       [](J& c) {
         c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "rope_scaling.type: dynamic: "},
      {kLlama32,
       [](J& c) {
         c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "rope_scaling.type: linear: "},
      {kLlama32, [](J& c) { c["rope_scaling"].erase("factor"); }, "rope_scaling.factor missing"},
      {kLlama32, [](J& c) { c["rope_scaling"] = "llama3"; },
       "rope_scaling: llama3: expected a mapping"},
      {kSmolLm2, [](J& c) { c["hidden_act"] = "gelu"; }, "hidden_act: gelu: "},
      {kSmolLm2, [](J& c) { c["attention_bias"] = true; }, "attention_bias: true: "},
      {kSmolLm2, [](J& c) { c["mlp_bias"] = true; }, "mlp_bias: true: "},
      {kSmolLm2, [](J& c) { c["rope_interleaved"] = true; }, "rope_interleaved: true: "},
      {kSmolLm2, [](J& c) { c["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor: 0.5: "},
      {kSmolLm2, [](J& c) { c["attention_dropout"] = 0.1; }, "attention_dropout: 0.1: "},
      {kQwen25, [](J& c) { c["use_sliding_window"] = true; }, "use_sliding_window: true: "},
      {kQwen25,
       [](J& c) {
         c["layer_types"] = {"full_attention", "sliding_attention"};
       },
       "layer_types[1]: sliding_attention: "},
      {kSmolLm2, [](J& c) { c["hidden_size"] = 1e12; },
       "hidden_size: 1000000000000.0: expected an integer in"},
      {kSmolLm2, [](J& c) { c["num_hidden_layers"] = "30"; },
       "num_hidden_layers: 30: expected an integer"},
      {kSmolLm2, [](J& c) { c["vocab_size"] = -1; }, "vocab_size: -1: expected an integer in"},
      {kSmolLm2, [](J& c) { c.erase("intermediate_size"); }, "intermediate_size missing"},
      {kSmolLm2, [](J& c) { c["rms_norm_eps"] = "tiny"; },
       "rms_norm_eps: tiny: expected a finite number"},
      {kMistral7b, [](J& c) { c["sliding_window"] = 1 << 30; }, "sliding_window: 1073741824: "},
  };
  for (const auto& [text, edit, want] : cases) {
    const std::string e = config_error(text, edit);
    EXPECT_NE(e.find(want), std::string::npos) << "want '" << want << "', got '" << e << "'";
  }
  TempDir dir;
  write_text(dir / "config.json", "[1, 2]");
  EXPECT_THROW(read_hf_config((dir / "").string()), std::runtime_error);
  write_text(dir / "config.json", std::string(kMaxJobFileBytes + 1, ' '));
  try {
    read_hf_config((dir / "").string());
    ADD_FAILURE() << "an oversize config.json was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the 1048576 allowed"), std::string::npos)
        << e.what();
  }
}

// export_hf then import_hf is bit-exact for the rotary families too, and config.json says what
// transformers needs to build each.
TEST(HfFamilies, ExportThenImportIsBitExactAndConfigJsonIsTheFamilys) {
  auto c = JobConfig::from_yaml(kQwenJob);
  EXPECT_EQ(c.model.parameter_count(256), parameter_layout(c.model, 256).back().offset +
                                              parameter_layout(c.model, 256).back().numel);
  for (Arch a : {Arch::llama, Arch::mistral, Arch::qwen2}) {
    SCOPED_TRACE(to_string(a));
    c.model.arch = a;
    c.model.sliding_window = a == Arch::mistral ? 6 : 0;
    c.model.rope_scaling.llama3 = a == Arch::llama;
    c.model.max_positions = 64;
    c.validate();
    TempDir dir;
    const auto theta = random_theta(c.model, 256, 11);
    const auto out = (dir / "hf").string();
    export_hf(c.model, 256, theta.data(), theta.size(), out, StDtype::f32, false);
    EXPECT_EQ(import_hf(out, c.model, 256), theta);
    std::ifstream in(dir / "hf" / "config.json");
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["model_type"], to_string(a));
    EXPECT_EQ(j["head_dim"], 12);
    EXPECT_EQ(j["max_position_embeddings"], 64);
    const HfModel back = read_hf_config(out);
    EXPECT_EQ(model_difference(back.model,
                               [&] {
                                 ModelConfig m = c.model;
                                 m.context = 64;  // the folder's positions
                                 return m;
                               }()),
              "");
    const auto st = read_safetensors((dir / "hf" / "model.safetensors").string());
    EXPECT_EQ(st.count("model.layers.1.self_attn.k_proj.bias"), a == Arch::qwen2 ? 1u : 0u);
    if (a == Arch::qwen2) {
      EXPECT_EQ(st.at("model.layers.1.self_attn.k_proj.bias").shape,
                (std::vector<std::int64_t>{24}));
      EXPECT_EQ(j["use_sliding_window"], false);
    }
    if (a == Arch::mistral) {
      EXPECT_EQ(j["sliding_window"], 6);
    }
    if (a == Arch::llama) {
      EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
    }
  }
}

TEST(HfFamilies, ShardsAreReadWithTheirIndexAndHostileIndexesRefused) {
  const auto c = JobConfig::from_yaml(kQwenJob);
  TempDir dir;
  const fs::path out = dir / "hf";
  const auto theta = sharded_folder(out, c.model);
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  EXPECT_EQ(import_hf(out.string(), c.model, 256), theta);
  EXPECT_NO_THROW(check_hf_folder(out.string(), c.model, 256));

  const fs::path index = out / "model.safetensors.index.json";
  const auto original = [&] {
    std::ifstream in(index);
    return nlohmann::json::parse(in);
  }();
  const auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = original;
    edit(j);
    write_text(index, j.dump());
    return import_error(out.string(), c.model, 256);
  };
  const std::string some = original["weight_map"].begin().key();
  EXPECT_NE(error_with([&](auto& j) {
              j["weight_map"][some] = "../model-00001-of-00003.safetensors";
            }).find("which is not a *.safetensors file name inside the folder"),
            std::string::npos);
  EXPECT_NE(error_with([&](auto& j) {
              j["weight_map"][some] = "/etc/model.safetensors";
            }).find("not a *.safetensors file name inside the folder"),
            std::string::npos);
  EXPECT_NE(error_with([&](auto& j) { j["weight_map"][some] = ".."; }).find("inside the folder"),
            std::string::npos);
  EXPECT_NE(
      error_with([&](auto& j) { j["weight_map"][some] = "config.json"; }).find("inside the folder"),
      std::string::npos);
  EXPECT_NE(error_with([&](auto& j) { j["weight_map"][some] = 7; }).find("no file name"),
            std::string::npos);
  EXPECT_NE(error_with([&](auto& j) { j.erase("weight_map"); }).find("no weight_map"),
            std::string::npos);
  // A shard that is not there; a tensor the index puts in a file that lacks it; a tensor in a
  // file that the index does not put there.
  std::string e =
      error_with([&](auto& j) { j["weight_map"][some] = "model-00009-of-00009.safetensors"; });
  EXPECT_NE(e.find("no model-00009-of-00009.safetensors in that folder"), std::string::npos) << e;
  e = error_with([&](auto& j) {
    j["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors";
  });
  EXPECT_NE(e.find("no tensor model.layers.9.mlp.up_proj.weight, which "
                   "model.safetensors.index.json puts in this file"),
            std::string::npos)
      << e;
  e = error_with([&](auto& j) { j["weight_map"].erase(some); });
  EXPECT_NE(e.find("tensor " + some + ", which model.safetensors.index.json does not put"),
            std::string::npos)
      << e;
  // An index of more than 16 MiB is refused before it is read (a sparse file: no disk used).
  write_text(index, "{}");
  fs::resize_file(index, kMaxHfIndexBytes + 1);
  e = import_error(out.string(), c.model, 256);
  EXPECT_NE(e.find("more than the 16777216 allowed"), std::string::npos) << e;
  // A shard that is a symbolic link could leave the node's data root.
  write_text(index, original.dump());
  const fs::path shard = out / "model-00002-of-00003.safetensors";
  fs::rename(shard, dir / "elsewhere.safetensors");
  fs::create_symlink(dir / "elsewhere.safetensors", shard);
  e = import_error(out.string(), c.model, 256);
  EXPECT_NE(e.find("is a symbolic link"), std::string::npos) << e;
  fs::remove(shard);
  fs::rename(dir / "elsewhere.safetensors", shard);
  EXPECT_EQ(import_hf(out.string(), c.model, 256), theta);
  // Neither a model.safetensors nor an index.
  fs::remove(index);
  e = import_error(out.string(), c.model, 256);
  EXPECT_NE(e.find("no model.safetensors and no model.safetensors.index.json"), std::string::npos)
      << e;
}

// `model: {hf: DIR}` parses and validates without the folder (a client without it); resolving
// fills every field from config.json, keeps the job's context, and refuses a field of the job
// that disagrees, naming both.
TEST(HfFamilies, AJobTakesItsModelFromTheFolderOnce) {
  TempDir dir;
  write_text(dir / "config.json", kSmolLm2);
  const std::string folder = (dir / "").string();
  const std::string yaml = "name: t\nmodel: {hf: " + folder +
                           ", context: 2048}\ndata: {dir: /tmp/x, format: tokens}\n"
                           "sync: {mode: streaming, fragments: 6, overlap_steps: 1}\n"
                           "inner: {steps: 12}\nrounds: 1\n";
  // Unresolved: the rules that need the shape (model.vocab with tokens, fragments <= layers)
  // wait for the folder.
  JobConfig c = JobConfig::from_yaml(yaml);
  EXPECT_EQ(c.model.hf, folder);
  EXPECT_EQ(c.model_given, (std::vector<std::string>{"hf", "context"}));
  resolve_hf_model(c, folder);
  EXPECT_TRUE(c.model.hf.empty());
  EXPECT_EQ(c.init, "hf:" + folder);
  EXPECT_EQ(c.model.arch, Arch::llama);
  EXPECT_EQ(c.model.context, 2048);
  EXPECT_EQ(c.model.max_positions, 8192);
  EXPECT_EQ(c.model.vocab, 49152);
  EXPECT_EQ(c.model.layers, 30);
  EXPECT_EQ(c.parameter_estimate(), 134515008);
  // What travels to the workers names every field and reads back as the same model.
  const JobConfig sent = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(model_difference(sent.model, c.model), "");
  EXPECT_EQ(sent.init, c.init);
  EXPECT_EQ(c.to_yaml().find("hf: "), std::string::npos);
  // config.json agrees with what travelled; the weights are what this folder lacks.
  try {
    check_hf_folder(folder, sent.model, sent.vocab_size());
    ADD_FAILURE() << "a folder without weights passed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("no model.safetensors and no model.safetensors.index.json"),
        std::string::npos)
        << e.what();
  }
  // Without a context, the folder's positions.
  c = JobConfig::from_yaml(replace(yaml, ", context: 2048", ""));
  resolve_hf_model(c, folder);
  EXPECT_EQ(c.model.context, 8192);
  // Fields the job file gives must agree; the same values (width for d_model) pass.
  const auto resolve_error = [&](const std::string& from, const std::string& to) {
    JobConfig j = JobConfig::from_yaml(replace(yaml, from, to));
    try {
      resolve_hf_model(j, folder);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto with = [&](const std::string& fields) {
    return resolve_error(", context: 2048", ", context: 2048" + fields);
  };
  EXPECT_EQ(with(", width: 576, kv_heads: 3, tied_embeddings: true, arch: llama, "
                 "norm_eps: 0.00001, mlp_hidden: 1536"),
            "");
  EXPECT_NE(with(", layers: 12")
                .find("config.json: num_hidden_layers is 30, but the job's model.layers is 12 "
                      "(leave model.layers out of the job file to take the folder's)"),
            std::string::npos)
      << with(", layers: 12");
  EXPECT_NE(with(", arch: qwen2").find("model_type is llama, but the job's model.arch is qwen2"),
            std::string::npos);
  EXPECT_NE(with(", vocab: 50000").find("vocab_size is 49152, but the job's model.vocab is 50000"),
            std::string::npos);
  EXPECT_NE(with(", rope_theta: 10000")
                .find("rope_theta is 100000, but the job's model.rope_theta is 10000"),
            std::string::npos);
  EXPECT_NE(resolve_error("context: 2048", "context: 9000")
                .find("max_position_embeddings is 8192, but the job's model.context is 9000"),
            std::string::npos);
  // The folder's model must also fit the job: 6 fragments of 30 layers do, 31 do not.
  const std::string e =
      resolve_error("{mode: streaming, fragments: 6, overlap_steps: 1}\ninner: {steps: 12}",
                    "{mode: streaming, fragments: 31, overlap_steps: 1}\ninner: {steps: 31}");
  EXPECT_NE(e.find("config.json gives a model this job cannot run: sync.fragments: must be in "
                   "[1, model.layers = 30]"),
            std::string::npos)
      << e;
  // A model without the folder is refused where it would be built.
  JobConfig unresolved = JobConfig::from_yaml(yaml);
  EXPECT_THROW(parameter_layout(unresolved.model, 256), std::logic_error);
}

// The new fields parse, validate, round-trip, and default to what they were: the examples'
// job files write none of them.
TEST(HfFamilies, NewModelFieldsRoundTripAndDefaultToTodays) {
  const std::string yaml = R"(
name: t
model: {arch: mistral, layers: 2, width: 32, heads: 4, kv_heads: 2, head_dim: 16, context: 16, sliding_window: 8, max_positions: 4096,
        rope_scaling: {rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}}
data: {dir: /tmp/x}
rounds: 1
)";
  const auto c = JobConfig::from_yaml(yaml);
  EXPECT_EQ(c.model.arch, Arch::mistral);
  EXPECT_EQ(c.model.head_dim(), 16);
  EXPECT_EQ(c.model.sliding_window, 8);
  EXPECT_TRUE(c.model.rope_scaling.llama3);
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.to_yaml(), c.to_yaml());
  EXPECT_EQ(model_difference(again.model, c.model), "");
  auto other = c.model;
  other.rope_scaling.factor = 4;
  EXPECT_NE(model_difference(other, c.model).find("model.rope_scaling"), std::string::npos);
  other = c.model;
  other.sliding_window = 0;
  EXPECT_EQ(model_difference(other, c.model), "model.sliding_window (unset against 8)");

  EXPECT_NE(error_of(replace(yaml, "rope_type: llama3", "rope_type: yarn"))
                .find("model.rope_scaling.rope_type: expected llama3"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(yaml, "factor: 8", "factor: 0.5")),
            "model.rope_scaling.factor: must be >= 1, got 0.5");
  EXPECT_NE(error_of(replace(yaml, "high_freq_factor: 4", "high_freq_factor: 1"))
                .find("model.rope_scaling.high_freq_factor: must be > low_freq_factor"),
            std::string::npos);
  EXPECT_NE(error_of(replace(yaml, "factor: 8,", "factor: 8, beta: 1,"))
                .find("model.rope_scaling.beta: unknown field"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(yaml, "head_dim: 16", "head_dim: 15")),
            "model.head_dim: must be even for rotary positions, got 15");
  EXPECT_NE(error_of(replace(yaml, "arch: mistral", "arch: llama"))
                .find("model.sliding_window: must be 0 except for arch mistral"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(yaml, "max_positions: 4096", "max_positions: 8")),
            "model.max_positions: must be 0 or at least model.context (16), got 8");
  const std::string gpt2 = "name: t\nmodel: {head_dim: 8}\ndata: {dir: /tmp/x}\nrounds: 1\n";
  EXPECT_EQ(error_of(gpt2),
            "model.head_dim: must be unset for arch gpt2 (a rotary arch's field), got 8");
  for (const char* example : {"tiny-lm.yaml", "small-lm.yaml", "gpt2-small.yaml", "llama-tiny.yaml",
                              "llama-150m.yaml", "tokens-lm.yaml"}) {
    const auto e = JobConfig::from_yaml_file(std::string(LOCO_SOURCE_DIR "/examples/") + example);
    const std::string text = e.to_yaml();
    for (const char* field : {"head_dim", "rope_scaling", "sliding_window", "max_positions", "hf:"})
      EXPECT_EQ(text.find(field), std::string::npos) << example << " writes " << field;
  }
}

// examples/smollm2-continue.yaml parses without its folder (CI has no download), and with
// SmolLM2-135M's config.json it is the model the docs describe and needs the memory they give
// (docs/guide/memory.md, "Continuing a pretrained model": computed, not measured).
TEST(HfFamilies, TheSmolLm2ExampleNeedsTheMemoryItsDocsSay) {
  JobConfig c = JobConfig::from_yaml_file(LOCO_SOURCE_DIR "/examples/smollm2-continue.yaml");
  EXPECT_EQ(c.model.hf, "data/smollm2-135m");
  TempDir dir;
  write_text(dir / "config.json", kSmolLm2);
  resolve_hf_model(c, (dir / "").string());
  EXPECT_EQ(c.parameter_estimate(), 134515008);
  EXPECT_EQ(c.model.context, 2048);
  const MemoryEstimate e = worker_memory(c, true);
  for (const auto& t : e.device) std::printf("device %-40s %14.0f\n", t.what.c_str(), t.bytes);
  for (const auto& t : e.host) std::printf("host   %-40s %14.0f\n", t.what.c_str(), t.bytes);
  std::printf("device %s, host %s\n", gib(e.device_bytes()).c_str(), gib(e.host_bytes()).c_str());
  EXPECT_EQ(gib(e.device_bytes()), "8.8 GiB");
  EXPECT_EQ(gib(e.host_bytes()), "6.6 GiB");
}
