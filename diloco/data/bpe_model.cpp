#include "diloco/data/bpe_model.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "diloco/data/tokenizer_json.hpp"
#include "diloco/data/tokenizer_text.hpp"

namespace loco::diloco::detail {

namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(const std::string& name, const std::string& field, const std::string& what) {
  throw std::runtime_error(name + ": " + field + ": " + what);
}

std::string shown(const Json& v) { return v.dump().substr(0, 80); }

// m[key] ("vocab", "merges"): an object or an array of at most kMaxTokenizerEntries entries.
const Json& entries(const Json& m, const char* key, bool object, const std::string& name) {
  const std::string field = std::string("model.") + key;
  if (!m.contains(key) || !(object ? m[key].is_object() : m[key].is_array()))
    fail(name, field, object ? "expected an object" : "expected an array");
  const Json& e = m[key];
  if (e.size() > kMaxTokenizerEntries)
    fail(name, field,
         std::to_string(e.size()) + " entries, more than " + std::to_string(kMaxTokenizerEntries));
  return e;
}

bool flag(const Json& m, const char* key, const std::string& name) {
  if (!m.contains(key) || m[key].is_null()) return false;
  if (!m[key].is_boolean())
    fail(name, std::string("model.") + key, "expected a boolean, got " + shown(m[key]));
  return m[key].get<bool>();
}

std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) { return (std::uint64_t(a) << 32) | b; }

// The only code point of s, or kInvalidByte when s is not exactly one.
std::uint32_t single_code_point(std::string_view s) {
  if (s.empty()) return kInvalidByte;
  std::size_t i = 0;
  const std::uint32_t cp = next_code_point(s, i);
  return i == s.size() ? cp : kInvalidByte;
}

std::uint32_t last_code_point(std::string_view s) {
  std::size_t from = s.size() - 1;
  while (from > 0 && (static_cast<unsigned char>(s[from]) & 0xc0) == 0x80) --from;
  std::size_t i = from;
  return next_code_point(s, i);
}

std::uint32_t first_code_point(std::string_view s) {
  std::size_t i = 0;
  return next_code_point(s, i);
}

// Words longer than this are cut at hard boundaries (characters only) and not cached whole.
constexpr std::size_t kCutAbove = 64;
constexpr std::size_t kCachedUpTo = 256;
constexpr std::size_t kCacheEntries = 100000;

}  // namespace

BpeModel::BpeModel(const Json& m, const std::string& name, bool byte_level)
    : byte_level_(byte_level) {
  if (!m.is_object()) fail(name, "model", "missing");
  if (m.contains("type") && !(m["type"].is_string() && m["type"].get<std::string>() == "BPE"))
    fail(name, "model.type", "only BPE is supported, got " + shown(m["type"]));
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    fail(name, "model.dropout", "not supported (only null or 0), got " + shown(m["dropout"]));
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      fail(name, std::string("model.") + k, "not supported (only null), got " + shown(m[k]));
  byte_fallback_ = flag(m, "byte_fallback", name);
  ignore_merges_ = flag(m, "ignore_merges", name);
  fuse_unk_ = flag(m, "fuse_unk", name);
  read_vocab(m, name);
  read_symbols(m, name);
  read_merges(m, name);
}

void BpeModel::read_vocab(const Json& m, const std::string& name) {
  const auto& vocab = entries(m, "vocab", /*object=*/true, name);
  for (const auto& [tok, idj] : vocab.items()) {
    if (!idj.is_number_unsigned() || idj.get<std::uint64_t>() >= kMaxTokenizerEntries)
      fail(
          name, "model.vocab[" + tok.substr(0, 40) + "]",
          "expected an id in [0, " + std::to_string(kMaxTokenizerEntries) + "), got " + idj.dump());
    if (tok.size() > kMaxTokenBytes)
      fail(name, "model.vocab", "a token longer than " + std::to_string(kMaxTokenBytes) + " bytes");
    const auto id = idj.get<std::uint32_t>();
    if (id >= tokens_.size()) {
      tokens_.resize(id + 1);
      known_.resize(id + 1, false);
    }
    if (known_[id])
      fail(name, "model.vocab[" + tok.substr(0, 40) + "]", "id " + idj.dump() + " given twice");
    tokens_[id] = tok;
    known_[id] = true;
    vocab_.emplace(tok, id);
    if (const auto cp = single_code_point(tok); cp != kInvalidByte) char_ids_.emplace(cp, id);
  }
  if (tokens_.empty()) fail(name, "model.vocab", "empty");
}

void BpeModel::read_symbols(const Json& m, const std::string& name) {
  for (int b = 0; (byte_level_ || byte_fallback_) && b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    const std::string sym = byte_level_ ? byte_map().utf8[b] : std::string(hex);
    const auto it = vocab_.find(sym);
    // The 13 bytes valid UTF-8 never holds: a byte-level vocabulary may lack their symbols
    // (GPT-NeoX's and MPT's do), and `tokenizers` encodes valid text with it all the same.
    const bool never_in_utf8 = b == 0xC0 || b == 0xC1 || b >= 0xF5;
    if (it == vocab_.end() && byte_level_ && never_in_utf8) {
      byte_id_[b] = kNoSymbol;
      continue;
    }
    if (it == vocab_.end())
      fail(name, "model.vocab",
           byte_level_ ? "lacks the byte-level symbol of byte " + std::to_string(b) +
                             " (a byte-level BPE holds all 256)"
                       : "lacks " + sym + " (model.byte_fallback needs all 256 byte tokens)");
    byte_id_[b] = it->second;
  }
  if (!m.contains("unk_token") || m["unk_token"].is_null()) return;
  if (!m["unk_token"].is_string())
    fail(name, "model.unk_token", "expected a string or null, got " + shown(m["unk_token"]));
  const auto it = vocab_.find(m["unk_token"].get<std::string>());
  if (it != vocab_.end()) {
    has_unk_ = true;
    unk_id_ = it->second;
  } else if (!byte_level_ && !byte_fallback_) {  // it would be needed for unknown characters
    fail(name, "model.unk_token", shown(m["unk_token"]) + " is not in model.vocab");
  }
}

namespace {

// A merge as "a b" or [a, b].
std::pair<std::string, std::string> merge_parts(const Json& e, const std::string& name,
                                                const std::string& field) {
  if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string())
    return {e[0].get<std::string>(), e[1].get<std::string>()};
  if (!e.is_string()) fail(name, field, "expected \"a b\" or [a, b], got " + shown(e));
  const auto s = e.get<std::string>();
  const auto sp = s.find(' ');
  if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
    fail(name, field, "expected \"a b\", got " + shown(e));
  return {s.substr(0, sp), s.substr(sp + 1)};
}

}  // namespace

void BpeModel::read_merges(const Json& m, const std::string& name) {
  const auto& merges = entries(m, "merges", /*object=*/false, name);
  merges_.reserve(merges.size());
  std::uint32_t rank = 0;
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string field = "model.merges[" + std::to_string(r) + "]";
    // merges.txt's header, which `tokenizers` skips in the "a b" form: it takes no rank.
    if (merges[r].is_string() && merges[r].get<std::string>().starts_with("#version")) continue;
    const auto [a, b] = merge_parts(merges[r], name, field);
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ab = vocab_.find(a + b);
    if (a.empty() || b.empty() || ia == vocab_.end() || ib == vocab_.end() || ab == vocab_.end())
      fail(name, field,
           "\"" + a.substr(0, 40) + "\", \"" + b.substr(0, 40) +
               "\" or their merge is not in model.vocab");
    // A pair given twice takes its last rank, as `tokenizers`' map of merges does.
    merges_.insert_or_assign(pair_key(ia->second, ib->second), Merge{rank++, ab->second});
    if (!byte_level_) joins_before_[first_code_point(b)].insert(last_code_point(a));
  }
}

const std::uint32_t* BpeModel::char_id(std::uint32_t cp) const {
  const auto it = char_ids_.find(cp);
  return it == char_ids_.end() ? nullptr : &it->second;
}

std::vector<std::uint32_t> BpeModel::symbols(std::string_view word) const {
  std::vector<std::uint32_t> ids;
  ids.reserve(word.size());
  if (byte_level_) {
    for (unsigned char c : word) {
      if (byte_id_[c] == kNoSymbol)
        throw std::runtime_error(
            "the text is not valid UTF-8: it holds a byte that valid UTF-8 never holds, and "
            "this byte-level vocabulary (as GPT-NeoX's) has no symbol for it");
      ids.push_back(byte_id_[c]);
    }
    return ids;
  }
  bool unk_pending = false;  // a run of unknown characters, fused into one unk when fuse_unk
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t at = i;
    const std::uint32_t cp = next_code_point(word, i);
    if (const auto* id = char_id(cp)) {
      if (unk_pending) ids.push_back(unk_id_);
      unk_pending = false;
      ids.push_back(*id);
    } else if (byte_fallback_) {  // every <0xNN> is there (checked): no unk is pending
      for (std::size_t k = at; k < i; ++k)
        ids.push_back(byte_id_[static_cast<unsigned char>(word[k])]);
    } else if (has_unk_) {
      if (unk_pending && !fuse_unk_) ids.push_back(unk_id_);
      unk_pending = true;
    }  // no unk token: `tokenizers` drops the character
  }
  if (unk_pending) ids.push_back(unk_id_);
  return ids;
}

namespace {

// A word's symbols as a linked list, with a heap of the merges its adjacent pairs allow.
class Merger {
 public:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  template <class Find>
  Merger(std::vector<std::uint32_t> ids, Find find) : ids_(std::move(ids)) {
    const std::size_t n = ids_.size();
    if (n > kNone - 1) throw std::runtime_error("tokenizer.json: a word of more than 4 GiB");
    prev_.resize(n);
    next_.resize(n);
    alive_.assign(n, true);
    for (std::uint32_t i = 0; i < n; ++i) {
      prev_[i] = i == 0 ? kNone : i - 1;
      next_[i] = i + 1 == n ? kNone : i + 1;
    }
    for (std::uint32_t i = 0; i + 1 < n; ++i) push(i, find);
  }

  // Pops candidates until one still applies and merges it; false when none is left.
  template <class Find>
  bool step(Find find) {
    while (!heap_.empty()) {
      const Cand c = heap_.top();
      heap_.pop();
      const std::uint32_t i = c.pos;
      if (!alive_[i] || next_[i] == kNone) continue;
      const std::uint32_t j = next_[i];
      const auto* m = find(ids_[i], ids_[j]);
      if (!m || m->id != c.id) continue;  // stale: the pair makes another id now, or none
      ids_[i] = c.id;
      alive_[j] = false;
      next_[i] = next_[j];
      if (next_[j] != kNone) prev_[next_[j]] = i;
      push(prev_[i], find);
      push(i, find);
      return true;
    }
    return false;
  }

  std::vector<std::uint32_t> result() const {
    std::vector<std::uint32_t> out;
    for (std::uint32_t i = 0; !ids_.empty() && i != kNone; i = next_[i]) out.push_back(ids_[i]);
    return out;
  }

 private:
  struct Cand {
    std::uint32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  template <class Find>
  void push(std::uint32_t i, Find find) {
    if (i == kNone || next_[i] == kNone) return;
    if (const auto* m = find(ids_[i], ids_[next_[i]])) heap_.push({m->rank, i, m->id});
  }

  std::vector<std::uint32_t> ids_, prev_, next_;
  std::vector<bool> alive_;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap_;
};

}  // namespace

// Repeatedly merges the adjacent pair of lowest rank (the leftmost on ties); a candidate is
// stale when its pair no longer makes the id it was queued with (`tokenizers`'
// Word::merge_all).
std::vector<std::uint32_t> BpeModel::merge(std::vector<std::uint32_t> ids) const {
  auto find = [this](std::uint32_t a, std::uint32_t b) -> const Merge* {
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  Merger m(std::move(ids), find);
  while (m.step(find)) {
  }
  return m.result();
}

std::vector<std::uint32_t> BpeModel::bpe(std::string_view word) const {
  if (ignore_merges_) {
    std::string mapped;
    if (byte_level_)
      for (unsigned char c : word) mapped += byte_map().utf8[c];
    const auto it = vocab_.find(byte_level_ ? mapped : std::string(word));
    if (it != vocab_.end()) return {it->second};
  }
  return merge(symbols(word));
}

void BpeModel::encode_cached(std::string_view word, std::vector<std::uint32_t>& out) const {
  if (word.size() > kCachedUpTo) {
    const auto ids = bpe(word);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  const std::string key(word);
  std::lock_guard lock(cache_mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (cache_.size() >= kCacheEntries) cache_.clear();  // bounded; words repeat
    it = cache_.emplace(key, bpe(word)).first;
  }
  out.insert(out.end(), it->second.begin(), it->second.end());
}

// Between two known characters q and c (each its own first symbol), no merge can ever join
// across when no merge's right part starts with c while its left part ends with q: every
// merged symbol is the concatenation of its parts, so the symbol ending at q ends with q and
// the one starting at c starts with c. The halves then merge independently, as in the whole
// word (a candidate's order among those of its own half is unchanged): a text that the
// SentencePiece-style pipeline hands over as one word is cut into words before "▁" and
// cached like the words of a byte-level BPE.
bool BpeModel::hard_boundary(std::uint32_t before, std::uint32_t at) const {
  if (!char_id(before) || !char_id(at)) return false;
  const auto it = joins_before_.find(at);
  return it == joins_before_.end() || !it->second.contains(before);
}

void BpeModel::encode_word(std::string_view word, std::vector<std::uint32_t>& out) const {
  if (byte_level_ || ignore_merges_ || word.size() <= kCutAbove) return encode_cached(word, out);
  std::size_t start = 0;
  std::uint32_t before = kInvalidByte;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t at = i;
    const std::uint32_t cp = next_code_point(word, i);
    if (at > start && hard_boundary(before, cp)) {
      encode_cached(word.substr(start, at - start), out);
      start = at;
    }
    before = cp;
  }
  encode_cached(word.substr(start), out);
}

}  // namespace loco::diloco::detail
