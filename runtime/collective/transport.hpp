// What the butterfly schedule needs of a network: whole messages to and from peers named by
// their endpoints, without blocking, on two channels. Internal to the collective.
//
// Implementations: ZmqTransport (zmq_transport.hpp: tcp, ipc and inproc endpoints; the one a
// Communicator uses) and MemoryTransport (memory_transport.hpp: queues in one process, no
// sockets, for the schedule's tests).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/collective/wire.hpp"

namespace loco::collective::detail {

// Bytes shared without copies: `owner` keeps them alive. A transport holds its own reference
// to the owner of a sent payload for as long as it may still read the bytes.
struct Buffer {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  std::span<const uint8_t> bytes() const { return {data, size}; }
};

struct Message {
  Header header;
  std::string sender;  // the sender's member name, as it says
  Buffer payload;
  uint64_t link = 0;   // the connection it came on, for link_bytes(); 0: not known
  // It came through a relay and failed to authenticate (or was replayed): nothing in it was
  // decoded; `sender` names the member it claims to come from, the payload is empty.
  bool forged = false;
};

// data: chunks, in order behind each other. control: keepalives and aborts, on a connection
// of their own so that they never wait behind data.
enum class Channel : uint8_t { data, control };

// What happened to our connections to a peer since the last look. relay_lost: the relay that
// carries our messages to and from it closed its connection (it was killed or restarted): what
// it held of either's messages is gone, though the peer may well be alive. (A relay that refuses
// connections is down: nothing is lost yet, and the peers' liveness judges.)
enum class PeerEvent : uint8_t { none, closed, refused, relay_lost };

class Transport {
 public:
  virtual ~Transport() = default;
  // Where peers reach this transport.
  virtual const std::string& endpoint() const = 0;
  // Whether the transport is done with a sent payload soon after the peer's kernel has it,
  // so that payloads may point into the caller's input (false where the receiver itself holds
  // the sender's bytes, as in one process).
  virtual bool releases_sent_payloads(const std::string& peer) const = 0;
  // Opens connections to `peers` (no-op for open ones) and closes the others, letting what is
  // queued for them drain for `linger`.
  virtual void keep_only(std::span<const std::string> peers, std::chrono::milliseconds linger) = 0;
  // Hands a whole message to the transport without blocking. False, and nothing taken, when
  // the peer's queue on that channel is full.
  virtual bool try_send(const std::string& peer, Channel channel, const Header& header,
                        const std::string& sender, Buffer payload) = 0;
  // A received message, or false when none is waiting. Messages without a valid header
  // (another protocol, another version) are dropped here.
  virtual bool try_receive(Message& out) = 0;
  // Bytes that have arrived on connection `link` (Message::link) so far, whole messages or not:
  // on a slow link a message takes longer than a liveness window, and its bytes arriving prove
  // the sender alive. 0 when not known (the connection is gone, or the transport cannot tell).
  virtual uint64_t link_bytes(uint64_t link) = 0;
  // Drains and returns what happened to our connections to `peer` (closed wins over refused).
  virtual PeerEvent take_event(const std::string& peer) = 0;
  // Whether data sent to `peer` may still be on its way: queued in the transport, or in the
  // kernel and not yet acknowledged by the peer's. False when it cannot tell.
  virtual bool undelivered(const std::string& peer) = 0;
  // Blocks until a message arrives, a connection event, one of `writable` may take a data
  // message, or `limit` passes.
  virtual void wait(std::span<const std::string> writable, std::chrono::milliseconds limit) = 0;
  // Closes every connection at once, dropping what is queued (after a failed operation: what
  // is queued may point into the caller's input, and only delays the peers). The caller then
  // empties the receive queue with try_receive(): a transport whose queue is full stops
  // reading a connection, and then never sees its peer close it.
  virtual void drop_all() = 0;
};

}  // namespace loco::collective::detail
