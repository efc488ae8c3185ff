#include "diloco/tokenizer_json.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace loco::diloco {

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer split, as the ByteLevel pre-tokenizer of `tokenizers` uses it.
constexpr const char* kGpt2Split =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Next code point of valid UTF-8 at s[i] (nlohmann validates the JSON's strings); advances i.
std::uint32_t next_code_point(const std::string& s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
  std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1fu) : n == 3 ? (c & 0x0fu) : (c & 0x07u);
  for (int k = 1; k < n && i + static_cast<std::size_t>(k) < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]) & 0x3fu);
  i += static_cast<std::size_t>(n);
  return cp;
}

// GPT-2's byte <-> unicode map: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100 onwards, in byte order; no byte becomes whitespace or a control.
struct ByteMap {
  std::string utf8[256];     // byte -> its character, UTF-8
  std::vector<int> byte_of;  // code point -> byte, -1 when none (code points < 324)
  ByteMap() : byte_of(324, -1) {
    std::uint32_t extra = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      const std::uint32_t cp = self ? b : extra++;
      append_utf8(utf8[b], cp);
      byte_of[cp] = static_cast<int>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

class Pcre2Split {
 public:
  Pcre2Split() {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Split), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error(std::string("tokenizer.json: cannot compile the split regex: ") +
                               reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
  }
  ~Pcre2Split() { pcre2_code_free(code_); }
  Pcre2Split(const Pcre2Split&) = delete;
  Pcre2Split& operator=(const Pcre2Split&) = delete;

  // Calls fn(begin, end) for the matches and for the text between them (none with valid
  // UTF-8: some alternative matches every character; invalid bytes never match).
  template <class Fn>
  void split(const std::string& s, std::size_t from, std::size_t to, Fn&& fn) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    std::size_t at = from;
    while (at < to) {
      const int rc =
          pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), to, at, 0, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        // Never a silently different split: the ids would not be those of `tokenizers`.
        throw std::runtime_error("tokenizer.json: the split regex failed at byte " +
                                 std::to_string(at) + ": " + reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[0] > at) fn(at, static_cast<std::size_t>(ov[0]));
      if (ov[1] == ov[0]) break;  // the pattern matches nothing empty; defensive
      fn(static_cast<std::size_t>(ov[0]), static_cast<std::size_t>(ov[1]));
      at = ov[1];
    }
    if (at < to) fn(at, to);
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

struct AddedToken {
  std::string content;
  std::uint32_t id;
};

class ByteLevelBpe final : public Tokenizer {
 public:
  ByteLevelBpe(const Json& j, const std::string& name) {
    auto fail = [&](const std::string& field, const std::string& what) -> void {
      throw std::runtime_error(name + ": " + field + ": " + what);
    };
    auto require_null = [&](const Json& o, const char* key, const std::string& field) {
      if (o.contains(key) && !o[key].is_null())
        fail(field, "not supported (only null), got " + o[key].dump().substr(0, 80));
    };
    auto require_false = [&](const Json& o, const char* key, const std::string& field) {
      if (o.contains(key) && !(o[key].is_boolean() && !o[key].get<bool>()))
        fail(field, "not supported (only false), got " + o[key].dump().substr(0, 80));
    };
    if (!j.is_object()) fail("(top level)", "expected an object");
    require_null(j, "truncation", "truncation");
    require_null(j, "padding", "padding");
    require_null(j, "normalizer", "normalizer");

    // Pre-tokenizer: ByteLevel with its regex.
    const auto& pre = j.value("pre_tokenizer", Json());
    if (!pre.is_object() || pre.value("type", "") != "ByteLevel")
      fail("pre_tokenizer", "only ByteLevel is supported, got " + pre.dump().substr(0, 80));
    if (pre.contains("use_regex") &&
        !(pre["use_regex"].is_boolean() && pre["use_regex"].get<bool>()))
      fail("pre_tokenizer.use_regex", "only true is supported");
    if (pre.contains("add_prefix_space")) {
      if (!pre["add_prefix_space"].is_boolean())
        fail("pre_tokenizer.add_prefix_space", "expected a boolean");
      add_prefix_space_ = pre["add_prefix_space"].get<bool>();
    }
    const auto& post = j.value("post_processor", Json());
    if (!post.is_null() && !(post.is_object() && post.value("type", "") == "ByteLevel"))
      fail("post_processor",
           "only ByteLevel or null is supported, got " + post.dump().substr(0, 80));
    const auto& dec = j.value("decoder", Json());
    if (!dec.is_null() && !(dec.is_object() && dec.value("type", "") == "ByteLevel"))
      fail("decoder", "only ByteLevel or null is supported, got " + dec.dump().substr(0, 80));

    // Model.
    if (!j.contains("model") || !j["model"].is_object()) fail("model", "missing");
    const auto& m = j["model"];
    if (m.value("type", "BPE") != "BPE") fail("model.type", "only BPE is supported");
    require_null(m, "dropout", "model.dropout");
    require_null(m, "unk_token", "model.unk_token");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() &&
          !(m[k].is_string() && m[k].get<std::string>().empty()))
        fail(std::string("model.") + k, "not supported (only null)");
    require_false(m, "fuse_unk", "model.fuse_unk");
    require_false(m, "byte_fallback", "model.byte_fallback");
    if (m.contains("ignore_merges")) {
      if (!m["ignore_merges"].is_boolean()) fail("model.ignore_merges", "expected a boolean");
      ignore_merges_ = m["ignore_merges"].get<bool>();
    }
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail("model.vocab", "expected an object");
    const auto& vocab = m["vocab"];
    if (vocab.size() > kMaxTokenizerEntries)
      fail("model.vocab", std::to_string(vocab.size()) + " entries, more than " +
                              std::to_string(kMaxTokenizerEntries));
    std::uint32_t max_id = 0;
    for (const auto& [tok, idj] : vocab.items()) {
      if (!idj.is_number_unsigned() || idj.get<std::uint64_t>() >= kMaxTokenizerEntries)
        fail("model.vocab[" + tok.substr(0, 40) + "]", "expected an id in [0, " +
                                                           std::to_string(kMaxTokenizerEntries) +
                                                           "), got " + idj.dump());
      if (tok.size() > kMaxTokenBytes)
        fail("model.vocab", "a token longer than " + std::to_string(kMaxTokenBytes) + " bytes");
      const auto id = idj.get<std::uint32_t>();
      vocab_.emplace(tok, id);
      max_id = std::max(max_id, id);
    }
    // Ids -> bytes (through the byte map), for decoding.
    id_bytes_.assign(max_id + 1, std::string());
    known_.assign(max_id + 1, false);
    const auto& bm = byte_map();
    for (const auto& [tok, id] : vocab_) {
      std::string bytes;
      for (std::size_t i = 0; i < tok.size();) {
        const std::size_t at = i;
        const std::uint32_t cp = next_code_point(tok, i);
        if (cp < bm.byte_of.size() && bm.byte_of[cp] >= 0)
          bytes.push_back(static_cast<char>(bm.byte_of[cp]));
        else
          bytes.append(tok, at, i - at);
      }
      id_bytes_[id] = std::move(bytes);
      known_[id] = true;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(bm.utf8[b]);
      if (it == vocab_.end())
        fail("model.vocab", "lacks the byte-level symbol of byte " + std::to_string(b) +
                                " (a byte-level BPE holds all 256)");
      byte_id_[b] = it->second;
    }

    if (!m.contains("merges") || !m["merges"].is_array()) fail("model.merges", "expected an array");
    const auto& merges = m["merges"];
    if (merges.size() > kMaxTokenizerEntries)
      fail("model.merges", std::to_string(merges.size()) + " entries, more than " +
                               std::to_string(kMaxTokenizerEntries));
    merges_.reserve(merges.size());
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const auto& e = merges[r];
      const std::string field = "model.merges[" + std::to_string(r) + "]";
      std::string a, b;
      if (e.is_string()) {
        const auto s = e.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(field, "expected \"a b\", got " + e.dump().substr(0, 80));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        fail(field, "expected \"a b\" or [a, b], got " + e.dump().substr(0, 80));
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), ab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || ab == vocab_.end())
        fail(field, "\"" + a.substr(0, 40) + "\", \"" + b.substr(0, 40) +
                        "\" or their merge is not in model.vocab");
      // The first rank of a pair wins, as in `tokenizers`.
      merges_.emplace(pair_key(ia->second, ib->second),
                      Merge{static_cast<std::uint32_t>(r), ab->second});
    }

    // Added tokens: matched in the raw text (there is no normalizer).
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      const auto& at = j["added_tokens"];
      if (!at.is_array()) fail("added_tokens", "expected an array");
      if (at.size() > kMaxAddedTokens)
        fail("added_tokens", "more than " + std::to_string(kMaxAddedTokens));
      for (std::size_t i = 0; i < at.size(); ++i) {
        const auto& t = at[i];
        const std::string field = "added_tokens[" + std::to_string(i) + "]";
        if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() ||
            !t.contains("content") || !t["content"].is_string())
          fail(field, "expected {id, content, ...}");
        for (const char* k : {"single_word", "lstrip", "rstrip"})
          require_false(t, k, field + "." + k);
        const auto content = t["content"].get<std::string>();
        const auto id = t["id"].get<std::uint64_t>();
        if (content.empty() || content.size() > kMaxTokenBytes)
          fail(field + ".content", "empty or longer than " + std::to_string(kMaxTokenBytes));
        if (id >= kMaxTokenizerEntries) fail(field + ".id", "out of range");
        added_.push_back({content, static_cast<std::uint32_t>(id)});
        if (id >= id_bytes_.size()) {
          id_bytes_.resize(id + 1);
          known_.resize(id + 1, false);
        }
        id_bytes_[id] = content;
        known_[id] = true;
      }
    }
  }

  int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }

  std::vector<std::uint32_t> encode(const std::string& text) const override {
    std::vector<std::uint32_t> out;
    // Where each added token next occurs at or after `at` (npos: nowhere); found once per
    // occurrence, so a text with many of one and none of another stays linear.
    std::vector<std::size_t> next(added_.size(), 0);
    std::vector<bool> stale(added_.size(), true);
    std::size_t at = 0;
    while (at < text.size()) {
      // The leftmost added token, the longest at that position.
      std::size_t best = std::string::npos;
      const AddedToken* hit = nullptr;
      for (std::size_t k = 0; k < added_.size(); ++k) {
        if (stale[k] || (next[k] != std::string::npos && next[k] < at)) {
          next[k] = text.find(added_[k].content, at);
          stale[k] = false;
        }
        const std::size_t p = next[k];
        if (p == std::string::npos) continue;
        if (p < best || (p == best && added_[k].content.size() > hit->content.size())) {
          best = p;
          hit = &added_[k];
        }
      }
      const std::size_t end = hit ? best : text.size();
      if (end > at) encode_piece(text, at, end, out);
      if (!hit) break;
      out.push_back(hit->id);
      at = best + hit->content.size();
    }
    return out;
  }

  std::string decode(std::span<const std::uint32_t> tokens) const override {
    std::string out;
    for (auto t : tokens)
      if (t < id_bytes_.size() && known_[t]) out += id_bytes_[t];
    return out;
  }

 private:
  struct Merge {
    std::uint32_t rank;
    std::uint32_t id;
  };
  static std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) {
    return (std::uint64_t(a) << 32) | b;
  }

  // Text between added tokens: split by the regex, each word to ids (cached).
  void encode_piece(const std::string& text, std::size_t from, std::size_t to,
                    std::vector<std::uint32_t>& out) const {
    std::string prefixed;
    const std::string* s = &text;
    if (add_prefix_space_ && text[from] != ' ') {
      prefixed = " " + text.substr(from, to - from);
      s = &prefixed;
      from = 0;
      to = prefixed.size();
    }
    split_.split(*s, from, to, [&](std::size_t b, std::size_t e) {
      const std::string word = s->substr(b, e - b);
      std::lock_guard lock(cache_mu_);
      auto it = cache_.find(word);
      if (it == cache_.end()) {
        if (cache_.size() > 100000) cache_.clear();  // bounded; words repeat
        it = cache_.emplace(word, bpe(word)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    });
  }

  // Byte-level BPE of one word: repeatedly merges the adjacent pair of lowest rank (the
  // leftmost on ties), as `tokenizers` does, over a linked list with a heap of candidates.
  std::vector<std::uint32_t> bpe(const std::string& word) const {
    const auto& bm = byte_map();
    if (ignore_merges_) {
      std::string mapped;
      for (unsigned char c : word) mapped += bm.utf8[c];
      if (auto it = vocab_.find(mapped); it != vocab_.end()) return {it->second};
    }
    const std::size_t n = word.size();
    std::vector<std::uint32_t> id(n);
    std::vector<std::size_t> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (std::size_t i = 0; i < n; ++i) {
      id[i] = byte_id_[static_cast<unsigned char>(word[i])];
      prev[i] = i == 0 ? SIZE_MAX : i - 1;
      next[i] = i + 1 == n ? SIZE_MAX : i + 1;
    }
    struct Cand {
      std::uint32_t rank;
      std::size_t pos;  // left symbol
      std::uint32_t left, right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
    auto push = [&](std::size_t i) {
      if (i == SIZE_MAX || next[i] == SIZE_MAX) return;
      auto it = merges_.find(pair_key(id[i], id[next[i]]));
      if (it != merges_.end()) heap.push({it->second.rank, i, id[i], id[next[i]]});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const std::size_t i = c.pos;
      // Stale: the left symbol was merged away or either side changed since.
      if (!alive[i] || next[i] == SIZE_MAX || id[i] != c.left || id[next[i]] != c.right) continue;
      const std::size_t j = next[i];
      id[i] = merges_.at(pair_key(c.left, c.right)).id;
      alive[j] = false;
      next[i] = next[j];
      if (next[j] != SIZE_MAX) prev[next[j]] = i;
      push(prev[i]);
      push(i);
    }
    std::vector<std::uint32_t> ids;
    for (std::size_t i = 0; i != SIZE_MAX && n > 0; i = next[i]) ids.push_back(id[i]);
    return ids;
  }

  std::unordered_map<std::string, std::uint32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::uint32_t byte_id_[256] = {};
  std::vector<std::string> id_bytes_;
  std::vector<bool> known_;
  std::vector<AddedToken> added_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  Pcre2Split split_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::uint32_t>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> parse_tokenizer_json(const std::string& text, const std::string& name) {
  if (text.size() > kMaxTokenizerJsonBytes)
    throw std::runtime_error(name + ": " + std::to_string(text.size()) +
                             " bytes, more than the limit of " +
                             std::to_string(kMaxTokenizerJsonBytes));
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw std::runtime_error(name + ": not JSON: " + e.what());
  }
  try {
    return std::make_unique<ByteLevelBpe>(j, name);
  } catch (const Json::exception& e) {
    throw std::runtime_error(name + ": unexpected content: " + e.what());
  }
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("data.tokenizer: cannot open " + path);
  const auto size = static_cast<std::size_t>(in.tellg());
  if (size > kMaxTokenizerJsonBytes)
    throw std::runtime_error(path + ": " + std::to_string(size) +
                             " bytes, more than the limit of " +
                             std::to_string(kMaxTokenizerJsonBytes));
  in.seekg(0);
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  return parse_tokenizer_json(text, path);
}

}  // namespace loco::diloco
