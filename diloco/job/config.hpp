// JobConfig: the job file (YAML) that describes one DiLoCo training job.
// The same file drives the simulator (`loco-train train --simulate K`) and a
// distributed run (`loco submit`). No LibTorch here.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../runtime/collective/compression.hpp"

namespace loco::diloco {

// byte: one token per byte. bpe: a sentencepiece BPE trained on the corpus (data.bpe_vocab).
// json: a Hugging Face tokenizer.json (byte-level BPE, Llama 3, SentencePiece-style BPE of
// Llama 2 and Mistral: tokenizer_json.hpp) at data.tokenizer_json.
enum class TokenizerKind { byte, bpe, json };

// text: DIR/corpus/*.txt, tokenized on first use. tokens: DIR/*.bin, pre-tokenized files
// (nanoGPT's raw ids, llm.c's headed files; scripts/prepare-data writes them).
enum class DataFormat { text, tokens };
// Width of the ids in a token file without an llm.c header.
enum class TokenDtype { uint16, uint32 };

// Where a worker trains. auto: CUDA when the runtime gave the worker a GPU (its
// node offers `gpu` resources) and this process has CUDA; otherwise the CPU.
enum class DeviceKind { auto_, cpu, cuda };
const char* to_string(DeviceKind d);

// Arithmetic of the inner steps' forward and backward. bf16: autocast to bfloat16 (as
// torch.autocast), with fp32 master weights, gradients and AdamW state; the
// pseudo-gradient and the all-reduce are unchanged (fp32, or the job's compression).
enum class Precision { fp32, bf16 };

// Thrown for a job file that does not parse or does not validate. what()
// names the field, the rule and the value: "inner.lr: must be > 0, got -1".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bounds on every size in a job file, generous for real use and small enough that no value
// makes a worker allocate without limit or overflow an int (docs/guide/jobs.md, the job file).
inline constexpr std::size_t kMaxJobFileBytes = std::size_t(1) << 20;
inline constexpr int kMaxJobFileNesting = 32;  // [ ] and { } inside each other
inline constexpr std::size_t kMaxJobNameBytes = 256;
inline constexpr std::size_t kMaxPathBytes = 4096;
inline constexpr int kMaxThreads = 1024;
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxWidth = 65536;
inline constexpr int kMaxHeads = 1024;
inline constexpr int kMaxContext = 1 << 20;
inline constexpr int kMaxMlpRatio = 64;
inline constexpr double kMaxParameters = 2e10;        // 20 B: 320 GB with AdamW state
inline constexpr double kMaxActivationValues = 1e12;  // micro-batch x context x width x layers
inline constexpr int kMaxShards = 1 << 20;
// model.vocab: ids are uint32 in token files; an embedding of 2^21 rows is beyond any
// vocabulary in use (llama-3: 128,256).
inline constexpr int kMaxVocab = 1 << 21;
inline constexpr int kMaxWorkers = 4096;
inline constexpr int kMaxRestarts = 1000;
inline constexpr double kMaxWaitS = 7 * 24 * 3600.0;
inline constexpr int kMaxSteps = 1 << 24;  // inner.steps, inner.warmup
inline constexpr int kMaxBatchSize = 1 << 16;
inline constexpr int kMaxRounds = 1 << 24;  // rounds, checkpoint.every, eval.every
inline constexpr std::int64_t kMaxTokenBudget = std::int64_t(1) << 50;
inline constexpr int kMaxEvalBatches = 1 << 16;

// The decoder's block type (docs/guide/models.md, "The decoder").
//   gpt2:    learned positions, LayerNorm with biases, GELU (tanh) MLP, biases everywhere.
//   llama:   rotary positions (RoPE, optionally Llama 3's scaling), RMSNorm, SwiGLU MLP, no
//            biases, optional grouped-query attention (kv_heads < heads).
//   mistral: llama's blocks, with an optional sliding window of attention (sliding_window).
//   qwen2:   llama's blocks with biases on the q, k and v projections (Qwen2, Qwen2.5).
// The last three share one skeleton (rotary()); they differ in the Hugging Face model_type a
// folder is read from and exported as (diloco/model/hf_format.hpp), and in those details.
enum class Arch { gpt2, llama, mistral, qwen2 };
const char* to_string(Arch a);

// Llama 3's rope scaling (config.json's rope_scaling with rope_type llama3): the inverse
// frequencies of wavelengths above original_context / low_freq_factor divided by `factor`,
// those below original_context / high_freq_factor kept, those between interpolated.
struct RopeScaling {
  bool llama3 = false;  // off: the plain rotary embedding
  double factor = 8;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int original_context = 8192;  // original_max_position_embeddings
};

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int layers = 4;
  int d_model = 128;  // YAML: `width` or `d_model`
  int heads = 4;
  int context = 128;  // tokens per sequence
  // 0: taken from the tokenizer (256 for byte, data.bpe_vocab for bpe). Required with
  // data.format: tokens and with a tokenizer.json: every node must build the same model,
  // so the size is written in the job, not read from a file on each node.
  int vocab = 0;
  bool tied_embeddings = true;
  int mlp_ratio = 4;  // gpt2: MLP width mlp_ratio × d_model (unless mlp_hidden)
  // The MLP's hidden width; 0: gpt2 mlp_ratio × d_model, llama Llama's rule, 8/3 × d_model
  // rounded up to a multiple of 256.
  int mlp_hidden = 0;
  int kv_heads = 0;           // rotary archs: key/value heads, a divisor of heads; 0: heads
  double rope_theta = 10000;  // rotary archs: the RoPE base
  double norm_eps = 1e-5;     // LayerNorm (gpt2) or RMSNorm (llama) epsilon
  // Rotary archs: the width of an attention head (YAML `head_dim`); 0: d_model / heads.
  // Mistral's and Qwen3-style configs may give one that is not.
  int explicit_head_dim = 0;
  RopeScaling rope_scaling;  // rotary archs
  // mistral: a token attends to itself and the sliding_window − 1 tokens before it
  // (transformers' sliding-window causal mask); 0: to every token before it.
  int sliding_window = 0;
  // Rotary archs: the max_position_embeddings an exported config.json says (a pretrained
  // model's, kept through training); 0: context.
  int max_positions = 0;
  // A Hugging Face folder whose config.json gives the model (YAML `model.hf`; relative to the
  // node's data root on a cluster). Resolved once where the job is loaded (loco-train) or
  // submitted (the OuterAggregator) by resolve_hf_model (hf_format.hpp): the fields are filled
  // from config.json, `init` becomes hf:DIR, and `hf` is cleared, so the job that travels to
  // the workers and into checkpoints names every field. Non-empty: not resolved yet.
  std::string hf;
  // Recompute each block in the backward pass instead of keeping its activations.
  bool activation_checkpointing = false;
  // A model of the user's own (docs/guide/models.md, "The model interface"): the file of a
  // TorchScript module (torch.jit.save) whose forward(tokens, targets) returns the loss; "" for
  // the built-in decoder. With it only `context` and `vocab` of the fields above apply (the
  // others must stay at their defaults). A relative path is taken from the data root on a
  // cluster, from the working directory in the simulator.
  std::string torchscript;
  // What the file held when the job was described (torchscript_model.hpp,
  // describe_torchscript): XXH3-64 of its bytes, 16 hex digits, and its parameter count.
  // Written into the job at submission (by the aggregator, or the simulator) and into its
  // checkpoints; every worker and every resume checks its file against them. 0 / "": not yet.
  std::string torchscript_hash;
  std::int64_t torchscript_parameters = 0;
  // Not in the job file: where this process reads `torchscript` (a worker's or the
  // aggregator's path under its node's data root); "": `torchscript` as written.
  std::string torchscript_file;

  bool is_torchscript() const { return !torchscript.empty(); }

  bool rotary() const { return arch != Arch::gpt2; }
  bool qkv_bias() const { return arch == Arch::qwen2; }
  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : d_model / heads; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int mlp_width() const;
  // The exact number of parameters of the model with a vocabulary of `vocab` (a TorchScript
  // model's: torchscript_parameters, 0 until it is described).
  std::int64_t parameter_count(int vocab) const;
};

struct DataConfig {
  // YAML: `dir` or `path`. format text: holds corpus/*.txt (scripts/fetch-corpus); format
  // tokens: the token files *.bin (names containing "val": the validation split).
  std::string dir = "data";
  DataFormat format = DataFormat::text;
  TokenDtype dtype = TokenDtype::uint16;  // token files without a header (nanoGPT's *.bin)
  // YAML `tokenizer`: byte | bpe | a path ending in .json (then kind json, path below).
  TokenizerKind tokenizer = TokenizerKind::byte;
  std::string tokenizer_json;
  int bpe_vocab = 2048;        // size of the sentencepiece BPE vocabulary when tokenizer: bpe
  int shards = 64;             // the training split is cut into this many shards
  double val_fraction = 0.01;  // the last fraction of the tokens is the validation split
};

struct WorkersConfig {
  int count = 4;         // workers per round when all are present (`loco scale` changes it)
  int min = 1;           // a round never closes with fewer
  int max = 0;           // upper bound for `loco scale`; 0: no bound
  int max_restarts = 3;  // per worker actor: restarted on a live node when its node dies
  double wait_s = 300;   // below `min` workers, how long the job waits for joins before failing
  // With a GPU device: GPUs per worker (its actor asks for resources {gpu: gpus}), one
  // local rank per GPU, its inner steps data-parallel over them (NCCL).
  int gpus = 1;
  // On the CPU: local ranks per worker, threads over Gloo, data-parallel as GPUs are (0: 1).
  // For a host whose sockets or cores are better used as several ranks, and for testing the
  // ranks' logic where there is no GPU. On a GPU device the ranks are the GPUs.
  int local_ranks = 0;
  // Lets several workers hold one GPU (tests on a one-GPU host); off: one worker per GPU.
  bool share_gpu = false;
  // Stragglers: once `min` members have finished their inner steps, how long at most the
  // round waits for the others (the window adapts below it to how late members have been:
  // actors/round_decisions.hpp, grace_window). A member that misses it sits the round out
  // and catches up from the next one. 0: wait for every member, however late.
  double grace_max_s = 0;
};

// How long a round's inner phase is.
//   steps: H inner steps for every member (lockstep).
//   time:  every member runs inner steps until the round's budget of seconds is spent
//          (inner.round_seconds, or H × the members' median seconds per step of the last
//          round), so a slower worker does fewer steps; the pseudo-gradients are averaged
//          weighted by the tokens each member processed.
enum class InnerBudget { steps, time };

struct InnerConfig {
  int steps = 50;  // H: inner steps per round
  int batch_size =
      16;  // sequences per inner step (per worker), split into grad_accum micro-batches
  double lr = 1e-3;
  int warmup = 100;  // linear warmup steps, then cosine decay to lr * min_lr_ratio
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;  // AdamW, on tensors of 2+ dimensions only (not on norms and biases)
  double grad_clip = 1.0;     // max global gradient norm; 0 disables
  int grad_accum = 1;
  std::array<double, 2> betas = {0.9, 0.95};
  double eps = 1e-8;
  InnerBudget budget = InnerBudget::steps;
  double round_seconds = 0;  // with budget: time; 0: H × the median seconds per step
};

struct OuterConfig {
  double lr = 0.7;
  double momentum = 0.9;
  bool nesterov = true;
};

// compression: {kind: topk, ...}: SparseLoCo's sparse pseudo-gradients (arXiv 2508.15706;
// docs/decisions/0036-sparse-pseudo-gradients.md). Each worker keeps an error-feedback
// buffer e per fragment (blocking: one, all of θ): e ← β·e + Δ; it sends, per chunk of `chunk`
// entries, the `k` of largest |e|, each value as one of 2^bits levels (the levels' means sent)
// and its index packed; what it sent is subtracted from e. The members gather every member's
// bytes and each decodes them all, in member order: the same mean everywhere.
//   outer: sparseloco: the error feedback takes the outer momentum's place (the outer step is
//          θ ← θ − outer.lr · mean, momentum unused; SparseLoCo runs outer.lr 1.0, β 0.95);
//          nesterov: the job's outer SGD with Nesterov momentum, on the sparse mean.
//   mean: members: each entry of the mean is the members' sum over K (SparseLoCo's rule: an entry
//         one member sent arrives divided by K); senders: over the members that sent that entry
//         (Templar's "average the overlapping indices"), so an entry one member sent arrives
//         whole.
enum class OuterRule { sparseloco, nesterov };
enum class SparseMean { members, senders };
struct TopkConfig {
  bool on = false;  // compression.kind is topk; otherwise `compression` is a dense codec
  int chunk = 4096;
  int k = 64;
  int bits = 2;
  double error_feedback = 0.95;  // β
  OuterRule outer = OuterRule::sparseloco;
  // senders by default: the sparse mean's scale then does not shrink with K, so the job's
  // outer lr (tuned for dense DiLoCo) carries over (docs/results.md, "Where sparse is safe").
  SparseMean mean = SparseMean::senders;
};

// compression: auto (diloco/round/codec_plan.hpp; docs/decisions/0052): each round's codec
// chosen by the aggregator from the ladder fp32, bf16, int8, topk k = chunk/4, chunk/16,
// chunk/64 (topk's chunk, bits and error_feedback from TopkConfig; its outer rule is the job's
// own, nesterov, so that the outer state means the same under every codec): the least lossy
// whose exchange fits the window, measured each round.
struct AutoCodecConfig {
  bool on = false;
  double share = 0.03;  // blocking: the most of a round its exchange may take
  double margin = 0.7;  // a less lossy codec is taken when it fits in margin × the window ...
  int patience = 1;     // ... for this many rounds in a row
  bool sparse = true;   // the topk rungs may be chosen (needs inner.budget steps, one rank)
  std::string start = "fp32";  // the first round's codec (a rung's name: fp32, int8, topk:64)
  // A dense round after topk ones: keep (send Δ; the buffer waits for the next topk round) or
  // flush (send Δ plus what the buffer holds, emptied: topk's rule with every entry sent; its
  // stale mass in one step cost more loss: decision 0052).
  bool flush = false;
};

// How a round's pseudo-gradients are synchronized (docs/decisions/, 0013 to 0015: Streaming
// DiLoCo and the eager outer step).
//   blocking:  today's round: H inner steps, then the all-reduce of all of Δ, then the step.
//   streaming: Streaming DiLoCo: the parameters cut into `fragments` P (the transformer
//              blocks strided over depth, fragment 0 also the embeddings and final norm);
//              fragment p synchronizes after inner step (p + 1)·H/P of every round, its
//              average arrives `overlap_steps` τ inner steps later, and then its θ steps with
//              its own momentum and the local fragment becomes mix·local + (1 − mix)·global.
//   eager:     the all-reduce of round t runs under round t + 1's first `overlap_steps` τ
//              inner steps: each worker starts round t + 1 from a provisional outer step
//              with its own Δ in place of the average; when the average lands, θ steps with
//              it (the outer state stays the same on every worker) and the local parameters
//              move by what θ moved past the provisional start. τ = 0 is blocking.
enum class SyncMode { blocking, streaming, eager };
struct SyncConfig {
  SyncMode mode = SyncMode::blocking;
  int fragments = 1;      // P: divides inner.steps and is at most model.layers
  int overlap_steps = 0;  // τ in [0, inner.steps)
  double mix = 0;         // α in [0, 1]: how much of the local fragment survives its merge
};

struct CheckpointConfig {
  int every = 0;  // rounds between checkpoints; 0: only at the end
  std::string dir = "checkpoints";
  // The round checkpoints kept in the job's folder: the newest `keep` (with their workers'
  // inner states); older ones are deleted as new ones are written. 0: keep them all.
  // final.pt is always kept. Default 3, so that a job with `every: 1` does not fill a disk.
  int keep = 3;
  // The most a job's folder may hold, in GiB (its checkpoints, with their workers' inner
  // states, metrics.jsonl, job.yaml). A checkpoint that would take it past this, or past the
  // file system's free space less 1 GiB, is not written, saying so in the job's log; the job
  // goes on. 0: no quota (the free space is still checked).
  double quota_gib = 100;
  // Start the job from this checkpoint (a file under the node's checkpoint root, written by
  // any loco job): its outer state and round, and, where the files are beside it, each
  // worker's inner state, so the job continues as the one that wrote it would have. Needs
  // nothing of the cluster or Redis that ran that job. `loco submit --resume CKPT` sets it.
  std::string resume;
};

// The guard against broken or hostile pseudo-gradients (docs/decisions/0039-robust-averaging.md;
// diloco/round/guard.hpp has the rule). Before each average, the members exchange a summary of their
// Δ (finite or not, its norm, a sketch of `sketch` sampled values) and every member leaves out
// the same ones: Δ that is not finite, a norm above max_norm_ratio × the group's median, a
// direction opposed to the rest's (agreement below −opposed × the group's median agreement,
// less the sketch's noise). The others are averaged. A worker left out
// `evict_after` rounds in a row is removed from the job.
struct GuardConfig {
  bool on = true;
  double max_norm_ratio = 3.0;  // c
  double opposed = 0.25;        // 0: no direction rule
  int sketch = 2048;            // sampled values per fragment in the summary
  int evict_after = 3;          // 0: never removed
};

struct EvalConfig {
  int every = 50;   // inner steps between evaluations (rounded up to a round end for DiLoCo)
  int batches = 8;  // validation batches of inner.batch_size sequences
};

// The distributed all-reduce (collective::Options). The defaults hold from loopback down to
// 4 Mbit/s links (tests/netns: netns_collective_slow_links, netns_collective_4mbit); below
// that set a longer timeout and smaller chunks (tests/netns/slow_links.sh: 1 Mbit/s, 64 KiB,
// 15 s).
struct AllreduceConfig {
  int chunk_kb = 512;           // chunk of a member's part, in KiB of fp32
  double peer_timeout_s = 3.0;  // a member from which no byte arrives for this long is lost
  // sync.mode streaming and eager: how long a member whose connection is open may take to begin
  // a fragment's all-reduce after another did (it may be a fragment interval behind; a member
  // whose process is gone is still lost at once). Blocking rounds use peer_timeout_s.
  double entry_timeout_s = 60.0;
};

struct JobConfig {
  std::string name = "job";
  std::uint64_t seed = 0;
  int threads = 0;  // torch intra-op threads per process; 0: leave torch's default
  DeviceKind device = DeviceKind::cpu;
  Precision precision = Precision::fp32;
  ModelConfig model;
  DataConfig data;
  WorkersConfig workers;
  InnerConfig inner;
  OuterConfig outer;
  // Numerics applied to pseudo-gradients when they are averaged: the collective's codec
  // (fp32 while `topk` is on: no dense vector is sent then).
  collective::Codec compression = collective::Codec::fp32;
  TopkConfig topk;  // compression: {kind: topk, ...}; with auto: its topk rungs' settings
  AutoCodecConfig autocodec;  // compression: auto
  AllreduceConfig allreduce;
  SyncConfig sync;
  GuardConfig guard;
  int rounds = 0;                 // number of outer rounds; 0: derived from token_budget
  std::int64_t token_budget = 0;  // tokens per worker; used when rounds is 0
  // 0: none. Otherwise the round the aggregator plans once this many minutes have passed since
  // the job's submission is its last (a round already sent ahead runs too): the job ends as at
  // its rounds, evaluated and checkpointed, and succeeds. Its rounds stay the upper bound.
  double time_limit_minutes = 0;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  // Where θ starts: "" (the model's initialisation from `seed`), or "hf:DIR", a Hugging Face
  // folder (config.json and model.safetensors, diloco/model/hf_format.hpp) of exactly this job's
  // model: a pretrained start. On a cluster DIR is under each node's data root and every worker
  // reads it; a resumed job or a joining worker takes θ from its checkpoint or a live worker.
  std::string init;
  // The model fields the job file wrote, by their names in the table ("d_model" for `width`):
  // with model.hf those must agree with the folder's config.json (resolve_hf_model). Not
  // written by to_yaml.
  std::vector<std::string> model_given;

  // Parses and validates. With model.hf set (not resolved), the rules that need the model's
  // shape wait for resolve_hf_model, which validates again. Throws ConfigError naming the field on
  // any problem, including unknown keys (a typo must not silently fall back to a default).
  static JobConfig from_yaml(const std::string& text);
  static JobConfig from_yaml_file(const std::string& path);
  std::string to_yaml() const;

  // Throws ConfigError for the first invalid field.
  void validate() const;
  // Vocabulary size after the tokenizer is known.
  int vocab_size() const;
  // Rounds to run: `rounds`, or the token budget divided by the tokens of one round (with
  // ends_at_tokens(), the first estimate: the aggregator counts the tokens instead).
  int total_rounds() const;
  // inner.budget: time with token_budget and rounds 0: the job ends once its members together
  // trained token_budget × workers.count tokens, in as many rounds as that takes, the last
  // sized to what remains (actors/round_decisions.hpp, token_round).
  bool ends_at_tokens() const {
    return rounds == 0 && token_budget > 0 && inner.budget == InnerBudget::time;
  }
  std::int64_t token_target() const { return token_budget * std::max(1, workers.count); }
  // How many parameters the model has (model.parameter_count(vocab_size()); the bound in
  // validate()).
  double parameter_estimate() const;
  // Whether workers ask the runtime for GPUs (device cuda, or auto when
  // `cluster_has_gpus`: some live node offers `gpu` resources).
  bool wants_gpus(bool cluster_has_gpus) const {
    return device == DeviceKind::cuda || (device == DeviceKind::auto_ && cluster_has_gpus);
  }
  // Local ranks of each worker: one per GPU on CUDA, workers.local_ranks (at least 1) on the CPU.
  // The outer optimizer's settings as the job steps θ: `outer`, less the momentum where
  // compression topk's SparseLoCo rule lets the error feedback take its place.
  OuterConfig outer_step() const {
    OuterConfig o = outer;
    if (topk.on && topk.outer == OuterRule::sparseloco) o.momentum = 0, o.nesterov = false;
    return o;
  }
  // compression topk: the most workers for which gathering every member's sparse bytes sends
  // fewer bytes per member than int8's butterfly all-reduce ((K − 1)·b against
  // 2 (K − 1)/K · n): past it, the sparse codec saves nothing and loco refuses the job.
  int topk_max_workers() const;
  // compression auto: whether its ladder reaches topk (`sparse`, and what topk needs:
  // inner.budget steps, one local rank per worker).
  bool auto_sparse() const {
    return autocodec.on && autocodec.sparse && inner.budget == InnerBudget::steps &&
           std::max(1, workers.local_ranks) == 1 && workers.gpus == 1;
  }
  // Whether workers keep an error-feedback buffer: topk, or auto whose ladder reaches topk.
  bool keeps_feedback() const { return topk.on || auto_sparse(); }
  // The compression as logs say it: a codec's name, or "topk (chunk C, k K, bits B)".
  std::string compression_name() const;
  int ranks_per_worker(bool cuda) const {
    return cuda ? workers.gpus : std::max(1, workers.local_ranks);
  }
  std::int64_t tokens_per_inner_step() const {
    return static_cast<std::int64_t>(inner.batch_size) * model.context;
  }
};

// The job file `yaml` with `sets` applied: each "a.b.c=VALUE" (as `loco submit --set`) puts
// VALUE, read as YAML ("3e-4", "true", "[0.9, 0.95]", "text"), at that path, making the
// mappings on the way. The result is a job file again; from_yaml validates it. Throws
// ConfigError naming the --set that is not "PATH=VALUE", whose path is not names joined by
// dots, or that goes through a field that is not a mapping.
std::string with_overrides(const std::string& yaml, const std::vector<std::string>& sets);

// Model FLOPs of training on one token, forward and backward: 6 per parameter, plus
// attention's scores and weighted sums, 12 · layers · width · context (the count of PaLM's
// appendix B, as nanoGPT's MFU uses). For per-step TFLOP/s and MFU. A TorchScript module's:
// 6 per parameter alone (loco does not know its layers).
double training_flops_per_token(const ModelConfig& m, std::int64_t parameters);

// The dense peak FLOP/s of a GPU named `device` (as CUDA names it, e.g. "NVIDIA H100 80GB
// HBM3") at `precision`: bf16 on tensor cores, fp32 without TF32, from the vendor's data
// sheets; 0 for a device not in the table (the CPU among them). $LOCO_PEAK_TFLOPS, when set,
// is the peak of any device, in TFLOP/s.
double peak_flops(const std::string& device, Precision precision);

// The first field of the model (as `model.NAME`) in which `a` and `b` differ, or "" when
// they build the same parameters (activation_checkpointing is not compared: it changes no
// parameter; nor is a TorchScript file's path: its hash is). For a job that resumes or starts
// from another job's weights.
std::string model_difference(const ModelConfig& a, const ModelConfig& b);

// Every field of the model section (hf and activation_checkpointing too) with its value as the
// job file writes it, in the table's order: {"arch", "llama"}, {"layers", "2"}, ...
std::vector<std::pair<std::string, std::string>> model_fields(const ModelConfig& m);

// The device a worker trains on, decided from the job's `device`, the GPU indices
// the runtime gave its actor (this_actor().gpus), and what this process's torch
// sees. No LibTorch here: the caller passes torch::cuda::is_available() and
// device_count(). Throws ConfigError naming `device` when it cannot be met.
struct DeviceChoice {
  bool cuda = false;
  int index = 0;       // CUDA device index when cuda
  std::string reason;  // why this device, for the worker's log ("cuda:1 (node gpu 1)")
};
DeviceChoice choose_device(DeviceKind want, const std::vector<int>& gpus, bool cuda_available,
                           int cuda_devices);

}  // namespace loco::diloco
