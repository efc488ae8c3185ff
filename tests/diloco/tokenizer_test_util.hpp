// Helpers of the tokenizer.json tests (token_data_test, tokenizer_families_test): files, the
// KJV, Hugging Face's `tokenizers` through the project's venv, and the texts both compare on.
// Needs LOCO_SOURCE_DIR.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "diloco/data/data.hpp"
#include "tests/diloco/test_corpus.hpp"

namespace loco::diloco::testing {

namespace tfs = std::filesystem;

inline std::string read_file(const tfs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const tfs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

inline int run(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Runs `args` with the venv's python (scripts/env.sh); its exit status.
inline int venv_python(const std::string& args) {
  return run("bash -c 'source " + std::string(LOCO_SOURCE_DIR) +
             "/scripts/env.sh && \"$LOCO_VENV/bin/python\" " + args + "'");
}

// Ids of a raw uint32 file.
inline std::vector<std::uint32_t> read_ids(const tfs::path& p) {
  const auto bytes = read_file(p);
  std::vector<std::uint32_t> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// The KJV at `path` (the bible tool), or without it the tests' corpus.
inline void write_kjv(const tfs::path& path) {
  if (run("command -v bible >/dev/null 2>&1") == 0) {
    ASSERT_EQ(run("bible -f Gen1:1-Rev22:21 </dev/null | sed -E "
                  "'s/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > " +
                  path.string()),
              0);
  } else {
    const auto d = make_corpus_dir("tokjson", 2000000);
    tfs::copy_file(tfs::path(d) / "corpus" / "a.txt", path);
    remove_tree(d);
  }
  ASSERT_GT(tfs::file_size(path), 100000u);
}

// Unicode, digits, punctuation, whitespace runs and three of `special` (a special token).
inline std::string test_text(const std::string& special) {
  return "In the beginning God created the heaven and the earth.\n\n"
         "And God said, Let there be light: and there was light.   Three spaces, a tab\there,\n"
         "digits 1234567 and 3.14159, 42nd; it's, we'll, they've, I'm, you'd, don't.\n"
         "Unicode: caf\xc3\xa9 na\xc3\xafve \xc3\x9c"
         "ber stra\xc3\x9f"
         "e, \xce\xb1\xce\xb2\xce\xb3, "
         "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e, \xf0\x9f\x99\x82 and \xe2\x80\x94 "
         "dashes\xe2\x80\xa6\n" +
         special + "A new document after the special token" + special + special +
         "\n"
         "   leading spaces, trailing spaces   \n\n\n"
         "\r\nwindows line\r\n!!!???...,,,;;;\"quoted\" (parens) [brackets] {braces} "
         "#$%&*+-=/\\@^_`|~\n"
         "  \t \n";
}

// Characters that Oniguruma (`tokenizers`) and PCRE2 could class differently: Unicode
// whitespace (NEL, no-break, em and ideographic spaces, line separator, VT, FF; U+180E is
// whitespace in PCRE2 only), digits
// outside ASCII, marks, connector punctuation, letters whose case folds oddly (long s,
// Kelvin), CJK and emoji (byte fallback).
inline std::string unicode_text() {
  return "a\xc2\x85"
         "b m \xe1\xa0\x8en \xc2\xa0x\xe2\x80\x83y\xe3\x80\x80z\xe2\x80\xa8w\x0bv\x0cu\x1cs end\n"
         "\xd9\xa1\xd9\xa2\xd9\xa3 \xef\xbc\x90\xef\xbc\x91 x\xc2\xb2 \xe2\x85\xa0\xe2\x85\xa1 "
         "e\xcc\x81t\xc3\xa9 snake_case a\xe2\x80\xbf"
         "b \xc5\xbf"
         "TOP \xe2\x84\xaa"
         "ELVIN IT'S "
         "it'\xc5\xbf 'S 'LL\n"
         "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87 "
         "\xf0\x9f\x99\x82\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xe2\x80\x8b\xef\xbb\xbf zero-width\n"
         "  \xc2\xa0 \xe3\x80\x80\n\r\n\xe2\x80\xa9 tail";
}

// Pieces far longer than words: a megabyte of one letter, long digit and whitespace runs
// (a split regex must match them whole, not stop at a PCRE2 limit).
inline std::string long_runs_text() {
  return std::string(1 << 20, 'a') + " " + std::string(100000, '7') + "\n" +
         std::string(50000, ' ') + "x" + std::string(30000, '\n') + "end " +
         std::string(20000, '!');
}

// 2 MB of pseudo-random words and numbers: few repeats for a cache of words.
inline std::string distinct_words_text() {
  std::string text;
  std::uint64_t x = 1;
  while (text.size() < (2u << 20)) {
    x = splitmix64(x);
    const int len = 1 + static_cast<int>(x % 12);
    text += (x >> 8) % 7 == 0 ? ", " : " ";
    for (int i = 0; i < len; ++i)
      text += static_cast<char>(((x >> 16) % 3 == 0 ? '0' : 'a') +
                                static_cast<int>((x >> (20 + 3 * i)) % 10));
    if ((x >> 60) == 0) text += ".\n";
  }
  return text;
}

}  // namespace loco::diloco::testing
