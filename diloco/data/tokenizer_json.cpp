#include "diloco/data/tokenizer_json.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/bounded_json.hpp"
#include "diloco/data/bpe_model.hpp"
#include "diloco/data/tokenizer_regex.hpp"
#include "diloco/data/tokenizer_text.hpp"

namespace loco::diloco {

namespace {

using Json = nlohmann::json;
using detail::Pattern;
using detail::SplitBehavior;

constexpr std::size_t kMaxPatternBytes = std::size_t(1) << 16;
constexpr int kMaxDepth = 8;           // Sequences inside Sequences
constexpr std::size_t kMaxSteps = 64;  // parts of a Sequence, nested ones counted
constexpr std::size_t kMaxStrip = 1024;

// GPT-2's pre-tokenizer split, as the ByteLevel pre-tokenizer of `tokenizers` applies it.
constexpr const char* kGpt2Split =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string shown(const Json& v) { return v.dump().substr(0, 80); }

// Reads fields, failing with "NAME: FIELD: what is wrong".
class Reader {
 public:
  explicit Reader(const std::string& name) : name_(name) {}
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::runtime_error(name_ + ": " + field + ": " + what);
  }
  // The "type" of an object.
  std::string type(const Json& o, const std::string& field) const {
    if (!o.is_object() || !o.contains("type") || !o["type"].is_string())
      fail(field, "expected an object with a \"type\", got " + shown(o));
    return o["type"].get<std::string>();
  }
  bool boolean(const Json& o, const char* key, const std::string& field,
               std::optional<bool> absent) const {
    if (!o.contains(key) || o[key].is_null()) {
      if (!absent) fail(field + "." + key, "missing");
      return *absent;
    }
    if (!o[key].is_boolean()) fail(field + "." + key, "expected a boolean, got " + shown(o[key]));
    return o[key].get<bool>();
  }
  std::string string(const Json& o, const char* key, const std::string& field,
                     std::size_t max = kMaxTokenBytes) const {
    if (!o.contains(key) || !o[key].is_string()) fail(field + "." + key, "expected a string");
    auto s = o[key].get<std::string>();
    if (s.size() > max) fail(field + "." + key, "longer than " + std::to_string(max) + " bytes");
    return s;
  }
  // A single character (Metaspace's replacement, Strip's content).
  std::string character(const Json& o, const char* key, const std::string& field) const {
    auto s = string(o, key, field);
    std::size_t i = 0;
    if (s.empty() || (detail::next_code_point(s, i), i != s.size()))
      fail(field + "." + key, "expected one character, got " + shown(o[key]));
    return s;
  }
  // {"String": s} or {"Regex": r}.
  Pattern pattern(const Json& o, const std::string& field) const {
    const std::string f = field + ".pattern";
    if (!o.contains("pattern") || !o["pattern"].is_object() || o["pattern"].size() != 1)
      fail(f, "expected {\"String\": ...} or {\"Regex\": ...}");
    const auto& p = o["pattern"];
    const bool regex = p.contains("Regex");
    const std::string text = string(p, regex ? "Regex" : "String", f, kMaxPatternBytes);
    try {
      return regex ? Pattern::regex(text) : Pattern::literal(text);
    } catch (const std::invalid_argument& e) {
      fail(f, std::string("cannot use ") + shown(p) + ": " + e.what());
    }
  }
  // The parts of a Sequence (or the object itself as one part).
  std::vector<std::pair<const Json*, std::string>> parts(const Json& o, const char* key,
                                                         const std::string& field,
                                                         int depth) const {
    if (depth > kMaxDepth) fail(field, "Sequences nested deeper than " + std::to_string(kMaxDepth));
    if (type(o, field) != "Sequence") return {{&o, field}};
    if (!o.contains(key) || !o[key].is_array() || o[key].size() > kMaxSteps)
      fail(field + "." + key, "expected an array of at most " + std::to_string(kMaxSteps));
    std::vector<std::pair<const Json*, std::string>> out;
    for (std::size_t i = 0; i < o[key].size(); ++i) {
      auto sub =
          parts(o[key][i], key, field + "." + key + "[" + std::to_string(i) + "]", depth + 1);
      out.insert(out.end(), sub.begin(), sub.end());
      if (out.size() > kMaxSteps)
        fail(field, "more than " + std::to_string(kMaxSteps) + " parts in all");
    }
    return out;
  }

 private:
  const std::string& name_;
};

enum class Scheme { always, never, first };

// Metaspace's prepend_scheme (with the older add_prefix_space), pre-tokenizer or decoder.
Scheme prepend_scheme(const Reader& r, const Json& o, const std::string& field) {
  const bool has_scheme = o.contains("prepend_scheme") && !o["prepend_scheme"].is_null();
  const bool add = r.boolean(o, "add_prefix_space", field, true);
  if (!has_scheme) return add ? Scheme::always : Scheme::never;
  const auto s = r.string(o, "prepend_scheme", field);
  Scheme scheme = Scheme::always;
  if (s == "never")
    scheme = Scheme::never;
  else if (s == "first")
    scheme = Scheme::first;
  else if (s != "always")
    r.fail(field + ".prepend_scheme", "expected always, never or first, got " + s);
  if (o.contains("add_prefix_space") && !add && scheme != Scheme::never)
    r.fail(field + ".add_prefix_space", "false does not match prepend_scheme " + s);
  return scheme;
}

// ---- Normalizer: Prepend and Replace, in a Sequence or alone ----------------------------

class Normalizer {
 public:
  void read(const Reader& r, const Json& j) {
    if (j.is_null()) return;
    for (const auto& [o, field] : r.parts(j, "normalizers", "normalizer", 0)) {
      const auto type = r.type(*o, field);
      if (type == "Prepend") {
        steps_.push_back({r.string(*o, "prepend", field), std::nullopt, ""});
      } else if (type == "Replace") {
        steps_.push_back({"", r.pattern(*o, field), r.string(*o, "content", field)});
      } else {
        r.fail(field, type + " is not supported (only Prepend, Replace and Sequence of them)");
      }
    }
  }
  // `tokenizers`' Prepend adds to a non-empty text; Replace replaces every match. Throws
  // std::runtime_error when the text grows more than 8 times and 64 bytes (a hostile file:
  // a real normalizer writes a character for a character and prepends one).
  std::string apply(std::string_view text) const {
    std::string s(text);
    for (const auto& step : steps_) {
      if (step.pattern)
        s = detail::replace_all(s, *step.pattern, step.content);
      else if (!s.empty())
        s.insert(0, step.prepend);
      if (s.size() > 8 * text.size() + 64)
        throw std::runtime_error("the normalizer makes a text of " + std::to_string(text.size()) +
                                 " bytes " + std::to_string(s.size()) + " bytes long");
    }
    return s;
  }
  bool empty() const { return steps_.empty(); }

 private:
  struct Step {
    std::string prepend;
    std::optional<Pattern> pattern;  // Replace
    std::string content;
  };
  std::vector<Step> steps_;
};

// ---- Pre-tokenizer: Split, ByteLevel, Metaspace, in a Sequence or alone -----------------

class PreTokenizer {
 public:
  void read(const Reader& r, const Json& j) {
    if (j.is_null()) return;
    for (const auto& [o, field] : r.parts(j, "pretokenizers", "pre_tokenizer", 0)) {
      if (byte_level_)
        r.fail(field, "follows ByteLevel (loco maps bytes last: ByteLevel must be the last part)");
      const auto type = r.type(*o, field);
      if (type == "Split")
        read_split(r, *o, field);
      else if (type == "ByteLevel")
        read_byte_level(r, *o, field);
      else if (type == "Metaspace")
        read_metaspace(r, *o, field);
      else
        r.fail(field, type + " is not supported (only Split, ByteLevel, Metaspace and Sequence)");
    }
  }
  // Whether the words are bytes for a byte-level BPE.
  bool byte_level() const { return byte_level_; }

  // Hands `emit` the words of `text`; at_start: the text begins the input (Metaspace's
  // prepend_scheme first).
  void run(std::string_view text, bool at_start,
           const std::function<void(std::string_view)>& emit) const {
    run(std::size_t{0}, text, at_start, emit);
  }

 private:
  enum class Kind { split, byte_level, metaspace };
  struct Stage {
    Kind kind;
    std::optional<Pattern> pattern;  // Split; ByteLevel's regex; Metaspace's split
    SplitBehavior behavior = SplitBehavior::isolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement;        // Metaspace
    Scheme scheme = Scheme::always;
  };

  void read_split(const Reader& r, const Json& o, const std::string& field) {
    Stage s{Kind::split, r.pattern(o, field)};
    const auto b = r.string(o, "behavior", field);
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::removed},
        {"Isolated", SplitBehavior::isolated},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous},
        {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    const auto* it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                  [&](const auto& k) { return b == k.first; });
    if (it == std::end(kBehaviors)) r.fail(field + ".behavior", "unknown: " + b);
    s.behavior = it->second;
    s.invert = r.boolean(o, "invert", field, false);
    stages_.push_back(std::move(s));
  }
  void read_byte_level(const Reader& r, const Json& o, const std::string& field) {
    Stage s{Kind::byte_level};
    s.add_prefix_space = r.boolean(o, "add_prefix_space", field, std::nullopt);
    if (r.boolean(o, "use_regex", field, true)) s.pattern = Pattern::regex(kGpt2Split);
    stages_.push_back(std::move(s));
    byte_level_ = true;
  }
  void read_metaspace(const Reader& r, const Json& o, const std::string& field) {
    Stage s{Kind::metaspace};
    s.replacement = r.character(o, "replacement", field);
    s.scheme = prepend_scheme(r, o, field);
    if (r.boolean(o, "split", field, true)) s.pattern = Pattern::literal(s.replacement);
    stages_.push_back(std::move(s));
  }

  using Emit = std::function<void(std::string_view)>;

  void run(std::size_t stage, std::string_view text, bool at_start, const Emit& emit) const {
    if (stage == stages_.size()) {
      if (!text.empty()) emit(text);
      return;
    }
    const Stage& s = stages_[stage];
    if (s.kind == Kind::split) return split(stage, text, at_start, s.behavior, s.invert, emit);
    if (s.kind == Kind::byte_level) return byte_level(stage, text, at_start, emit);
    metaspace(stage, text, at_start, emit);
  }

  // The pieces of the stage's pattern, each through the stages after it.
  void split(std::size_t stage, std::string_view text, bool at_start, SplitBehavior behavior,
             bool invert, const Emit& emit) const {
    detail::split_pieces(*stages_[stage].pattern, text, behavior, invert,
                         [&](std::size_t b, std::size_t e) {
                           run(stage + 1, text.substr(b, e - b), at_start && b == 0, emit);
                         });
  }

  // A space in front unless there is one; GPT-2's split with use_regex.
  void byte_level(std::size_t stage, std::string_view text, bool at_start, const Emit& emit) const {
    const Stage& s = stages_[stage];
    std::string prefixed;
    if (s.add_prefix_space && !text.starts_with(' ')) text = prefixed = " " + std::string(text);
    if (s.pattern) return split(stage, text, at_start, SplitBehavior::isolated, false, emit);
    run(stage + 1, text, at_start, emit);
  }

  // Spaces to the replacement, which the scheme may put in front; split before each with
  // split.
  void metaspace(std::size_t stage, std::string_view text, bool at_start, const Emit& emit) const {
    const Stage& s = stages_[stage];
    std::string t;
    for (char c : text) {
      if (c == ' ')
        t += s.replacement;
      else
        t += c;
    }
    const bool prepend = s.scheme == Scheme::always || (s.scheme == Scheme::first && at_start);
    if (prepend && !std::string_view(t).starts_with(s.replacement)) t.insert(0, s.replacement);
    if (s.pattern) return split(stage, t, at_start, SplitBehavior::merged_with_next, false, emit);
    run(stage + 1, t, at_start, emit);
  }

  std::vector<Stage> stages_;
  bool byte_level_ = false;
};

// ---- Decoder --------------------------------------------------------------------------

// `tokenizers`' decoders, over the tokens' texts. One difference: bytes that are not UTF-8
// stay as they are (`tokenizers` writes U+FFFD for each).
class Decoder {
 public:
  void read(const Reader& r, const Json& j) {
    if (j.is_null()) return;
    none_ = false;
    for (const auto& [o, field] : r.parts(j, "decoders", "decoder", 0)) {
      const auto type = r.type(*o, field);
      Step s{};
      if (type == "ByteLevel") {
        s.kind = Kind::byte_level;
      } else if (type == "Replace") {
        s = {Kind::replace, r.pattern(*o, field), r.string(*o, "content", field)};
      } else if (type == "ByteFallback") {
        s.kind = Kind::byte_fallback;
      } else if (type == "Fuse") {
        s.kind = Kind::fuse;
      } else if (type == "Strip") {
        s = {Kind::strip, std::nullopt, r.character(*o, "content", field)};
        s.start = count(r, *o, "start", field);
        s.stop = count(r, *o, "stop", field);
      } else if (type == "Metaspace") {
        s = {Kind::metaspace, std::nullopt, r.character(*o, "replacement", field)};
        s.scheme = prepend_scheme(r, *o, field);
      } else {
        r.fail(field, type +
                          " is not supported (only ByteLevel, Replace, ByteFallback, Fuse, "
                          "Strip, Metaspace and Sequence)");
      }
      steps_.push_back(std::move(s));
    }
  }

  std::string decode(std::vector<std::string> tokens) const {
    std::string out;
    if (none_) {  // `tokenizers` without a decoder: the tokens joined by spaces
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    for (const auto& s : steps_) tokens = apply(s, std::move(tokens));
    for (const auto& t : tokens) out += t;
    return out;
  }

 private:
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace };
  struct Step {
    Kind kind;
    std::optional<Pattern> pattern;  // Replace
    std::string content;             // Replace; Strip's character; Metaspace's replacement
    std::size_t start = 0, stop = 0;
    Scheme scheme = Scheme::always;
  };

  static std::size_t count(const Reader& r, const Json& o, const char* key,
                           const std::string& field) {
    if (!o.contains(key) || !o[key].is_number_unsigned() || o[key].get<std::uint64_t>() > kMaxStrip)
      r.fail(field + "." + key, "expected a count up to " + std::to_string(kMaxStrip));
    return o[key].get<std::size_t>();
  }

  static std::vector<std::string> apply(const Step& s, std::vector<std::string> tokens) {
    switch (s.kind) {
      case Kind::byte_level:
        return {byte_level(tokens)};
      case Kind::byte_fallback:
        return byte_fallback(tokens);
      case Kind::fuse:
        return {fuse(tokens)};
      default:
        break;
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      if (s.kind == Kind::replace) t = detail::replace_all(t, *s.pattern, s.content);
      if (s.kind == Kind::strip) t = strip(t, s.content, s.start, s.stop);
      if (s.kind == Kind::metaspace)
        t = metaspace(t, s.content, i == 0 && s.scheme != Scheme::never);
    }
    return tokens;
  }

  static std::string fuse(const std::vector<std::string>& tokens) {
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  // Each token's characters back to bytes when all of them are byte-level characters.
  static std::string byte_level(const std::vector<std::string>& tokens) {
    const auto& bm = detail::byte_map();
    std::string out;
    for (const auto& t : tokens) {
      std::string bytes;
      bool all = true;
      for (std::size_t i = 0; all && i < t.size();) {
        const std::uint32_t cp = detail::next_code_point(t, i);
        all = cp < bm.byte_of.size() && bm.byte_of[cp] >= 0;
        if (all) bytes.push_back(static_cast<char>(bm.byte_of[cp]));
      }
      out += all ? bytes : t;
    }
    return out;
  }

  // Runs of <0xNN> tokens become their bytes: one token when they are UTF-8, else one per
  // byte (where `tokenizers` puts U+FFFD).
  static std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
    std::vector<std::string> out;
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      bool utf8 = true;
      for (std::size_t i = 0; utf8 && i < run.size();)
        utf8 = detail::next_code_point(run, i) < detail::kInvalidByte;
      if (utf8) out.push_back(run);
      for (std::size_t i = 0; !utf8 && i < run.size(); ++i) out.emplace_back(1, run[i]);
      run.clear();
    };
    for (const auto& t : tokens) {
      if (t.size() == 6 && t.starts_with("<0x") && t.ends_with('>') &&
          std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4]))) {
        run.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
        continue;
      }
      flush();
      out.push_back(t);
    }
    flush();
    return out;
  }

  // Up to `start` leading and `stop` trailing copies of the character c.
  static std::string strip(const std::string& t, const std::string& c, std::size_t start,
                           std::size_t stop) {
    std::size_t b = 0, e = t.size();
    for (std::size_t k = 0; k < start && t.compare(b, c.size(), c) == 0; ++k) b += c.size();
    for (std::size_t k = 0;
         k < stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k)
      e -= c.size();
    return t.substr(b, e - b);
  }

  // The replacement back to spaces; the first token loses its replacements when a prefix
  // was prepended (as `tokenizers` does it, all of them).
  static std::string metaspace(const std::string& t, const std::string& rep, bool first) {
    std::string out;
    for (std::size_t i = 0; i < t.size();) {
      if (t.compare(i, rep.size(), rep) == 0) {
        if (!first) out += ' ';
        i += rep.size();
      } else {
        out += t[i++];
      }
    }
    return out;
  }

  bool none_ = true;
  std::vector<Step> steps_;
};

// A post-processor adds the tokens of a template (<|begin_of_text|>, <s>) around each
// sequence given to `tokenizers`' encode(add_special_tokens=True). loco encodes corpora,
// whose documents it separates itself, as encode(text, add_special_tokens=False): the
// templates are read, checked for their kind, and not applied.
void check_post_processor(const Reader& r, const Json& j) {
  if (j.is_null()) return;
  for (const auto& [o, field] : r.parts(j, "processors", "post_processor", 0)) {
    const auto type = r.type(*o, field);
    if (type != "ByteLevel" && type != "TemplateProcessing")
      r.fail(field, type + " is not supported (only ByteLevel, TemplateProcessing and Sequence)");
  }
}

struct AddedToken {
  std::string content;
  std::uint32_t id;
};

// Calls on_text(begin, end) for the stretches between the tokens and on_token(id) for the
// tokens, matched leftmost-longest as `tokenizers`' AddedVocabulary does.
void split_added(const std::vector<AddedToken>& tokens, std::string_view text,
                 const std::function<void(std::size_t, std::size_t)>& on_text,
                 const std::function<void(std::uint32_t)>& on_token) {
  // Where each token next occurs at or after `at` (npos: nowhere); found once per
  // occurrence, so a text with many of one and none of another stays linear.
  std::vector<std::size_t> next(tokens.size(), 0);
  std::vector<bool> stale(tokens.size(), true);
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t best = std::string::npos;
    const AddedToken* hit = nullptr;
    for (std::size_t k = 0; k < tokens.size(); ++k) {
      if (stale[k] || (next[k] != std::string::npos && next[k] < at)) {
        next[k] = text.find(tokens[k].content, at);
        stale[k] = false;
      }
      const std::size_t p = next[k];
      if (p == std::string::npos) continue;
      if (p < best || (p == best && tokens[k].content.size() > hit->content.size())) {
        best = p;
        hit = &tokens[k];
      }
    }
    const std::size_t end = hit ? best : text.size();
    if (end > at) on_text(at, end);
    if (!hit) break;
    on_token(hit->id);
    at = best + hit->content.size();
  }
}

class JsonTokenizer final : public Tokenizer {
 public:
  JsonTokenizer(const Json& j, const std::string& name) {
    const Reader r(name);
    if (!j.is_object()) r.fail("(top level)", "expected an object");
    for (const char* k : {"truncation", "padding"})
      if (j.contains(k) && !j[k].is_null())
        r.fail(k, "not supported (only null), got " + shown(j[k]));
    normalizer_.read(r, j.value("normalizer", Json()));
    pre_.read(r, j.value("pre_tokenizer", Json()));
    if (!j.contains("model")) r.fail("model", "missing");
    model_ = std::make_unique<detail::BpeModel>(j["model"], name, pre_.byte_level());
    check_post_processor(r, j.value("post_processor", Json()));
    decoder_.read(r, j.value("decoder", Json()));
    vocab_size_ = model_->max_id() + 1;
    read_added(r, j.value("added_tokens", Json()), j["model"]["vocab"]);
  }

  int vocab_size() const override { return static_cast<int>(vocab_size_); }

  std::vector<std::uint32_t> encode(const std::string& text) const override {
    std::vector<std::uint32_t> out;
    split_added(
        raw_, text,
        [&](std::size_t b, std::size_t e) {
          encode_segment(std::string_view(text).substr(b, e - b), b == 0, out);
        },
        [&](std::uint32_t id) { out.push_back(id); });
    return out;
  }

  std::string decode(std::span<const std::uint32_t> ids) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const auto id : ids) {
      if (const auto it = added_text_.find(id); it != added_text_.end())
        tokens.push_back(it->second);
      else if (const auto* t = model_->token(id))
        tokens.push_back(*t);
    }
    return decoder_.decode(std::move(tokens));
  }

 private:
  // Text between the added tokens matched in the raw text: normalized (then split by the
  // added tokens matched in normalized text), pre-tokenized, each word through the model.
  void encode_segment(std::string_view segment, bool at_start,
                      std::vector<std::uint32_t>& out) const {
    auto words = [&](std::string_view text, bool start) {
      pre_.run(text, start, [&](std::string_view word) { model_->encode_word(word, out); });
    };
    if (normalizer_.empty() && normalized_.empty()) return words(segment, at_start);
    const std::string normalized = normalizer_.apply(segment);
    split_added(
        normalized_, normalized,
        [&](std::size_t b, std::size_t e) {
          words(std::string_view(normalized).substr(b, e - b), at_start && b == 0);
        },
        [&](std::uint32_t id) { out.push_back(id); });
  }

  void read_added(const Reader& r, const Json& at, const Json& vocab);

  Normalizer normalizer_;
  PreTokenizer pre_;
  std::unique_ptr<detail::BpeModel> model_;
  Decoder decoder_;
  std::vector<AddedToken> raw_;  // matched in the raw text
  std::vector<AddedToken>
      normalized_;  // normalized=true: their normalized text, in normalized text
  std::unordered_map<std::uint32_t, std::string> added_text_;
  std::uint32_t vocab_size_ = 0;
};

// Added tokens get the id `tokenizers` gives them, which it does not read from the file: the
// model's id of the same text, else the next after the model's entries. A file that says
// otherwise is refused rather than encoded with ids it does not show.
void JsonTokenizer::read_added(const Reader& r, const Json& at, const Json& vocab) {
  if (at.is_null()) return;
  if (!at.is_array()) r.fail("added_tokens", "expected an array");
  if (at.size() > kMaxAddedTokens)
    r.fail("added_tokens", "more than " + std::to_string(kMaxAddedTokens));
  auto next_id = static_cast<std::uint32_t>(vocab.size());
  for (std::size_t i = 0; i < at.size(); ++i) {
    const auto& t = at[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned())
      r.fail(field, "expected {id, content, ...}");
    for (const char* k : {"single_word", "lstrip", "rstrip"})
      if (r.boolean(t, k, field, false)) r.fail(field + "." + k, "not supported (only false)");
    const auto content = r.string(t, "content", field);
    if (content.empty()) r.fail(field + ".content", "empty");
    const bool known = vocab.contains(content);
    const std::uint32_t id = known ? vocab[content].get<std::uint32_t>() : next_id++;
    if (t["id"].get<std::uint64_t>() != id)
      r.fail(field + ".id", t["id"].dump() + ", but `tokenizers` gives \"" + content.substr(0, 40) +
                                "\" the id " + std::to_string(id));
    if (!added_text_.emplace(id, content).second)
      r.fail(field + ".content", "\"" + content.substr(0, 40) + "\" given twice");
    // Matched after the normalizer, in each stretch between the others, as their normalized
    // text, which is also what they decode to.
    if (r.boolean(t, "normalized", field, !r.boolean(t, "special", field, false))) {
      normalized_.push_back({normalizer_.apply(content), id});
      added_text_[id] = normalized_.back().content;
    } else {
      raw_.push_back({content, id});
    }
    vocab_size_ = std::max(vocab_size_, id + 1);
  }
}

}  // namespace

std::unique_ptr<Tokenizer> parse_tokenizer_json(const std::string& text, const std::string& name) {
  if (text.size() > kMaxTokenizerJsonBytes)
    throw std::runtime_error(name + ": " + std::to_string(text.size()) +
                             " bytes, more than the limit of " +
                             std::to_string(kMaxTokenizerJsonBytes));
  const Json j = parse_bounded_json<Json>(text, name);
  try {
    return std::make_unique<JsonTokenizer>(j, name);
  } catch (const Json::exception& e) {
    throw std::runtime_error(name + ": unexpected content: " + e.what());
  }
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  return parse_tokenizer_json(read_bounded(path, kMaxTokenizerJsonBytes, "data.tokenizer " + path),
                              path);
}

}  // namespace loco::diloco
