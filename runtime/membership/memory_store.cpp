// The in-memory store: one keyspace shared by plain keys, hashes and streams,
// as in Redis, so that code written against it behaves the same on Redis
// (a key holds one kind of value; using it as another kind is a StoreError).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <variant>

#include "runtime/membership/store.hpp"

namespace loco::membership {
namespace {

struct StreamId {
  uint64_t ms = 0;
  uint64_t seq = 0;
  auto operator<=>(const StreamId&) const = default;
  std::string str() const { return std::to_string(ms) + "-" + std::to_string(seq); }
};

bool parse_u64(std::string_view text, uint64_t& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// "MS-SEQ" or "MS" (sequence 0), as Redis reads range bounds.
StreamId parse_stream_id(const std::string& id) {
  StreamId parsed;
  const auto dash = id.find('-');
  const std::string_view text(id);
  const bool ok = dash == std::string::npos ? parse_u64(text, parsed.ms)
                                            : parse_u64(text.substr(0, dash), parsed.ms) &&
                                                  parse_u64(text.substr(dash + 1), parsed.seq);
  if (!ok) throw StoreError("invalid stream id '" + id + "' (expected MS-SEQ, e.g. \"5-1\")");
  return parsed;
}

using Hash = std::map<std::string, std::string>;

struct Stream {
  std::deque<std::pair<StreamId, std::map<std::string, std::string>>> entries;
  StreamId last;  // survives trimming, so ids never go back
};

struct Value {
  std::variant<std::string, Hash, Stream> data;
  std::optional<int64_t> expires_at;  // by the store's clock
};

void check_ttl(const std::optional<std::chrono::milliseconds>& ttl) {
  if (ttl && ttl->count() <= 0) {
    throw StoreError("ttl must be positive, got " + std::to_string(ttl->count()) + " ms");
  }
}

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(ClockFn clock) : clock_(std::move(clock)) {
    if (!clock_) throw StoreError("make_memory_store: the clock is empty");
  }

  void put(const std::string& key, const std::string& value,
           std::optional<std::chrono::milliseconds> ttl) override {
    check_ttl(ttl);
    std::lock_guard lock(mutex_);
    const int64_t now = clock_();
    keys_[key] = Value{value, expiry(now, ttl)};
  }

  bool put_if_absent(const std::string& key, const std::string& value,
                     std::optional<std::chrono::milliseconds> ttl) override {
    check_ttl(ttl);
    std::lock_guard lock(mutex_);
    const int64_t now = clock_();
    if (live(key, now)) return false;
    keys_[key] = Value{value, expiry(now, ttl)};
    return true;
  }

  std::optional<std::string> get(const std::string& key) override {
    std::lock_guard lock(mutex_);
    Value* v = live(key, clock_());
    if (!v) return std::nullopt;
    return as<std::string>(*v, key);
  }

  bool erase(const std::string& key) override {
    std::lock_guard lock(mutex_);
    if (!live(key, clock_())) return false;
    keys_.erase(key);
    return true;
  }

  void hput(const std::string& hash, const std::string& field, const std::string& value) override {
    std::lock_guard lock(mutex_);
    Value* v = live(hash, clock_());
    if (!v) v = &(keys_[hash] = Value{Hash{}, std::nullopt});
    as<Hash>(*v, hash)[field] = value;
  }

  std::optional<std::string> hget(const std::string& hash, const std::string& field) override {
    std::lock_guard lock(mutex_);
    Value* v = live(hash, clock_());
    if (!v) return std::nullopt;
    const Hash& h = as<Hash>(*v, hash);
    auto it = h.find(field);
    if (it == h.end()) return std::nullopt;
    return it->second;
  }

  std::map<std::string, std::string> hgetall(const std::string& hash) override {
    std::lock_guard lock(mutex_);
    Value* v = live(hash, clock_());
    if (!v) return {};
    return as<Hash>(*v, hash);
  }

  bool hdel(const std::string& hash, const std::string& field) override {
    std::lock_guard lock(mutex_);
    Value* v = live(hash, clock_());
    if (!v) return false;
    Hash& h = as<Hash>(*v, hash);
    const bool existed = h.erase(field) > 0;
    if (h.empty()) keys_.erase(hash);  // Redis drops empty hashes
    return existed;
  }

  std::string append(const std::string& stream, const std::map<std::string, std::string>& fields,
                     size_t max_len) override {
    if (fields.empty()) throw StoreError("append to stream '" + stream + "': no fields");
    std::lock_guard lock(mutex_);
    const int64_t now = clock_();
    Value* v = live(stream, now);
    if (!v) v = &(keys_[stream] = Value{Stream{}, std::nullopt});
    Stream& s = as<Stream>(*v, stream);
    // Like Redis: the clock's millisecond when it moved forward, else the
    // last id's millisecond with the next sequence number.
    const uint64_t ms = now > 0 ? static_cast<uint64_t>(now) : 0;
    const StreamId id = ms > s.last.ms ? StreamId{ms, 0} : StreamId{s.last.ms, s.last.seq + 1};
    s.last = id;
    s.entries.emplace_back(id, fields);
    while (s.entries.size() > max_len) s.entries.pop_front();
    return id.str();
  }

  std::vector<Event> read(const std::string& stream, const std::string& after_id,
                          size_t max_count) override {
    const StreamId after = parse_stream_id(after_id);
    std::lock_guard lock(mutex_);
    Value* v = live(stream, clock_());
    if (!v) return {};
    const Stream& s = as<Stream>(*v, stream);
    auto it =
        std::upper_bound(s.entries.begin(), s.entries.end(), after,
                         [](const StreamId& a, const auto& entry) { return a < entry.first; });
    std::vector<Event> events;
    for (; it != s.entries.end() && events.size() < max_count; ++it) {
      events.push_back(Event{it->first.str(), it->second});
    }
    return events;
  }

  std::vector<Event> read_last(const std::string& stream, size_t max_count) override {
    std::lock_guard lock(mutex_);
    Value* v = live(stream, clock_());
    if (!v) return {};
    const Stream& s = as<Stream>(*v, stream);
    const size_t skip = s.entries.size() > max_count ? s.entries.size() - max_count : 0;
    std::vector<Event> events;
    for (auto it = s.entries.begin() + skip; it != s.entries.end(); ++it)
      events.push_back(Event{it->first.str(), it->second});
    return events;
  }

  void ping() override {}

  std::string describe() const override { return "memory"; }

 private:
  static std::optional<int64_t> expiry(int64_t now,
                                       const std::optional<std::chrono::milliseconds>& ttl) {
    if (!ttl) return std::nullopt;
    return now + ttl->count();
  }

  // The key's value if it exists and has not expired; drops expired keys.
  Value* live(const std::string& key, int64_t now) {
    auto it = keys_.find(key);
    if (it == keys_.end()) return nullptr;
    if (it->second.expires_at && *it->second.expires_at <= now) {
      keys_.erase(it);
      return nullptr;
    }
    return &it->second;
  }

  template <typename T>
  static T& as(Value& v, const std::string& key) {
    if (T* data = std::get_if<T>(&v.data)) return *data;
    throw StoreError("WRONGTYPE: key '" + key + "' holds a " + kind(v) + ", not a " + kind_of<T>());
  }

  static std::string kind(const Value& v) {
    return std::visit([](const auto& data) { return kind_of<std::decay_t<decltype(data)>>(); },
                      v.data);
  }

  template <typename T>
  static std::string kind_of() {
    if constexpr (std::is_same_v<T, std::string>) return "string";
    if constexpr (std::is_same_v<T, Hash>) return "hash";
    if constexpr (std::is_same_v<T, Stream>) return "stream";
  }

  const ClockFn clock_;
  std::mutex mutex_;
  std::unordered_map<std::string, Value> keys_;
};

}  // namespace

std::unique_ptr<Store> make_memory_store(ClockFn clock) {
  return std::make_unique<MemoryStore>(std::move(clock));
}

bool stream_id_less(const std::string& a, const std::string& b) {
  return parse_stream_id(a) < parse_stream_id(b);
}

}  // namespace loco::membership
