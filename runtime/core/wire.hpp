#pragma once
// The wire format, private to runtime/ (only its .cpp files and white-box tests
// include this, so that a change here rebuilds no user code). One message is a
// list of ZeroMQ frames:
//
//   [envelope][body][blob 0][blob 1]...
//
// envelope: msgpack array (version, kind, correlation id, sender, target actor,
//           method, error type, error message) — the only frame every hop decodes;
// body, blobs: a detail::Payload (codec.hpp). The body is copied into and out
//           of its frame; blobs are sent from their own memory and received as
//           views of their frames: neither side copies them.
#include <cstdint>
#include <msgpack.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "runtime/core/codec.hpp"

namespace loco::detail {

constexpr uint32_t kProtocolVersion = 1;
// An envelope is eight short fields; its frame is refused past this size before it is decoded.
// Error messages that travel in it are cut to fit (kMaxErrorMessageBytes).
constexpr size_t kMaxEnvelopeBytes = size_t(64) << 10;
constexpr size_t kMaxErrorMessageBytes = size_t(16) << 10;

// Attach: a node reached only through the head (Reachability::reverse) says, every heartbeat,
// that its connection to the head serves node `via`; the head answers with a Pong.
enum class Kind : uint8_t {
  Request = 1,
  Tell = 2,
  Reply = 3,
  Error = 4,
  Ping = 5,
  Pong = 6,
  Attach = 7
};

struct Envelope {
  uint32_t version = kProtocolVersion;
  uint8_t kind = 0;
  uint64_t corr = 0;
  std::string sender;
  std::string target;
  std::string method;
  std::string error_type;
  std::string error_message;
  // Set by the Core of a calling actor from what its node was told when the head created it
  // (ActorContext), never from the actor's code: the job it belongs to and its owner's key.
  // Empty for a call that no actor makes (a driver, a node, the head): `from_actor` false.
  bool from_actor = false;
  std::string sender_job;
  std::string sender_owner;
  // A call (or ping) for an actor of a node reached through the head: that node's id; the head
  // forwards it on the node's connection (Core::forward). Attach: the node the connection serves.
  std::string via;
  // Set by the head on a call it forwards: who the original caller's key proved it is
  // (security::user_id_of), which the node believes only of what arrives from its head.
  std::string origin;
  MSGPACK_DEFINE(version, kind, corr, sender, target, method, error_type, error_message, from_actor,
                 sender_job, sender_owner, via, origin)

  Kind k() const { return static_cast<Kind>(kind); }
};

// A frame that points at the blob's memory and keeps its owner alive until
// ZeroMQ has sent it.
zmq::message_t zero_copy_frame(const Blob& blob);
// A blob that points into the frame and owns it.
Blob blob_of(zmq::message_t&& frame);

// Frames of a whole message.
std::vector<zmq::message_t> encode(const Envelope& env, Payload&& payload);
// An envelope-only message (pings, errors).
std::vector<zmq::message_t> encode(const Envelope& env);

// Splits received frames. Throws ProtocolError for a missing or malformed
// envelope, another protocol version, or too many bytes (the whole message over
// `max_bytes`, the envelope over kMaxEnvelopeBytes: both checked before decoding).
struct Decoded {
  Envelope env;
  Payload payload;
};
Decoded decode(std::vector<zmq::message_t>&& frames, size_t max_bytes);
// Best effort: the correlation id of a message whose envelope may be broken
// (0 when even that cannot be read), so that an error reply can still name it.
uint64_t salvage_corr(const zmq::message_t& envelope_frame);

}  // namespace loco::detail
