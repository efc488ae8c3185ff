#pragma once
// Arguments and results as msgpack, with loco::Blob for bulk bytes. A message
// carries a body (msgpack of the arguments, a tuple, or of the result) and
// blobs: the raw bytes of every loco::Blob inside the body, each sent as its
// own frame without copying (the body holds an ext placeholder with the blob's
// index). Tensors travel this way, never as msgpack arrays: the body is copied
// into and out of its frame (a few bytes, usually; no allocation at all below
// 16), the blobs never are. How a message becomes ZeroMQ frames is private to
// runtime/ (wire.hpp).
#include <cstdint>
#include <cstring>
#include <memory>
#include <msgpack.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"

namespace loco {

// An immutable byte buffer shared without copies: built from a vector the
// caller moves in, or pointing into a received ZeroMQ frame.
class Blob {
 public:
  Blob() = default;
  static Blob from_vector(std::vector<uint8_t>&& bytes);
  static Blob copy_of(const void* data, size_t size);
  template <class T>
  static Blob from_values(std::vector<T>&& values) {
    auto owner = std::make_shared<std::vector<T>>(std::move(values));
    return Blob(owner, reinterpret_cast<const uint8_t*>(owner->data()), owner->size() * sizeof(T));
  }
  // Keeps `owner` alive for as long as any copy of the blob exists.
  Blob(std::shared_ptr<const void> owner, const uint8_t* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // The bytes as an array of T; throws ProtocolError when the size is not a multiple.
  template <class T>
  std::span<const T> as() const {
    if (size_ % sizeof(T) != 0)
      throw ProtocolError("blob of " + std::to_string(size_) + " bytes is not a whole number of " +
                          std::to_string(sizeof(T)) + "-byte values");
    return {reinterpret_cast<const T*>(data_), size_ / sizeof(T)};
  }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

namespace detail {

constexpr int8_t kBlobExtType = 17;

// A body and its blobs, ready to send or just received.
struct Payload {
  std::string body;  // msgpack
  std::vector<Blob> blobs;
};

// Thread-local plumbing between msgpack's adaptors and a payload's blobs.
std::vector<Blob>*& blob_sink();
const std::vector<Blob>*& blob_source();

// msgpack's output stream for a body.
struct BodyWriter {
  std::string& out;
  void write(const char* data, size_t size) { out.append(data, size); }
};

template <class T>
Payload pack_payload(const T& value) {
  Payload p;
  BodyWriter writer{p.body};
  std::vector<Blob>* saved = blob_sink();
  blob_sink() = &p.blobs;
  try {
    msgpack::pack(writer, value);
  } catch (...) {
    blob_sink() = saved;
    throw;
  }
  blob_sink() = saved;
  return p;
}

// msgpack from the network is decoded in two passes: a walk that builds nothing checks the
// input against these limits (and every declared array, map, str, bin or ext length against
// the bytes that are actually there), then msgpack-c builds the objects under an unpack_limit
// sized from the input. So a 42-byte message that declares 2^32 elements, or a deep nest of
// arrays, is refused before anything is allocated.
struct UnpackLimits {
  size_t max_depth = 32;  // nested arrays and maps
  // What the objects msgpack builds may take (16-byte objects, 32-byte map entries, copies of
  // strings), beyond the input itself: caps the 24x growth of a message of many tiny objects.
  size_t max_decoded_bytes = size_t(64) << 20;
};
// The decoded object; throws ProtocolError naming `what` and the limit that was exceeded, or
// saying that the bytes are not msgpack.
msgpack::object_handle unpack_bounded(const char* data, size_t size, std::string_view what,
                                      const UnpackLimits& limits = {});

// Decodes a body into T; blobs in the result share `p.blobs`' memory (a
// received frame: no copy). Throws ProtocolError naming `what_prefix + what`
// when the body does not hold a T (the two parts are joined only then: this
// runs for every call).
template <class T>
T unpack_payload(const Payload& p, std::string_view what_prefix, std::string_view what = {}) {
  const std::vector<Blob>* saved = blob_source();
  blob_source() = &p.blobs;
  try {
    msgpack::object_handle oh = unpack_bounded(p.body.data(), p.body.size(), "message body");
    T value = oh.get().as<T>();
    blob_source() = saved;
    return value;
  } catch (const Error&) {
    blob_source() = saved;
    throw;
  } catch (const std::exception& e) {
    blob_source() = saved;
    throw ProtocolError(std::string(what_prefix) + std::string(what) + ": cannot decode (" +
                        e.what() + ")");
  }
}

}  // namespace detail

// msgpack that did not come from a call's arguments but is read like network input (a job's
// records and reports, which anyone who reaches the head may append to): decoded under the
// same bounds as a message (detail::UnpackLimits). Throws ProtocolError naming `what` and the
// limit exceeded, or saying that the bytes are not msgpack.
inline msgpack::object_handle unpack_checked(std::string_view bytes, std::string_view what) {
  return detail::unpack_bounded(bytes.data(), bytes.size(), what);
}
// The same, converted to T; msgpack's type_error when the object does not hold a T.
template <class T>
T unpack_checked(std::string_view bytes, std::string_view what) {
  return unpack_checked(bytes, what).get().as<T>();
}

}  // namespace loco

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <>
  struct pack<loco::Blob> {
    template <typename Stream>
    packer<Stream>& operator()(packer<Stream>& o, const loco::Blob& b) const {
      auto* sink = loco::detail::blob_sink();
      if (!sink) throw loco::ProtocolError("loco::Blob packed outside a loco message");
      uint32_t index = static_cast<uint32_t>(sink->size());
      sink->push_back(b);
      char bytes[4];
      std::memcpy(bytes, &index, 4);
      o.pack_ext(4, loco::detail::kBlobExtType);
      o.pack_ext_body(bytes, 4);
      return o;
    }
  };

  template <>
  struct convert<loco::Blob> {
    const msgpack::object& operator()(const msgpack::object& o, loco::Blob& b) const {
      if (o.type != msgpack::type::EXT || o.via.ext.type() != loco::detail::kBlobExtType ||
          o.via.ext.size != 4)
        throw msgpack::type_error();
      uint32_t index;
      std::memcpy(&index, o.via.ext.data(), 4);
      auto* source = loco::detail::blob_source();
      if (!source || index >= source->size())
        throw loco::ProtocolError("message refers to blob frame " + std::to_string(index) +
                                  " but carries " + std::to_string(source ? source->size() : 0) +
                                  " blob frames");
      b = (*source)[index];
      return o;
    }
  };

  }  // namespace adaptor
}
}  // namespace msgpack
