#pragma once
// The wire format. One message is a list of ZeroMQ frames:
//
//   [envelope][body][blob 0][blob 1]...
//
// envelope: msgpack array (version, kind, correlation id, sender, target actor,
//           method, error type, error message) — the only frame every hop decodes;
// body:     msgpack of the arguments (a tuple) or of the result;
// blobs:    raw bytes of every loco::Blob inside the body, sent as their own
//           frames without copying (the body holds an ext placeholder with the
//           blob's index). Tensors travel this way, never as msgpack arrays.
#include <cstdint>
#include <cstring>
#include <memory>
#include <msgpack.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "runtime/core/errors.hpp"

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

constexpr uint32_t kProtocolVersion = 1;
constexpr int8_t kBlobExtType = 17;

enum class Kind : uint8_t { Request = 1, Tell = 2, Reply = 3, Error = 4, Ping = 5, Pong = 6 };

struct Envelope {
  uint32_t version = kProtocolVersion;
  uint8_t kind = 0;
  uint64_t corr = 0;
  std::string sender;
  std::string target;
  std::string method;
  std::string error_type;
  std::string error_message;
  MSGPACK_DEFINE(version, kind, corr, sender, target, method, error_type, error_message)

  Kind k() const { return static_cast<Kind>(kind); }
};

// A body and its blobs, ready to send or just received.
struct Payload {
  zmq::message_t body;
  std::vector<zmq::message_t> blobs;
};

// Thread-local plumbing between msgpack's adaptors and the frames.
std::vector<Blob>*& blob_sink();
std::vector<zmq::message_t>*& blob_source();

zmq::message_t zero_copy_frame(const Blob& blob);

template <class T>
Payload pack_payload(const T& value) {
  msgpack::sbuffer buf;
  std::vector<Blob> blobs;
  std::vector<Blob>* saved = blob_sink();
  blob_sink() = &blobs;
  try {
    msgpack::pack(buf, value);
  } catch (...) {
    blob_sink() = saved;
    throw;
  }
  blob_sink() = saved;
  Payload p;
  p.body = zmq::message_t(buf.data(), buf.size());
  p.blobs.reserve(blobs.size());
  for (const Blob& b : blobs) p.blobs.push_back(zero_copy_frame(b));
  return p;
}

// Decodes a body into T; blobs point into `p.blobs`' frames (which the caller
// must hand over: they are moved into shared ownership). Throws ProtocolError
// naming `what_prefix + what` when the body does not hold a T (the two parts are
// joined only then: this runs for every call).
template <class T>
T unpack_payload(Payload& p, std::string_view what_prefix, std::string_view what = {}) {
  std::vector<zmq::message_t>* saved = blob_source();
  blob_source() = &p.blobs;
  try {
    msgpack::object_handle oh =
        msgpack::unpack(static_cast<const char*>(p.body.data()), p.body.size());
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

// Frames of a whole message.
std::vector<zmq::message_t> encode(const Envelope& env, Payload&& payload);
// An envelope-only message (pings, errors).
std::vector<zmq::message_t> encode(const Envelope& env);

// Splits received frames. Throws ProtocolError for a missing or malformed
// envelope, another protocol version, or too many bytes.
struct Decoded {
  Envelope env;
  Payload payload;
};
Decoded decode(std::vector<zmq::message_t>&& frames, size_t max_bytes);
// Best effort: the correlation id of a message whose envelope may be broken
// (0 when even that cannot be read), so that an error reply can still name it.
uint64_t salvage_corr(const zmq::message_t& envelope_frame);

}  // namespace detail
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
      auto frame = std::make_shared<zmq::message_t>(std::move((*source)[index]));
      // A moved-from frame is empty: re-share the same frame for repeated references.
      (*source)[index].copy(*frame);
      const uint8_t* data = static_cast<const uint8_t*>(frame->data());
      size_t size = frame->size();
      b = loco::Blob(std::shared_ptr<const void>(frame, frame.get()), data, size);
      return o;
    }
  };

  }  // namespace adaptor
}
}  // namespace msgpack
