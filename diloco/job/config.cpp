#include "diloco/job/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "diloco/job/codec_choice.hpp"
#include "diloco/job/memory.hpp"
#include "runtime/collective/sparse.hpp"

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
  // `compression: X` or `compression: {kind: X}`: the kinds a mapping also takes.
  throw ConfigError((key == "kind" ? "compression.kind" : key) + ": expected one of " + allowed +
                    "|topk|auto (or a mapping with kind and settings: {kind: topk, k: 64}), got " +
                    quoted(s));
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

// The job file's fields, each declared once: its place (a section of the file or the top
// level), its name, how it is read and written, what it means, and the checks that concern it
// alone (a finite number, a range). read_fields, the unknown-field check, to_yaml and
// validate()'s single-field checks go through this table; `--set` writes any of its paths
// (with_overrides), which from_yaml then reads as the file's own. Rules between fields (a
// divisor of another, "needs sync.mode: streaming") stay in validate().
struct Field {
  const char* section;  // "" for the top level, else the mapping it is in
  const char* name;     // as written by to_yaml and named in errors (with the section)
  const char* help;
  // Reads the field under `key` (its name, or one of `also`) from its section's node, which
  // may be absent. Throws ConfigError.
  std::function<void(const YAML::Node& node, const std::string& where, const std::string& key,
                     JobConfig& c)>
      read;
  std::function<void(YAML::Emitter& out, const JobConfig& c)> write;  // the value
  std::function<bool(const JobConfig& c)> written;                    // empty: always
  // The names it is read under, in order, the last one present winning (model: width, then
  // d_model; data: dir, then path); empty: its name alone.
  std::vector<std::string> also;
  // The checks of the field alone: validate() runs them, those of every field, before the
  // rules between fields.
  std::function<void(const JobConfig& c, const std::string& path)> check;
};

std::string path_of(const Field& f) { return join(f.section, f.name); }

// A field of type T at `get(c)`.
template <class T, class Get>
Field plain(const char* section, const char* name, Get get, const char* help) {
  Field f{section, name, help, {}, {}, {}, {}, {}};
  f.read = [get](const YAML::Node& node, const std::string& where, const std::string& key,
                 JobConfig& c) { read(node, where, key, static_cast<T&>(get(c))); };
  f.write = [get](YAML::Emitter& out, const JobConfig& c) { out << get(c); };
  return f;
}

// `c.*m` and `c.*s.*m`, for const and non-const JobConfigs.
template <class T>
auto at(T JobConfig::*m) {
  return [m](auto& c) -> auto& { return c.*m; };
}
template <class S, class T>
auto at(S JobConfig::*s, T S::*m) {
  return [ s, m ](auto& c) -> auto& { return (c.*s).*m; };
}

// A number that must be finite (checked before the rules between fields: NaN fails every
// comparison, and +inf passes "> 0").
template <class Get>
Field finite(const char* section, const char* name, Get get, const char* help) {
  Field f = plain<double>(section, name, get, help);
  f.check = [get](const JobConfig& c, const std::string& path) { require_finite(get(c), path); };
  return f;
}

// An integer (or any number) that must be in [lo, hi]: "must be in [lo, hi], got v".
template <class T, class Get>
Field ranged(const char* section, const char* name, Get get, T lo, T hi, const char* help) {
  Field f = plain<T>(section, name, get, help);
  f.check = [get, lo, hi](const JobConfig& c, const std::string& path) {
    require_in(static_cast<T>(get(c)), lo, hi, path);
  };
  return f;
}

// One of `choices`, by name.
template <class E, std::size_t N, class Get>
Field choice(const char* section, const char* name, Get get,
             std::array<std::pair<const char*, E>, N> choices, const char* help) {
  Field f{section, name, help, {}, {}, {}, {}, {}};
  f.read = [get, choices](const YAML::Node& node, const std::string& where, const std::string& key,
                          JobConfig& c) {
    read_enum(node, where, key, static_cast<E&>(get(c)), choices);
  };
  f.write = [get, choices](YAML::Emitter& out, const JobConfig& c) {
    for (const auto& [n, v] : choices)
      if (v == get(c)) out << n;
  };
  return f;
}

Field with_alias(Field f, std::vector<std::string> also) {
  f.also = std::move(also);
  return f;
}
Field only_when(Field f, std::function<bool(const JobConfig&)> written) {
  f.written = std::move(written);
  return f;
}

// data.tokenizer: byte | bpe | the path of a tokenizer.json (kind json, the path beside it).
Field tokenizer_field() {
  Field f{"data", "tokenizer", "byte, bpe, or the path of a tokenizer.json", {}, {}, {}, {}, {}};
  f.read = [](const YAML::Node& d, const std::string& where, const std::string& key, JobConfig& c) {
    if (!d || !d[key]) return;
    std::string t;
    read(d, where, key, t);
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
  };
  f.write = [](YAML::Emitter& out, const JobConfig& c) {
    out << (c.data.tokenizer == TokenizerKind::byte  ? std::string("byte")
            : c.data.tokenizer == TokenizerKind::bpe ? std::string("bpe")
                                                     : c.data.tokenizer_json);
  };
  return f;
}

// inner.betas: AdamW's two, finite.
Field betas_field() {
  Field f{"inner", "betas", "AdamW's betas, [b1, b2]", {}, {}, {}, {}, {}};
  f.read = [](const YAML::Node& i, const std::string&, const std::string& key, JobConfig& c) {
    if (!i || !i[key]) return;
    const auto b = i[key];
    if (!b.IsSequence() || b.size() != 2)
      throw ConfigError("inner.betas: expected a list of two numbers, got " +
                        quoted(YAML::Dump(b)));
    try {
      c.inner.betas = {b[0].as<double>(), b[1].as<double>()};
    } catch (const YAML::Exception&) {
      throw ConfigError("inner.betas: expected a list of two numbers, got " +
                        quoted(YAML::Dump(b)));
    }
  };
  f.write = [](YAML::Emitter& out, const JobConfig& c) {
    out << YAML::Flow << YAML::BeginSeq << c.inner.betas[0] << c.inner.betas[1] << YAML::EndSeq;
  };
  f.check = [](const JobConfig& c, const std::string& path) {
    require_finite(c.inner.betas[0], path + "[0]");
    require_finite(c.inner.betas[1], path + "[1]");
  };
  return f;
}

// model.rope_scaling: {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}, config.json's names (RopeScaling). Any other rope_type is
// refused: loco computes no other scaling.
Field rope_scaling_field() {
  Field f{"model",
          "rope_scaling",
          "rotary archs: Llama 3's rope scaling, {rope_type: llama3, factor, low_freq_factor, "
          "high_freq_factor, original_max_position_embeddings}",
          {},
          {},
          {},
          {},
          {}};
  f.read = [](const YAML::Node& m, const std::string& where, const std::string& key, JobConfig& c) {
    if (!m || !m[key]) return;
    const YAML::Node node = m[key];
    const std::string path = join(where, key);
    check_keys(node, path,
               {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"});
    std::string type;
    read(node, path, "rope_type", type);
    if (type != "llama3")
      throw ConfigError(path +
                        ".rope_type: expected llama3 (the only rope scaling loco computes), "
                        "got " +
                        quoted(type));
    RopeScaling& r = c.model.rope_scaling;
    r.llama3 = true;
    read(node, path, "factor", r.factor);
    read(node, path, "low_freq_factor", r.low_freq_factor);
    read(node, path, "high_freq_factor", r.high_freq_factor);
    read(node, path, "original_max_position_embeddings", r.original_context);
  };
  f.write = [](YAML::Emitter& out, const JobConfig& c) {
    const RopeScaling& r = c.model.rope_scaling;
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "rope_type" << YAML::Value
        << (r.llama3 ? "llama3" : "none") << YAML::Key << "factor" << YAML::Value << r.factor
        << YAML::Key << "low_freq_factor" << YAML::Value << r.low_freq_factor << YAML::Key
        << "high_freq_factor" << YAML::Value << r.high_freq_factor << YAML::Key
        << "original_max_position_embeddings" << YAML::Value << r.original_context << YAML::EndMap;
  };
  f.written = [](const JobConfig& c) { return c.model.rope_scaling.llama3; };
  f.check = [](const JobConfig& c, const std::string& path) {
    const RopeScaling& r = c.model.rope_scaling;
    if (!r.llama3) return;
    require_finite(r.factor, path + ".factor");
    require_finite(r.low_freq_factor, path + ".low_freq_factor");
    require_finite(r.high_freq_factor, path + ".high_freq_factor");
    require(r.factor >= 1, path + ".factor", ">= 1", r.factor);
    require(r.low_freq_factor > 0, path + ".low_freq_factor", "> 0", r.low_freq_factor);
    require(r.high_freq_factor > r.low_freq_factor, path + ".high_freq_factor",
            "> low_freq_factor (" + show(r.low_freq_factor) + ")", r.high_freq_factor);
    require_in(r.original_context, 1, kMaxContext, path + ".original_max_position_embeddings");
  };
  return f;
}

// compression: a dense codec by its name (the collective's), auto, or a mapping with `kind`: a
// codec's name, topk with its settings (TopkConfig), or auto with its own (AutoCodecConfig) and
// the topk rungs' chunk, bits and error_feedback.
Field compression_field() {
  Field f{"",
          "compression",
          "the pseudo-gradients' numerics: fp32|fp16|bf16|int8|auto, or {kind: topk, chunk, k, "
          "bits, error_feedback, outer: sparseloco|nesterov, mean: members|senders}, or {kind: "
          "auto, share, margin, patience, sparse, start, feedback: flush|keep, chunk, bits, "
          "error_feedback}",
          {},
          {},
          {},
          {},
          {}};
  f.read = [](const YAML::Node& root, const std::string&, const std::string& key, JobConfig& c) {
    if (!root || !root[key]) return;
    const YAML::Node node = root[key];
    if (!node.IsMap()) {
      std::string name;
      read(root, "", key, name);
      c.topk.on = name == "topk";  // with its defaults
      c.autocodec.on = name == "auto";
      if (c.autocodec.on) c.topk.outer = OuterRule::nesterov;
      if (c.autocodec.on || c.topk.on)
        c.compression = collective::Codec::fp32;
      else
        read_codec(root, key, c.compression);
      return;
    }
    static const std::set<std::string> topk_fields = {"chunk", "k", "bits", "error_feedback",
                                                      "outer", "mean"};
    static const std::set<std::string> auto_fields = {
        "chunk", "bits", "error_feedback", "share", "margin", "patience", "sparse", "start",
        "feedback"};
    std::string kind;
    read(node, key, "kind", kind);
    for (const auto& kv : node) {
      const std::string name = kv.first.as<std::string>();
      if (name == "kind" || (kind == "topk" && topk_fields.count(name)) ||
          (kind == "auto" && auto_fields.count(name)))
        continue;
      if (topk_fields.count(name) || auto_fields.count(name))
        throw ConfigError(key + "." + name + ": not a field of kind " + quoted(kind) +
                          " (topk: chunk, k, bits, error_feedback, outer, mean; auto: share, "
                          "margin, patience, sparse, start, feedback, chunk, bits, "
                          "error_feedback)");
      throw ConfigError(key + "." + name + ": unknown field (kind, chunk, k, bits, " +
                        "error_feedback, outer, mean, share, margin, patience, sparse, start, "
                        "feedback)");
    }
    c.topk.on = kind == "topk";
    c.autocodec.on = kind == "auto";
    if (!c.topk.on && !c.autocodec.on) {
      read_codec(node, "kind", c.compression);
      return;
    }
    c.compression = collective::Codec::fp32;
    read(node, key, "chunk", c.topk.chunk);
    read(node, key, "bits", c.topk.bits);
    read(node, key, "error_feedback", c.topk.error_feedback);
    if (c.autocodec.on) {
      AutoCodecConfig& a = c.autocodec;
      c.topk.outer = OuterRule::nesterov;  // the job's outer step under every rung
      read(node, key, "share", a.share);
      read(node, key, "margin", a.margin);
      read(node, key, "patience", a.patience);
      read(node, key, "sparse", a.sparse);
      read(node, key, "start", a.start);
      read_enum(node, key, "feedback", a.flush,
                std::array<std::pair<const char*, bool>, 2>{{{"flush", true}, {"keep", false}}});
      return;
    }
    read(node, key, "k", c.topk.k);
    read_enum(node, key, "outer", c.topk.outer,
              std::array<std::pair<const char*, OuterRule>, 2>{
                  {{"sparseloco", OuterRule::sparseloco}, {"nesterov", OuterRule::nesterov}}});
    read_enum(node, key, "mean", c.topk.mean,
              std::array<std::pair<const char*, SparseMean>, 2>{
                  {{"members", SparseMean::members}, {"senders", SparseMean::senders}}});
  };
  f.write = [](YAML::Emitter& out, const JobConfig& c) {
    if (c.autocodec.on) {
      const AutoCodecConfig& a = c.autocodec;
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "kind" << YAML::Value << "auto"
          << YAML::Key << "share" << YAML::Value << a.share << YAML::Key << "margin"
          << YAML::Value << a.margin << YAML::Key << "patience" << YAML::Value << a.patience
          << YAML::Key << "sparse" << YAML::Value << a.sparse << YAML::Key << "start"
          << YAML::Value << a.start << YAML::Key << "feedback" << YAML::Value
          << (a.flush ? "flush" : "keep") << YAML::Key << "chunk" << YAML::Value << c.topk.chunk
          << YAML::Key << "bits" << YAML::Value << c.topk.bits << YAML::Key << "error_feedback"
          << YAML::Value << c.topk.error_feedback << YAML::EndMap;
      return;
    }
    if (!c.topk.on) {
      out << std::string(collective::to_string(c.compression));
      return;
    }
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "kind" << YAML::Value << "topk"
        << YAML::Key << "chunk" << YAML::Value << c.topk.chunk << YAML::Key << "k" << YAML::Value
        << c.topk.k << YAML::Key << "bits" << YAML::Value << c.topk.bits << YAML::Key
        << "error_feedback" << YAML::Value << c.topk.error_feedback << YAML::Key << "outer"
        << YAML::Value
        << (c.topk.outer == OuterRule::sparseloco ? "sparseloco" : "nesterov") << YAML::Key
        << "mean" << YAML::Value << (c.topk.mean == SparseMean::members ? "members" : "senders")
        << YAML::EndMap;
  };
  f.check = [](const JobConfig& c, const std::string& path) {
    if (!c.topk.on && !c.autocodec.on) return;
    require(c.topk.chunk >= 2 && c.topk.chunk <= 65536, path + ".chunk", "in [2, 65536]",
            c.topk.chunk);
    if (c.topk.on)
      require(c.topk.k >= 1 && c.topk.k <= c.topk.chunk, path + ".k",
              "in [1, compression.chunk = " + show(c.topk.chunk) + "]", c.topk.k);
    require(c.topk.bits >= 1 && c.topk.bits <= 8, path + ".bits", "in [1, 8]", c.topk.bits);
    require_finite(c.topk.error_feedback, path + ".error_feedback");
    require(c.topk.error_feedback >= 0 && c.topk.error_feedback <= 1, path + ".error_feedback",
            "in [0, 1]", c.topk.error_feedback);
    if (!c.autocodec.on) return;
    const AutoCodecConfig& a = c.autocodec;
    require_finite(a.share, path + ".share");
    require(a.share > 0 && a.share < 1, path + ".share", "in (0, 1)", a.share);
    require_finite(a.margin, path + ".margin");
    require(a.margin > 0 && a.margin <= 1, path + ".margin", "in (0, 1]", a.margin);
    require(a.patience >= 1 && a.patience <= 1000, path + ".patience", "in [1, 1000]",
            a.patience);
    // A rung of the ladder: not fp16 (bf16's bytes), and k within a chunk.
    const auto start = parse_choice(a.start);
    const bool rung = start && start->dense != collective::Codec::fp16 &&
                      start->topk_k <= static_cast<std::uint32_t>(c.topk.chunk);
    if (!rung)
      throw ConfigError(path + ".start: expected a rung of the ladder: fp32|bf16|int8|topk:K|"
                        "topk:KqB (K in [1, chunk], B bits in [1, 8]), got " + quoted(a.start));
    if (start->sparse() && !c.auto_sparse())
      throw ConfigError(path + ".start: " + quoted(a.start) + " needs the ladder's topk rungs "
                        "(sparse: true, inner.budget: steps, one local rank per worker)");
  };
  return f;
}

const std::vector<Field>& fields() {
  using DK = DeviceKind;
  static const std::vector<Field> table = [] {
    std::vector<Field> t = {
        plain<std::string>("", "name", at(&JobConfig::name), "the job's name"),
        plain<std::uint64_t>("", "seed", at(&JobConfig::seed),
                             "seeds θ's initialisation and the data order"),
        plain<int>("", "threads", at(&JobConfig::threads),
                   "torch intra-op threads per process; 0: torch's default"),
        choice("", "device", at(&JobConfig::device),
               std::array<std::pair<const char*, DK>, 3>{
                   {{"auto", DK::auto_}, {"cpu", DK::cpu}, {"cuda", DK::cuda}}},
               "where workers train: cpu, cuda, or auto (cuda where the node offers gpus)"),
        // model
        choice("model", "arch", at(&JobConfig::model, &ModelConfig::arch),
               std::array<std::pair<const char*, Arch>, 4>{{{"gpt2", Arch::gpt2},
                                                            {"llama", Arch::llama},
                                                            {"mistral", Arch::mistral},
                                                            {"qwen2", Arch::qwen2}}},
               "the decoder's block type"),
        only_when(plain<std::string>("model", "hf", at(&JobConfig::model, &ModelConfig::hf),
                                     "a Hugging Face folder whose config.json gives the model"),
                  [](const JobConfig& c) { return !c.model.hf.empty(); }),
        plain<int>("model", "layers", at(&JobConfig::model, &ModelConfig::layers), "blocks"),
        with_alias(plain<int>("model", "d_model", at(&JobConfig::model, &ModelConfig::d_model),
                              "the model's width"),
                   {"width", "d_model"}),
        plain<int>("model", "heads", at(&JobConfig::model, &ModelConfig::heads), "attention heads"),
        plain<int>("model", "context", at(&JobConfig::model, &ModelConfig::context),
                   "tokens per sequence"),
        plain<int>("model", "vocab", at(&JobConfig::model, &ModelConfig::vocab),
                   "the vocabulary's size; 0: the tokenizer's"),
        plain<bool>("model", "tied_embeddings",
                    at(&JobConfig::model, &ModelConfig::tied_embeddings),
                    "the output layer is the embedding table"),
        plain<int>("model", "mlp_ratio", at(&JobConfig::model, &ModelConfig::mlp_ratio),
                   "gpt2: the MLP's width over d_model"),
        ranged("model", "mlp_hidden", at(&JobConfig::model, &ModelConfig::mlp_hidden), 0,
               kMaxWidth * kMaxMlpRatio, "the MLP's hidden width; 0: the arch's rule"),
        finite("model", "norm_eps", at(&JobConfig::model, &ModelConfig::norm_eps),
               "LayerNorm or RMSNorm epsilon"),
        only_when(plain<int>("model", "kv_heads", at(&JobConfig::model, &ModelConfig::kv_heads),
                             "rotary archs: key/value heads; 0: heads"),
                  [](const JobConfig& c) { return c.model.rotary(); }),
        only_when(finite("model", "rope_theta", at(&JobConfig::model, &ModelConfig::rope_theta),
                         "rotary archs: the RoPE base"),
                  [](const JobConfig& c) { return c.model.rotary(); }),
        only_when(
            ranged("model", "head_dim", at(&JobConfig::model, &ModelConfig::explicit_head_dim), 0,
                   kMaxWidth, "rotary archs: an attention head's width; 0: width / heads"),
            [](const JobConfig& c) { return c.model.explicit_head_dim != 0; }),
        rope_scaling_field(),
        only_when(ranged("model", "sliding_window",
                         at(&JobConfig::model, &ModelConfig::sliding_window), 0, kMaxContext,
                         "mistral: tokens a token attends to, itself included; 0: all before it"),
                  [](const JobConfig& c) { return c.model.sliding_window != 0; }),
        only_when(
            ranged("model", "max_positions", at(&JobConfig::model, &ModelConfig::max_positions), 0,
                   kMaxContext, "rotary archs: an export's max_position_embeddings; 0: context"),
            [](const JobConfig& c) { return c.model.max_positions != 0; }),
        plain<bool>("model", "activation_checkpointing",
                    at(&JobConfig::model, &ModelConfig::activation_checkpointing),
                    "recompute each block in the backward pass"),
        only_when(plain<std::string>("model", "torchscript",
                                     at(&JobConfig::model, &ModelConfig::torchscript),
                                     "a TorchScript module's file: a model of the user's own"),
                  [](const JobConfig& c) { return c.model.is_torchscript(); }),
        only_when(plain<std::string>("model", "torchscript_hash",
                                     at(&JobConfig::model, &ModelConfig::torchscript_hash),
                                     "XXH3-64 of the module's file (written at submission)"),
                  [](const JobConfig& c) { return !c.model.torchscript_hash.empty(); }),
        only_when(plain<std::int64_t>("model", "torchscript_parameters",
                                      at(&JobConfig::model, &ModelConfig::torchscript_parameters),
                                      "the module's parameters (written at submission)"),
                  [](const JobConfig& c) { return c.model.torchscript_parameters != 0; }),
        // data
        with_alias(plain<std::string>("data", "dir", at(&JobConfig::data, &DataConfig::dir),
                                      "the corpus or token files' folder"),
                   {"dir", "path"}),
        choice("data", "format", at(&JobConfig::data, &DataConfig::format),
               std::array<std::pair<const char*, DataFormat>, 2>{
                   {{"text", DataFormat::text}, {"tokens", DataFormat::tokens}}},
               "text: DIR/corpus/*.txt; tokens: DIR/*.bin"),
        choice("data", "dtype", at(&JobConfig::data, &DataConfig::dtype),
               std::array<std::pair<const char*, TokenDtype>, 2>{
                   {{"uint16", TokenDtype::uint16}, {"uint32", TokenDtype::uint32}}},
               "the ids' width in token files without a header"),
        tokenizer_field(),
        ranged("data", "bpe_vocab", at(&JobConfig::data, &DataConfig::bpe_vocab), 320, 65536,
               "the sentencepiece BPE's vocabulary (tokenizer: bpe)"),
        ranged("data", "shards", at(&JobConfig::data, &DataConfig::shards), 1, kMaxShards,
               "the training split is cut into this many shards"),
        finite("data", "val_fraction", at(&JobConfig::data, &DataConfig::val_fraction),
               "the last fraction of the tokens is the validation split"),
        // workers
        ranged("workers", "count", at(&JobConfig::workers, &WorkersConfig::count), 1, kMaxWorkers,
               "workers per round when all are present"),
        plain<int>("workers", "min", at(&JobConfig::workers, &WorkersConfig::min),
                   "a round never closes with fewer"),
        plain<int>("workers", "max", at(&JobConfig::workers, &WorkersConfig::max),
                   "the bound of `loco scale`; 0: none"),
        ranged("workers", "max_restarts", at(&JobConfig::workers, &WorkersConfig::max_restarts), 0,
               kMaxRestarts, "restarts of each worker actor"),
        finite("workers", "wait_s", at(&JobConfig::workers, &WorkersConfig::wait_s),
               "how long below `min` the job waits for joins"),
        plain<int>("workers", "gpus", at(&JobConfig::workers, &WorkersConfig::gpus),
                   "GPUs per worker (device cuda)"),
        plain<bool>("workers", "share_gpu", at(&JobConfig::workers, &WorkersConfig::share_gpu),
                    "several workers may hold one GPU"),
        ranged("workers", "local_ranks", at(&JobConfig::workers, &WorkersConfig::local_ranks), 0,
               64, "local ranks per worker on the CPU; 0: 1"),
        finite("workers", "grace_max_s", at(&JobConfig::workers, &WorkersConfig::grace_max_s),
               "the most a round waits for stragglers; 0: for every member"),
        // inner
        ranged("inner", "steps", at(&JobConfig::inner, &InnerConfig::steps), 1, kMaxSteps,
               "H: inner steps per round"),
        ranged("inner", "batch_size", at(&JobConfig::inner, &InnerConfig::batch_size), 1,
               kMaxBatchSize, "sequences per inner step per worker"),
        finite("inner", "lr", at(&JobConfig::inner, &InnerConfig::lr), "AdamW's peak rate"),
        ranged("inner", "warmup", at(&JobConfig::inner, &InnerConfig::warmup), 0, kMaxSteps,
               "linear warmup steps"),
        finite("inner", "min_lr_ratio", at(&JobConfig::inner, &InnerConfig::min_lr_ratio),
               "the cosine decay's end, over lr"),
        finite("inner", "weight_decay", at(&JobConfig::inner, &InnerConfig::weight_decay),
               "AdamW's, on tensors of 2+ dimensions"),
        finite("inner", "grad_clip", at(&JobConfig::inner, &InnerConfig::grad_clip),
               "the gradient's largest norm; 0: no clipping"),
        plain<int>("inner", "grad_accum", at(&JobConfig::inner, &InnerConfig::grad_accum),
                   "micro-batches per inner step"),
        betas_field(),
        finite("inner", "eps", at(&JobConfig::inner, &InnerConfig::eps), "AdamW's epsilon"),
        choice("inner", "budget", at(&JobConfig::inner, &InnerConfig::budget),
               std::array<std::pair<const char*, InnerBudget>, 2>{
                   {{"steps", InnerBudget::steps}, {"time", InnerBudget::time}}},
               "a round's inner phase: H steps, or a budget of seconds"),
        finite("inner", "round_seconds", at(&JobConfig::inner, &InnerConfig::round_seconds),
               "budget: time, the round's seconds; 0: H x the median step"),
        // outer
        finite("outer", "lr", at(&JobConfig::outer, &OuterConfig::lr),
               "the outer Nesterov step's rate"),
        finite("outer", "momentum", at(&JobConfig::outer, &OuterConfig::momentum),
               "the outer step's momentum"),
        plain<bool>("outer", "nesterov", at(&JobConfig::outer, &OuterConfig::nesterov),
                    "Nesterov momentum"),
        choice("", "precision", at(&JobConfig::precision),
               std::array<std::pair<const char*, Precision>, 2>{
                   {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}}},
               "the inner steps' arithmetic"),
        compression_field(),
        // allreduce
        ranged("allreduce", "chunk_kb", at(&JobConfig::allreduce, &AllreduceConfig::chunk_kb), 1,
               65536, "chunk of a member's part, KiB of fp32"),
        finite("allreduce", "peer_timeout_s",
               at(&JobConfig::allreduce, &AllreduceConfig::peer_timeout_s),
               "a member silent this long is lost"),
        finite("allreduce", "entry_timeout_s",
               at(&JobConfig::allreduce, &AllreduceConfig::entry_timeout_s),
               "streaming and eager: how late a member may begin a fragment's all-reduce"),
        // sync
        choice("sync", "mode", at(&JobConfig::sync, &SyncConfig::mode),
               std::array<std::pair<const char*, SyncMode>, 3>{{{"blocking", SyncMode::blocking},
                                                                {"streaming", SyncMode::streaming},
                                                                {"eager", SyncMode::eager}}},
               "how a round's pseudo-gradients are synchronized"),
        plain<int>("sync", "fragments", at(&JobConfig::sync, &SyncConfig::fragments),
                   "streaming: P, the parameters' fragments"),
        plain<int>("sync", "overlap_steps", at(&JobConfig::sync, &SyncConfig::overlap_steps),
                   "τ: inner steps an all-reduce runs under"),
        // Not `finite`: a NaN is "not in [0, 1]" (validate()).
        plain<double>("sync", "mix", at(&JobConfig::sync, &SyncConfig::mix),
                      "α: how much of the local fragment survives its merge"),
        // guard
        plain<bool>("guard", "on", at(&JobConfig::guard, &GuardConfig::on),
                    "leave broken or hostile pseudo-gradients out of the average"),
        finite("guard", "max_norm_ratio", at(&JobConfig::guard, &GuardConfig::max_norm_ratio),
               "c: a Δ whose norm is above c x the group's median is left out"),
        finite("guard", "opposed", at(&JobConfig::guard, &GuardConfig::opposed),
               "a Δ whose agreement with the others is below -opposed x the group's median "
               "(less the noise) is left out; 0: no direction rule"),
        ranged("guard", "sketch", at(&JobConfig::guard, &GuardConfig::sketch), 16, 65536,
               "sampled values of Δ in each member's summary"),
        ranged("guard", "evict_after", at(&JobConfig::guard, &GuardConfig::evict_after), 0,
               kMaxRounds, "rounds left out in a row before a worker is removed; 0: never"),
        ranged("", "rounds", at(&JobConfig::rounds), 0, kMaxRounds,
               "outer rounds; 0: from token_budget"),
        ranged("", "token_budget", at(&JobConfig::token_budget), std::int64_t{0}, kMaxTokenBudget,
               "tokens per worker, when rounds is 0"),
        ranged("", "time_limit_minutes", at(&JobConfig::time_limit_minutes), 0.0, 1e6,
               "the job ends with the round planned once this many minutes passed; 0: never"),
        // checkpoint
        ranged("checkpoint", "every", at(&JobConfig::checkpoint, &CheckpointConfig::every), 0,
               kMaxRounds, "rounds between checkpoints; 0: only at the end"),
        plain<std::string>("checkpoint", "dir", at(&JobConfig::checkpoint, &CheckpointConfig::dir),
                           "where checkpoints go"),
        ranged("checkpoint", "keep", at(&JobConfig::checkpoint, &CheckpointConfig::keep), 0,
               kMaxRounds, "round checkpoints kept; 0: all"),
        ranged("checkpoint", "quota_gib", at(&JobConfig::checkpoint, &CheckpointConfig::quota_gib),
               0.0, 1e6, "the most the job's folder may hold; 0: no quota"),
        only_when(plain<std::string>("checkpoint", "resume",
                                     at(&JobConfig::checkpoint, &CheckpointConfig::resume),
                                     "a checkpoint to start from"),
                  [](const JobConfig& c) { return !c.checkpoint.resume.empty(); }),
        // eval
        ranged("eval", "every", at(&JobConfig::eval, &EvalConfig::every), 1, kMaxRounds,
               "inner steps between evaluations"),
        ranged("eval", "batches", at(&JobConfig::eval, &EvalConfig::batches), 1, kMaxEvalBatches,
               "validation batches"),
        only_when(plain<std::string>("", "init", at(&JobConfig::init),
                                     "hf:DIR, a pretrained start; unset: from seed"),
                  [](const JobConfig& c) { return !c.init.empty(); }),
    };
    return t;
  }();
  return table;
}

// The names a section of the file may hold: its fields' (and their other names), and at the
// top level the sections too.
std::set<std::string> names_in(const std::string& section) {
  std::set<std::string> out;
  for (const Field& f : fields()) {
    if (f.section == section) {
      out.insert(f.name);
      out.insert(f.also.begin(), f.also.end());
    } else if (section.empty()) {
      out.insert(f.section);
    }
  }
  return out;
}

// from_yaml's reading of every field (no validation): a section's unknown names are refused
// before its fields are read.
void read_fields(const YAML::Node& root, JobConfig& c) {
  std::set<std::string> checked = {""};
  check_keys(root, "", names_in(""));
  for (const Field& f : fields()) {
    const YAML::Node node = *f.section ? root[f.section] : root;
    if (checked.insert(f.section).second) check_keys(node, f.section, names_in(f.section));
    if (f.also.empty())
      f.read(node, f.section, f.name, c);
    else
      for (const std::string& key : f.also) f.read(node, f.section, key, c);
    if (std::string(f.section) == "model" && node) {
      bool given = node[f.name].IsDefined();
      for (const std::string& key : f.also) given = given || node[key].IsDefined();
      if (given) c.model_given.push_back(f.name);
    }
  }
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

std::string JobConfig::compression_name() const {
  if (autocodec.on)
    return "auto (from " + autocodec.start + (auto_sparse() ? ", down to topk" : ", dense only") +
           ")";
  if (!topk.on) return std::string(collective::to_string(compression));
  return "topk (chunk " + show(topk.chunk) + ", k " + show(topk.k) + ", bits " + show(topk.bits) +
         ")";
}

int JobConfig::topk_max_workers() const {
  const auto n = static_cast<std::size_t>(model.parameter_count(vocab_size()));
  // A TorchScript module not yet described: no bound until its size is known (the aggregator
  // and the simulator validate again once it is).
  if (n == 0) return kMaxWorkers;
  const double b = double(collective::sparse::encoded_bytes(n, sparse_params(topk)));
  const double int8 = double(collective::encoded_bytes(collective::Codec::int8, n));
  // (K − 1)·b < 2 (K − 1)/K · int8  ⇔  K < 2·int8 / b.
  return std::max(1, static_cast<int>(std::ceil(2 * int8 / b)) - 1);
}

namespace {

// model.torchscript: the module is the architecture, so the built-in decoder's fields must stay
// at their defaults (a job file that sets them meant another model), and what describes the
// file must look like what describe_torchscript writes.
void check_torchscript_model(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (!m.is_torchscript())
    throw ConfigError(
        "model.torchscript_hash and model.torchscript_parameters: only with "
        "model.torchscript");
  require_text(m.torchscript, kMaxPathBytes, "model.torchscript");
  if (!m.hf.empty())
    throw ConfigError("model.hf: not with model.torchscript (a Hugging Face folder is a model of "
                      "the built-in decoder; the module's file is the architecture)");
  ModelConfig builtin = m;
  builtin.torchscript.clear();
  builtin.torchscript_hash.clear();
  builtin.torchscript_parameters = 0;
  builtin.context = ModelConfig{}.context;
  builtin.vocab = ModelConfig{}.vocab;
  std::string d = model_difference(builtin, ModelConfig{});
  if (d.empty() && m.activation_checkpointing) d = "model.activation_checkpointing";
  if (!d.empty())
    throw ConfigError(d.substr(0, d.find(' ')) + ": not with model.torchscript (the module is " +
                      "the architecture; of the model's fields only context and vocab apply)");
  const std::string& h = m.torchscript_hash;
  const auto hex = [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); };
  require(h.empty() || (h.size() == 16 && std::all_of(h.begin(), h.end(), hex)),
          "model.torchscript_hash", "16 lowercase hex digits (XXH3-64 of the file)", quoted(h));
  require_in<std::int64_t>(m.torchscript_parameters, 0, static_cast<std::int64_t>(kMaxParameters),
                           "model.torchscript_parameters");
  if (!c.init.empty())
    throw ConfigError("init: " + quoted(c.init) + " is a Hugging Face folder of the built-in " +
                      "model, not of model.torchscript (the module's file holds its initial θ)");
}

// The rules between the model's fields, and the vocabulary's.
void validate_rotary(const ModelConfig& m) {
  require(m.heads % m.kv_head_count() == 0, "model.kv_heads",
          "a divisor of model.heads (" + show(m.heads) + ")", m.kv_heads);
  if (m.explicit_head_dim == 0) {
    require(m.d_model % m.heads == 0, "model.heads",
            "a divisor of model.d_model (" + show(m.d_model) + ")", m.heads);
    require(
        m.head_dim() % 2 == 0, "model.heads",
        "such that d_model / heads is even for rotary positions (d_model " + show(m.d_model) + ")",
        m.heads);
  } else {
    require(m.head_dim() % 2 == 0, "model.head_dim", "even for rotary positions",
            m.explicit_head_dim);
    require(std::int64_t(m.heads) * m.head_dim() <= kMaxWidth, "model.head_dim",
            "such that heads x head_dim <= " + show(kMaxWidth), m.explicit_head_dim);
  }
  require(m.rope_theta > 1, "model.rope_theta", "> 1", m.rope_theta);
  // Positions past max_position_embeddings are not what the model was made for.
  require(m.max_positions == 0 || m.max_positions >= m.context, "model.max_positions",
          "0 or at least model.context (" + show(m.context) + ")", m.max_positions);
  require(m.sliding_window == 0 || m.arch == Arch::mistral, "model.sliding_window",
          "0 except for arch mistral (transformers' Llama and Qwen2 configs have no such "
          "window here)",
          m.sliding_window);
}

// gpt2 refuses the rotary archs' fields rather than ignoring them: a job file that asks for
// them wants another model.
void validate_gpt2(const ModelConfig& m) {
  require(m.d_model % m.heads == 0, "model.heads",
          "a divisor of model.d_model (" + show(m.d_model) + ")", m.heads);
  require(m.kv_heads == 0 || m.kv_heads == m.heads, "model.kv_heads",
          "0 or model.heads for arch gpt2 (grouped-query attention is arch: llama's)", m.kv_heads);
  require(m.rope_theta == ModelConfig{}.rope_theta, "model.rope_theta",
          "unset for arch gpt2 (learned positions; rotary positions are arch: llama's)",
          m.rope_theta);
  for (const auto& [field, value] : {std::pair{"model.head_dim", m.explicit_head_dim},
                                     std::pair{"model.sliding_window", m.sliding_window},
                                     std::pair{"model.max_positions", m.max_positions}})
    require(value == 0, field, "unset for arch gpt2 (a rotary arch's field)", value);
  if (m.rope_scaling.llama3)
    throw ConfigError("model.rope_scaling: unset for arch gpt2 (learned positions)");
}

void validate_model(const JobConfig& c) {
  const ModelConfig& m = c.model;
  require(m.layers <= kMaxLayers, "model.layers", "<= " + show(kMaxLayers), m.layers);
  require(m.d_model <= kMaxWidth, "model.d_model", "<= " + show(kMaxWidth), m.d_model);
  require(m.heads <= kMaxHeads, "model.heads", "<= " + show(kMaxHeads), m.heads);
  require(m.context <= kMaxContext, "model.context", "<= " + show(kMaxContext), m.context);
  require(m.mlp_ratio <= kMaxMlpRatio, "model.mlp_ratio", "<= " + show(kMaxMlpRatio), m.mlp_ratio);
  require(m.layers >= 1, "model.layers", ">= 1", m.layers);
  require(m.d_model >= 1, "model.d_model", ">= 1", m.d_model);
  require(m.heads >= 1, "model.heads", ">= 1", m.heads);
  require(m.context >= 2, "model.context", ">= 2", m.context);
  require(m.vocab >= 0 && m.vocab <= kMaxVocab, "model.vocab",
          "in [0, " + show(kMaxVocab) + "] (0: from the tokenizer)", m.vocab);
  if (c.data.tokenizer == TokenizerKind::json && m.vocab == 0)
    throw ConfigError(
        "model.vocab: required with data.tokenizer: " + quoted(c.data.tokenizer_json) +
        " (every node builds the same model; scripts/prepare-data prints the vocabulary size)");
  if (c.data.format == DataFormat::tokens && m.vocab == 0)
    throw ConfigError(
        "model.vocab: required with data.format: tokens (the ids in the token files are checked "
        "against it; scripts/prepare-data prints the vocabulary size)");
  require(m.mlp_ratio >= 1, "model.mlp_ratio", ">= 1", m.mlp_ratio);
  require(m.norm_eps > 0 && m.norm_eps <= 1, "model.norm_eps", "in (0, 1]", m.norm_eps);
  require_in(m.kv_heads, 0, m.heads, "model.kv_heads");
  if (m.rotary())
    validate_rotary(m);
  else
    validate_gpt2(m);
  if (c.data.tokenizer == TokenizerKind::byte)
    require(m.vocab == 0 || m.vocab >= 256, "model.vocab", ">= 256 for the byte tokenizer",
            m.vocab);
}

// Bounds on sizes together, once each is sane: what one worker must hold.
void validate_sizes(const JobConfig& c) {
  const double params = c.parameter_estimate();
  require(params <= kMaxParameters, "model",
          "at most " + show(kMaxParameters) + " parameters (ModelConfig::parameter_count)", params);
  // One micro-batch's activations: per layer, context x width values and heads x context^2
  // attention weights per sequence (a TorchScript module's are its own: not counted).
  const double activations =
      c.model.is_torchscript()
          ? 0.0
          : static_cast<double>(c.inner.batch_size / c.inner.grad_accum) * c.model.layers *
                c.model.context *
                (static_cast<double>(c.model.d_model) +
                 static_cast<double>(c.model.heads) * c.model.context);
  require(activations <= kMaxActivationValues, "model.context",
          "small enough that batch_size / grad_accum x layers x context x (width + heads x "
          "context) <= " +
              show(kMaxActivationValues) + " (one micro-batch's activations)",
          c.model.context);
  // What one worker holds, all terms together (diloco/job/memory.hpp): no node holds more. The
  // cluster compares the estimate with its largest node at submission (check_fits).
  const double worker_bytes = worker_memory_bytes(c);
  if (worker_bytes > kMaxWorkerBytes)
    throw ConfigError(memory_field(c, false) + ": needs about " + gib(worker_bytes) +
                      " per worker, more than any node holds (at most " + gib(kMaxWorkerBytes) +
                      " is accepted)");
  require(static_cast<double>(c.total_rounds()) <= kMaxRounds, "token_budget",
          "at most " + show(kMaxRounds) + " rounds' worth of tokens", c.token_budget);
}

}  // namespace

// JobConfig::validate's rules between fields, in the order it applies them (the first broken
// one is the error): names and files, data and workers, the inner schedule, compression topk,
// the steps' numbers, the synchronization.
void validate_names_and_files(const JobConfig& c) {
  require(!c.name.empty(), "name", "a non-empty string", "''");
  require_text(c.name, kMaxJobNameBytes, "name");
  require_text(c.data.dir, kMaxPathBytes, "data.dir");
  require_text(c.checkpoint.dir, kMaxPathBytes, "checkpoint.dir");
  require_text(c.checkpoint.resume, kMaxPathBytes, "checkpoint.resume");
  require_text(c.init, kMaxPathBytes, "init");
  require(c.init.empty() || (c.init.rfind("hf:", 0) == 0 && c.init.size() > 3), "init",
          "hf:DIR, a Hugging Face folder of the job's model (or unset)", quoted(c.init));
  if (c.model.is_torchscript() || !c.model.torchscript_hash.empty() ||
      c.model.torchscript_parameters != 0)
    check_torchscript_model(c);
  require(c.threads >= 0, "threads", ">= 0", c.threads);
  require(c.threads <= kMaxThreads, "threads", "<= " + show(kMaxThreads), c.threads);
  require_text(c.model.hf, kMaxPathBytes, "model.hf");
  if (c.data.tokenizer == TokenizerKind::json)
    require_text(c.data.tokenizer_json, kMaxPathBytes, "data.tokenizer");
  if (c.data.format == DataFormat::tokens && c.data.tokenizer == TokenizerKind::bpe)
    throw ConfigError(
        "data.tokenizer: bpe trains on DIR/corpus, which data.format: tokens has not; name the "
        "tokenizer.json of the token files (or byte)");
}

void validate_data_and_workers(const JobConfig& c) {
  // 256 byte-fallback pieces + the corpus characters + the control pieces.
  require(!c.data.dir.empty(), "data.dir", "a folder", "''");
  require(c.data.val_fraction > 0 && c.data.val_fraction < 0.5, "data.val_fraction", "in (0, 0.5)",
          c.data.val_fraction);
  require(c.workers.min >= 1 && c.workers.min <= c.workers.count, "workers.min",
          "in [1, workers.count]", c.workers.min);
  require(c.workers.max == 0 || c.workers.max >= c.workers.count, "workers.max",
          "0 or >= workers.count", c.workers.max);
  require(c.workers.max <= kMaxWorkers, "workers.max", "<= " + show(kMaxWorkers), c.workers.max);
  require(c.workers.wait_s > 0 && c.workers.wait_s <= kMaxWaitS, "workers.wait_s",
          "in (0, " + show(kMaxWaitS) + "]", c.workers.wait_s);
  require(c.workers.gpus >= 1, "workers.gpus", ">= 1", c.workers.gpus);
  require(c.workers.gpus <= 64, "workers.gpus", "<= 64", c.workers.gpus);
  if (c.device == DeviceKind::cuda && c.workers.local_ranks > 1 &&
      c.workers.local_ranks != c.workers.gpus)
    throw ConfigError("workers.local_ranks: " + show(c.workers.local_ranks) +
                      " with device: cuda, where a worker's ranks are its GPUs (workers.gpus: " +
                      show(c.workers.gpus) + "); leave it out or make it equal");
}

void validate_inner_schedule(const JobConfig& c) {
  require(c.inner.lr > 0, "inner.lr", "> 0", c.inner.lr);
  require(c.inner.min_lr_ratio >= 0 && c.inner.min_lr_ratio <= 1, "inner.min_lr_ratio", "in [0, 1]",
          c.inner.min_lr_ratio);
  require(c.inner.weight_decay >= 0, "inner.weight_decay", ">= 0", c.inner.weight_decay);
  require(c.inner.grad_clip >= 0, "inner.grad_clip", ">= 0 (0 disables)", c.inner.grad_clip);
  require(c.workers.grace_max_s >= 0 && c.workers.grace_max_s <= kMaxWaitS, "workers.grace_max_s",
          "in [0, " + show(kMaxWaitS) + "] (0: wait for every member)", c.workers.grace_max_s);
  require(c.inner.round_seconds >= 0 && c.inner.round_seconds <= kMaxWaitS, "inner.round_seconds",
          "in [0, " + show(kMaxWaitS) + "] (0: H x the median seconds per step)",
          c.inner.round_seconds);
  if (c.inner.budget == InnerBudget::time) {
    if (c.sync.mode != SyncMode::blocking)
      throw ConfigError(
          "inner.budget: time needs sync.mode: blocking (streaming and eager "
          "synchronize at fixed steps)");
    if (std::max(1, c.workers.local_ranks) > 1 || c.workers.gpus > 1)
      throw ConfigError(
          "inner.budget: time runs one local rank per worker for now "
          "(workers.local_ranks and workers.gpus must be 1)");
  }
}

void validate_topk(const JobConfig& c, bool shaped) {
  if (c.inner.budget == InnerBudget::time)
    throw ConfigError(
        "compression: topk runs inner.budget: steps for now (with time, members weigh their Δ "
        "by tokens, which the error feedback of a sparse average does not carry)");
  if (std::max(1, c.workers.local_ranks) > 1 || c.workers.gpus > 1)
    throw ConfigError(
        "compression: topk runs one local rank per worker for now (workers.local_ranks and "
        "workers.gpus must be 1)");
  const int most = shaped ? c.topk_max_workers() : kMaxWorkers;
  for (const auto& [field, n] :
       {std::pair{"workers.count", c.workers.count}, std::pair{"workers.max", c.workers.max}})
    if (n > most)
      throw ConfigError(std::string(field) + ": " + show(n) + " workers gathering " +
                        "compression topk's bytes (chunk " + show(c.topk.chunk) + ", k " +
                        show(c.topk.k) + ", bits " + show(c.topk.bits) + ") would each send more " +
                        "than int8's all-reduce; at most " + show(most) +
                        " (or a smaller k, a larger chunk, or compression: int8)");
}

void validate_steps(const JobConfig& c) {
  require(c.guard.max_norm_ratio > 1, "guard.max_norm_ratio", "> 1 (the median's own norm passes)",
          c.guard.max_norm_ratio);
  require(c.guard.opposed >= 0 && c.guard.opposed <= 1, "guard.opposed", "in [0, 1]",
          c.guard.opposed);
  require(c.inner.grad_accum >= 1, "inner.grad_accum", ">= 1", c.inner.grad_accum);
  require(c.inner.batch_size % c.inner.grad_accum == 0, "inner.grad_accum",
          "a divisor of inner.batch_size (" + show(c.inner.batch_size) + ")", c.inner.grad_accum);
  // Each rank reads batch_size / G sequences of every step, in grad_accum micro-batches.
  for (int g :
       {c.device == DeviceKind::cpu ? 1 : c.workers.gpus, std::max(1, c.workers.local_ranks)})
    if (c.inner.batch_size % (g * c.inner.grad_accum) != 0)
      throw ConfigError("inner.batch_size: " + show(c.inner.batch_size) +
                        " sequences do not split into " + show(g) + " local ranks of " +
                        show(c.inner.grad_accum) +
                        " micro-batches; make it a multiple of the ranks per worker "
                        "(workers.gpus or workers.local_ranks) × inner.grad_accum");
  require(c.inner.betas[0] >= 0 && c.inner.betas[0] < 1, "inner.betas[0]", "in [0, 1)",
          c.inner.betas[0]);
  require(c.inner.betas[1] >= 0 && c.inner.betas[1] < 1, "inner.betas[1]", "in [0, 1)",
          c.inner.betas[1]);
  require(c.inner.eps > 0, "inner.eps", "> 0", c.inner.eps);
  // The steps run in fp32, and torch takes their scalars as floats: AdamW's update is scaled by
  // lr / (1 - betas[0]) (the first step's bias correction) and θ decays by lr x weight_decay;
  // beyond fp32's range (3.4e38) a step cannot run at all ("value cannot be converted to type
  // float without overflow", on every worker, every time the round is redone). A rate below
  // that which still makes the loss non-finite fails the job after kMaxRoundRedos redos.
  constexpr double fp32_max = std::numeric_limits<float>::max();
  require(c.inner.lr / (1 - c.inner.betas[0]) <= fp32_max &&
              c.inner.lr * c.inner.weight_decay <= fp32_max,
          "inner.lr",
          "small enough that inner.lr / (1 - inner.betas[0]) and inner.lr x inner.weight_decay "
          "are within fp32's range (3.4e38), in which the inner steps run",
          c.inner.lr);
  require(c.outer.lr > 0, "outer.lr", "> 0", c.outer.lr);
  require(c.outer.lr <= fp32_max, "outer.lr", "within fp32's range (3.4e38), in which θ steps",
          c.outer.lr);
  require(c.outer.momentum >= 0 && c.outer.momentum < 1, "outer.momentum", "in [0, 1)",
          c.outer.momentum);
  require(c.rounds > 0 || c.token_budget > 0, "rounds", "> 0 (or set token_budget)", c.rounds);
}

void validate_sync(const JobConfig& c, bool shaped) {
  // A TorchScript module's fragments are runs of its parameter tensors: at most as many as it
  // has tensors, checked when it is loaded (TorchScriptModel::fragments).
  if (c.model.is_torchscript())
    require(c.sync.fragments >= 1, "sync.fragments", ">= 1", c.sync.fragments);
  else
    require(c.sync.fragments >= 1 && (!shaped || c.sync.fragments <= c.model.layers),
            "sync.fragments", "in [1, model.layers = " + show(c.model.layers) + "]",
            c.sync.fragments);
  require(c.inner.steps % c.sync.fragments == 0, "sync.fragments",
          "a divisor of inner.steps (" + show(c.inner.steps) + ")", c.sync.fragments);
  require(c.sync.overlap_steps >= 0 && c.sync.overlap_steps < c.inner.steps, "sync.overlap_steps",
          "in [0, inner.steps)", c.sync.overlap_steps);
  require(c.sync.mix >= 0 && c.sync.mix <= 1, "sync.mix", "in [0, 1]", c.sync.mix);
  if (c.sync.mode == SyncMode::blocking && (c.sync.fragments != 1 || c.sync.overlap_steps != 0))
    throw ConfigError("sync.fragments: " + show(c.sync.fragments) + " and sync.overlap_steps: " +
                      show(c.sync.overlap_steps) + " need sync.mode: streaming (or eager)");
  if (c.sync.mode == SyncMode::eager && (c.sync.fragments != 1 || c.sync.mix != 0))
    throw ConfigError("sync.fragments: " + show(c.sync.fragments) +
                      " and sync.mix: " + show(c.sync.mix) +
                      ": eager synchronizes all of θ at once and mixes nothing (1 and 0); "
                      "fragments and mixing are sync.mode: streaming");
  require(c.allreduce.peer_timeout_s >= 0.1 && c.allreduce.peer_timeout_s <= 3600,
          "allreduce.peer_timeout_s", "in [0.1, 3600]", c.allreduce.peer_timeout_s);
  require(c.allreduce.entry_timeout_s >= 0 && c.allreduce.entry_timeout_s <= 3600,
          "allreduce.entry_timeout_s", "in [0, 3600]", c.allreduce.entry_timeout_s);
}

void JobConfig::validate() const {
  // Each field's own checks first (kFields: non-finite numbers, which fail every comparison
  // below, or pass "> 0" as +inf does; ranges), then the rules between fields.
  for (const Field& f : fields())
    if (f.check) f.check(*this, path_of(f));
  validate_names_and_files(*this);
  // A model from a Hugging Face folder has its shape once resolve_hf_model has read the
  // folder (on the node that has it); until then the rules that need the shape wait.
  const bool shaped = model.hf.empty();
  if (shaped) validate_model(*this);
  validate_data_and_workers(*this);
  validate_inner_schedule(*this);
  if (topk.on) validate_topk(*this, shaped);
  validate_steps(*this);
  if (shaped) validate_sizes(*this);
  validate_sync(*this, shaped);
}

const char* to_string(Arch a) {
  switch (a) {
    case Arch::gpt2:
      return "gpt2";
    case Arch::llama:
      return "llama";
    case Arch::mistral:
      return "mistral";
    case Arch::qwen2:
      return "qwen2";
  }
  return "?";
}

int ModelConfig::mlp_width() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (arch == Arch::gpt2) return mlp_ratio * d_model;
  // Llama's: two thirds of 4 × d_model (SwiGLU has three matrices, not two), rounded up to a
  // multiple of 256.
  const std::int64_t h = 2 * (4 * static_cast<std::int64_t>(d_model)) / 3;
  return static_cast<int>((h + 255) / 256 * 256);
}

std::int64_t ModelConfig::parameter_count(int vocab) const {
  if (is_torchscript()) return torchscript_parameters;
  const std::int64_t d = d_model, v = vocab, m = mlp_width();
  const std::int64_t embeddings = v * d * (tied_embeddings ? 1 : 2);
  if (arch == Arch::gpt2) {
    // ln1, ln2 (weight and bias), qkv and proj with biases, fc and fc_proj with biases.
    const std::int64_t block =
        4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d);
    return embeddings + static_cast<std::int64_t>(context) * d + layers * block + 2 * d;
  }
  // ln1, ln2 (weight only), q, k, v (qwen2: with biases), o, gate/up and down without biases.
  const std::int64_t q = static_cast<std::int64_t>(heads) * head_dim();
  const std::int64_t kv = static_cast<std::int64_t>(kv_head_count()) * head_dim();
  const std::int64_t biases = qkv_bias() ? q + 2 * kv : 0;
  const std::int64_t block = 2 * d + (q * d + 2 * kv * d) + biases + d * q + 3 * d * m;
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
  std::string section;  // the mapping open, "" for none
  for (const Field& f : fields()) {
    if (f.written && !f.written(*this)) continue;
    if (f.section != section) {
      if (!section.empty()) out << YAML::EndMap;
      section = f.section;
      if (!section.empty()) out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << f.name << YAML::Value;
    f.write(out, *this);
  }
  if (!section.empty()) out << YAML::EndMap;
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
  if (m.is_torchscript()) return 6.0 * double(parameters);  // its attention, if any, unknown
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

namespace {

// A model field's value as the job file writes it.
std::string field_text(const Field& f, const ModelConfig& m) {
  JobConfig c;
  c.model = m;
  YAML::Emitter e;
  f.write(e, c);
  return e.c_str();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> model_fields(const ModelConfig& m) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : fields())
    if (std::string(f.section) == "model") out.emplace_back(f.name, field_text(f, m));
  return out;
}

std::string model_difference(const ModelConfig& a, const ModelConfig& b) {
  // Through the job file's own table, so that every field (and any added later) is compared;
  // a field that neither writes (llama's kv_heads for two gpt2 models) is not. A TorchScript
  // module is compared by its hash (torchscript_hash), not its path.
  JobConfig ja, jb;
  ja.model = a;
  jb.model = b;
  for (const Field& f : fields()) {
    const std::string name = f.name;
    if (std::string(f.section) != "model" || name == "activation_checkpointing" || name == "hf" ||
        name == "torchscript")
      continue;
    if (f.written && !f.written(ja) && !f.written(jb)) continue;
    // A field that one writes and the other does not (torchscript_hash) is "unset" there.
    const auto text = [&f](const JobConfig& j) {
      return f.written && !f.written(j) ? std::string("unset") : field_text(f, j.model);
    };
    const std::string va = text(ja), vb = text(jb);
    if (va != vb) return "model." + name + " (" + va + " against " + vb + ")";
  }
  return "";
}

}  // namespace loco::diloco
