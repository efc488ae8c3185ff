// A relay for members behind NAT: two members that cannot connect to each other (both
// outbound-only) each connect to it, and it forwards their messages by routing id. Library
// class here; `loco relay` runs one. See docs/guide/nat.md, "Members behind NAT".
//
// What it can do, by construction:
// - Admit only the cluster's members: a CURVE server with a key pair of its own (not the
//   cluster's: it cannot pass for the head or a member), whose ZAP handler admits only clients
//   that prove the cluster's key. Without CURVE (--insecure) anyone who reaches it.
// - See routing ids (which member talks to which), sizes and timing; never plaintext, which
//   members seal end to end (seal.hpp); whatever it changes fails to authenticate.
// - Bounded: frames over `max_message_bytes` close their connection before they are allocated;
//   `hwm` messages queued per connection each way; a token bucket of `rate_mbit` on the bytes
//   it forwards; a destination that is not connected for `hold_ttl` has the message dropped
//   and counted (the members' liveness judges); a connected one whose queue is full (a member
//   that enters its operation late, or drains slowly) loses nothing. Until then
//   it waits at the relay (members enter an operation at different times), at most
//   `max_held_bytes` in all: over that the relay reads nothing more, and ZeroMQ and TCP push
//   back on the senders.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/security/keys.hpp"

namespace loco::collective {

struct RelayOptions {
  // CURVE when security.curve: only security.cluster.public_key is used (the key members
  // present); give the relay no cluster secret.
  security::Settings security;
  // The relay's own CURVE key pair; a fresh one when empty (members need its public half:
  // Group::relay.public_key).
  security::KeyPair own;
  double rate_mbit = 0;  // forwarded bytes per second, in Mbit/s; 0: unbounded
  size_t max_message_bytes = size_t(64) << 20;
  int hwm = 64;
  // Longer than any operation's entry window (Options::entry_timeout: a straggler may begin a
  // streaming fragment's operation minutes after the others, and its DEALER connects to the
  // relay only then): a message dropped from a member's stream is not detected (docs/guide/
  // nat.md). What waits is bounded by max_held_bytes meanwhile.
  std::chrono::milliseconds hold_ttl{300000};
  size_t max_held_bytes = size_t(256) << 20;
  // A connection that has not finished its handshake (CURVE included) within this is closed:
  // idle connections of someone without the key hold no descriptor for long. Generous, for the
  // few bytes of a member's handshake behind data on a saturated link; ZeroMQ reconnects a
  // member it closed.
  std::chrono::milliseconds handshake_timeout{60000};
  // Connections held from any one address; past it a new one is closed at once (0: no
  // bound). Members of a site behind one NAT address share it.
  size_t max_connections_per_source = 256;
  // Test hook: sees each message before it is forwarded, as frames (destination routing id,
  // source routing id, then the member's frames: header, sender, sealed payload), and may
  // change them (a hostile relay). Empty in production.
  std::function<void(std::vector<std::string>& frames)> tap;
};

class Relay {
 public:
  // Binds (CollectiveError if it cannot; "tcp://HOST:0" picks a port) and starts forwarding on
  // a thread of its own, until destroyed.
  Relay(const std::string& bind_endpoint, RelayOptions options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  const std::string& endpoint() const;
  // Its CURVE public key (Z85), for Group::relay.public_key; "" without CURVE.
  const std::string& public_key() const;
  // Its bound on forwarded bytes per second (0: unbounded), and the same in words.
  double rate() const;
  std::string describe_rate() const;
  uint64_t forwarded() const;  // messages
  uint64_t dropped() const;    // messages: malformed, no such destination, or stuck
  uint64_t refused() const;    // handshakes its ZAP handler refused

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::collective
