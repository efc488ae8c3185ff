// tokenizer.json, a downloaded file: any bytes either parse into a tokenizer or are refused with
// std::runtime_error naming the field; a parsed tokenizer encodes any text (a refusal is a
// std::runtime_error too) into ids it can decode. Input: the JSON, a NUL byte, the text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "diloco/data/tokenizer_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto nul = input.find('\0');
  const std::string json = input.substr(0, nul);
  const std::string text = nul == std::string::npos ? "" : input.substr(nul + 1);
  std::unique_ptr<loco::diloco::Tokenizer> tok;
  try {
    tok = loco::diloco::parse_tokenizer_json(json, "fuzz.json");
  } catch (const std::runtime_error&) {
    return 0;
  }
  try {
    const auto ids = tok->encode(text);
    for (auto id : ids)
      if (id >= static_cast<std::uint32_t>(tok->vocab_size())) std::abort();
    (void)tok->decode(ids);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
