#pragma once
// The membership store: where the runtime keeps everything that must survive a
// head restart (nodes, actors, names, jobs) and the stream of membership events.
//
// Two implementations pass one test suite (tests/runtime/membership):
//   make_redis_store   - the real one, over hiredis, against redis-server;
//   make_memory_store  - in-process, with an injected clock, for unit tests.
//
// Contract shared by both:
//   * every operation either completes or throws StoreUnavailable (connection
//     lost, server down, timeout) / StoreError (anything else); a later call
//     after StoreUnavailable tries to reconnect, so callers retry with backoff;
//   * keys with a TTL disappear once the TTL has passed (by the store's clock);
//   * stream ids are strings that compare in append order (Redis "ms-seq" ids;
//     use stream_id_less to compare), read() returns events strictly after
//     `after_id` ("0" = from the beginning), oldest first; read_last() the
//     newest ones, oldest first;
//   * all methods are safe to call from several threads;
//   * as in Redis, a key holds one kind of value (plain, hash or stream): using
//     it as another kind is a StoreError ("WRONGTYPE ..."), put() replaces any
//     kind and erase() removes any kind; a hash whose last field is deleted is
//     gone; a ttl must be positive (StoreError otherwise); append() needs at
//     least one field; a malformed after_id is a StoreError.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace loco::membership {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store cannot be reached right now; retrying later may succeed.
class StoreUnavailable : public StoreError {
 public:
  using StoreError::StoreError;
};

struct Event {
  std::string id;
  std::map<std::string, std::string> fields;
};

class Store {
 public:
  virtual ~Store() = default;

  // Plain keys. A ttl of nullopt means the key never expires; a put without a
  // ttl on an existing key removes its ttl.
  virtual void put(const std::string& key, const std::string& value,
                   std::optional<std::chrono::milliseconds> ttl = std::nullopt) = 0;
  // Sets the key only if it does not exist; true when this call set it.
  virtual bool put_if_absent(const std::string& key, const std::string& value,
                             std::optional<std::chrono::milliseconds> ttl = std::nullopt) = 0;
  virtual std::optional<std::string> get(const std::string& key) = 0;
  // True when the key existed.
  virtual bool erase(const std::string& key) = 0;

  // Hashes (field -> value maps under one key). Values are binary-safe.
  virtual void hput(const std::string& hash, const std::string& field,
                    const std::string& value) = 0;
  virtual std::optional<std::string> hget(const std::string& hash, const std::string& field) = 0;
  virtual std::map<std::string, std::string> hgetall(const std::string& hash) = 0;
  virtual bool hdel(const std::string& hash, const std::string& field) = 0;

  // Append-only event stream, trimmed to about `max_len` newest entries.
  // Returns the new event's id.
  virtual std::string append(const std::string& stream,
                             const std::map<std::string, std::string>& fields,
                             size_t max_len = 10000) = 0;
  virtual std::vector<Event> read(const std::string& stream, const std::string& after_id,
                                  size_t max_count = 1000) = 0;
  // The newest `max_count` events, oldest first (what "recent events" shows).
  virtual std::vector<Event> read_last(const std::string& stream, size_t max_count) = 0;

  // Round trip to the store; throws StoreUnavailable when it cannot be reached.
  virtual void ping() = 0;

  // A human-readable description for logs and errors ("redis://127.0.0.1:6379").
  virtual std::string describe() const = 0;
};

// "redis://HOST:PORT", "redis://HOST:PORT/DB", with a password "redis://:PASSWORD@HOST:PORT"
// (or "redis://USER:PASSWORD@..." for a Redis ACL user): it sends AUTH on every connection; a
// wrong password, or none to a server that wants one, is a StoreError saying so. Messages
// and describe() never show the password (redact_url). Connects lazily: construction
// never throws for an unreachable server, the first operation does.
// `timeout` bounds connecting and every command.
std::unique_ptr<Store> make_redis_store(
    const std::string& url, std::chrono::milliseconds timeout = std::chrono::milliseconds(1000));

// `url` with its password replaced by "***", for logs and messages.
std::string redact_url(const std::string& url);

// Milliseconds since some fixed origin.
using ClockFn = std::function<int64_t()>;
// The in-memory store; TTLs follow `clock` (tests advance it by hand).
std::unique_ptr<Store> make_memory_store(ClockFn clock);

// Compares two stream ids in append order ("5-1" < "5-2" < "10-0"); "5" means "5-0".
// Throws StoreError for a malformed id.
bool stream_id_less(const std::string& a, const std::string& b);

}  // namespace loco::membership
