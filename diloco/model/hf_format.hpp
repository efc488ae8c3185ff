// Hugging Face transformers' format of a model: a folder of config.json and model.safetensors
// (or shards model-0000I-of-0000N.safetensors with model.safetensors.index.json) that
// `AutoModelForCausalLM.from_pretrained(DIR)` loads. The families loco reads and writes:
// model_type gpt2, llama (Llama 2 and 3, SmolLM, SmolLM2), mistral and qwen2 (Qwen2, Qwen2.5),
// the last three one skeleton (ModelConfig::rotary()). `loco export CKPT --format hf --out DIR`
// writes one from θ; a job file's `model: {hf: DIR}` takes its model from one (resolve_hf_model),
// and `init: hf:DIR` (or loco-train's `--init hf:DIR`) reads one into θ. No LibTorch here: θ is
// the flat fp32 parameter vector, in the order GptImpl registers its parameters
// (parameter_layout).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/model/safetensors.hpp"

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

// Bounds on a folder's files besides the safetensors reader's own: config.json (kMaxJobFileBytes)
// and the shards' index, whose weight_map names at most kMaxHfShards files.
inline constexpr std::uintmax_t kMaxHfIndexBytes = std::uintmax_t(16) << 20;
inline constexpr std::size_t kMaxHfShards = 4096;

// A folder's config.json as loco's model, and its vocabulary's size. `model.context` is the
// positions the model was made for (gpt2's n_positions; max_position_embeddings, also kept as
// model.max_positions, for the others). Whatever loco would compute otherwise than transformers
// is refused with a ConfigError naming the field and its value: another model_type
// ("model_type: gemma2"), a rope scaling other than llama3 ("rope_scaling.rope_type: yarn"),
// hidden_act other than silu, attention_bias or mlp_bias in a llama or mistral, Qwen2's
// use_sliding_window, a partial or interleaved rotary embedding, attention dropout.
struct HfModel {
  ModelConfig model;
  int vocab = 0;
};
HfModel read_hf_config(const std::string& dir);

// Fills `job`'s model from the folder `dir` (model.hf as found on this node): every field from
// its config.json (the vocabulary from vocab_size; model.context from the job file if it gives
// one, else max_position_embeddings), except activation_checkpointing. A field the job file gave
// (JobConfig::model_given) must agree with the folder, else a ConfigError names both
// ("num_hidden_layers is 30, but the job's model.layers is 12"). Then `init` becomes
// "hf:" + model.hf where the job gave none, model.hf is cleared, and the job is validated.
void resolve_hf_model(JobConfig& job, const std::string& dir);

// Writes `dir` (config.json, model.safetensors) from θ (`n` values) of a model of `model` and
// `vocab`, as `dtype` (f32 or bf16): config.json of the model's own model_type, with what
// transformers needs to build it (biases, head_dim, rope_scaling, sliding_window,
// max_position_embeddings as read). The folder is written beside `dir` and renamed into place;
// an existing non-empty `dir` is refused unless `force` (then replaced). GPT-2's Conv1D weights
// are stored transposed ([in, out]); loco's fused qkv (and its bias) and gate/up are split into
// HF's q/k/v_proj and gate/up_proj. Throws std::runtime_error naming the problem.
void export_hf(const ModelConfig& model, int vocab, const float* theta, std::size_t n,
               const std::string& dir, StDtype dtype, bool force);

// Reads `dir` into θ for a model of `model` and `vocab`. config.json must describe that model
// (else a ConfigError naming the config.json field and the job's field that differ), and the
// weights (model.safetensors, or the shards the index names: each file plainly inside `dir`,
// no '/', no "..", holding exactly the tensors the index gives it) must hold exactly its
// tensors, of exactly their shapes (F32, BF16 or F16): a missing, misshapen or unexpected tensor
// is an error naming it. No file of the folder may be a symbolic link (it could leave the node's
// data root). GPT-2 files may name their tensors without the "transformer." prefix and carry
// the causal-mask buffers "h.N.attn.bias" and "h.N.attn.masked_bias" of older transformers
// versions (skipped: they are not parameters); a tied model's files may repeat the embeddings
// as lm_head.weight (checked equal). The shards are read one at a time.
std::vector<float> import_hf(const std::string& dir, const ModelConfig& model, int vocab);

// import_hf's check of config.json and of the weight files' names (the index, and that every
// file is there), without reading the weights: what a cluster job's submission checks before
// any worker reads them.
void check_hf_folder(const std::string& dir, const ModelConfig& model, int vocab);

// "hf:DIR" -> DIR; "" for anything else (a loco checkpoint's path).
std::string hf_init_dir(const std::string& init);

}  // namespace loco::diloco
