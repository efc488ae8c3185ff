// loco tokenize: a tokenizer.json tried on a text, as `tokenizers` would encode it (the same
// C++ encoder the nodes run: diloco/data/tokenizer_json.hpp), and ids decoded back.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/cli/commands.hpp"
#include "diloco/data/data.hpp"
#include "diloco/data/tokenizer_json.hpp"

namespace loco::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  bool decode = false;
  std::string text = "-";  // "-": standard input
};

// At most this much text (or ids) is read: the tool is for trying a tokenizer, not for a corpus.
constexpr std::size_t kMaxInputBytes = std::size_t(64) << 20;

std::string read_input(const std::string& text) {
  if (text != "-") return text;
  std::string in;
  char buf[1 << 16];
  while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
    in.append(buf, std::size_t(std::cin.gcount()));
    if (in.size() > kMaxInputBytes)
      throw std::invalid_argument("standard input holds more than 64 MiB; loco tokenize is for "
                                  "trying a tokenizer (scripts/prepare-data tokenizes a corpus)");
  }
  return in;
}

// Ids separated by spaces, commas, brackets or line breaks ("[1, 2, 3]" as Python prints them).
std::vector<std::uint32_t> parse_ids(const std::string& text, int vocab) {
  std::string spaced = text;
  for (char& c : spaced)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream in(spaced);
  std::vector<std::uint32_t> ids;
  std::string word;
  while (in >> word) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v >= vocab)
      throw std::invalid_argument("--decode: '" + word.substr(0, 32) +
                                  "' is not an id of this tokenizer (0 to " +
                                  std::to_string(vocab - 1) + ")");
    ids.push_back(static_cast<std::uint32_t>(v));
  }
  return ids;
}

int run_tokenize(const TokenizeArgs& a) {
  const auto tok = diloco::load_tokenizer_json(a.tokenizer);
  const std::string input = read_input(a.text);
  if (a.decode) {
    const auto ids = parse_ids(input, tok->vocab_size());
    std::cout << tok->decode(ids);
    if (a.text != "-") std::cout << "\n";
    return 0;
  }
  const auto ids = tok->encode(input);
  for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, Commands& out) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand(
      "tokenize", "encode a text with a tokenizer.json as `tokenizers` does (ids), or decode ids");
  cmd->add_option("--tokenizer", a->tokenizer, "a tokenizer.json (Hugging Face `tokenizers`)")
      ->required();
  cmd->add_flag("--decode", a->decode, "read ids (\"1 2 3\" or \"[1, 2, 3]\") and print the text");
  cmd->add_option("text", a->text, "the text, or the ids with --decode; - or none: standard input");
  out.push_back({cmd, [a] { return run_tokenize(*a); }});
}

}  // namespace loco::cli
