// The BPE model of a tokenizer.json: one pre-tokenized word to ids, as `tokenizers`'
// models::bpe does it. Internal to tokenizer_json.cpp. No LibTorch here.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace loco::diloco::detail {

class BpeModel {
 public:
  // From the JSON's "model" object; throws std::runtime_error "NAME: model.FIELD: what".
  // byte_level: the words are raw bytes, each byte a symbol of GPT-2's byte<->unicode map
  // (the ByteLevel pre-tokenizer ran); otherwise each character is a symbol: its token,
  // or with byte_fallback the <0xNN> tokens of its UTF-8 bytes, or unk_token.
  BpeModel(const nlohmann::json& m, const std::string& name, bool byte_level);

  // Appends the ids of one word.
  void encode_word(std::string_view word, std::vector<std::uint32_t>& out) const;

  // The token of an id; nullptr when the vocabulary has none.
  const std::string* token(std::uint32_t id) const {
    return id < tokens_.size() && known_[id] ? &tokens_[id] : nullptr;
  }
  std::uint32_t max_id() const { return static_cast<std::uint32_t>(tokens_.size()) - 1; }

 private:
  struct Merge {
    std::uint32_t rank;
    std::uint32_t id;
  };
  void read_vocab(const nlohmann::json& m, const std::string& name);
  void read_merges(const nlohmann::json& m, const std::string& name);
  void read_symbols(const nlohmann::json& m, const std::string& name);
  // The word's symbols before merging, as merge_word in `tokenizers` makes them.
  std::vector<std::uint32_t> symbols(std::string_view word) const;
  std::vector<std::uint32_t> merge(std::vector<std::uint32_t> ids) const;
  std::vector<std::uint32_t> bpe(std::string_view word) const;
  // Where a long word of characters may be cut without changing its merges (see .cpp).
  bool hard_boundary(std::uint32_t before, std::uint32_t at) const;
  void encode_cached(std::string_view word, std::vector<std::uint32_t>& out) const;
  const std::uint32_t* char_id(std::uint32_t cp) const;

  bool byte_level_;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  bool has_unk_ = false;
  std::uint32_t unk_id_ = 0;
  std::unordered_map<std::string, std::uint32_t> vocab_;
  std::vector<std::string> tokens_;
  std::vector<bool> known_;
  std::unordered_map<std::uint32_t, std::uint32_t> char_ids_;  // one-character tokens
  std::uint32_t byte_id_[256] = {};                            // byte-level symbol or <0xNN>
  // byte_id_ of a byte that valid UTF-8 never holds (0xC0, 0xC1, 0xF5-0xFF) whose symbol a
  // byte-level vocabulary lacks (GPT-NeoX's, MPT's): such a byte cannot be encoded.
  static constexpr std::uint32_t kNoSymbol = 0xFFFFFFFFu;
  std::unordered_map<std::uint64_t, Merge> merges_;
  // For each character c: the last characters of the left parts of merges whose right part
  // starts with c.
  std::unordered_map<std::uint32_t, std::unordered_set<std::uint32_t>> joins_before_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::uint32_t>> cache_;
};

}  // namespace loco::diloco::detail
