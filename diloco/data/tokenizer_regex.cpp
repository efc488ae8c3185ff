#include "diloco/data/tokenizer_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>

#include "diloco/data/tokenizer_text.hpp"

namespace loco::diloco::detail {

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument(what +
                              ": Oniguruma (which `tokenizers` uses) and PCRE2 (which loco "
                              "uses) read it differently, or loco does not translate it");
}

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// Copies p[from] (a '{') through the next '}' to out; returns the index of the '}'.
std::size_t copy_braces(std::string_view p, std::size_t from, std::string& out) {
  const std::size_t close = p.find('}', from);
  if (close == std::string_view::npos) refuse("an unclosed { after an escape");
  out.append(p.substr(from, close - from + 1));
  return close;
}

// Unicode's White_Space, which Oniguruma's \s is (PCRE2's also has U+180E).
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";

// Escapes both engines read alike: letters here, and any punctuation.
constexpr std::string_view kSharedEscapes = "dDtnrfaezZA";

// The escapes spelled otherwise in PCRE2 (\s, \S, \v, \u) at p[i] ('\\'); returns the index
// of the last character used, or npos for the others.
std::size_t rewrite_escape(std::string_view p, std::size_t i, bool in_class, std::string& out) {
  const std::string ws(kWhiteSpace);
  switch (p[i + 1]) {
    case 's':
      out += in_class ? ws : "[" + ws + "]";
      return i + 1;
    case 'S':
      if (in_class) refuse("\\S inside a class");
      out += "[^" + ws + "]";
      return i + 1;
    case 'v':  // the vertical tab; PCRE2's \v is a class of line breaks
      out += "\\x{0B}";
      return i + 1;
    case 'u':
      if (i + 5 >= p.size() || !std::all_of(p.begin() + i + 2, p.begin() + i + 6, is_hex))
        refuse("\\u without four hex digits");
      out += "\\x{" + std::string(p.substr(i + 2, 4)) + "}";
      return i + 5;
    default:
      return std::string_view::npos;
  }
}

// The escape at p[i] ('\\'); returns the index of its last character.
std::size_t translate_escape(std::string_view p, std::size_t i, bool in_class, std::string& out) {
  if (i + 1 >= p.size()) refuse("a trailing backslash");
  if (const auto end = rewrite_escape(p, i, in_class, out); end != std::string_view::npos)
    return end;
  const char e = p[i + 1];
  out += '\\';
  out += e;
  if (e == 'x' || e == 'p' || e == 'P') {
    if (i + 2 < p.size() && p[i + 2] == '{') return copy_braces(p, i + 2, out);
    return i + 1;  // \xHH, \pL: the characters that follow are copied as they are
  }
  if (std::isalnum(static_cast<unsigned char>(e)) &&
      kSharedEscapes.find(e) == std::string_view::npos)
    refuse(std::string("the escape \\") + e);
  return i + 1;
}

// The group opening at p[i] ("(?"): only the kinds both engines read alike.
void check_group(std::string_view p, std::size_t i) {
  const std::string_view rest = p.substr(i + 2);
  for (std::string_view ok : {":", "=", "!", ">", "#", "<=", "<!", "i)", "i:", "-i)", "-i:"})
    if (rest.substr(0, ok.size()) == ok) return;
  if (rest.size() >= 2 && rest[0] == '<' && std::isalpha(static_cast<unsigned char>(rest[1])))
    return;  // a named group
  refuse("the group (?" + std::string(rest.substr(0, 2)));
}

}  // namespace

namespace {

// Copies the class that opens at p[i] ('[') to out, refusing what PCRE2 reads otherwise;
// returns the index of its closing ']'.
std::size_t translate_class(std::string_view p, std::size_t i, std::string& out) {
  out += '[';
  if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
  const std::size_t body = i + 1;  // a ']' here is a member
  for (++i; i < p.size(); ++i) {
    const char c = p[i];
    const char next = i + 1 < p.size() ? p[i + 1] : '\0';
    if (c == '\\') {
      i = translate_escape(p, i, true, out);
      continue;
    }
    if (c == '[') refuse(next == ':' ? "a POSIX bracket [:...:]" : "a class inside a class");
    if (c == '&' && next == '&') refuse("the class intersection &&");
    out += c;
    if (c == ']' && i != body) return i;
  }
  refuse("an unclosed class [");
}

// Oniguruma's {,n} at p[i] ('{'): whether it is one (then PCRE2's {0,n} is written).
bool zero_to_n(std::string_view p, std::size_t i, std::string& out) {
  if (i + 1 >= p.size() || p[i + 1] != ',') return false;
  std::size_t j = i + 2;
  while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) ++j;
  if (j == i + 2 || j >= p.size() || p[j] != '}') return false;
  out += "{0";
  return true;
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    const char next = i + 1 < p.size() ? p[i + 1] : '\0';
    if (c == '\\') {
      i = translate_escape(p, i, false, out);
    } else if (c == '[') {
      i = translate_class(p, i, out);
    } else {
      if (c == '(' && next == '?') check_group(p, i);
      if ((c == '*' || c == '+' || c == '?' || c == '}') && next == '+')
        refuse(std::string("the quantifier ") + c + "+ (possessive in PCRE2, nested in Oniguruma)");
      if (!(c == '{' && zero_to_n(p, i, out))) out += c;
    }
  }
  return out;
}

struct Pattern::Code {
  pcre2_code* code = nullptr;
  pcre2_match_context* match_context = nullptr;
  ~Code() {
    pcre2_match_context_free(match_context);
    pcre2_code_free(code);
  }
};

namespace {

std::string pcre2_message(int err) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(err, msg, sizeof msg);
  return reinterpret_cast<const char*>(msg);
}

}  // namespace

Pattern::Pattern(std::unique_ptr<Code> code, std::string literal)
    : code_(std::move(code)), literal_(std::move(literal)) {}
Pattern::~Pattern() = default;
Pattern::Pattern(Pattern&&) noexcept = default;
Pattern& Pattern::operator=(Pattern&&) noexcept = default;

std::unique_ptr<Pattern::Code> Pattern::compile(std::string_view pattern) {
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  pcre2_set_bsr(ctx, PCRE2_BSR_UNICODE);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &err, &off, ctx);
  pcre2_compile_context_free(ctx);
  if (!code)
    throw std::invalid_argument("PCRE2 cannot compile it at offset " + std::to_string(off) + ": " +
                                pcre2_message(err));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
  auto c = std::make_unique<Code>();
  c->code = code;
  // Explicit limits (a hostile pattern backtracking without end is an error, not a hang).
  c->match_context = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(c->match_context, 10'000'000);
  pcre2_set_depth_limit(c->match_context, 10'000'000);
  return c;
}

namespace {

// Whether every \p{X}, \P{X}, \pX of an Oniguruma pattern names a general category (L, Lu,
// ..., Cn) rather than a script (\p{Han}), whose members a stand-in of the same category
// need not share.
bool names_categories_only(std::string_view p) {
  static constexpr std::string_view kCategories[] = {
      "L",  "Lu", "Ll", "Lt", "Lm", "Lo", "L&", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl",
      "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So",
      "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn"};
  for (std::size_t i = 0; i + 2 < p.size(); ++i) {
    if (p[i] == '\\' && p[i + 1] == '\\') {
      ++i;  // an escaped backslash
      continue;
    }
    if (p[i] != '\\' || (p[i + 1] != 'p' && p[i + 1] != 'P')) continue;
    std::string_view name = p.substr(i + 2, 1);
    if (p[i + 2] == '{') {
      const std::size_t close = p.find('}', i + 3);
      if (close == std::string_view::npos) return false;
      name = p.substr(i + 3, close - i - 3);
      if (!name.empty() && name[0] == '^') name.remove_prefix(1);
    }
    if (std::find(std::begin(kCategories), std::end(kCategories), name) == std::end(kCategories))
      return false;
  }
  return true;
}

// {first, last, stand-in}: the characters PCRE2's tables lack, as `tokenizers` classes them.
struct StandIn {
  std::uint32_t first, last, stand_in;
};
constexpr StandIn kStandIns[] = {
#include "diloco/data/tokenizer_unicode_newer.inc"
};

std::string utf8(std::uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

}  // namespace

Pattern Pattern::regex(std::string_view onig) {
  Pattern p(compile(onig_to_pcre2(onig)), "");
  p.by_category_ = names_categories_only(onig);
  return p;
}

Pattern Pattern::literal(std::string_view text) {
  if (text.empty()) throw std::invalid_argument("an empty string");
  return Pattern(nullptr, std::string(text));
}

void Pattern::find_matches(std::string_view text,
                           const std::function<void(const Match&)>& fn) const {
  if (!code_) {  // a literal: its non-overlapping occurrences, left to right
    std::size_t prev = 0;
    for (std::size_t at = text.find(literal_); at != std::string_view::npos;
         at = text.find(literal_, prev)) {
      if (at > prev) fn({prev, at, false});
      fn({at, at + literal_.size(), true});
      prev = at + literal_.size();
    }
    if (prev < text.size()) fn({prev, text.size(), false});
    return;
  }
  std::string copy;
  const std::string_view matched = with_stand_ins(text, copy);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(matched.data());
  std::size_t from = 0, prev = 0;
  bool matched_before = false;
  std::size_t last_match_end = 0;
  while (from <= text.size()) {
    const int rc =
        pcre2_match(code_->code, subject, text.size(), from, 0, md, code_->match_context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      throw std::runtime_error("the pattern failed at byte " + std::to_string(from) + ": " +
                               pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t b = ov[0], e = ov[1];
    if (b == e && matched_before && last_match_end == e) {
      // Oniguruma's iterator: no empty match right after a match; on by one character.
      std::size_t next = from;
      if (from < text.size()) next_code_point(text, next);
      from = from < text.size() ? next : from + 1;
      continue;
    }
    if (b > prev) fn({prev, b, false});
    fn({b, e, true});
    prev = from = last_match_end = e;
    matched_before = true;
  }
  pcre2_match_data_free(md);
  if (prev < text.size()) fn({prev, text.size(), false});
}

std::string_view Pattern::with_stand_ins(std::string_view text, std::string& copy) const {
  static const Pattern unknown(compile(R"(\p{Cn})"), "");
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(unknown.code_->code, nullptr);
  std::string_view out = text;
  std::size_t from = 0;
  while (from < text.size()) {
    const int rc = pcre2_match(unknown.code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()),
                               text.size(), from, 0, md, nullptr);
    if (rc <= 0) break;
    const std::size_t at = pcre2_get_ovector_pointer(md)[0];
    std::size_t next = at;
    const std::uint32_t cp = next_code_point(text, next);
    from = next;
    const StandIn* hit = std::upper_bound(
        std::begin(kStandIns), std::end(kStandIns), cp,
        [](std::uint32_t c, const StandIn& s) { return c < s.first; });
    if (hit == std::begin(kStandIns) || (--hit)->last < cp) continue;  // unassigned in both
    if (!by_category_) {
      pcre2_match_data_free(md);
      char name[16];
      std::snprintf(name, sizeof name, "U+%04X", static_cast<unsigned>(cp));
      char version[32] = {};
      pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version);
      throw std::runtime_error(std::string("the text has ") + name +
                               ", a character that PCRE2's Unicode tables (" + version +
                               ") lack, and the pattern names a script, which loco cannot "
                               "match it by as `tokenizers` does: it does not split it rather "
                               "than split it differently");
    }
    if (copy.empty()) copy.assign(text);
    const std::string s = utf8(hit->stand_in);
    copy.replace(at, s.size(), s);  // the same length (scripts/unicode-newer)
    out = copy;
  }
  pcre2_match_data_free(md);
  return out;
}

namespace {

// Whether a stretch joins the piece before it (NormalizedString::split's folds, read
// forwards).
bool joins_previous(SplitBehavior behavior, bool prev_match, bool is_match) {
  switch (behavior) {
    case SplitBehavior::merged_with_previous:
      return is_match && !prev_match;
    case SplitBehavior::merged_with_next:
      return prev_match && !is_match;
    case SplitBehavior::contiguous:
      return is_match == prev_match;
    default:
      return false;
  }
}

}  // namespace

void split_pieces(const Pattern& p, std::string_view text, SplitBehavior behavior, bool invert,
                  const std::function<void(std::size_t, std::size_t)>& emit) {
  bool first = true, prev_match = false, open = false;
  std::size_t begin = 0, end = 0;
  auto flush = [&] {
    if (open && end > begin) emit(begin, end);
    open = false;
  };
  p.find_matches(text, [&](const Match& m) {
    const bool is_match = m.is_match != invert;
    const bool joins = !first && joins_previous(behavior, prev_match, is_match);
    first = false;
    prev_match = is_match;
    if (behavior == SplitBehavior::removed && is_match) return flush();
    if (joins && open) {
      end = m.end;
      return;
    }
    flush();
    begin = m.begin;
    end = m.end;
    open = true;
  });
  flush();
}

std::string replace_all(std::string_view text, const Pattern& p, std::string_view content) {
  // A hostile Replace (a long content for every character) must not take all memory; a real
  // one makes a character of at most 4 bytes.
  const std::size_t limit = 8 * text.size() + 64;
  std::string out;
  out.reserve(text.size());
  p.find_matches(text, [&](const Match& m) {
    if (m.is_match)
      out.append(content);
    else
      out.append(text.substr(m.begin, m.end - m.begin));
    if (out.size() > limit)
      throw std::runtime_error("a Replace makes the text more than 8 times longer");
  });
  return out;
}

}  // namespace loco::diloco::detail
