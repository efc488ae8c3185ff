// A Hugging Face tokenizer.json, encoded and decoded in C++ as `tokenizers` does it (its
// encode(text, add_special_tokens=False)). No LibTorch here.
//
// Supported, the families a user brings:
// - GPT-2's and scripts/prepare-data's byte-level BPE: pre-tokenizer ByteLevel (GPT-2's split
//   regex, add_prefix_space), decoder ByteLevel.
// - Llama 3's: pre-tokenizer Sequence[Split(its Regex, Isolated), ByteLevel(use_regex false)],
//   model ignore_merges, special tokens after the vocabulary.
// - SentencePiece-style BPE as `tokenizers` converts it (Llama 2, Mistral): normalizer
//   Sequence[Prepend("▁"), Replace(" ", "▁")] or pre-tokenizer Metaspace (prepend_scheme
//   always / never / first, split); model byte_fallback (<0xNN> tokens), unk_token, fuse_unk;
//   decoder Sequence[Replace, ByteFallback, Fuse, Strip].
// In general: model BPE (vocab; merges "a b" or [a, b], a pair given twice taking its last
// rank; ignore_merges; byte_fallback; unk_token, fuse_unk); normalizers Prepend, Replace and
// Sequence; pre-tokenizers Split (Regex or String pattern, every behavior, invert), ByteLevel
// (the last part of a Sequence), Metaspace and Sequence; added tokens matched leftmost-longest
// in the raw text, those with normalized true after the normalizer (with the ids `tokenizers`
// gives them); decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence (or
// none: tokens joined by spaces).
//
// Post-processors (ByteLevel, TemplateProcessing, Sequence of them) are accepted and not
// applied: they add <|begin_of_text|> or <s> around a sequence given to
// encode(add_special_tokens=True); loco encodes corpora, whose documents prepare-data
// separates with an end-of-text token.
//
// Regexes are Oniguruma's (tokenizers) run by PCRE2: tokenizer_regex.hpp says what is
// rewritten, what is refused, and why a text with a character newer than PCRE2's Unicode
// tables is refused by a regex. Anything else (Unigram, WordPiece, WordLevel models;
// normalizers such as NFC, NFKC, Lowercase, Precompiled; pre-tokenizers such as Whitespace,
// Digits, Punctuation; dropout, subword prefixes, lstrip/rstrip/single_word added tokens,
// truncation, padding) is refused naming the field and its value: encoding it differently
// than `tokenizers` does would silently train on other ids.
#pragma once

#include <memory>
#include <string>

#include "diloco/data/data.hpp"

namespace loco::diloco {

inline constexpr std::size_t kMaxTokenizerJsonBytes = std::size_t(256) << 20;
inline constexpr std::size_t kMaxTokenizerEntries = std::size_t(1) << 21;  // vocab, merges
inline constexpr std::size_t kMaxTokenBytes = 4096;                        // one token's text
inline constexpr std::size_t kMaxAddedTokens = std::size_t(1) << 16;

// Parses the file; throws std::runtime_error "PATH: FIELD: what is wrong". The tokenizer's
// vocab_size() is its largest id + 1. encode() throws std::runtime_error on text it cannot
// split as `tokenizers` does (a PCRE2 limit, a character newer than PCRE2's tables).
// decode() gives `tokenizers`' decode(ids, skip_special_tokens=False), except that bytes
// that are not UTF-8 stay as they are (`tokenizers` writes U+FFFD for each), and renders an
// id it does not know as nothing (a model's vocabulary may be padded past the tokenizer's).
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);
// The same from the JSON text (tests); `name` stands for the path in errors.
std::unique_ptr<Tokenizer> parse_tokenizer_json(const std::string& text, const std::string& name);

}  // namespace loco::diloco
