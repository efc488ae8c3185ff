// The patterns of a tokenizer.json (Split pre-tokenizers, Replace normalizers and decoders:
// {"Regex": ...} or {"String": ...}), matched as Hugging Face's `tokenizers` matches them.
// Internal to tokenizer_json.cpp. No LibTorch here.
//
// `tokenizers` compiles a Regex with Oniguruma (Ruby syntax); loco with PCRE2 (UTF, Unicode
// properties, LF newlines, ^ and $ at line ends as in Ruby). What the two spell differently is
// rewritten (\s also matches U+0085 in Oniguruma; \v is the vertical tab; \uHHHH; {,n}) or
// refused naming the construct (\h, \w, \b, backreferences, POSIX brackets, nested classes
// and &&, possessive-looking quantifiers, inline options other than i): a pattern read
// differently would split differently, and train on other ids than `tokenizers` gives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loco::diloco::detail {

// A stretch of a text: a match of a pattern, or the text between two matches.
struct Match {
  std::size_t begin;
  std::size_t end;
  bool is_match;
};

// The PCRE2 spelling of an Oniguruma pattern; throws std::invalid_argument naming what it
// cannot carry over.
std::string onig_to_pcre2(std::string_view onig);

class Pattern {
 public:
  // Throws std::invalid_argument (the construct, or PCRE2's compile error).
  static Pattern regex(std::string_view onig);
  // A literal, non-empty (throws otherwise).
  static Pattern literal(std::string_view text);
  ~Pattern();
  Pattern(Pattern&&) noexcept;
  Pattern& operator=(Pattern&&) noexcept;

  // `tokenizers`' find_matches: the text cut into its matches (as Oniguruma's iterator finds
  // them: an empty match right after the previous match is skipped) and the stretches
  // between them, handed to `fn` in order; nothing for an empty text. Throws
  // std::runtime_error on a PCRE2 matching error (a limit).
  // A character PCRE2's Unicode tables (14.0) lack but `tokenizers` knows (U+1FA77, Unicode
  // 15's pink heart) is matched as a stand-in of the general category `tokenizers` gives it,
  // of the same UTF-8 length (tokenizer_unicode_newer.inc, scripts/unicode-newer): the split
  // is `tokenizers`'. A pattern that names a script (\p{Han}) rather than a general category
  // cannot be matched so: it throws std::runtime_error naming the character instead of
  // splitting otherwise.
  void find_matches(std::string_view text, const std::function<void(const Match&)>& fn) const;

 private:
  struct Code;
  Pattern(std::unique_ptr<Code> code, std::string literal);
  static std::unique_ptr<Code> compile(std::string_view pattern);
  // `text` with each character PCRE2's tables lack replaced by its stand-in, in `copy` (then
  // the view is of it), or `text` itself when it has none. Throws when one has no stand-in
  // that this pattern would class as `tokenizers` does.
  std::string_view with_stand_ins(std::string_view text, std::string& copy) const;
  std::unique_ptr<Code> code_;  // null: a literal
  std::string literal_;
  bool by_category_ = true;  // its \p{...} name general categories only
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// The pieces [begin, end) of `text` that a Split by `p` keeps, handed to `emit` in order, as
// `tokenizers`' NormalizedString::split makes them; empty pieces dropped.
void split_pieces(const Pattern& p, std::string_view text, SplitBehavior behavior, bool invert,
                  const std::function<void(std::size_t, std::size_t)>& emit);

// Every match of `p` in `text` replaced by `content` (the Replace normalizer and decoder).
// Throws std::runtime_error when that makes the text more than 8 times and 64 bytes longer
// (a hostile file; a real Replace writes a character for a character).
std::string replace_all(std::string_view text, const Pattern& p, std::string_view content);

}  // namespace loco::diloco::detail
