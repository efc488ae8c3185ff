// Torch-free: model.arch and its fields in the job file, the presets' sizes, the safetensors
// reader and writer, and the Hugging Face folder's export and import (diloco/hf_format.hpp).
// The model itself against this layout: arch_test.cpp; against transformers: hf_export_test.py.
#include "diloco/hf_format.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "diloco/config.hpp"
#include "diloco/data.hpp"
#include "diloco/safetensors.hpp"
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
// sizes their comments and docs/design.md give.
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
  EXPECT_NE(error().find("header is not JSON"), std::string::npos) << error();

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
