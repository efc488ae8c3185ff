// The Redis store: one synchronous hiredis connection behind a mutex.
//
// Failure model: any I/O error (refused, reset, closed, timed out) frees the
// connection and throws StoreUnavailable naming the URL; the next call
// connects again. An error reply from the server is a StoreError and keeps the
// connection, except for the replies that mean "not now" (LOADING, BUSY, ...),
// which are StoreUnavailable.
#include <hiredis/hiredis.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "runtime/membership/store.hpp"

namespace loco::membership {
namespace {

struct RedisUrl {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // ACL user ("" = default)
  std::string password;  // "" = no AUTH
};

template <typename Int>
bool parse_int(std::string_view text, Int& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]; HOST may be an IPv6 address in brackets.
RedisUrl parse_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return StoreError("bad Redis URL '" + redact_url(url) + "': " + why +
                      " (expected redis://HOST:PORT, redis://:PASSWORD@HOST:PORT or "
                      "redis://HOST:PORT/DB)");
  };
  constexpr std::string_view scheme = "redis://";
  std::string_view rest(url);
  if (!rest.starts_with(scheme)) throw bad("it does not start with redis://");
  rest.remove_prefix(scheme.size());

  RedisUrl parsed;
  std::string_view authority = rest;
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    authority = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!parse_int(db, parsed.db) || parsed.db < 0) throw bad("database '" + std::string(db) + "'");
  }
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string_view::npos)
      throw bad("no ':' before the password (redis://:PASSWORD@HOST)");
    parsed.user = std::string(userinfo.substr(0, colon));
    parsed.password = std::string(userinfo.substr(colon + 1));
    if (parsed.password.empty()) throw bad("empty password");
  }

  std::string_view host = authority;
  std::string_view port;
  if (authority.starts_with('[')) {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) throw bad("unclosed '[' in the host");
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (!after.starts_with(':')) throw bad("junk after the host");
      port = after.substr(1);
      if (port.empty()) throw bad("empty port");
    }
  } else if (const auto colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (port.empty()) throw bad("empty port");
  }
  if (host.empty()) throw bad("no host");
  if (!port.empty() && (!parse_int(port, parsed.port) || parsed.port < 1 || parsed.port > 65535)) {
    throw bad("port '" + std::string(port) + "'");
  }
  parsed.host = std::string(host);
  return parsed;
}

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

// hiredis writes with write(2), so a peer that went away raises SIGPIPE, which
// kills a process that has not ignored it. Rather than change the process's
// signal disposition from a library, block SIGPIPE in this thread for the
// duration of one exchange and swallow the one it raised, if any.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

std::string reply_string(const redisReply* r) { return std::string(r->str, r->len); }

// Error replies that mean the server cannot serve now but may soon.
bool is_transient_error(std::string_view message) {
  for (std::string_view prefix : {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"}) {
    if (message.starts_with(prefix)) return true;
  }
  return false;
}

void check_ttl(const std::optional<std::chrono::milliseconds>& ttl) {
  if (ttl && ttl->count() <= 0) {
    throw StoreError("ttl must be positive, got " + std::to_string(ttl->count()) + " ms");
  }
}

class RedisStore final : public Store {
 public:
  // Messages and describe() name the URL with its password replaced (redact_url).
  RedisStore(const std::string& url, std::chrono::milliseconds timeout)
      : url_(redact_url(url)), parsed_(parse_url(url)), timeout_(timeout) {
    if (timeout_.count() <= 0) throw StoreError(url_ + ": the timeout must be positive");
  }

  ~RedisStore() override {
    if (ctx_) redisFree(ctx_);
  }

  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  void put(const std::string& key, const std::string& value,
           std::optional<std::chrono::milliseconds> ttl) override {
    check_ttl(ttl);
    if (ttl) {
      const std::string ms = std::to_string(ttl->count());
      expect_ok(command({"SET", key, value, "PX", ms}), "SET");
    } else {
      expect_ok(command({"SET", key, value}), "SET");
    }
  }

  bool put_if_absent(const std::string& key, const std::string& value,
                     std::optional<std::chrono::milliseconds> ttl) override {
    check_ttl(ttl);
    Reply r;
    if (ttl) {
      const std::string ms = std::to_string(ttl->count());
      r = command({"SET", key, value, "NX", "PX", ms});
    } else {
      r = command({"SET", key, value, "NX"});
    }
    if (r->type == REDIS_REPLY_NIL) return false;
    expect_ok(std::move(r), "SET NX");
    return true;
  }

  std::optional<std::string> get(const std::string& key) override {
    return optional_string(command({"GET", key}), "GET");
  }

  bool erase(const std::string& key) override { return integer(command({"DEL", key}), "DEL") > 0; }

  void hput(const std::string& hash, const std::string& field, const std::string& value) override {
    integer(command({"HSET", hash, field, value}), "HSET");
  }

  std::optional<std::string> hget(const std::string& hash, const std::string& field) override {
    return optional_string(command({"HGET", hash, field}), "HGET");
  }

  std::map<std::string, std::string> hgetall(const std::string& hash) override {
    Reply r = command({"HGETALL", hash});
    return field_map(r.get(), "HGETALL");
  }

  bool hdel(const std::string& hash, const std::string& field) override {
    return integer(command({"HDEL", hash, field}), "HDEL") > 0;
  }

  std::string append(const std::string& stream, const std::map<std::string, std::string>& fields,
                     size_t max_len) override {
    if (fields.empty()) throw StoreError("append to stream '" + stream + "': no fields");
    const std::string len = std::to_string(max_len);
    std::vector<std::string_view> args{"XADD", stream, "MAXLEN", "~", len, "*"};
    for (const auto& [field, value] : fields) {
      args.push_back(field);
      args.push_back(value);
    }
    Reply r = command(args);
    if (r->type != REDIS_REPLY_STRING) throw unexpected("XADD", r.get());
    return reply_string(r.get());
  }

  std::vector<Event> read(const std::string& stream, const std::string& after_id,
                          size_t max_count) override {
    if (max_count == 0) return {};
    const std::string start = "(" + after_id;  // exclusive range start, Redis >= 6.2
    const std::string count = std::to_string(max_count);
    return events_of(command({"XRANGE", stream, start, "+", "COUNT", count}), "XRANGE");
  }

  std::vector<Event> read_last(const std::string& stream, size_t max_count) override {
    if (max_count == 0) return {};
    const std::string count = std::to_string(max_count);
    auto events = events_of(command({"XREVRANGE", stream, "+", "-", "COUNT", count}), "XREVRANGE");
    std::reverse(events.begin(), events.end());
    return events;
  }

  // The entries of an XRANGE/XREVRANGE reply, in the reply's order.
  std::vector<Event> events_of(const Reply& r, const char* what) {
    if (r->type != REDIS_REPLY_ARRAY) throw unexpected(what, r.get());
    std::vector<Event> events;
    events.reserve(r->elements);
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* entry = r->element[i];
      if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 ||
          entry->element[0]->type != REDIS_REPLY_STRING) {
        throw unexpected(std::string(what) + " entry", entry);
      }
      events.push_back(
          Event{reply_string(entry->element[0]),
                field_map(entry->element[1], (std::string(what) + " fields").c_str())});
    }
    return events;
  }

  void ping() override {
    Reply r = command({"PING"});
    if (r->type != REDIS_REPLY_STATUS || reply_string(r.get()) != "PONG") {
      throw unexpected("PING", r.get());
    }
  }

  std::string describe() const override { return url_; }

 private:
  // Sends one command and returns its reply; error replies become exceptions.
  Reply command(const std::vector<std::string_view>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> argvlen;
    argv.reserve(args.size());
    argvlen.reserve(args.size());
    for (std::string_view a : args) {
      argv.push_back(a.data());
      argvlen.push_back(a.size());
    }

    std::lock_guard lock(mutex_);
    ScopedSigpipeBlock no_sigpipe;
    connect_locked();
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), argvlen.data())));
    if (!r) throw lost_connection_locked(std::string(args.front()));
    if (r->type == REDIS_REPLY_ERROR)
      throw_error_reply(std::string(args.front()), reply_string(r.get()));
    return r;
  }

  // An error reply to `command`: transient ones are StoreUnavailable; a server that wants a
  // password we did not give says so.
  [[noreturn]] void throw_error_reply(const std::string& command,
                                      const std::string& message) const {
    const std::string what = url_ + ": " + command + " failed: " + message;
    if (message.starts_with("NOAUTH"))
      throw StoreError(url_ + ": Redis requires a password (" + message +
                       "); give it in the URL: redis://:PASSWORD@HOST:PORT");
    if (is_transient_error(message)) throw StoreUnavailable(what);
    throw StoreError(what);
  }

  void connect_locked() {
    if (ctx_) return;
    redisContext* c =
        redisConnectWithTimeout(parsed_.host.c_str(), parsed_.port, to_timeval(timeout_));
    if (!c) throw StoreUnavailable(url_ + ": cannot allocate a Redis connection");
    if (c->err) {
      std::string cause = c->errstr;
      redisFree(c);
      throw unavailable_locked(url_ + ": " + cause);
    }
    if (redisSetTimeout(c, to_timeval(timeout_)) != REDIS_OK) {
      std::string cause = c->errstr;
      redisFree(c);
      throw unavailable_locked(url_ + ": cannot set the command timeout: " + cause);
    }
    redisEnableKeepAlive(c);  // best effort: finds dead peers on idle connections
    ctx_ = c;
    if (in_outage_) {
      in_outage_ = false;
      spdlog::info("membership store {}: connected again", url_);
    }
    if (!parsed_.password.empty()) {
      std::vector<const char*> argv = {"AUTH"};
      std::vector<size_t> argvlen = {4};
      if (!parsed_.user.empty()) {
        argv.push_back(parsed_.user.c_str());
        argvlen.push_back(parsed_.user.size());
      }
      argv.push_back(parsed_.password.c_str());
      argvlen.push_back(parsed_.password.size());
      Reply r(static_cast<redisReply*>(
          redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), argvlen.data())));
      if (!r) throw lost_connection_locked("AUTH");
      if (r->type == REDIS_REPLY_ERROR) {
        const std::string message = reply_string(r.get());
        drop_locked();
        if (is_transient_error(message)) throw StoreUnavailable(url_ + ": AUTH failed: " + message);
        throw StoreError(url_ + ": Redis refused the password of the URL (AUTH: " + message +
                         "); give the one its requirepass has");
      }
    }
    if (parsed_.db != 0) {
      const std::string db = std::to_string(parsed_.db);
      const char* argv[] = {"SELECT", db.c_str()};
      const size_t argvlen[] = {6, db.size()};
      Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_, 2, argv, argvlen)));
      if (!r) throw lost_connection_locked("SELECT");
      if (r->type == REDIS_REPLY_ERROR) {
        const std::string message = reply_string(r.get());
        drop_locked();
        throw_error_reply("SELECT " + db, message);
      }
    }
  }

  // Frees the broken connection and describes why it broke.
  StoreUnavailable lost_connection_locked(const std::string& command) {
    std::string cause = ctx_->errstr;
    // hiredis reports a read that timed out as EAGAIN.
    if (ctx_->err == REDIS_ERR_IO && cause.find("temporarily unavailable") != std::string::npos) {
      cause = "no reply to " + command + " within " + std::to_string(timeout_.count()) + " ms";
    } else if (cause.empty()) {
      cause = "connection lost during " + command;
    }
    drop_locked();
    return unavailable_locked(url_ + ": " + cause);
  }

  // Logs the first failure of an outage only, so that callers retrying with
  // backoff do not flood the log.
  StoreUnavailable unavailable_locked(const std::string& what) {
    if (!in_outage_) {
      in_outage_ = true;
      spdlog::warn("membership store unavailable: {}", what);
    }
    return StoreUnavailable(what);
  }

  void drop_locked() {
    redisFree(ctx_);
    ctx_ = nullptr;
  }

  StoreError unexpected(const std::string& what, const redisReply* r) const {
    return StoreError(url_ + ": unexpected reply to " + what + " (type " + std::to_string(r->type) +
                      ")");
  }

  void expect_ok(Reply r, const char* what) const {
    if (r->type != REDIS_REPLY_STATUS || reply_string(r.get()) != "OK") {
      throw unexpected(what, r.get());
    }
  }

  std::optional<std::string> optional_string(Reply r, const char* what) const {
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    if (r->type != REDIS_REPLY_STRING) throw unexpected(what, r.get());
    return reply_string(r.get());
  }

  long long integer(Reply r, const char* what) const {
    if (r->type != REDIS_REPLY_INTEGER) throw unexpected(what, r.get());
    return r->integer;
  }

  // A flat [field, value, field, value, ...] array as a map.
  std::map<std::string, std::string> field_map(const redisReply* r, const char* what) const {
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0) throw unexpected(what, r);
    std::map<std::string, std::string> fields;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
      const redisReply* f = r->element[i];
      const redisReply* v = r->element[i + 1];
      if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) throw unexpected(what, r);
      fields[reply_string(f)] = reply_string(v);
    }
    return fields;
  }

  const std::string url_;
  const RedisUrl parsed_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  redisContext* ctx_ = nullptr;  // null while disconnected; guarded by mutex_
  bool in_outage_ = false;       // since the last I/O failure; guarded by mutex_
};

}  // namespace

std::string redact_url(const std::string& url) {
  constexpr std::string_view scheme = "redis://";
  if (!url.starts_with(scheme)) return url;
  const auto end = url.find('/', scheme.size());
  const auto at = url.rfind('@', end == std::string::npos ? url.size() : end);
  if (at == std::string::npos || at < scheme.size()) return url;
  const std::string userinfo = url.substr(scheme.size(), at - scheme.size());
  const auto colon = userinfo.find(':');
  const std::string user = colon == std::string::npos ? userinfo : userinfo.substr(0, colon);
  return std::string(scheme) + user + ":***" + url.substr(at);
}

std::unique_ptr<Store> make_redis_store(const std::string& url, std::chrono::milliseconds timeout) {
  return std::make_unique<RedisStore>(url, timeout);
}

}  // namespace loco::membership
