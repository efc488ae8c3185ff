#include "runtime/core/codec.hpp"

#include <msgpack/v2/null_visitor.hpp>

namespace loco {

Blob Blob::from_vector(std::vector<uint8_t>&& bytes) { return from_values(std::move(bytes)); }

Blob Blob::copy_of(const void* data, size_t size) {
  auto* p = static_cast<const uint8_t*>(data);
  return from_vector(std::vector<uint8_t>(p, p + size));
}

namespace detail {

std::vector<Blob>*& blob_sink() {
  thread_local std::vector<Blob>* sink = nullptr;
  return sink;
}

const std::vector<Blob>*& blob_source() {
  thread_local const std::vector<Blob>* source = nullptr;
  return source;
}

namespace {

std::string mib(size_t bytes) {
  return std::to_string((bytes + (size_t(1) << 20) - 1) >> 20) + " MiB";
}

// The first pass: walks the input without building anything.
class LimitCheck : public msgpack::v2::null_visitor {
 public:
  LimitCheck(size_t input_bytes, const UnpackLimits& limits, std::string_view what)
      : input_(input_bytes), limits_(limits), what_(what) {}

  bool visit_str(const char*, uint32_t size) { return grow(size); }
  bool visit_bin(const char*, uint32_t size) { return grow(size); }
  bool visit_ext(const char*, uint32_t size) { return grow(size); }
  bool start_array(uint32_t n) {
    // Every element takes at least one byte of input.
    if (n > input_)
      refuse("an array of " + std::to_string(n) + " elements in " + std::to_string(input_) +
             " bytes");
    return open() && grow(size_t(n) * sizeof(msgpack::object));
  }
  bool end_array() { return close(); }
  bool start_map(uint32_t n) {
    if (size_t(n) * 2 > input_)
      refuse("a map of " + std::to_string(n) + " entries in " + std::to_string(input_) + " bytes");
    return open() && grow(size_t(n) * sizeof(msgpack::object_kv));
  }
  bool end_map() { return close(); }
  void parse_error(size_t, size_t at) {
    refuse("not msgpack (at byte " + std::to_string(at) + ")");
  }
  void insufficient_bytes(size_t, size_t at) {
    refuse("truncated msgpack (ends inside a value at byte " + std::to_string(at) + ")");
  }

 private:
  bool open() {
    if (++depth_ > limits_.max_depth)
      refuse("nesting deeper than the limit of " + std::to_string(limits_.max_depth) +
             " arrays or maps");
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  bool grow(size_t bytes) {
    decoded_ += bytes;
    if (decoded_ > limits_.max_decoded_bytes)
      refuse("decoding would take more than the budget of " + mib(limits_.max_decoded_bytes) +
             " for one message");
    return true;
  }
  [[noreturn]] void refuse(const std::string& why) {
    throw ProtocolError(std::string(what_) + " of " + std::to_string(input_) +
                        " bytes refused: " + why);
  }

  size_t input_;
  const UnpackLimits& limits_;
  std::string_view what_;
  size_t depth_ = 0;
  size_t decoded_ = 0;
};

}  // namespace

msgpack::object_handle unpack_bounded(const char* data, size_t size, std::string_view what,
                                      const UnpackLimits& limits) {
  LimitCheck check(size, limits, what);
  size_t off = 0;
  if (!msgpack::v2::parse(data, size, off, check))
    throw ProtocolError(std::string(what) + " of " + std::to_string(size) +
                        " bytes refused: not msgpack");
  // The same bounds once more, where msgpack-c allocates (a second line of defence: the walk
  // above already held the input to them).
  const msgpack::unpack_limit limit(size, size / 2, size, size, size, limits.max_depth + 1);
  try {
    return msgpack::unpack(data, size, nullptr, nullptr, limit);
  } catch (const msgpack::size_overflow& e) {
    throw ProtocolError(std::string(what) + " of " + std::to_string(size) +
                        " bytes refused by msgpack's unpack_limit: " + e.what());
  } catch (const msgpack::unpack_error& e) {
    throw ProtocolError(std::string(what) + " of " + std::to_string(size) +
                        " bytes refused: not msgpack (" + e.what() + ")");
  }
}

}  // namespace detail
}  // namespace loco
