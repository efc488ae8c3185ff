// Hugging Face transformers' format of a model: a folder of config.json and
// model.safetensors that `GPT2LMHeadModel` / `LlamaForCausalLM` `.from_pretrained(DIR)` loads.
// `loco export CKPT --format hf --out DIR` writes one from θ; `--init hf:DIR` (loco-train) and
// a job file's `init: hf:DIR` read one into θ. No LibTorch here: θ is the flat fp32 parameter
// vector, in the order GptImpl registers its parameters (parameter_layout).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diloco/config.hpp"
#include "diloco/safetensors.hpp"

namespace loco::diloco {

// One parameter of the flat vector: its name as GptImpl::named_parameters() gives it, its shape
// and where it sits.
struct ParamSpec {
  std::string name;  // "blocks.3.attn.qkv.weight"
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  // into θ
  std::int64_t numel = 0;
};

// The flat vector's layout for `model` with a vocabulary of `vocab`, without building the model
// (tests/diloco/train_test.cpp checks it against GptImpl's parameters, name by name).
std::vector<ParamSpec> parameter_layout(const ModelConfig& model, int vocab);

// Writes `dir` (config.json, model.safetensors) from θ (`n` values) of a model of `model` and
// `vocab`, as `dtype` (f32 or bf16). The folder is written beside `dir` and renamed into place;
// an existing non-empty `dir` is refused unless `force` (then replaced). GPT-2's Conv1D weights
// are stored transposed ([in, out]); loco's fused qkv (llama) and gate/up are split into HF's
// q/k/v_proj and gate/up_proj. Throws std::runtime_error naming the problem.
void export_hf(const ModelConfig& model, int vocab, const float* theta, std::size_t n,
               const std::string& dir, StDtype dtype, bool force);

// Reads `dir` into θ for a model of `model` and `vocab`. config.json must describe that model
// (else a ConfigError naming the config.json field and the job's field that differ), and
// model.safetensors must hold exactly its tensors, of exactly their shapes (F32, BF16 or F16):
// a missing, misshapen or unexpected tensor is an error naming it. GPT-2 files may name their
// tensors without the "transformer." prefix and carry the causal-mask buffers "h.N.attn.bias"
// and "h.N.attn.masked_bias" of older transformers versions (skipped: they are not
// parameters); a tied model's file may repeat the embeddings as lm_head.weight (checked equal).
std::vector<float> import_hf(const std::string& dir, const ModelConfig& model, int vocab);

// import_hf's check of config.json alone, and that model.safetensors is there: what a cluster
// job's submission checks before any worker reads the weights.
void check_hf_folder(const std::string& dir, const ModelConfig& model, int vocab);

// "hf:DIR" -> DIR; "" for anything else (a loco checkpoint's path).
std::string hf_init_dir(const std::string& init);

}  // namespace loco::diloco
