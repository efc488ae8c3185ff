#include "diloco/model/hf_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/bounded_json.hpp"

namespace loco::diloco::hf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A double as its shortest round-trip text, so that two values print alike only when equal.
// Plain digits where that reads well (100000, 0.00001), else the exponent form.
std::string number_text(double v) {
  char b[64];
  const bool plain = v == 0 || (std::abs(v) >= 1e-5 && std::abs(v) < 1e15);
  const auto r = plain ? std::to_chars(b, b + sizeof b, v, std::chars_format::fixed)
                       : std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}

// A value of a config.json as an error shows it: a string bare, anything else as JSON, cut.
std::string value_text(const json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20) ch = '?';
  return s.size() > 80 ? s.substr(0, 80) + "..." : s;
}

// The fields of one config.json (or of a mapping inside it, `prefix` naming it), read with the
// bounds and defaults transformers' config classes have; every error names the field.
class Fields {
 public:
  Fields(const json& node, std::string where, std::string prefix = "")
      : node_(node), where_(std::move(where)), prefix_(std::move(prefix)) {}

  bool has(const std::string& field) const {
    return node_.contains(field) && !node_[field].is_null();
  }
  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    throw ConfigError(where_ + ": " + prefix_ + field + ": " + value_text(node_[field]) + ": " +
                      why);
  }

  // An integer in [lo, hi]; absent or null: `fallback`, or an error when there is none.
  std::int64_t integer(const std::string& field, std::optional<std::int64_t> fallback,
                       std::int64_t lo, std::int64_t hi) const {
    if (!has(field)) {
      if (!fallback) throw ConfigError(where_ + ": " + prefix_ + field + " missing");
      return *fallback;
    }
    const json& v = node_[field];
    const bool integral = v.is_number_integer() ||
                          (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (!integral) refuse(field, "expected an integer");
    const double d = v.get<double>();
    if (d < double(lo) || d > double(hi))
      refuse(field,
             "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<std::int64_t>(d);
  }

  double number(const std::string& field, std::optional<double> fallback) const {
    if (!has(field)) {
      if (!fallback) throw ConfigError(where_ + ": " + prefix_ + field + " missing");
      return *fallback;
    }
    if (!node_[field].is_number() || !std::isfinite(node_[field].get<double>()))
      refuse(field, "expected a finite number");
    return node_[field].get<double>();
  }

  bool flag(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    if (!node_[field].is_boolean()) refuse(field, "expected true or false");
    return node_[field].get<bool>();
  }

  std::string text(const std::string& field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    if (!node_[field].is_string()) refuse(field, "expected a string");
    return node_[field].get<std::string>();
  }

  // A field that must keep transformers' default, `fine`, for loco to compute the same.
  void require_flag(const std::string& field, bool fine, const std::string& why) const {
    if (flag(field, fine) != fine) refuse(field, why);
  }

  const std::string& where() const { return where_; }

 private:
  const json& node_;
  std::string where_, prefix_;
};

constexpr int kMaxIntermediate = kMaxWidth * kMaxMlpRatio;

ModelConfig parse_gpt2(const Fields& f) {
  ModelConfig m;
  m.arch = Arch::gpt2;
  m.d_model = static_cast<int>(f.integer("n_embd", {}, 1, kMaxWidth));
  m.layers = static_cast<int>(f.integer("n_layer", {}, 1, kMaxLayers));
  m.heads = static_cast<int>(f.integer("n_head", {}, 1, kMaxHeads));
  m.context = static_cast<int>(f.integer("n_positions", {}, 1, kMaxContext));
  m.mlp_hidden =
      static_cast<int>(f.integer("n_inner", 4 * std::int64_t(m.d_model), 1, kMaxIntermediate));
  m.norm_eps = f.number("layer_norm_epsilon", 1e-5);
  m.tied_embeddings = f.flag("tie_word_embeddings", true);
  const std::string act = f.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    f.refuse("activation_function", "loco's gpt2 has the tanh GELU (gelu_new, gelu_pytorch_tanh)");
  f.require_flag("scale_attn_weights", true, "loco's attention scales by 1 / sqrt(head dim)");
  f.require_flag("scale_attn_by_inverse_layer_idx", false,
                 "loco's attention scales by 1 / sqrt(head dim) in every layer");
  return m;
}

// rope_scaling (older files; transformers 5 lets it win) or rope_parameters: the default
// rotary embedding or Llama 3's scaling, and the base.
void parse_rope(const Fields& f, const json& c, ModelConfig& m, int max_pos) {
  const bool old = f.has("rope_scaling");
  const std::string name = old ? "rope_scaling" : "rope_parameters";
  if (f.has(name) && !c[name].is_object()) f.refuse(name, "expected a mapping");
  const json r = f.has(name) ? c[name] : json::object();
  const Fields rf(r, f.where(), name + ".");
  for (const auto& [key, value] : r.items())
    if (value.is_object()) rf.refuse(key, "rotary parameters per layer type are not loco's");
  const std::string type_key = r.contains("rope_type") ? "rope_type" : "type";
  const std::string type = rf.text(type_key, "default");
  if (type != "default" && type != "llama3")
    rf.refuse(type_key, "loco computes the default rotary embedding and Llama 3's scaling only");
  m.rope_theta =
      rf.has("rope_theta") ? rf.number("rope_theta", {}) : f.number("rope_theta", 10000.0);
  for (const Fields* g : {&rf, &f})
    if (g->number("partial_rotary_factor", 1.0) != 1.0)
      g->refuse("partial_rotary_factor", "loco rotates whole heads");
  if (type != "llama3") return;
  RopeScaling& s = m.rope_scaling;
  s.llama3 = true;
  s.factor = rf.number("factor", {});
  s.low_freq_factor = rf.number("low_freq_factor", {});
  s.high_freq_factor = rf.number("high_freq_factor", {});
  // As transformers: a top-level original_max_position_embeddings first, then the mapping's,
  // then max_position_embeddings.
  const std::int64_t inner =
      rf.integer("original_max_position_embeddings", max_pos, 1, kMaxContext);
  s.original_context =
      static_cast<int>(f.integer("original_max_position_embeddings", inner, 1, kMaxContext));
}

// What transformers' Llama, Mistral and Qwen2 read beyond the shape, refused where loco would
// compute otherwise.
void parse_rotary_options(const Fields& f, const json& c, ModelConfig& m) {
  if (f.text("hidden_act", "silu") != "silu")
    f.refuse("hidden_act", "loco's MLP is SwiGLU with silu");
  if (f.number("attention_dropout", 0.0) != 0.0)
    f.refuse("attention_dropout", "loco's model has no dropout");
  f.require_flag("rope_interleaved", false, "loco rotates the halves of a head (rotate_half)");
  if (m.arch == Arch::llama) {
    f.require_flag("attention_bias", false,
                   "loco's llama has no attention biases (qwen2 has q, k and v's)");
    f.require_flag("mlp_bias", false, "loco's MLP has no biases");
  }
  if (m.arch == Arch::mistral)
    m.sliding_window = static_cast<int>(f.integer("sliding_window", 0, 1, kMaxContext));
  if (m.arch == Arch::qwen2) {
    // Qwen2's window applies from layer max_window_layers on, and only with use_sliding_window.
    f.require_flag("use_sliding_window", false, "loco's qwen2 attends to the whole context");
    if (f.has("layer_types") && c["layer_types"].is_array())
      for (std::size_t i = 0; i < c["layer_types"].size(); ++i)
        if (c["layer_types"][i] != "full_attention")
          throw ConfigError(f.where() + ": layer_types[" + std::to_string(i) +
                            "]: " + value_text(c["layer_types"][i]) +
                            ": loco's qwen2 attends to the whole context in every layer");
  }
}

// transformers' default max_position_embeddings of each family's config class.
int default_positions(Arch a) {
  return a == Arch::llama ? 2048 : a == Arch::mistral ? 131072 : 32768;
}

ModelConfig parse_rotary(const Fields& f, const json& c, Arch arch) {
  ModelConfig m;
  m.arch = arch;
  m.d_model = static_cast<int>(f.integer("hidden_size", {}, 1, kMaxWidth));
  m.layers = static_cast<int>(f.integer("num_hidden_layers", {}, 1, kMaxLayers));
  m.heads = static_cast<int>(f.integer("num_attention_heads", {}, 1, kMaxHeads));
  const int kv = static_cast<int>(f.integer("num_key_value_heads", m.heads, 1, kMaxHeads));
  m.kv_heads = kv == m.heads ? 0 : kv;
  m.mlp_hidden = static_cast<int>(f.integer("intermediate_size", {}, 1, kMaxIntermediate));
  // transformers: head_dim, or hidden_size // num_attention_heads.
  const int hd = static_cast<int>(f.integer("head_dim", m.d_model / m.heads, 1, kMaxWidth));
  m.explicit_head_dim = m.d_model % m.heads == 0 && hd == m.d_model / m.heads ? 0 : hd;
  m.norm_eps = f.number("rms_norm_eps", 1e-6);
  m.tied_embeddings = f.flag("tie_word_embeddings", false);
  const int max_pos = static_cast<int>(
      f.integer("max_position_embeddings", default_positions(arch), 1, kMaxContext));
  m.context = m.max_positions = max_pos;
  parse_rope(f, c, m, max_pos);
  parse_rotary_options(f, c, m);
  return m;
}

// One field that config.json and the job's model both give: the job file's name, config.json's
// and the value as each side has it.
struct Row {
  const char* job;
  const char* hf;
  std::function<std::string(const ModelConfig&, int vocab)> value;
};

std::string scaling_text(const RopeScaling& s) {
  if (!s.llama3) return "none";
  return "llama3 (factor " + number_text(s.factor) + ", low_freq_factor " +
         number_text(s.low_freq_factor) + ", high_freq_factor " + number_text(s.high_freq_factor) +
         ", original_max_position_embeddings " + std::to_string(s.original_context) + ")";
}

std::vector<Row> rows(Arch arch) {
  using M = const ModelConfig&;
  auto integer = [](int ModelConfig::*f) { return [f](M m, int) { return std::to_string(m.*f); }; };
  const bool gpt2 = arch == Arch::gpt2;
  std::vector<Row> out = {
      {"arch", "model_type", [](M m, int) { return std::string(to_string(m.arch)); }},
      {"vocab", "vocab_size", [](M, int v) { return std::to_string(v); }},
      {"d_model", gpt2 ? "n_embd" : "hidden_size", integer(&ModelConfig::d_model)},
      {"layers", gpt2 ? "n_layer" : "num_hidden_layers", integer(&ModelConfig::layers)},
      {"heads", gpt2 ? "n_head" : "num_attention_heads", integer(&ModelConfig::heads)},
      {"mlp_hidden", gpt2 ? "n_inner" : "intermediate_size",
       [](M m, int) { return std::to_string(m.mlp_width()); }},
      {"norm_eps", gpt2 ? "layer_norm_epsilon" : "rms_norm_eps",
       [](M m, int) { return number_text(m.norm_eps); }},
      {"tied_embeddings", "tie_word_embeddings",
       [](M m, int) { return std::string(m.tied_embeddings ? "true" : "false"); }},
  };
  if (gpt2) {
    out.push_back({"context", "n_positions", integer(&ModelConfig::context)});
    return out;
  }
  out.push_back({"kv_heads", "num_key_value_heads",
                 [](M m, int) { return std::to_string(m.kv_head_count()); }});
  out.push_back({"head_dim", "head_dim", [](M m, int) { return std::to_string(m.head_dim()); }});
  out.push_back({"rope_theta", "rope_theta", [](M m, int) { return number_text(m.rope_theta); }});
  out.push_back(
      {"rope_scaling", "rope_scaling", [](M m, int) { return scaling_text(m.rope_scaling); }});
  out.push_back({"sliding_window", "sliding_window", integer(&ModelConfig::sliding_window)});
  return out;
}

bool wanted(const std::vector<std::string>* only, const std::string& field) {
  return !only || std::find(only->begin(), only->end(), field) != only->end();
}

// `given`: the job file gave the field beside model.hf (resolve_hf_model), rather than the
// whole model (an init: hf:DIR of exactly the job's model).
[[noreturn]] void differ(const std::string& where, const std::string& hf, const std::string& got,
                         const std::string& job, const std::string& want, bool given) {
  throw ConfigError(where + ": " + hf + " is " + got + ", but the job's model." + job + " is " +
                    want +
                    (given ? " (leave model." + job + " out of the job file to take the folder's)"
                           : " (the job file's model must describe the model in " + where + ")"));
}

}  // namespace

std::string folder_file(const std::string& dir, const std::string& name) {
  const fs::path p = fs::path(dir) / name;
  std::error_code ec;
  if (fs::is_symlink(p, ec))
    throw std::runtime_error(p.string() +
                             " is a symbolic link, which could leave the node's data root: "
                             "copy the file into the folder");
  if (!fs::is_regular_file(p, ec))
    throw std::runtime_error(dir + ": no " + name + " in that folder (or not a file)");
  return p.string();
}

json read_json_object(const std::string& path, std::uintmax_t max_bytes) {
  const std::string text = read_bounded(path, max_bytes);
  const json c = parse_bounded_json(text, path);
  if (!c.is_object()) throw std::runtime_error(path + ": not a JSON object");
  return c;
}

HfModel parse_config(const json& c, const std::string& where) {
  const Fields f(c, where);
  const std::string type = f.text("model_type", "");
  if (type.empty()) throw ConfigError(where + ": model_type missing");
  HfModel out;
  if (type == "gpt2")
    out.model = parse_gpt2(f);
  else if (type == "llama")
    out.model = parse_rotary(f, c, Arch::llama);
  else if (type == "mistral")
    out.model = parse_rotary(f, c, Arch::mistral);
  else if (type == "qwen2")
    out.model = parse_rotary(f, c, Arch::qwen2);
  else
    f.refuse("model_type",
             "loco reads gpt2, llama (Llama 2 and 3, SmolLM, SmolLM2), mistral and qwen2 "
             "(Qwen2, Qwen2.5)");
  out.vocab = static_cast<int>(f.integer("vocab_size", {}, 1, kMaxVocab));
  return out;
}

void compare(const HfModel& folder, const ModelConfig& job, int vocab, const std::string& where,
             const std::vector<std::string>* only) {
  const ModelConfig& m = folder.model;
  for (const Row& r : rows(m.arch)) {
    // gpt2's MLP width is mlp_hidden, or mlp_ratio × d_model.
    const bool ratio =
        !m.rotary() && std::string(r.job) == "mlp_hidden" && wanted(only, "mlp_ratio");
    if (!wanted(only, r.job) && !ratio) continue;
    const std::string got = r.value(m, folder.vocab), want = r.value(job, vocab);
    if (got != want) differ(where, r.hf, got, r.job, want, only != nullptr);
  }
  if (!m.rotary()) return;
  // Rotary positions extend to any length: the job's context needs only to fit.
  if (wanted(only, "context") && job.context > m.max_positions)
    differ(where, "max_position_embeddings", std::to_string(m.max_positions), "context",
           std::to_string(job.context) + " (more than the model was made for)", only != nullptr);
  if (job.max_positions != 0 && job.max_positions != m.max_positions)
    differ(where, "max_position_embeddings", std::to_string(m.max_positions), "max_positions",
           std::to_string(job.max_positions), only != nullptr);
}

namespace {

json rope_parameters(const ModelConfig& m) {
  json r = {{"rope_type", m.rope_scaling.llama3 ? "llama3" : "default"},
            {"rope_theta", m.rope_theta}};
  if (!m.rope_scaling.llama3) return r;
  r["factor"] = m.rope_scaling.factor;
  r["low_freq_factor"] = m.rope_scaling.low_freq_factor;
  r["high_freq_factor"] = m.rope_scaling.high_freq_factor;
  r["original_max_position_embeddings"] = m.rope_scaling.original_context;
  return r;
}

json gpt2_json(const ModelConfig& m, int vocab) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", vocab},
          {"n_positions", m.context},
          {"n_embd", m.d_model},
          {"n_layer", m.layers},
          {"n_head", m.heads},
          {"n_inner", m.mlp_width()},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", m.norm_eps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", m.tied_embeddings}};
}

json rotary_json(const ModelConfig& m, int vocab) {
  static const char* kClass[] = {"", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
  json c = {{"architectures", {kClass[static_cast<int>(m.arch)]}},
            {"model_type", to_string(m.arch)},
            {"vocab_size", vocab},
            {"hidden_size", m.d_model},
            {"intermediate_size", m.mlp_width()},
            {"num_hidden_layers", m.layers},
            {"num_attention_heads", m.heads},
            {"num_key_value_heads", m.kv_head_count()},
            {"head_dim", m.head_dim()},
            {"max_position_embeddings", m.max_positions > 0 ? m.max_positions : m.context},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_parameters", rope_parameters(m)},
            {"hidden_act", "silu"},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", m.tied_embeddings}};
  if (m.rope_scaling.llama3) {
    // transformers 4 reads rope_scaling (and rope_theta beside it); 5 takes it over
    // rope_parameters and adds the base.
    c["rope_scaling"] = rope_parameters(m);
    c["rope_scaling"].erase("rope_theta");
  }
  if (m.arch == Arch::llama) c["attention_bias"] = false, c["mlp_bias"] = false;
  if (m.arch == Arch::mistral)
    c["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr);
  if (m.arch == Arch::qwen2)
    c["use_sliding_window"] = false, c["sliding_window"] = nullptr,
    c["max_window_layers"] = m.layers;
  return c;
}

}  // namespace

json config_json(const ModelConfig& m, int vocab, StDtype dtype) {
  json c = m.rotary() ? rotary_json(m, vocab) : gpt2_json(m, vocab);
  const char* dt = dtype == StDtype::bf16 ? "bfloat16" : "float32";
  c["torch_dtype"] = dt;
  c["dtype"] = dt;
  return c;
}

}  // namespace loco::diloco::hf

namespace loco::diloco {

HfModel read_hf_config(const std::string& dir) {
  const std::string path = hf::folder_file(dir, "config.json");
  return hf::parse_config(hf::read_json_object(path, kMaxJobFileBytes), path);
}

namespace {

// The fields of `given` that compare() does not cover: the same as the folder's, as the job
// file writes them.
void compare_rest(const ModelConfig& job, const ModelConfig& folder,
                  const std::vector<std::string>& given, const std::string& where) {
  static const std::set<std::string> covered = {
      "arch",          "vocab",        "d_model",
      "layers",        "heads",        "mlp_hidden",
      "mlp_ratio",     "norm_eps",     "tied_embeddings",
      "context",       "kv_heads",     "head_dim",
      "rope_theta",    "rope_scaling", "sliding_window",
      "max_positions", "hf",           "activation_checkpointing"};
  const auto mine = model_fields(job), theirs = model_fields(folder);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const std::string& name = mine[i].first;
    if (covered.count(name) || std::find(given.begin(), given.end(), name) == given.end() ||
        mine[i].second == theirs[i].second)
      continue;
    throw ConfigError("model." + name + ": " + mine[i].second + " in the job file, but " + where +
                      " gives " + theirs[i].second + " (leave it out to take the folder's)");
  }
}

}  // namespace

void resolve_hf_model(JobConfig& job, const std::string& dir) {
  const std::string where = (std::filesystem::path(dir) / "config.json").string();
  HfModel f;
  try {
    f = read_hf_config(dir);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::runtime_error& e) {  // the file: missing, a link, too large, not JSON
    throw ConfigError("model.hf: " + std::string(e.what()));
  }
  ModelConfig m = f.model;
  m.vocab = f.vocab;
  const auto& given = job.model_given;
  const bool has_context = std::find(given.begin(), given.end(), "context") != given.end();
  if (has_context) m.context = job.model.context;
  hf::compare(f, job.model, job.model.vocab, where, &given);
  compare_rest(job.model, m, given, where);
  m.activation_checkpointing = job.model.activation_checkpointing;
  if (job.init.empty()) job.init = "hf:" + job.model.hf;
  job.model = m;
  try {
    job.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(where + " gives a model this job cannot run: " + e.what());
  }
}

}  // namespace loco::diloco
