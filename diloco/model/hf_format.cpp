#include "diloco/model/hf_format.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "diloco/data/data.hpp"
#include "diloco/model/hf_config.hpp"

namespace loco::diloco {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<ParamSpec> parameter_layout(const ModelConfig& m, int vocab) {
  if (!m.hf.empty())
    throw std::logic_error("model.hf " + m.hf + " is not resolved (resolve_hf_model first)");
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
      if (m.qkv_bias()) add(b + "attn.qkv.bias", {q + 2 * kv});
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

// One HF tensor: rows [row0, row0 + rows) of a loco parameter (of a 1-D one: entries),
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
      if (m.qkv_bias()) {
        add(h + "self_attn.q_proj.bias", b + "attn.qkv.bias", false, 0, q);
        add(h + "self_attn.k_proj.bias", b + "attn.qkv.bias", false, q, kv);
        add(h + "self_attn.v_proj.bias", b + "attn.qkv.bias", false, q + kv, kv);
      }
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

// The HF tensor's shape, and its values from θ (export) or into θ (import). A 1-D parameter
// is a column: its pieces are runs of entries.
std::int64_t piece_rows(const Piece& p, const ParamSpec& s) {
  return p.rows < 0 ? s.shape[0] : p.rows;
}
std::int64_t columns(const ParamSpec& s) { return s.shape.size() == 1 ? 1 : s.shape[1]; }

std::vector<std::int64_t> piece_shape(const Piece& p, const ParamSpec& s) {
  const std::int64_t n = piece_rows(p, s);
  if (s.shape.size() == 1) return {n};
  const std::int64_t cols = columns(s);
  return p.transpose ? std::vector<std::int64_t>{cols, n} : std::vector<std::int64_t>{n, cols};
}

std::vector<float> take(const Piece& p, const ParamSpec& s, const float* theta) {
  const std::int64_t rows = piece_rows(p, s), cols = columns(s);
  const float* src = theta + s.offset + p.row0 * cols;
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(p.transpose ? c * rows + r : r * cols + c)] = src[r * cols + c];
  return out;
}

void put(const Piece& p, const ParamSpec& s, const std::vector<float>& values, float* theta) {
  const std::int64_t rows = piece_rows(p, s), cols = columns(s);
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
    f << hf::config_json(model, vocab, dtype).dump(2) << "\n";
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

// One weight file of a folder, and the tensors the index puts in it (none listed: a folder of
// one model.safetensors, whose tensors are whatever it holds).
struct WeightFile {
  std::string path;
  std::set<std::string> tensors;
};

// A shard's name as the index gives it: a plain file name inside the folder.
void check_shard_name(const std::string& index, const std::string& tensor,
                      const std::string& file) {
  const bool plain = !file.empty() && file.size() <= 255 && file != "." && file != ".." &&
                     file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                     std::none_of(file.begin(), file.end(),
                                  [](unsigned char ch) { return ch < 0x20 || ch == 0x7f; }) &&
                     file.ends_with(".safetensors");
  if (!plain)
    throw std::runtime_error(index + ": weight_map gives tensor " + tensor.substr(0, 200) +
                             " the file '" + file.substr(0, 200) +
                             "', which is not a *.safetensors file name inside the folder "
                             "(no '/', no '..')");
}

// The shards of model.safetensors.index.json: its weight_map, tensor -> file, file by file.
std::vector<WeightFile> index_files(const std::string& dir, const std::string& index) {
  const json c = hf::read_json_object(index, kMaxHfIndexBytes);
  if (!c.contains("weight_map") || !c["weight_map"].is_object() || c["weight_map"].empty())
    throw std::runtime_error(index + ": no weight_map (a mapping of tensor names to files)");
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [tensor, file] : c["weight_map"].items()) {
    if (!file.is_string())
      throw std::runtime_error(index + ": weight_map gives tensor " + tensor.substr(0, 200) +
                               " no file name");
    check_shard_name(index, tensor, file.get<std::string>());
    by_file[file.get<std::string>()].insert(tensor);
    if (by_file.size() > kMaxHfShards)
      throw std::runtime_error(index + ": more than " + std::to_string(kMaxHfShards) + " files");
  }
  std::vector<WeightFile> out;
  for (auto& [file, tensors] : by_file)
    out.push_back({hf::folder_file(dir, file), std::move(tensors)});
  return out;
}

// The folder's weight files: model.safetensors, else the shards of its index.
std::vector<WeightFile> weight_files(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / "model.safetensors", ec) || fs::is_symlink(d / "model.safetensors", ec))
    return {{hf::folder_file(dir, "model.safetensors"), {}}};
  if (!fs::exists(d / "model.safetensors.index.json", ec))
    throw std::runtime_error(dir +
                             ": no model.safetensors and no model.safetensors.index.json in "
                             "that folder");
  return index_files(dir, hf::folder_file(dir, "model.safetensors.index.json"));
}

// config.json against the job's model, and the weight files (not read).
std::vector<WeightFile> checked_folder(const std::string& dir, const ModelConfig& model,
                                       int vocab) {
  const HfModel folder = read_hf_config(dir);
  hf::compare(folder, model, vocab, (fs::path(dir) / "config.json").string(), nullptr);
  return weight_files(dir);
}

// A weight file's tensors, read whole, against what the index says it holds; GPT-2 files of
// older transformers renamed ("transformer." prefixed, the attention's causal-mask buffers
// dropped).
std::map<std::string, StTensor> read_weight_file(const WeightFile& w, bool gpt2) {
  auto file = read_safetensors(w.path);
  if (!w.tensors.empty()) {
    for (const auto& name : w.tensors)
      if (!file.count(name))
        throw std::runtime_error(w.path + ": no tensor " + name +
                                 ", which model.safetensors.index.json puts in this file");
    for (const auto& [name, t] : file)
      if (!w.tensors.count(name))
        throw std::runtime_error(w.path + ": tensor " + name +
                                 ", which model.safetensors.index.json does not put in this file");
  }
  if (!gpt2) return file;
  std::map<std::string, StTensor> named;
  for (auto& [name, t] : file) {
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
    const bool bare = name.rfind("transformer.", 0) != 0 && name != "lm_head.weight";
    named.emplace(bare ? "transformer." + name : name, std::move(t));
  }
  return named;
}

// "a, b, c and 4 more"
std::string first_names(const std::vector<std::string>& names) {
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 5) list += " and " + std::to_string(names.size() - 5) + " more";
  return list;
}

// What the weight files held, against the model: every piece once, nothing else.
struct ImportState {
  std::vector<float> theta;
  std::vector<bool> seen;             // by piece
  std::optional<StTensor> tied_head;  // lm_head.weight of a tied model, checked at the end
  std::vector<std::string> extra;     // tensors the model does not have
};

void take_file(std::map<std::string, StTensor>& file, const std::string& path,
               const std::vector<Piece>& pieces, const std::map<std::string, std::size_t>& by_name,
               const std::vector<ParamSpec>& layout, bool tied, ImportState& st) {
  for (auto& [name, t] : file) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (tied && name == "lm_head.weight" && !st.tied_head)
        st.tied_head = std::move(t);
      else
        st.extra.push_back(name);
      continue;
    }
    const Piece& p = pieces[it->second];
    const auto want = piece_shape(p, layout[p.param]);
    if (t.shape != want)
      throw std::runtime_error(path + ": tensor " + name + " has shape " + shape_text(t.shape) +
                               ", the job's model needs " + shape_text(want));
    if (st.seen[it->second])
      throw std::runtime_error(path + ": tensor " + name + " is in two of the folder's files");
    put(p, layout[p.param], t.values, st.theta.data());
    st.seen[it->second] = true;
  }
}

// The end of an import: nothing missing, a tied head equal to the embeddings, nothing extra.
void check_import(const std::string& dir, const std::vector<Piece>& pieces,
                  const std::vector<ParamSpec>& layout, const ImportState& st) {
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < pieces.size(); ++i)
    if (!st.seen[i]) missing.push_back(pieces[i].hf);
  if (!missing.empty())
    throw std::runtime_error(dir + ": missing " + std::to_string(missing.size()) +
                             " tensor(s) of the job's model: " + first_names(missing));
  if (st.tied_head) {
    // A tied model saved with its head: only the same values as the embeddings are accepted.
    const auto& wte = layout.front();
    if (st.tied_head->values.size() != static_cast<std::size_t>(wte.numel) ||
        !std::equal(st.tied_head->values.begin(), st.tied_head->values.end(),
                    st.theta.begin() + wte.offset))
      throw std::runtime_error(dir +
                               ": lm_head.weight differs from the embeddings, but "
                               "config.json ties them (tie_word_embeddings)");
  }
  if (!st.extra.empty())
    throw std::runtime_error(
        dir + ": " + std::to_string(st.extra.size()) +
        " tensor(s) that the job's model does not have: " + first_names(st.extra));
}

}  // namespace

void check_hf_folder(const std::string& dir, const ModelConfig& model, int vocab) {
  checked_folder(dir, model, vocab);
}

std::vector<float> import_hf(const std::string& dir, const ModelConfig& model, int vocab) {
  const auto files = checked_folder(dir, model, vocab);
  const auto layout = parameter_layout(model, vocab);
  const auto pieces = hf_pieces(model, layout);
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < pieces.size(); ++i) by_name[pieces[i].hf] = i;
  ImportState st;
  st.theta.assign(static_cast<std::size_t>(layout.back().offset + layout.back().numel), 0.f);
  st.seen.assign(pieces.size(), false);
  for (const WeightFile& w : files) {
    auto file = read_weight_file(w, model.arch == Arch::gpt2);
    take_file(file, w.path, pieces, by_name, layout, model.tied_embeddings, st);
  }
  const std::string where = files.size() == 1 ? files.front().path : dir;
  check_import(where, pieces, layout, st);
  return std::move(st.theta);
}

std::string hf_init_dir(const std::string& init) {
  return init.rfind("hf:", 0) == 0 ? init.substr(3) : std::string();
}

}  // namespace loco::diloco
