#include "runtime/core/wire.hpp"

namespace loco::detail {

zmq::message_t zero_copy_frame(const Blob& blob) {
  if (blob.size() == 0) return zmq::message_t();
  // The frame keeps a reference to the blob's owner until ZeroMQ has sent it.
  auto* keep = new std::shared_ptr<const void>(blob.owner());
  return zmq::message_t(
      const_cast<uint8_t*>(blob.data()), blob.size(),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }, keep);
}

Blob blob_of(zmq::message_t&& frame) {
  auto owner = std::make_shared<zmq::message_t>(std::move(frame));
  const uint8_t* data = static_cast<const uint8_t*>(owner->data());
  size_t size = owner->size();
  return Blob(std::move(owner), data, size);
}

std::vector<zmq::message_t> encode(const Envelope& env, Payload&& payload) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, env);
  std::vector<zmq::message_t> frames;
  frames.reserve(2 + payload.blobs.size());
  frames.emplace_back(buf.data(), buf.size());
  frames.emplace_back(payload.body.data(), payload.body.size());
  for (const Blob& b : payload.blobs) frames.push_back(zero_copy_frame(b));
  return frames;
}

std::vector<zmq::message_t> encode(const Envelope& env) {
  msgpack::sbuffer buf;
  if (env.error_message.size() > kMaxErrorMessageBytes) {
    Envelope cut = env;
    cut.error_message.resize(kMaxErrorMessageBytes);
    cut.error_message += "...(cut)";
    msgpack::pack(buf, cut);
  } else {
    msgpack::pack(buf, env);
  }
  std::vector<zmq::message_t> frames;
  frames.emplace_back(buf.data(), buf.size());
  return frames;
}

Decoded decode(std::vector<zmq::message_t>&& frames, size_t max_bytes) {
  if (frames.empty()) throw ProtocolError("empty message: no envelope frame");
  size_t total = 0;
  for (auto& f : frames) total += f.size();
  if (total > max_bytes)
    throw ProtocolError("message of " + std::to_string(total) + " bytes exceeds the limit of " +
                        std::to_string(max_bytes) + " bytes");
  if (frames[0].size() > kMaxEnvelopeBytes)
    throw ProtocolError("envelope of " + std::to_string(frames[0].size()) +
                        " bytes exceeds the limit of " + std::to_string(kMaxEnvelopeBytes) +
                        " bytes");
  Decoded d;
  try {
    msgpack::object_handle oh =
        unpack_bounded(static_cast<const char*>(frames[0].data()), frames[0].size(),
                       "malformed envelope", UnpackLimits{1, kMaxEnvelopeBytes * 2});
    const msgpack::object& o = oh.get();
    // Read the version first so that another version's envelope of another
    // shape is reported as a version mismatch, not as garbage.
    if (o.type != msgpack::type::ARRAY || o.via.array.size < 1)
      throw ProtocolError("malformed envelope: not a msgpack array");
    uint32_t version = o.via.array.ptr[0].as<uint32_t>();
    if (version != kProtocolVersion)
      throw ProtocolError("envelope of protocol version " + std::to_string(version) +
                          ", this process speaks version " + std::to_string(kProtocolVersion));
    o.convert(d.env);
  } catch (const ProtocolError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProtocolError(std::string("malformed envelope: ") + e.what());
  }
  auto k = d.env.kind;
  if (k < static_cast<uint8_t>(Kind::Request) || k > static_cast<uint8_t>(Kind::Attach))
    throw ProtocolError("malformed envelope: unknown message kind " + std::to_string(k));
  if (frames.size() >= 2)
    d.payload.body.assign(static_cast<const char*>(frames[1].data()), frames[1].size());
  d.payload.blobs.reserve(frames.size() > 2 ? frames.size() - 2 : 0);
  for (size_t i = 2; i < frames.size(); ++i)
    d.payload.blobs.push_back(blob_of(std::move(frames[i])));
  return d;
}

uint64_t salvage_corr(const zmq::message_t& frame) {
  if (frame.size() > kMaxEnvelopeBytes) return 0;
  try {
    msgpack::object_handle oh = unpack_bounded(static_cast<const char*>(frame.data()), frame.size(),
                                               "envelope", UnpackLimits{1, kMaxEnvelopeBytes * 2});
    const msgpack::object& o = oh.get();
    if (o.type == msgpack::type::ARRAY && o.via.array.size >= 3 &&
        o.via.array.ptr[2].type == msgpack::type::POSITIVE_INTEGER)
      return o.via.array.ptr[2].via.u64;
  } catch (...) {
  }
  return 0;
}

}  // namespace loco::detail
