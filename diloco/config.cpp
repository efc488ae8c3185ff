#include "diloco/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "diloco/memory.hpp"

namespace loco::diloco {

namespace {

// Text from the job file as it shows in an error: cut, control bytes escaped.
std::string clean(const std::string& s) {
  std::string out;
  for (unsigned char ch : s.substr(0, 80)) {
    if (ch >= 0x20 && ch < 0x7f) {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    }
  }
  return s.size() > 80 ? out + "... (" + std::to_string(s.size()) + " bytes)" : out;
}

std::string quoted(const std::string& s) { return "'" + clean(s) + "'"; }

std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// Rejects keys that the schema does not know, naming the first one.
void check_keys(const YAML::Node& node, const std::string& where,
                const std::set<std::string>& known) {
  if (!node) return;
  if (!node.IsMap())
    throw ConfigError((where.empty() ? std::string("job") : where) + ": expected a mapping");
  for (const auto& kv : node) {
    // YAML allows any node as a key ("? {a: 1}"); a job file's keys are names.
    if (!kv.first.IsScalar())
      throw ConfigError((where.empty() ? std::string("job") : where) +
                        ": a key must be a name, got " + quoted(YAML::Dump(kv.first)));
    const auto key = kv.first.as<std::string>();
    if (!known.count(key)) {
      std::string allowed;
      for (const auto& k : known) allowed += (allowed.empty() ? "" : "|") + k;
      throw ConfigError(join(where, clean(key)) + ": unknown field (expected one of " + allowed +
                        ")");
    }
  }
}

template <class T>
void read(const YAML::Node& node, const std::string& where, const std::string& key, T& out) {
  if (!node || !node[key]) return;
  try {
    out = node[key].as<T>();
  } catch (const YAML::Exception&) {
    std::ostringstream msg;
    msg << join(where, key) << ": cannot read " << quoted(YAML::Dump(node[key])) << " as "
        << (std::is_same_v<T, bool>       ? "a boolean"
            : std::is_integral_v<T>       ? "an integer"
            : std::is_floating_point_v<T> ? "a number"
                                          : "a string");
    throw ConfigError(msg.str());
  }
}

template <class E, std::size_t N>
void read_enum(const YAML::Node& node, const std::string& where, const std::string& key, E& out,
               const std::array<std::pair<const char*, E>, N>& choices) {
  if (!node || !node[key]) return;
  std::string s;
  read(node, where, key, s);
  std::string allowed;
  for (const auto& [name, value] : choices) {
    if (s == name) {
      out = value;
      return;
    }
    allowed += (allowed.empty() ? "" : "|") + std::string(name);
  }
  throw ConfigError(join(where, key) + ": expected one of " + allowed + ", got " + quoted(s));
}

// The collective's codecs by their names (collective::parse_codec).
void read_codec(const YAML::Node& node, const std::string& key, collective::Codec& out) {
  if (!node || !node[key]) return;
  std::string s;
  read(node, "", key, s);
  if (auto c = collective::parse_codec(s)) {
    out = *c;
    return;
  }
  std::string allowed;
  for (auto c : {collective::Codec::fp32, collective::Codec::fp16, collective::Codec::bf16,
                 collective::Codec::int8})
    allowed += (allowed.empty() ? "" : "|") + std::string(collective::to_string(c));
  throw ConfigError(key + ": expected one of " + allowed + ", got " + quoted(s));
}

template <class T>
std::string show(T v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

template <class T>
void require(bool ok, const std::string& field, const std::string& rule, T got) {
  if (!ok) throw ConfigError(field + ": must be " + rule + ", got " + show(got));
}

// A number in [lo, hi], named by `field`.
template <class T>
void require_in(T v, T lo, T hi, const std::string& field) {
  require(v >= lo && v <= hi, field, "in [" + show(lo) + ", " + show(hi) + "]", v);
}

void require_finite(double v, const std::string& field) {
  require(std::isfinite(v), field, "a finite number", v);
}

void require_text(const std::string& s, size_t max_bytes, const std::string& field) {
  if (s.size() > max_bytes)
    throw ConfigError(field + ": must be at most " + show(max_bytes) + " bytes, got " +
                      show(s.size()) + " bytes");
  for (unsigned char ch : s)
    if (ch < 0x20 || ch == 0x7f)
      throw ConfigError(field + ": must not contain control characters, got " + quoted(s));
}

// yaml-cpp parses flow collections ([..], {..}) by recursion: a job file of a few thousand
// opening brackets would exhaust the stack. Nothing in a job file nests more than a few
// levels; refuse deep flow nesting before yaml-cpp sees it. (Brackets inside quoted strings
// count too: harmless, as no field holds that many.)
void check_nesting(const std::string& text) {
  int depth = 0;
  for (char ch : text) {
    if (ch == '[' || ch == '{') {
      if (++depth > kMaxJobFileNesting)
        throw ConfigError("job file: more than " + show(kMaxJobFileNesting) +
                          " nested [ or { brackets");
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
}

// from_yaml's reading of every field (no validation).
void read_fields(const YAML::Node& root, JobConfig& c) {
  check_keys(root, "",
             {"name", "seed", "threads", "device", "precision", "model", "data", "workers", "inner",
              "outer", "compression", "allreduce", "sync", "rounds", "token_budget", "checkpoint",
              "eval", "init"});
  read(root, "", "name", c.name);
  read(root, "", "seed", c.seed);
  read(root, "", "threads", c.threads);
  read_enum(
      root, "", "device", c.device,
      std::array<std::pair<const char*, DeviceKind>, 3>{
          {{"auto", DeviceKind::auto_}, {"cpu", DeviceKind::cpu}, {"cuda", DeviceKind::cuda}}});
  read(root, "", "rounds", c.rounds);
  read(root, "", "token_budget", c.token_budget);
  read(root, "", "init", c.init);
  read_codec(root, "compression", c.compression);
  read_enum(root, "", "precision", c.precision,
            std::array<std::pair<const char*, Precision>, 2>{
                {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}}});

  const auto m = root["model"];
  check_keys(m, "model",
             {"arch", "layers", "width", "d_model", "heads", "context", "vocab", "tied_embeddings",
              "mlp_ratio", "mlp_hidden", "kv_heads", "rope_theta", "norm_eps",
              "activation_checkpointing"});
  read_enum(
      m, "model", "arch", c.model.arch,
      std::array<std::pair<const char*, Arch>, 2>{{{"gpt2", Arch::gpt2}, {"llama", Arch::llama}}});
  read(m, "model", "layers", c.model.layers);
  read(m, "model", "width", c.model.d_model);
  read(m, "model", "d_model", c.model.d_model);
  read(m, "model", "heads", c.model.heads);
  read(m, "model", "context", c.model.context);
  read(m, "model", "vocab", c.model.vocab);
  read(m, "model", "tied_embeddings", c.model.tied_embeddings);
  read(m, "model", "mlp_ratio", c.model.mlp_ratio);
  read(m, "model", "mlp_hidden", c.model.mlp_hidden);
  read(m, "model", "kv_heads", c.model.kv_heads);
  read(m, "model", "rope_theta", c.model.rope_theta);
  read(m, "model", "norm_eps", c.model.norm_eps);
  read(m, "model", "activation_checkpointing", c.model.activation_checkpointing);

  const auto d = root["data"];
  check_keys(
      d, "data",
      {"dir", "path", "format", "dtype", "tokenizer", "bpe_vocab", "shards", "val_fraction"});
  read(d, "data", "dir", c.data.dir);
  read(d, "data", "path", c.data.dir);
  read_enum(d, "data", "format", c.data.format,
            std::array<std::pair<const char*, DataFormat>, 2>{
                {{"text", DataFormat::text}, {"tokens", DataFormat::tokens}}});
  read_enum(d, "data", "dtype", c.data.dtype,
            std::array<std::pair<const char*, TokenDtype>, 2>{
                {{"uint16", TokenDtype::uint16}, {"uint32", TokenDtype::uint32}}});
  if (d && d["tokenizer"]) {
    std::string t;
    read(d, "data", "tokenizer", t);
    if (t == "byte") {
      c.data.tokenizer = TokenizerKind::byte;
    } else if (t == "bpe") {
      c.data.tokenizer = TokenizerKind::bpe;
    } else if (t.size() > 5 && t.ends_with(".json")) {
      c.data.tokenizer = TokenizerKind::json;
      c.data.tokenizer_json = t;
    } else {
      throw ConfigError("data.tokenizer: expected byte|bpe or the path of a tokenizer.json, got " +
                        quoted(t));
    }
  }
  read(d, "data", "bpe_vocab", c.data.bpe_vocab);
  read(d, "data", "shards", c.data.shards);
  read(d, "data", "val_fraction", c.data.val_fraction);

  const auto w = root["workers"];
  check_keys(w, "workers",
             {"count", "min", "max", "max_restarts", "wait_s", "gpus", "share_gpu", "local_ranks",
              "grace_max_s"});
  read(w, "workers", "count", c.workers.count);
  read(w, "workers", "min", c.workers.min);
  read(w, "workers", "max", c.workers.max);
  read(w, "workers", "max_restarts", c.workers.max_restarts);
  read(w, "workers", "wait_s", c.workers.wait_s);
  read(w, "workers", "gpus", c.workers.gpus);
  read(w, "workers", "share_gpu", c.workers.share_gpu);
  read(w, "workers", "local_ranks", c.workers.local_ranks);
  read(w, "workers", "grace_max_s", c.workers.grace_max_s);

  const auto i = root["inner"];
  check_keys(i, "inner",
             {"steps", "batch_size", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip",
              "grad_accum", "betas", "eps", "budget", "round_seconds"});
  read(i, "inner", "steps", c.inner.steps);
  read(i, "inner", "batch_size", c.inner.batch_size);
  read(i, "inner", "lr", c.inner.lr);
  read(i, "inner", "warmup", c.inner.warmup);
  read(i, "inner", "min_lr_ratio", c.inner.min_lr_ratio);
  read(i, "inner", "weight_decay", c.inner.weight_decay);
  read(i, "inner", "grad_clip", c.inner.grad_clip);
  read(i, "inner", "grad_accum", c.inner.grad_accum);
  read(i, "inner", "eps", c.inner.eps);
  read_enum(i, "inner", "budget", c.inner.budget,
            std::array<std::pair<const char*, InnerBudget>, 2>{
                {{"steps", InnerBudget::steps}, {"time", InnerBudget::time}}});
  read(i, "inner", "round_seconds", c.inner.round_seconds);
  if (i && i["betas"]) {
    const auto b = i["betas"];
    if (!b.IsSequence() || b.size() != 2)
      throw ConfigError("inner.betas: expected a list of two numbers, got " +
                        quoted(YAML::Dump(b)));
    try {
      c.inner.betas = {b[0].as<double>(), b[1].as<double>()};
    } catch (const YAML::Exception&) {
      throw ConfigError("inner.betas: expected a list of two numbers, got " +
                        quoted(YAML::Dump(b)));
    }
  }

  const auto o = root["outer"];
  check_keys(o, "outer", {"lr", "momentum", "nesterov"});
  read(o, "outer", "lr", c.outer.lr);
  read(o, "outer", "momentum", c.outer.momentum);
  read(o, "outer", "nesterov", c.outer.nesterov);

  const auto y = root["sync"];
  check_keys(y, "sync", {"mode", "fragments", "overlap_steps", "mix"});
  read_enum(y, "sync", "mode", c.sync.mode,
            std::array<std::pair<const char*, SyncMode>, 3>{{{"blocking", SyncMode::blocking},
                                                             {"streaming", SyncMode::streaming},
                                                             {"eager", SyncMode::eager}}});
  read(y, "sync", "fragments", c.sync.fragments);
  read(y, "sync", "overlap_steps", c.sync.overlap_steps);
  read(y, "sync", "mix", c.sync.mix);

  const auto k = root["checkpoint"];
  check_keys(k, "checkpoint", {"every", "dir", "keep", "resume"});
  read(k, "checkpoint", "every", c.checkpoint.every);
  read(k, "checkpoint", "dir", c.checkpoint.dir);
  read(k, "checkpoint", "keep", c.checkpoint.keep);
  read(k, "checkpoint", "resume", c.checkpoint.resume);

  const auto a = root["allreduce"];
  check_keys(a, "allreduce", {"chunk_kb", "peer_timeout_s", "entry_timeout_s"});
  read(a, "allreduce", "chunk_kb", c.allreduce.chunk_kb);
  read(a, "allreduce", "peer_timeout_s", c.allreduce.peer_timeout_s);
  read(a, "allreduce", "entry_timeout_s", c.allreduce.entry_timeout_s);

  const auto e = root["eval"];
  check_keys(e, "eval", {"every", "batches"});
  read(e, "eval", "every", c.eval.every);
  read(e, "eval", "batches", c.eval.batches);
}

}  // namespace

JobConfig JobConfig::from_yaml(const std::string& text) {
  if (text.size() > kMaxJobFileBytes)
    throw ConfigError("job file: " + show(text.size()) + " bytes, more than the limit of " +
                      show(kMaxJobFileBytes) + " bytes");
  check_nesting(text);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(std::string("job file: YAML syntax error: ") + e.what());
  }
  JobConfig c;
  if (!root || root.IsNull()) throw ConfigError("job file: empty");
  try {
    read_fields(root, c);
  } catch (const YAML::Exception& e) {
    // What the checks above do not foresee still comes out as a ConfigError.
    throw ConfigError("job file: " + clean(e.what()));
  }
  c.validate();
  return c;
}

JobConfig JobConfig::from_yaml_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open job file");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return from_yaml(ss.str());
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

void JobConfig::validate() const {
  // Non-finite numbers first: NaN fails every comparison below, but +inf passes "> 0".
  for (const auto& [v, field] : std::initializer_list<std::pair<double, const char*>>{
           {data.val_fraction, "data.val_fraction"},
           {workers.wait_s, "workers.wait_s"},
           {workers.grace_max_s, "workers.grace_max_s"},
           {inner.round_seconds, "inner.round_seconds"},
           {inner.lr, "inner.lr"},
           {inner.min_lr_ratio, "inner.min_lr_ratio"},
           {inner.weight_decay, "inner.weight_decay"},
           {inner.grad_clip, "inner.grad_clip"},
           {inner.betas[0], "inner.betas[0]"},
           {inner.betas[1], "inner.betas[1]"},
           {inner.eps, "inner.eps"},
           {outer.lr, "outer.lr"},
           {outer.momentum, "outer.momentum"},
           {allreduce.peer_timeout_s, "allreduce.peer_timeout_s"},
           {allreduce.entry_timeout_s, "allreduce.entry_timeout_s"},
           {model.rope_theta, "model.rope_theta"},
           {model.norm_eps, "model.norm_eps"}})
    require_finite(v, field);
  require(!name.empty(), "name", "a non-empty string", "''");
  require_text(name, kMaxJobNameBytes, "name");
  require_text(data.dir, kMaxPathBytes, "data.dir");
  require_text(checkpoint.dir, kMaxPathBytes, "checkpoint.dir");
  require_text(checkpoint.resume, kMaxPathBytes, "checkpoint.resume");
  require_text(init, kMaxPathBytes, "init");
  require(init.empty() || (init.rfind("hf:", 0) == 0 && init.size() > 3), "init",
          "hf:DIR, a Hugging Face folder of the job's model (or unset)", quoted(init));
  require(threads >= 0, "threads", ">= 0", threads);
  require(threads <= kMaxThreads, "threads", "<= " + show(kMaxThreads), threads);
  require(model.layers <= kMaxLayers, "model.layers", "<= " + show(kMaxLayers), model.layers);
  require(model.d_model <= kMaxWidth, "model.d_model", "<= " + show(kMaxWidth), model.d_model);
  require(model.heads <= kMaxHeads, "model.heads", "<= " + show(kMaxHeads), model.heads);
  require(model.context <= kMaxContext, "model.context", "<= " + show(kMaxContext), model.context);
  require(model.mlp_ratio <= kMaxMlpRatio, "model.mlp_ratio", "<= " + show(kMaxMlpRatio),
          model.mlp_ratio);
  require(model.layers >= 1, "model.layers", ">= 1", model.layers);
  require(model.d_model >= 1, "model.d_model", ">= 1", model.d_model);
  require(model.heads >= 1, "model.heads", ">= 1", model.heads);
  require(model.d_model % model.heads == 0, "model.heads",
          "a divisor of model.d_model (" + show(model.d_model) + ")", model.heads);
  require(model.context >= 2, "model.context", ">= 2", model.context);
  require(model.vocab >= 0 && model.vocab <= kMaxVocab, "model.vocab",
          "in [0, " + show(kMaxVocab) + "] (0: from the tokenizer)", model.vocab);
  if (data.tokenizer == TokenizerKind::json) {
    require_text(data.tokenizer_json, kMaxPathBytes, "data.tokenizer");
    if (model.vocab == 0)
      throw ConfigError(
          "model.vocab: required with data.tokenizer: " + quoted(data.tokenizer_json) +
          " (every node builds the same model; scripts/prepare-data prints the vocabulary size)");
  }
  if (data.format == DataFormat::tokens && model.vocab == 0)
    throw ConfigError(
        "model.vocab: required with data.format: tokens (the ids in the token files are checked "
        "against it; scripts/prepare-data prints the vocabulary size)");
  if (data.format == DataFormat::tokens && data.tokenizer == TokenizerKind::bpe)
    throw ConfigError(
        "data.tokenizer: bpe trains on DIR/corpus, which data.format: tokens has not; name the "
        "tokenizer.json of the token files (or byte)");
  require(model.mlp_ratio >= 1, "model.mlp_ratio", ">= 1", model.mlp_ratio);
  require_in(model.mlp_hidden, 0, kMaxWidth * kMaxMlpRatio, "model.mlp_hidden");
  require(model.norm_eps > 0 && model.norm_eps <= 1, "model.norm_eps", "in (0, 1]", model.norm_eps);
  require_in(model.kv_heads, 0, model.heads, "model.kv_heads");
  if (model.arch == Arch::gpt2) {
    // Refused rather than ignored: a job file that asks for them wants another model.
    require(model.kv_heads == 0 || model.kv_heads == model.heads, "model.kv_heads",
            "0 or model.heads for arch gpt2 (grouped-query attention is arch: llama's)",
            model.kv_heads);
    require(model.rope_theta == ModelConfig{}.rope_theta, "model.rope_theta",
            "unset for arch gpt2 (learned positions; rotary positions are arch: llama's)",
            model.rope_theta);
  } else {
    require(model.heads % model.kv_head_count() == 0, "model.kv_heads",
            "a divisor of model.heads (" + show(model.heads) + ")", model.kv_heads);
    require(model.head_dim() % 2 == 0, "model.heads",
            "such that d_model / heads is even for rotary positions (d_model " +
                show(model.d_model) + ")",
            model.heads);
    require(model.rope_theta > 1, "model.rope_theta", "> 1", model.rope_theta);
  }
  if (data.tokenizer == TokenizerKind::byte)
    require(model.vocab == 0 || model.vocab >= 256, "model.vocab", ">= 256 for the byte tokenizer",
            model.vocab);
  // 256 byte-fallback pieces + the corpus characters + the control pieces.
  require(data.bpe_vocab >= 320 && data.bpe_vocab <= 65536, "data.bpe_vocab", "in [320, 65536]",
          data.bpe_vocab);
  require(!data.dir.empty(), "data.dir", "a folder", "''");
  require_in(data.shards, 1, kMaxShards, "data.shards");
  require(data.val_fraction > 0 && data.val_fraction < 0.5, "data.val_fraction", "in (0, 0.5)",
          data.val_fraction);
  require_in(workers.count, 1, kMaxWorkers, "workers.count");
  require(workers.min >= 1 && workers.min <= workers.count, "workers.min", "in [1, workers.count]",
          workers.min);
  require(workers.max == 0 || workers.max >= workers.count, "workers.max", "0 or >= workers.count",
          workers.max);
  require(workers.max <= kMaxWorkers, "workers.max", "<= " + show(kMaxWorkers), workers.max);
  require_in(workers.max_restarts, 0, kMaxRestarts, "workers.max_restarts");
  require(workers.wait_s > 0 && workers.wait_s <= kMaxWaitS, "workers.wait_s",
          "in (0, " + show(kMaxWaitS) + "]", workers.wait_s);
  require(workers.gpus >= 1, "workers.gpus", ">= 1", workers.gpus);
  require(workers.gpus <= 64, "workers.gpus", "<= 64", workers.gpus);
  require(workers.local_ranks >= 0 && workers.local_ranks <= 64, "workers.local_ranks",
          "in [0, 64]", workers.local_ranks);
  if (device == DeviceKind::cuda && workers.local_ranks > 1 && workers.local_ranks != workers.gpus)
    throw ConfigError("workers.local_ranks: " + show(workers.local_ranks) +
                      " with device: cuda, where a worker's ranks are its GPUs (workers.gpus: " +
                      show(workers.gpus) + "); leave it out or make it equal");
  require_in(inner.steps, 1, kMaxSteps, "inner.steps");
  require_in(inner.batch_size, 1, kMaxBatchSize, "inner.batch_size");
  require(inner.lr > 0, "inner.lr", "> 0", inner.lr);
  require_in(inner.warmup, 0, kMaxSteps, "inner.warmup");
  require(inner.min_lr_ratio >= 0 && inner.min_lr_ratio <= 1, "inner.min_lr_ratio", "in [0, 1]",
          inner.min_lr_ratio);
  require(inner.weight_decay >= 0, "inner.weight_decay", ">= 0", inner.weight_decay);
  require(inner.grad_clip >= 0, "inner.grad_clip", ">= 0 (0 disables)", inner.grad_clip);
  require(workers.grace_max_s >= 0 && workers.grace_max_s <= kMaxWaitS, "workers.grace_max_s",
          "in [0, " + show(kMaxWaitS) + "] (0: wait for every member)", workers.grace_max_s);
  require(inner.round_seconds >= 0 && inner.round_seconds <= kMaxWaitS, "inner.round_seconds",
          "in [0, " + show(kMaxWaitS) + "] (0: H x the median seconds per step)",
          inner.round_seconds);
  if (inner.budget == InnerBudget::time) {
    if (sync.mode != SyncMode::blocking)
      throw ConfigError(
          "inner.budget: time needs sync.mode: blocking (streaming and eager "
          "synchronize at fixed steps)");
    if (std::max(1, workers.local_ranks) > 1 || workers.gpus > 1)
      throw ConfigError(
          "inner.budget: time runs one local rank per worker for now "
          "(workers.local_ranks and workers.gpus must be 1)");
  }
  require(inner.grad_accum >= 1, "inner.grad_accum", ">= 1", inner.grad_accum);
  require(inner.batch_size % inner.grad_accum == 0, "inner.grad_accum",
          "a divisor of inner.batch_size (" + show(inner.batch_size) + ")", inner.grad_accum);
  // Each rank reads batch_size / G sequences of every step, in grad_accum micro-batches.
  for (int g : {device == DeviceKind::cpu ? 1 : workers.gpus, std::max(1, workers.local_ranks)})
    if (inner.batch_size % (g * inner.grad_accum) != 0)
      throw ConfigError("inner.batch_size: " + show(inner.batch_size) +
                        " sequences do not split into " + show(g) + " local ranks of " +
                        show(inner.grad_accum) +
                        " micro-batches; make it a multiple of the ranks per worker "
                        "(workers.gpus or workers.local_ranks) × inner.grad_accum");
  require(inner.betas[0] >= 0 && inner.betas[0] < 1, "inner.betas[0]", "in [0, 1)", inner.betas[0]);
  require(inner.betas[1] >= 0 && inner.betas[1] < 1, "inner.betas[1]", "in [0, 1)", inner.betas[1]);
  require(inner.eps > 0, "inner.eps", "> 0", inner.eps);
  // The steps run in fp32, and torch takes their scalars as floats: AdamW's update is scaled by
  // lr / (1 - betas[0]) (the first step's bias correction) and θ decays by lr x weight_decay;
  // beyond fp32's range (3.4e38) a step cannot run at all ("value cannot be converted to type
  // float without overflow", on every worker, every time the round is redone). A rate below
  // that which still makes the loss non-finite fails the job after kMaxRoundRedos redos.
  constexpr double fp32_max = std::numeric_limits<float>::max();
  require(inner.lr / (1 - inner.betas[0]) <= fp32_max && inner.lr * inner.weight_decay <= fp32_max,
          "inner.lr",
          "small enough that inner.lr / (1 - inner.betas[0]) and inner.lr x inner.weight_decay "
          "are within fp32's range (3.4e38), in which the inner steps run",
          inner.lr);
  require(outer.lr > 0, "outer.lr", "> 0", outer.lr);
  require(outer.lr <= fp32_max, "outer.lr", "within fp32's range (3.4e38), in which θ steps",
          outer.lr);
  require(outer.momentum >= 0 && outer.momentum < 1, "outer.momentum", "in [0, 1)", outer.momentum);
  require_in(rounds, 0, kMaxRounds, "rounds");
  require_in(token_budget, std::int64_t{0}, kMaxTokenBudget, "token_budget");
  require(rounds > 0 || token_budget > 0, "rounds", "> 0 (or set token_budget)", rounds);
  require_in(checkpoint.every, 0, kMaxRounds, "checkpoint.every");
  require_in(checkpoint.keep, 0, kMaxRounds, "checkpoint.keep");
  require_in(eval.every, 1, kMaxRounds, "eval.every");
  require_in(eval.batches, 1, kMaxEvalBatches, "eval.batches");
  // Bounds on sizes together, once each is sane: what one worker must hold.
  const double params = parameter_estimate();
  require(params <= kMaxParameters, "model",
          "at most " + show(kMaxParameters) + " parameters (ModelConfig::parameter_count)", params);
  // One micro-batch's activations: per layer, context x width values and heads x context^2
  // attention weights per sequence.
  const double activations =
      static_cast<double>(inner.batch_size / inner.grad_accum) * model.layers * model.context *
      (static_cast<double>(model.d_model) + static_cast<double>(model.heads) * model.context);
  require(activations <= kMaxActivationValues, "model.context",
          "small enough that batch_size / grad_accum x layers x context x (width + heads x "
          "context) <= " +
              show(kMaxActivationValues) + " (one micro-batch's activations)",
          model.context);
  // What one worker holds, all terms together (diloco/memory.hpp): no node holds more. The
  // cluster compares the estimate with its largest node at submission (check_fits).
  const double worker_bytes = worker_memory_bytes(*this);
  if (worker_bytes > kMaxWorkerBytes)
    throw ConfigError(memory_field(*this, false) + ": needs about " + gib(worker_bytes) +
                      " per worker, more than any node holds (at most " + gib(kMaxWorkerBytes) +
                      " is accepted)");
  require(static_cast<double>(total_rounds()) <= kMaxRounds, "token_budget",
          "at most " + show(kMaxRounds) + " rounds' worth of tokens", token_budget);
  require(sync.fragments >= 1 && sync.fragments <= model.layers, "sync.fragments",
          "in [1, model.layers = " + show(model.layers) + "]", sync.fragments);
  require(inner.steps % sync.fragments == 0, "sync.fragments",
          "a divisor of inner.steps (" + show(inner.steps) + ")", sync.fragments);
  require(sync.overlap_steps >= 0 && sync.overlap_steps < inner.steps, "sync.overlap_steps",
          "in [0, inner.steps)", sync.overlap_steps);
  require(sync.mix >= 0 && sync.mix <= 1, "sync.mix", "in [0, 1]", sync.mix);
  if (sync.mode == SyncMode::blocking && (sync.fragments != 1 || sync.overlap_steps != 0))
    throw ConfigError("sync.fragments: " + show(sync.fragments) + " and sync.overlap_steps: " +
                      show(sync.overlap_steps) + " need sync.mode: streaming (or eager)");
  if (sync.mode == SyncMode::eager && (sync.fragments != 1 || sync.mix != 0))
    throw ConfigError("sync.fragments: " + show(sync.fragments) +
                      " and sync.mix: " + show(sync.mix) +
                      ": eager synchronizes all of θ at once and mixes nothing (1 and 0); "
                      "fragments and mixing are sync.mode: streaming");
  require(allreduce.chunk_kb >= 1 && allreduce.chunk_kb <= 65536, "allreduce.chunk_kb",
          "in [1, 65536]", allreduce.chunk_kb);
  require(allreduce.peer_timeout_s >= 0.1 && allreduce.peer_timeout_s <= 3600,
          "allreduce.peer_timeout_s", "in [0.1, 3600]", allreduce.peer_timeout_s);
  require(allreduce.entry_timeout_s >= 0 && allreduce.entry_timeout_s <= 3600,
          "allreduce.entry_timeout_s", "in [0, 3600]", allreduce.entry_timeout_s);
}

const char* to_string(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama"; }

int ModelConfig::mlp_width() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (arch == Arch::gpt2) return mlp_ratio * d_model;
  // Llama's: two thirds of 4 × d_model (SwiGLU has three matrices, not two), rounded up to a
  // multiple of 256.
  const std::int64_t h = 2 * (4 * static_cast<std::int64_t>(d_model)) / 3;
  return static_cast<int>((h + 255) / 256 * 256);
}

std::int64_t ModelConfig::parameter_count(int vocab) const {
  const std::int64_t d = d_model, v = vocab, m = mlp_width();
  const std::int64_t embeddings = v * d * (tied_embeddings ? 1 : 2);
  if (arch == Arch::gpt2) {
    // ln1, ln2 (weight and bias), qkv and proj with biases, fc and fc_proj with biases.
    const std::int64_t block =
        4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d);
    return embeddings + static_cast<std::int64_t>(context) * d + layers * block + 2 * d;
  }
  // ln1, ln2 (weight only), q, k, v, o without biases, gate/up and down without biases.
  const std::int64_t kv = static_cast<std::int64_t>(kv_head_count()) * head_dim();
  const std::int64_t block = 2 * d + (d * d + 2 * kv * d) + d * d + 3 * d * m;
  return embeddings + layers * block + d;
}

const char* to_string(DeviceKind d) {
  switch (d) {
    case DeviceKind::auto_:
      return "auto";
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::cuda:
      return "cuda";
  }
  return "?";
}

DeviceChoice choose_device(DeviceKind want, const std::vector<int>& gpus, bool cuda_available,
                           int cuda_devices) {
  if (want == DeviceKind::cpu) return {false, 0, "cpu (device: cpu)"};
  const bool strict = want == DeviceKind::cuda;
  if (gpus.empty()) {
    if (strict)
      throw ConfigError(
          "device: cuda, but the runtime gave this worker no GPU (start its node with "
          "`loco start --resources gpu=N`)");
    return {false, 0, "cpu (device: auto; the worker's node offers no gpu resources)"};
  }
  if (!cuda_available) {
    if (strict)
      throw ConfigError(
          "device: cuda, but CUDA is not available in this process (a LibTorch "
          "without CUDA, no driver, or CUDA_VISIBLE_DEVICES empty); GPU index " +
          std::to_string(gpus[0]) + " was assigned");
    return {false, 0, "cpu (device: auto; CUDA is not available in this process)"};
  }
  const int index = gpus[0];
  if (index < 0 || index >= cuda_devices)
    throw ConfigError("device: GPU index " + std::to_string(index) +
                      " was assigned, but this process sees " + std::to_string(cuda_devices) +
                      " CUDA device(s): the node's `--resources gpu=N` is more than it has");
  return {true, index, "cuda:" + std::to_string(index) + " (device: " + to_string(want) + ")"};
}

int JobConfig::vocab_size() const {
  if (model.vocab > 0) return model.vocab;
  return data.tokenizer == TokenizerKind::byte ? 256 : data.bpe_vocab;
}

int JobConfig::total_rounds() const {
  if (rounds > 0) return rounds;
  const std::int64_t per_round = std::max<std::int64_t>(1, tokens_per_inner_step() * inner.steps);
  const std::int64_t n = std::max<std::int64_t>(1, (token_budget + per_round - 1) / per_round);
  return static_cast<int>(std::min<std::int64_t>(n, std::numeric_limits<int>::max()));
}

double JobConfig::parameter_estimate() const {
  return static_cast<double>(model.parameter_count(vocab_size()));
}

std::string JobConfig::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << name;
  out << YAML::Key << "seed" << YAML::Value << seed;
  out << YAML::Key << "threads" << YAML::Value << threads;
  out << YAML::Key << "device" << YAML::Value << to_string(device);
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap << YAML::Key << "arch" << YAML::Value
      << to_string(model.arch) << YAML::Key << "layers" << YAML::Value << model.layers << YAML::Key
      << "d_model" << YAML::Value << model.d_model << YAML::Key << "heads" << YAML::Value
      << model.heads << YAML::Key << "context" << YAML::Value << model.context << YAML::Key
      << "vocab" << YAML::Value << model.vocab << YAML::Key << "tied_embeddings" << YAML::Value
      << model.tied_embeddings << YAML::Key << "mlp_ratio" << YAML::Value << model.mlp_ratio
      << YAML::Key << "mlp_hidden" << YAML::Value << model.mlp_hidden << YAML::Key << "norm_eps"
      << YAML::Value << model.norm_eps;
  if (model.arch == Arch::llama)
    out << YAML::Key << "kv_heads" << YAML::Value << model.kv_heads << YAML::Key << "rope_theta"
        << YAML::Value << model.rope_theta;
  out << YAML::Key << "activation_checkpointing" << YAML::Value << model.activation_checkpointing
      << YAML::EndMap;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap << YAML::Key << "dir" << YAML::Value
      << data.dir << YAML::Key << "format" << YAML::Value
      << (data.format == DataFormat::text ? "text" : "tokens") << YAML::Key << "dtype"
      << YAML::Value << (data.dtype == TokenDtype::uint16 ? "uint16" : "uint32") << YAML::Key
      << "tokenizer" << YAML::Value
      << (data.tokenizer == TokenizerKind::byte  ? std::string("byte")
          : data.tokenizer == TokenizerKind::bpe ? std::string("bpe")
                                                 : data.tokenizer_json)
      << YAML::Key << "bpe_vocab" << YAML::Value << data.bpe_vocab << YAML::Key << "shards"
      << YAML::Value << data.shards << YAML::Key << "val_fraction" << YAML::Value
      << data.val_fraction << YAML::EndMap;
  out << YAML::Key << "workers" << YAML::Value << YAML::BeginMap << YAML::Key << "count"
      << YAML::Value << workers.count << YAML::Key << "min" << YAML::Value << workers.min
      << YAML::Key << "max" << YAML::Value << workers.max << YAML::Key << "max_restarts"
      << YAML::Value << workers.max_restarts << YAML::Key << "wait_s" << YAML::Value
      << workers.wait_s << YAML::Key << "gpus" << YAML::Value << workers.gpus << YAML::Key
      << "share_gpu" << YAML::Value << workers.share_gpu << YAML::Key << "local_ranks"
      << YAML::Value << workers.local_ranks << YAML::Key << "grace_max_s" << YAML::Value
      << workers.grace_max_s << YAML::EndMap;
  out << YAML::Key << "inner" << YAML::Value << YAML::BeginMap << YAML::Key << "steps"
      << YAML::Value << inner.steps << YAML::Key << "batch_size" << YAML::Value << inner.batch_size
      << YAML::Key << "lr" << YAML::Value << inner.lr << YAML::Key << "warmup" << YAML::Value
      << inner.warmup << YAML::Key << "min_lr_ratio" << YAML::Value << inner.min_lr_ratio
      << YAML::Key << "weight_decay" << YAML::Value << inner.weight_decay << YAML::Key
      << "grad_clip" << YAML::Value << inner.grad_clip << YAML::Key << "grad_accum" << YAML::Value
      << inner.grad_accum << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << inner.betas[0] << inner.betas[1] << YAML::EndSeq << YAML::Key << "eps" << YAML::Value
      << inner.eps << YAML::Key << "budget" << YAML::Value
      << (inner.budget == InnerBudget::steps ? "steps" : "time") << YAML::Key << "round_seconds"
      << YAML::Value << inner.round_seconds << YAML::EndMap;
  out << YAML::Key << "outer" << YAML::Value << YAML::BeginMap << YAML::Key << "lr" << YAML::Value
      << outer.lr << YAML::Key << "momentum" << YAML::Value << outer.momentum << YAML::Key
      << "nesterov" << YAML::Value << outer.nesterov << YAML::EndMap;
  out << YAML::Key << "precision" << YAML::Value
      << (precision == Precision::fp32 ? "fp32" : "bf16");
  out << YAML::Key << "compression" << YAML::Value
      << std::string(collective::to_string(compression));
  out << YAML::Key << "allreduce" << YAML::Value << YAML::BeginMap << YAML::Key << "chunk_kb"
      << YAML::Value << allreduce.chunk_kb << YAML::Key << "peer_timeout_s" << YAML::Value
      << allreduce.peer_timeout_s << YAML::Key << "entry_timeout_s" << YAML::Value
      << allreduce.entry_timeout_s << YAML::EndMap;
  out << YAML::Key << "sync" << YAML::Value << YAML::BeginMap << YAML::Key << "mode" << YAML::Value
      << (sync.mode == SyncMode::blocking    ? "blocking"
          : sync.mode == SyncMode::streaming ? "streaming"
                                             : "eager")
      << YAML::Key << "fragments" << YAML::Value << sync.fragments << YAML::Key << "overlap_steps"
      << YAML::Value << sync.overlap_steps << YAML::Key << "mix" << YAML::Value << sync.mix
      << YAML::EndMap;
  out << YAML::Key << "rounds" << YAML::Value << rounds;
  out << YAML::Key << "token_budget" << YAML::Value << token_budget;
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap << YAML::Key << "every"
      << YAML::Value << checkpoint.every << YAML::Key << "dir" << YAML::Value << checkpoint.dir
      << YAML::Key << "keep" << YAML::Value << checkpoint.keep;
  if (!checkpoint.resume.empty())
    out << YAML::Key << "resume" << YAML::Value << checkpoint.resume;
  out << YAML::EndMap;
  out << YAML::Key << "eval" << YAML::Value << YAML::BeginMap << YAML::Key << "every" << YAML::Value
      << eval.every << YAML::Key << "batches" << YAML::Value << eval.batches << YAML::EndMap;
  if (!init.empty()) out << YAML::Key << "init" << YAML::Value << init;
  out << YAML::EndMap;
  return out.c_str();
}

std::string with_overrides(const std::string& yaml, const std::vector<std::string>& sets) {
  if (yaml.size() > kMaxJobFileBytes)
    throw ConfigError("job file: " + show(yaml.size()) + " bytes, more than the limit of " +
                      show(kMaxJobFileBytes) + " bytes");
  check_nesting(yaml);
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError(std::string("job file: YAML syntax error: ") + e.what());
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw ConfigError("job file: expected a mapping of fields at the top");
  for (const std::string& set : sets) {
    const auto eq = set.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--set " + quoted(set) + ": expected PATH=VALUE, e.g. inner.lr=3e-4");
    const std::string path = set.substr(0, eq), text = set.substr(eq + 1);
    std::vector<std::string> names;
    for (std::size_t at = 0;;) {
      const auto dot = path.find('.', at);
      names.push_back(path.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
      const std::string& n = names.back();
      if (n.empty() || n.size() > 64 ||
          !std::all_of(n.begin(), n.end(), [](unsigned char ch) { return std::isalnum(ch) || ch == '_'; }))
        throw ConfigError("--set " + quoted(set) + ": " + quoted(path) +
                          " is not field names joined by dots");
      if (dot == std::string::npos) break;
      at = dot + 1;
    }
    if (text.size() > kMaxPathBytes)
      throw ConfigError("--set " + clean(path) + ": the value is longer than " +
                        show(kMaxPathBytes) + " bytes");
    check_nesting(text);
    YAML::Node value;
    try {
      value = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw ConfigError("--set " + clean(path) + ": " + quoted(text) + " is not a YAML value: " +
                        e.what());
    }
    // Mappings are reference-like in yaml-cpp: `node` walks the tree and writes into it.
    YAML::Node node = root;
    std::string where;
    for (std::size_t i = 0; i + 1 < names.size(); ++i) {
      where = join(where, names[i]);
      const YAML::Node next = node[names[i]];
      if (!next || next.IsNull())
        node[names[i]] = YAML::Node(YAML::NodeType::Map);
      else if (!next.IsMap())
        throw ConfigError("--set " + clean(path) + ": " + where +
                          " is not a mapping of fields, it is " + quoted(YAML::Dump(next)));
      node.reset(node[names[i]]);
    }
    node[names.back()] = value;
  }
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

double training_flops_per_token(const ModelConfig& m, std::int64_t parameters) {
  return 6.0 * double(parameters) + 12.0 * m.layers * double(m.d_model) * m.context;
}

double peak_flops(const std::string& device, Precision precision) {
  if (const char* env = std::getenv("LOCO_PEAK_TFLOPS")) {
    char* end = nullptr;
    const double t = std::strtod(env, &end);
    if (end != env && *end == '\0' && std::isfinite(t) && t > 0) return t * 1e12;
  }
  struct Peak {
    const char* name;  // matched in order: the first that `device` contains
    double bf16, fp32;
  };
  static constexpr Peak kPeaks[] = {
      {"H100 PCIe", 756e12, 51.2e12}, {"H100", 989.4e12, 66.9e12}, {"H200", 989.4e12, 66.9e12},
      {"H800", 989.4e12, 66.9e12},    {"A100", 312e12, 19.5e12},   {"A800", 312e12, 19.5e12},
      {"L40S", 362e12, 91.6e12},      {"L4", 121e12, 30.3e12},     {"A10", 125e12, 31.2e12},
  };
  for (const Peak& p : kPeaks)
    if (device.find(p.name) != std::string::npos)
      return precision == Precision::bf16 ? p.bf16 : p.fp32;
  return 0;
}

std::string model_difference(const ModelConfig& a, const ModelConfig& b) {
  // Through the job file's own emitter, so that every field (and any added later) is compared.
  JobConfig ja, jb;
  ja.model = a;
  jb.model = b;
  const YAML::Node ma = YAML::Load(ja.to_yaml())["model"], mb = YAML::Load(jb.to_yaml())["model"];
  for (const auto& kv : ma) {
    const auto key = kv.first.as<std::string>();
    if (key == "activation_checkpointing") continue;
    const std::string va = YAML::Dump(kv.second), vb = YAML::Dump(mb[key]);
    if (va != vb) return "model." + key + " (" + va + " against " + vb + ")";
  }
  return "";
}

}  // namespace loco::diloco
