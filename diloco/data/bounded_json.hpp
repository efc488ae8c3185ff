// Parsing JSON that came from outside (a model folder's config.json and index, a safetensors
// header, a tokenizer.json) with its nesting and its memory bounded while it is parsed, before
// anything recurses over it. nlohmann's parser keeps its own stack, but dump(), copies and
// comparisons recurse: a config.json nesting one field 500,000 deep (1 MB) crashed every node
// that read it (issue "21 ·"). And a document of empty arrays takes ~37 bytes of memory per byte
// of text. Header-only (nlohmann alone): the fuzz targets compile it. docs/security.md.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loco::diloco {

// What one document may hold. The memory is an estimate of what nlohmann allocates for the
// parsed value, counted as it is built (a scalar 16 bytes; a string 48 plus its length; an
// array or object 64 and each member 16, plus each key 80 and its length), against the
// document's size: at most `bytes_per_byte` times it plus `slack_bytes`. Real files take far
// less (a Hugging Face tokenizer.json about 7 bytes a byte, a config.json fewer); the
// allocator's growth of arrays adds at most as much again.
struct JsonLimits {
  int max_depth = 64;
  double bytes_per_byte = 16;
  std::size_t slack_bytes = std::size_t(16) << 20;
};

// `text` parsed; throws std::runtime_error "WHAT: ..." naming the limit it passed (nesting
// deeper than max_depth, or more memory than the bound, with where in the text), or the parse
// error. Nothing of the text itself is quoted.
template <class Json = nlohmann::json>
Json parse_bounded_json(std::string_view text, const std::string& what,
                        const JsonLimits& limits = {}) {
  struct Refused : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  const double budget =
      limits.bytes_per_byte * static_cast<double>(text.size()) + double(limits.slack_bytes);
  double used = 0;
  auto count = [&](double bytes) {
    used += bytes;
    if (used > budget)
      throw Refused(what + ": would take more than " + std::to_string(std::size_t(budget)) +
                    " bytes of memory parsed (" + std::to_string(limits.bytes_per_byte) +
                    " a byte of its " + std::to_string(text.size()) +
                    ", and 16 MiB): not a file of this kind, or a hostile one");
  };
  typename Json::parser_callback_t cb = [&](int depth, typename Json::parse_event_t event,
                                            Json& parsed) {
    using E = typename Json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (depth >= limits.max_depth)
          throw Refused(what + ": nested more than " + std::to_string(limits.max_depth) +
                        " deep: not a file of this kind, or a hostile one");
        count(64 + 16);
        break;
      case E::key:
        count(80 + static_cast<double>(
                       parsed.is_string()
                           ? parsed.template get_ref<const typename Json::string_t&>().size()
                           : 0));
        break;
      case E::value:
        count(16 + (parsed.is_string()
                        ? 32 + static_cast<double>(
                                   parsed.template get_ref<const typename Json::string_t&>().size())
                        : 0));
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text, cb);
  } catch (const Refused&) {
    throw;
  } catch (const typename Json::parse_error& e) {
    // Where, not what: nlohmann's message quotes the bytes it last read.
    throw std::runtime_error(what + ": not JSON (a syntax error at byte " + std::to_string(e.byte) +
                             ")");
  } catch (const typename Json::exception& e) {
    throw std::runtime_error(what + ": not JSON (" + e.what() + ")");
  }
}

}  // namespace loco::diloco
