// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2's kind, and what
// scripts/prepare-data trains), encoded and decoded in C++. No LibTorch here.
//
// Supported: model BPE (vocab; merges as "a b" strings or [a, b] pairs; ignore_merges), the
// ByteLevel pre-tokenizer with GPT-2's split regex (PCRE2, Unicode properties), the GPT-2
// byte<->unicode map, added tokens (matched in the text before splitting, leftmost-longest),
// the ByteLevel decoder, a ByteLevel or absent post-processor. Anything else (normalizers,
// other pre-tokenizers, unk tokens, dropout, byte fallback, subword prefixes, templates,
// truncation, padding) is refused naming the field: encoding it differently than
// `tokenizers` does would silently train on other ids.
#pragma once

#include <memory>
#include <string>

#include "diloco/data.hpp"

namespace loco::diloco {

inline constexpr std::size_t kMaxTokenizerJsonBytes = std::size_t(256) << 20;
inline constexpr std::size_t kMaxTokenizerEntries = std::size_t(1) << 21;  // vocab, merges
inline constexpr std::size_t kMaxTokenBytes = 4096;                        // one token's text
inline constexpr std::size_t kMaxAddedTokens = std::size_t(1) << 16;

// Parses the file; throws std::runtime_error "PATH: FIELD: what is wrong". The tokenizer's
// vocab_size() is its largest id + 1. decode() renders an id it does not know as nothing
// (a model's vocabulary may be padded past the tokenizer's), added tokens as their text.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);
// The same from the JSON text (tests); `name` stands for the path in errors.
std::unique_ptr<Tokenizer> parse_tokenizer_json(const std::string& text, const std::string& name);

}  // namespace loco::diloco
