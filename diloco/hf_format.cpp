#include "diloco/hf_format.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "diloco/data.hpp"

namespace loco::diloco {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<ParamSpec> parameter_layout(const ModelConfig& m, int vocab) {
  std::vector<ParamSpec> out;
  std::int64_t at = 0;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back({std::move(name), std::move(shape), at, n});
    at += n;
  };
  const std::int64_t d = m.d_model, v = vocab, mlp = m.mlp_width();
  const bool gpt2 = m.arch == Arch::gpt2;
  add("wte.weight", {v, d});
  if (gpt2) add("wpe.weight", {m.context, d});
  for (int i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    if (gpt2) {
      add(b + "ln1.weight", {d});
      add(b + "ln1.bias", {d});
      add(b + "attn.qkv.weight", {3 * d, d});
      add(b + "attn.qkv.bias", {3 * d});
      add(b + "attn.proj.weight", {d, d});
      add(b + "attn.proj.bias", {d});
      add(b + "ln2.weight", {d});
      add(b + "ln2.bias", {d});
      add(b + "fc.weight", {mlp, d});
      add(b + "fc.bias", {mlp});
      add(b + "fc_proj.weight", {d, mlp});
      add(b + "fc_proj.bias", {d});
    } else {
      const std::int64_t q = static_cast<std::int64_t>(m.heads) * m.head_dim();
      const std::int64_t kv = static_cast<std::int64_t>(m.kv_head_count()) * m.head_dim();
      add(b + "ln1.weight", {d});
      add(b + "attn.qkv.weight", {q + 2 * kv, d});
      add(b + "attn.proj.weight", {d, q});
      add(b + "ln2.weight", {d});
      add(b + "fc.weight", {2 * mlp, d});
      add(b + "fc_proj.weight", {d, mlp});
    }
  }
  add("ln_f.weight", {d});
  if (gpt2) add("ln_f.bias", {d});
  if (!m.tied_embeddings) add("lm_head.weight", {v, d});
  return out;
}

namespace {

// One HF tensor: rows [row0, row0 + rows) of a loco parameter (all of a 1-D one),
// transposed for GPT-2's Conv1D.
struct Piece {
  std::string hf;
  std::size_t param;
  std::int64_t row0 = 0, rows = -1;  // -1: all rows
  bool transpose = false;
};

std::vector<Piece> hf_pieces(const ModelConfig& m, const std::vector<ParamSpec>& layout) {
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < layout.size(); ++i) index[layout[i].name] = i;
  std::vector<Piece> out;
  auto add = [&](std::string hf, const std::string& loco, bool transpose = false,
                 std::int64_t row0 = 0, std::int64_t rows = -1) {
    out.push_back({std::move(hf), index.at(loco), row0, rows, transpose});
  };
  if (m.arch == Arch::gpt2) {
    add("transformer.wte.weight", "wte.weight");
    add("transformer.wpe.weight", "wpe.weight");
    for (int i = 0; i < m.layers; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      const std::string h = "transformer.h." + std::to_string(i) + ".";
      add(h + "ln_1.weight", b + "ln1.weight");
      add(h + "ln_1.bias", b + "ln1.bias");
      add(h + "attn.c_attn.weight", b + "attn.qkv.weight", true);
      add(h + "attn.c_attn.bias", b + "attn.qkv.bias");
      add(h + "attn.c_proj.weight", b + "attn.proj.weight", true);
      add(h + "attn.c_proj.bias", b + "attn.proj.bias");
      add(h + "ln_2.weight", b + "ln2.weight");
      add(h + "ln_2.bias", b + "ln2.bias");
      add(h + "mlp.c_fc.weight", b + "fc.weight", true);
      add(h + "mlp.c_fc.bias", b + "fc.bias");
      add(h + "mlp.c_proj.weight", b + "fc_proj.weight", true);
      add(h + "mlp.c_proj.bias", b + "fc_proj.bias");
    }
    add("transformer.ln_f.weight", "ln_f.weight");
    add("transformer.ln_f.bias", "ln_f.bias");
  } else {
    const std::int64_t q = static_cast<std::int64_t>(m.heads) * m.head_dim();
    const std::int64_t kv = static_cast<std::int64_t>(m.kv_head_count()) * m.head_dim();
    const std::int64_t mlp = m.mlp_width();
    add("model.embed_tokens.weight", "wte.weight");
    for (int i = 0; i < m.layers; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      const std::string h = "model.layers." + std::to_string(i) + ".";
      add(h + "input_layernorm.weight", b + "ln1.weight");
      add(h + "self_attn.q_proj.weight", b + "attn.qkv.weight", false, 0, q);
      add(h + "self_attn.k_proj.weight", b + "attn.qkv.weight", false, q, kv);
      add(h + "self_attn.v_proj.weight", b + "attn.qkv.weight", false, q + kv, kv);
      add(h + "self_attn.o_proj.weight", b + "attn.proj.weight");
      add(h + "post_attention_layernorm.weight", b + "ln2.weight");
      add(h + "mlp.gate_proj.weight", b + "fc.weight", false, 0, mlp);
      add(h + "mlp.up_proj.weight", b + "fc.weight", false, mlp, mlp);
      add(h + "mlp.down_proj.weight", b + "fc_proj.weight");
    }
    add("model.norm.weight", "ln_f.weight");
  }
  if (!m.tied_embeddings) add("lm_head.weight", "lm_head.weight");
  return out;
}

// The HF tensor's shape, and its values from θ (export) or into θ (import).
std::vector<std::int64_t> piece_shape(const Piece& p, const ParamSpec& s) {
  if (s.shape.size() == 1) return s.shape;
  const std::int64_t rows = p.rows < 0 ? s.shape[0] : p.rows, cols = s.shape[1];
  return p.transpose ? std::vector<std::int64_t>{cols, rows}
                     : std::vector<std::int64_t>{rows, cols};
}

std::vector<float> take(const Piece& p, const ParamSpec& s, const float* theta) {
  if (s.shape.size() == 1) return {theta + s.offset, theta + s.offset + s.numel};
  const std::int64_t rows = p.rows < 0 ? s.shape[0] : p.rows, cols = s.shape[1];
  const float* src = theta + s.offset + p.row0 * cols;
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(p.transpose ? c * rows + r : r * cols + c)] = src[r * cols + c];
  return out;
}

void put(const Piece& p, const ParamSpec& s, const std::vector<float>& values, float* theta) {
  if (s.shape.size() == 1) {
    std::copy(values.begin(), values.end(), theta + s.offset);
    return;
  }
  const std::int64_t rows = p.rows < 0 ? s.shape[0] : p.rows, cols = s.shape[1];
  float* dst = theta + s.offset + p.row0 * cols;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      dst[r * cols + c] =
          values[static_cast<std::size_t>(p.transpose ? c * rows + r : r * cols + c)];
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

json hf_config(const ModelConfig& m, int vocab, StDtype dtype) {
  const char* dt = dtype == StDtype::bf16 ? "bfloat16" : "float32";
  if (m.arch == Arch::gpt2)
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
            {"tie_word_embeddings", m.tied_embeddings},
            {"torch_dtype", dt},
            {"dtype", dt}};
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", vocab},
          {"hidden_size", m.d_model},
          {"intermediate_size", m.mlp_width()},
          {"num_hidden_layers", m.layers},
          {"num_attention_heads", m.heads},
          {"num_key_value_heads", m.kv_head_count()},
          {"head_dim", m.head_dim()},
          {"max_position_embeddings", m.context},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", m.rope_theta}}},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"tie_word_embeddings", m.tied_embeddings},
          {"torch_dtype", dt},
          {"dtype", dt}};
}

// config.json of `where` against the job's model, field by field.
void check_hf_config(const json& c, const ModelConfig& m, int vocab, const std::string& where) {
  auto differ = [&](const std::string& field, const std::string& got, const std::string& job_field,
                    const std::string& want) {
    throw ConfigError(where + ": " + field + " is " + got + ", but the job's " + job_field +
                      " is " + want + " (the job file's model must describe the model in " + where +
                      ")");
  };
  auto integer = [&](const std::string& field, std::int64_t want, const std::string& job_field,
                     std::optional<std::int64_t> fallback = std::nullopt) {
    std::int64_t got;
    if (c.contains(field) && c[field].is_number_integer()) {
      got = c[field].get<std::int64_t>();
    } else if ((!c.contains(field) || c[field].is_null()) && fallback) {
      got = *fallback;
    } else {
      throw ConfigError(where + ": " + field + " missing or not an integer (" +
                        (c.contains(field) ? c[field].dump() : "absent") + ")");
    }
    if (got != want) differ(field, std::to_string(got), job_field, std::to_string(want));
  };
  auto number = [&](const json& node, const std::string& field, double want,
                    const std::string& job_field, std::optional<double> fallback) {
    double got;
    if (node.contains(field) && node[field].is_number()) {
      got = node[field].get<double>();
    } else if ((!node.contains(field) || node[field].is_null()) && fallback) {
      got = *fallback;
    } else {
      throw ConfigError(where + ": " + field + " missing or not a number");
    }
    std::ostringstream g, w;
    g << got;
    w << want;
    if (got != want) differ(field, g.str(), job_field, w.str());
  };
  auto boolean = [&](const std::string& field, bool want, const std::string& job_field,
                     bool fallback) {
    const bool got = c.contains(field) && c[field].is_boolean() ? c[field].get<bool>() : fallback;
    if (got != want) differ(field, got ? "true" : "false", job_field, want ? "true" : "false");
  };
  auto text = [&](const std::string& field, const std::set<std::string>& allowed,
                  const std::string& fallback) {
    const std::string got =
        c.contains(field) && c[field].is_string() ? c[field].get<std::string>() : fallback;
    if (!allowed.count(got)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : " or ") + a;
      throw ConfigError(where + ": " + field + " is '" + got + "', loco's model has " + list);
    }
  };
  const std::string type = c.contains("model_type") && c["model_type"].is_string()
                               ? c["model_type"].get<std::string>()
                               : "(none)";
  if (type != to_string(m.arch)) differ("model_type", type, "model.arch", to_string(m.arch));
  integer("vocab_size", vocab, "vocabulary (model.vocab or the tokenizer's)");
  if (m.arch == Arch::gpt2) {
    integer("n_embd", m.d_model, "model.d_model");
    integer("n_layer", m.layers, "model.layers");
    integer("n_head", m.heads, "model.heads");
    integer("n_positions", m.context, "model.context");
    integer("n_inner", m.mlp_width(), "MLP width (model.mlp_hidden, or mlp_ratio × d_model)",
            4 * static_cast<std::int64_t>(m.d_model));
    number(c, "layer_norm_epsilon", m.norm_eps, "model.norm_eps", 1e-5);
    text("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "gelu_new");
    boolean("tie_word_embeddings", m.tied_embeddings, "model.tied_embeddings", true);
    boolean("scale_attn_by_inverse_layer_idx", false, "attention scale (1 / sqrt(head dim))",
            false);
    boolean("scale_attn_weights", true, "attention scale (1 / sqrt(head dim))", true);
    return;
  }
  integer("hidden_size", m.d_model, "model.d_model");
  integer("num_hidden_layers", m.layers, "model.layers");
  integer("num_attention_heads", m.heads, "model.heads");
  integer("num_key_value_heads", m.kv_head_count(), "model.kv_heads", m.heads);
  integer("intermediate_size", m.mlp_width(), "MLP width (model.mlp_hidden or Llama's rule)");
  integer("head_dim", m.head_dim(), "model.d_model / model.heads", m.head_dim());
  number(c, "rms_norm_eps", m.norm_eps, "model.norm_eps", 1e-6);
  // Rotary positions extend to any length: the job's context needs only to fit.
  if (c.contains("max_position_embeddings") && c["max_position_embeddings"].is_number_integer() &&
      c["max_position_embeddings"].get<std::int64_t>() < m.context)
    differ("max_position_embeddings", c["max_position_embeddings"].dump(), "model.context",
           std::to_string(m.context) + " (more than the model was made for)");
  const json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object()
                        ? c["rope_parameters"]
                        : json::object();
  if (rope.contains("rope_type") && rope["rope_type"] != "default")
    throw ConfigError(where + ": rope_parameters.rope_type " + rope["rope_type"].dump() +
                      ": loco's llama has the default rotary embedding only");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    throw ConfigError(where + ": rope_scaling " + c["rope_scaling"].dump() +
                      ": loco's llama has the default rotary embedding only");
  number(rope.contains("rope_theta") ? rope : c, "rope_theta", m.rope_theta, "model.rope_theta",
         10000.0);
  text("hidden_act", {"silu"}, "silu");
  boolean("attention_bias", false, "attention (no biases)", false);
  boolean("mlp_bias", false, "MLP (no biases)", false);
  boolean("tie_word_embeddings", m.tied_embeddings, "model.tied_embeddings", false);
}

}  // namespace

void export_hf(const ModelConfig& model, int vocab, const float* theta, std::size_t n,
               const std::string& dir, StDtype dtype, bool force) {
  const auto layout = parameter_layout(model, vocab);
  const auto total = static_cast<std::size_t>(layout.back().offset + layout.back().numel);
  if (n != total)
    throw std::runtime_error("export: θ has " + std::to_string(n) + " values, the model " +
                             std::to_string(total) + " (checkpoint and config disagree?)");
  const fs::path out = fs::path(dir).lexically_normal();
  if (out.empty() || out.filename().empty())
    throw std::runtime_error("export: --out '" + dir + "' is not a folder name");
  std::error_code ec;
  if (fs::exists(out) && !fs::is_directory(out))
    throw std::runtime_error("export: " + out.string() + " exists and is not a folder");
  if (fs::exists(out) && !fs::is_empty(out) && !force)
    throw std::runtime_error("export: " + out.string() +
                             " exists and is not empty (--force replaces it)");
  std::vector<std::pair<std::string, StTensor>> tensors;
  for (const auto& p : hf_pieces(model, layout)) {
    const auto& s = layout[p.param];
    StTensor t;
    t.shape = piece_shape(p, s);
    t.values = take(p, s, theta);
    tensors.emplace_back(p.hf, std::move(t));
  }
  // Written beside `out` and renamed, so that `out` is never half-written.
  const fs::path tmp = out.string() + ".tmp-export";
  remove_tree(tmp.string());  // not fs::remove_all: data.hpp says why
  fs::create_directories(tmp);
  write_safetensors((tmp / "model.safetensors").string(), tensors, dtype);
  {
    std::ofstream f(tmp / "config.json", std::ios::trunc);
    f << hf_config(model, vocab, dtype).dump(2) << "\n";
    if (!f.flush())
      throw std::runtime_error("export: cannot write " + (tmp / "config.json").string());
  }
  if (fs::exists(out)) remove_tree(out.string());
  fs::rename(tmp, out, ec);
  if (ec)
    throw std::runtime_error("export: cannot rename " + tmp.string() + " to " + out.string() +
                             ": " + ec.message());
}

namespace {

// DIR/config.json, checked against the job's model; returns DIR/model.safetensors.
std::string checked_folder(const std::string& dir, const ModelConfig& model, int vocab) {
  const fs::path d(dir);
  const std::string cfg_path = (d / "config.json").string();
  json c;
  {
    std::ifstream f(cfg_path);
    if (!f) throw std::runtime_error("hf:" + dir + ": no config.json in that folder");
    std::stringstream ss;
    ss << f.rdbuf();
    if (ss.str().size() > kMaxJobFileBytes)
      throw std::runtime_error(cfg_path + ": larger than " + std::to_string(kMaxJobFileBytes) +
                               " bytes");
    try {
      c = json::parse(ss.str());
    } catch (const json::exception& e) {
      throw std::runtime_error(cfg_path + ": not JSON (" + e.what() + ")");
    }
    if (!c.is_object()) throw std::runtime_error(cfg_path + ": not a JSON object");
  }
  check_hf_config(c, model, vocab, cfg_path);
  const std::string st_path = (d / "model.safetensors").string();
  if (!fs::is_regular_file(st_path))
    throw std::runtime_error("hf:" + dir +
                             ": no model.safetensors in that folder (a sharded "
                             "model.safetensors.index.json is not supported)");
  return st_path;
}

}  // namespace

void check_hf_folder(const std::string& dir, const ModelConfig& model, int vocab) {
  checked_folder(dir, model, vocab);
}

std::vector<float> import_hf(const std::string& dir, const ModelConfig& model, int vocab) {
  const std::string st_path = checked_folder(dir, model, vocab);
  auto file = read_safetensors(st_path);
  const bool gpt2 = model.arch == Arch::gpt2;
  if (gpt2) {
    // Older GPT-2 files: names without "transformer.", and the attention's causal-mask buffers.
    std::map<std::string, StTensor> named;
    for (auto& [name, t] : file) {
      if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
      const bool bare = name.rfind("transformer.", 0) != 0 && name != "lm_head.weight";
      named.emplace(bare ? "transformer." + name : name, std::move(t));
    }
    file = std::move(named);
  }
  const auto layout = parameter_layout(model, vocab);
  std::vector<float> theta(static_cast<std::size_t>(layout.back().offset + layout.back().numel));
  std::vector<std::string> missing;
  for (const auto& p : hf_pieces(model, layout)) {
    const auto& s = layout[p.param];
    auto it = file.find(p.hf);
    if (it == file.end()) {
      missing.push_back(p.hf);
      continue;
    }
    const auto want = piece_shape(p, s);
    if (it->second.shape != want)
      throw std::runtime_error(st_path + ": tensor " + p.hf + " has shape " +
                               shape_text(it->second.shape) + ", the job's model needs " +
                               shape_text(want));
    put(p, s, it->second.values, theta.data());
    file.erase(it);
  }
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += " and " + std::to_string(missing.size() - 5) + " more";
    throw std::runtime_error(st_path + ": missing " + std::to_string(missing.size()) +
                             " tensor(s) of the job's model: " + list);
  }
  if (model.tied_embeddings && file.count("lm_head.weight")) {
    // A tied model saved with its head: only the same values as the embeddings are accepted.
    const auto& head = file.at("lm_head.weight").values;
    const auto& wte = layout.front();
    if (head.size() != static_cast<std::size_t>(wte.numel) ||
        !std::equal(head.begin(), head.end(), theta.begin() + wte.offset))
      throw std::runtime_error(st_path +
                               ": lm_head.weight differs from the embeddings, but "
                               "config.json ties them (tie_word_embeddings)");
    file.erase("lm_head.weight");
  }
  if (!file.empty()) {
    std::string list;
    std::size_t i = 0;
    for (const auto& [name, t] : file) {
      if (i++ == 5) break;
      list += (list.empty() ? "" : ", ") + name;
    }
    if (file.size() > 5) list += " and " + std::to_string(file.size() - 5) + " more";
    throw std::runtime_error(st_path + ": " + std::to_string(file.size()) +
                             " tensor(s) that the job's model does not have: " + list);
  }
  return theta;
}

std::string hf_init_dir(const std::string& init) {
  return init.rfind("hf:", 0) == 0 ? init.substr(3) : std::string();
}

}  // namespace loco::diloco
