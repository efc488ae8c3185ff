#pragma once
// CURVE on ZeroMQ sockets, and the ZAP handler that decides who may connect. Private to
// runtime/ (it includes ZeroMQ); see keys.hpp for the contract.
#include <cstdint>
#include <memory>
#include <string>
#include <zmq.hpp>

#include "runtime/security/keys.hpp"

namespace loco::security {

// Before bind(): the socket accepts only CURVE handshakes, proving the cluster's secret key,
// from peers its context's ZAP handler admits. Nothing when `s.curve` is false. Throws
// KeyError for a client's settings: only the cluster key can serve.
void make_server(zmq::socket_t& socket, const Settings& s);
// Before connect(): the socket handshakes with CURVE, expecting the server to hold the
// cluster's key and presenting s.own(). Nothing when `s.curve` is false.
void make_client(zmq::socket_t& socket, const Settings& s);
// A server with a key pair of its own, not the cluster's (the collective's relay: it must not
// be able to pass for the head). Its context's ZAP handler still decides who is admitted
// (zap_handler_for with Settings whose cluster key holds only the public half).
void make_server_with(zmq::socket_t& socket, const KeyPair& own);
// A client of such a server: presents s.own() and expects the server to hold
// `server_public_key`. Nothing when `s.curve` is false.
void make_client_of(zmq::socket_t& socket, const Settings& s, const std::string& server_public_key);

// Who sent a received frame, from the user id the ZAP handler gave its connection (ZeroMQ
// attaches it to every frame): a member without CURVE, a client with no key or name for a
// frame that carries none or one that does not parse.
Identity identity_of(const zmq::message_t& frame, bool curve);
// The user id the ZAP handler gives a connection of `who`, which identity_of reads back:
// "member", or "client:KEY:NAME" / "admin:KEY:NAME" (KEY: 40 Z85 characters).
std::string user_id_of(const Identity& who);
Identity parse_user_id(const char* user_id);

// Which connections a server socket takes.
enum class Admit { members_and_clients, members };

// The ZAP handler of one ZeroMQ context (ZeroMQ asks "inproc://zeromq.zap.01" in the server
// socket's context about every handshake): a thread that admits a CURVE client only if its
// public key is the cluster's (role member) or, when the context admits them, one of the
// clients' (role client), tags the connection with that role, and counts and logs the others.
// Without a handler ZeroMQ would admit any client that knows the server's public key.
class ZapHandler {
 public:
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  uint64_t admitted() const;
  uint64_t refused() const;

 private:
  friend std::shared_ptr<ZapHandler> zap_handler_for(zmq::context_t&, const Settings&, Admit);
  struct Impl;
  explicit ZapHandler(std::unique_ptr<Impl> impl);
  void add(const Settings& s);
  std::unique_ptr<Impl> impl_;
};

// The handler of `ctx`, started on first use, its keys extended by `s`'s. Keep it for as long
// as the context has server sockets (sockets of several owners may share it; the first one
// decides `admit`). nullptr when `s.curve` is false.
std::shared_ptr<ZapHandler> zap_handler_for(zmq::context_t& ctx, const Settings& s,
                                            Admit admit = Admit::members_and_clients);

// Words for a ZMQ_EVENT_HANDSHAKE_FAILED_* monitor event of a client socket ("" for another
// event); `curve`: whether the client uses CURVE.
std::string describe_handshake_failure(uint16_t event, int32_t value, bool curve);

}  // namespace loco::security
