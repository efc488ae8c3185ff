// One suite for both membership stores (memory with a hand-driven clock, Redis
// against a real redis-server), then what only Redis can do: fail and recover.
#include "runtime/membership/store.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/eventually.hpp"
#include "tests/support/redis_server.hpp"

namespace loco::membership {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using loco::testing::RedisServer;

enum class Backend { kMemory, kRedis };

// Readable names in ctest's list instead of "4-byte object <00-00 00-00>".
void PrintTo(Backend backend, std::ostream* os) {
  *os << (backend == Backend::kMemory ? "memory" : "redis");
}

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kMemory ? "Memory" : "Redis";
}

// The message of the E that f throws; a test failure if it throws nothing or
// something else.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "threw nothing";
  return {};
}

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (memory()) {
      store_ = make_memory_store([this] { return now_ms_.load(); });
    } else {
      redis_ = std::make_unique<RedisServer>();
      store_ = make_redis_store(redis_->url());
    }
  }

  bool memory() const { return GetParam() == Backend::kMemory; }
  Store& store() { return *store_; }

  // Long enough that a key written with it is still there when read back at
  // once on a loaded machine, short enough to wait for on Redis.
  std::chrono::milliseconds short_ttl() const { return memory() ? 100ms : 300ms; }

  // Makes `ttl` pass for the store: the memory store's clock jumps; Redis's
  // clock runs by itself, and eventually() waits for it.
  void let_pass(std::chrono::milliseconds ttl) {
    if (memory()) now_ms_ += ttl.count() + 1;
  }

  // True once `done` holds: at once for memory, polling for at most 5 s on Redis.
  bool eventually(const std::function<bool()>& done) {
    return memory() ? done() : loco::testing::eventually(done, 5s, 10ms);
  }

  std::atomic<int64_t> now_ms_{1'000'000};
  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<Store> store_;
};

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values(Backend::kMemory, Backend::kRedis),
                         backend_name);

TEST_P(StoreTest, PutGetErase) {
  EXPECT_EQ(store().get("k"), std::nullopt);
  store().put("k", "v1");
  EXPECT_EQ(store().get("k"), "v1");
  store().put("k", "v2");
  EXPECT_EQ(store().get("k"), "v2");
  EXPECT_TRUE(store().erase("k"));
  EXPECT_FALSE(store().erase("k"));
  EXPECT_EQ(store().get("k"), std::nullopt);
  store().put("empty", "");
  EXPECT_EQ(store().get("empty"), "");
  EXPECT_NO_THROW(store().ping());
}

TEST_P(StoreTest, KeyWithTtlExpires) {
  store().put("k", "v", short_ttl());
  EXPECT_EQ(store().get("k"), "v");
  let_pass(short_ttl());
  EXPECT_TRUE(eventually([&] { return !store().get("k"); }));
  EXPECT_FALSE(store().erase("k"));
}

TEST_P(StoreTest, PutWithoutTtlRemovesTheTtl) {
  store().put("k", "v1", short_ttl());
  store().put("k", "v2");
  // A key written after both with the same ttl: once it is gone, k's ttl has passed.
  store().put("probe", "x", short_ttl());
  let_pass(short_ttl());
  ASSERT_TRUE(eventually([&] { return !store().get("probe"); }));
  EXPECT_EQ(store().get("k"), "v2");
}

TEST_P(StoreTest, RejectsANonPositiveTtl) {
  EXPECT_THROW(store().put("k", "v", 0ms), StoreError);
  EXPECT_THROW(store().put_if_absent("k", "v", -5ms), StoreError);
  EXPECT_EQ(store().get("k"), std::nullopt);
}

TEST_P(StoreTest, PutIfAbsent) {
  EXPECT_TRUE(store().put_if_absent("k", "first"));
  EXPECT_FALSE(store().put_if_absent("k", "second"));
  EXPECT_EQ(store().get("k"), "first");
  EXPECT_TRUE(store().erase("k"));
  EXPECT_TRUE(store().put_if_absent("k", "third"));
  EXPECT_EQ(store().get("k"), "third");
}

TEST_P(StoreTest, PutIfAbsentSucceedsAgainOnceTheTtlHasPassed) {
  EXPECT_TRUE(store().put_if_absent("lease", "a", short_ttl()));
  EXPECT_FALSE(store().put_if_absent("lease", "b", short_ttl()));
  let_pass(short_ttl());
  ASSERT_TRUE(eventually([&] { return !store().get("lease"); }));
  EXPECT_TRUE(store().put_if_absent("lease", "c"));
  EXPECT_EQ(store().get("lease"), "c");
}

TEST_P(StoreTest, PutIfAbsentRaceHasOneWinnerPerKey) {
  constexpr int kKeys = 200;
  constexpr int kThreads = 2;
  std::vector<std::atomic<int>> wins(kKeys);
  std::vector<std::string> winner(kKeys);
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int k = 0; k < kKeys; ++k) {
        const std::string name = "thread-" + std::to_string(t);
        if (store().put_if_absent("key-" + std::to_string(k), name)) {
          wins[k]++;
          winner[k] = name;  // only the one winner writes it
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_EQ(wins[k].load(), 1) << "key-" << k;
    EXPECT_EQ(store().get("key-" + std::to_string(k)), winner[k]);
  }
}

TEST_P(StoreTest, ValuesKeysAndFieldsAreBinarySafe) {
  const std::string key("bin\0key", 7);
  const std::string value("a\0b\r\n\xff\x00z", 8);
  store().put(key, value);
  EXPECT_EQ(store().get(key), value);
  EXPECT_EQ(store().get("bin"), std::nullopt);

  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  store().put("big", big);
  EXPECT_EQ(store().get("big"), big);

  const std::string field("f\0g", 3);
  store().hput("h", field, value);
  EXPECT_EQ(store().hget("h", field), value);
  EXPECT_EQ(store().hget("h", "f"), std::nullopt);
  EXPECT_EQ(store().hgetall("h"), (std::map<std::string, std::string>{{field, value}}));

  const std::map<std::string, std::string> fields{{field, value}, {"plain", std::string(3, '\0')}};
  const std::string id = store().append("s", fields);
  const auto events = store().read("s", "0");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, id);
  EXPECT_EQ(events[0].fields, fields);
}

TEST_P(StoreTest, Hashes) {
  EXPECT_EQ(store().hget("node:a", "addr"), std::nullopt);
  EXPECT_TRUE(store().hgetall("node:a").empty());
  EXPECT_FALSE(store().hdel("node:a", "addr"));

  store().hput("node:a", "addr", "10.0.0.1:7071");
  store().hput("node:a", "gpus", "8");
  store().hput("node:a", "addr", "10.0.0.2:7071");
  EXPECT_EQ(store().hget("node:a", "addr"), "10.0.0.2:7071");
  EXPECT_EQ(store().hgetall("node:a"),
            (std::map<std::string, std::string>{{"addr", "10.0.0.2:7071"}, {"gpus", "8"}}));

  EXPECT_TRUE(store().hdel("node:a", "gpus"));
  EXPECT_FALSE(store().hdel("node:a", "gpus"));
  EXPECT_TRUE(store().hdel("node:a", "addr"));
  EXPECT_TRUE(store().hgetall("node:a").empty());
}

TEST_P(StoreTest, OneKeyspaceForAllKinds) {
  store().put("k", "v");
  EXPECT_THROW(store().hget("k", "f"), StoreError);
  EXPECT_THROW(store().hput("k", "f", "v"), StoreError);
  EXPECT_THROW(store().append("k", {{"f", "v"}}), StoreError);

  store().hput("h", "f", "v");
  EXPECT_THROW(store().get("h"), StoreError);
  EXPECT_FALSE(store().put_if_absent("h", "v"));
  EXPECT_TRUE(store().erase("h"));
  EXPECT_TRUE(store().hgetall("h").empty());

  store().append("s", {{"f", "v"}});
  store().put("s", "now a string");  // like SET, replaces whatever was there
  EXPECT_EQ(store().get("s"), "now a string");
}

TEST_P(StoreTest, StreamReadsInAppendOrderAfterAnExclusiveId) {
  EXPECT_TRUE(store().read("events", "0").empty());
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(store().append("events", {{"kind", "join"}, {"i", std::to_string(i)}}));
  }
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_TRUE(stream_id_less(ids[i - 1], ids[i]));

  auto all = store().read("events", "0");
  ASSERT_EQ(all.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(all[i].id, ids[i]);
    EXPECT_EQ(all[i].fields.at("i"), std::to_string(i));
    EXPECT_EQ(all[i].fields.at("kind"), "join");
  }

  auto after = store().read("events", ids[2]);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].id, ids[3]);
  EXPECT_EQ(after[1].id, ids[4]);
  EXPECT_TRUE(store().read("events", ids[4]).empty());

  // Paging with max_count sees every event once.
  std::vector<std::string> paged;
  std::string cursor = "0";
  while (true) {
    auto page = store().read("events", cursor, 2);
    if (page.empty()) break;
    EXPECT_LE(page.size(), 2u);
    for (const auto& e : page) paged.push_back(e.id);
    cursor = page.back().id;
  }
  EXPECT_EQ(paged, ids);
}

TEST_P(StoreTest, ReadLastGivesTheNewestEventsOldestFirst) {
  EXPECT_TRUE(store().read_last("events", 3).empty());
  std::vector<std::string> ids;
  for (int i = 0; i < 1200; ++i)
    ids.push_back(store().append("events", {{"i", std::to_string(i)}}));
  auto last = store().read_last("events", 3);
  ASSERT_EQ(last.size(), 3u);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(last[j].id, ids[1197 + j]);
    EXPECT_EQ(last[j].fields.at("i"), std::to_string(1197 + j));
  }
  EXPECT_EQ(store().read_last("events", 5000).size(), 1200u);
  EXPECT_TRUE(store().read_last("events", 0).empty());
}

TEST_P(StoreTest, StreamRejectsBadInput) {
  EXPECT_THROW(store().append("s", {}), StoreError);
  store().append("s", {{"f", "v"}});
  EXPECT_THROW(store().read("s", "not-an-id"), StoreError);
}

TEST_P(StoreTest, StreamIsTrimmedToAboutMaxLenNewest) {
  constexpr int kAppends = 600;
  constexpr size_t kMaxLen = 10;
  for (int i = 0; i < kAppends; ++i) store().append("s", {{"i", std::to_string(i)}}, kMaxLen);
  const auto events = store().read("s", "0", 100000);
  // Redis trims "~" approximately: whole nodes of 100 entries, never below max_len.
  EXPECT_GE(events.size(), kMaxLen);
  EXPECT_LE(events.size(), kMaxLen + 200);
  if (memory()) {
    EXPECT_EQ(events.size(), kMaxLen);
  }
  // What is left is the newest, in order.
  for (size_t j = 0; j < events.size(); ++j) {
    EXPECT_EQ(events[j].fields.at("i"), std::to_string(kAppends - events.size() + j));
  }
}

TEST_P(StoreTest, ConcurrentUseFromSeveralThreads) {
  constexpr int kThreads = 4;
  constexpr int kOps = 100;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kOps; ++i) {
        const std::string tag = std::to_string(t) + ":" + std::to_string(i);
        store().put("k" + std::to_string(t), tag);
        if (store().get("k" + std::to_string(t)) != tag) mismatches++;
        store().hput("shared", tag, tag);
        store().append("log", {{"t", std::to_string(t)}, {"i", std::to_string(i)}});
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(store().hgetall("shared").size(), static_cast<size_t>(kThreads * kOps));

  const auto events = store().read("log", "0", 10000);
  ASSERT_EQ(events.size(), static_cast<size_t>(kThreads * kOps));
  std::vector<int> next(kThreads, 0);
  for (size_t j = 0; j < events.size(); ++j) {
    if (j > 0) {
      EXPECT_TRUE(stream_id_less(events[j - 1].id, events[j].id));
    }
    const int t = std::stoi(events[j].fields.at("t"));
    EXPECT_EQ(std::stoi(events[j].fields.at("i")), next[t]++) << "thread " << t;
  }
}

// ---- The memory store alone: what its injected clock makes exact.

class MemoryStoreTest : public ::testing::Test {
 protected:
  std::atomic<int64_t> now_ms_{5000};
  std::unique_ptr<Store> store_ = make_memory_store([this] { return now_ms_.load(); });
};

TEST_F(MemoryStoreTest, TtlEndsExactlyAfterItsDuration) {
  store_->put("k", "v", 100ms);
  now_ms_ = 5099;
  EXPECT_EQ(store_->get("k"), "v");
  now_ms_ = 5100;
  EXPECT_EQ(store_->get("k"), std::nullopt);
}

TEST_F(MemoryStoreTest, StreamIdsIncreaseWhenTheClockStandsStillOrGoesBack) {
  EXPECT_EQ(store_->append("s", {{"a", "1"}}), "5000-0");
  EXPECT_EQ(store_->append("s", {{"a", "2"}}), "5000-1");
  now_ms_ = 4000;
  EXPECT_EQ(store_->append("s", {{"a", "3"}}), "5000-2");
  now_ms_ = 6000;
  EXPECT_EQ(store_->append("s", {{"a", "4"}}), "6000-0");
}

TEST_F(MemoryStoreTest, StreamIdsKeepIncreasingAfterTrimming) {
  store_->append("s", {{"a", "1"}}, 1);
  store_->append("s", {{"a", "2"}}, 1);
  const auto events = store_->read("s", "0");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, "5000-1");
  EXPECT_EQ(store_->append("s", {{"a", "3"}}, 1), "5000-2");
}

TEST_F(MemoryStoreTest, ReadAfterAnIdThatIsNotInTheStream) {
  store_->append("s", {{"a", "1"}});  // 5000-0
  now_ms_ = 7000;
  store_->append("s", {{"a", "2"}});  // 7000-0
  EXPECT_EQ(store_->read("s", "6000-5").size(), 1u);
  EXPECT_EQ(store_->read("s", "5000").size(), 1u);  // "5000" means 5000-0
  EXPECT_EQ(store_->read("s", "99999-0").size(), 0u);
}

TEST(StreamIdLess, ComparesNumerically) {
  EXPECT_TRUE(stream_id_less("5-1", "5-2"));
  EXPECT_TRUE(stream_id_less("5-2", "10-0"));
  EXPECT_TRUE(stream_id_less("9-9", "10-0"));
  EXPECT_TRUE(stream_id_less("0", "1-0"));
  EXPECT_FALSE(stream_id_less("10-0", "9-9"));
  EXPECT_FALSE(stream_id_less("5-1", "5-1"));
  EXPECT_FALSE(stream_id_less("5", "5-0"));
  EXPECT_TRUE(stream_id_less("1700000000000-0", "1700000000000-10"));
  EXPECT_THROW(stream_id_less("x-1", "1-0"), StoreError);
  EXPECT_THROW(stream_id_less("1-", "1-0"), StoreError);
}

// ---- Redis alone: bad URLs, unreachable, hung and restarted servers.

// A socket that listens on loopback and never accepts: connections complete
// (the kernel queues them) but nothing is ever answered.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("SilentListener: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(RedisStoreTest, BadUrlsAreStoreErrorsNamingTheUrl) {
  for (const std::string url :
       {"", "127.0.0.1:6379", "http://127.0.0.1:6379", "redis://", "redis://:6379",
        "redis://host:", "redis://host:port", "redis://host:0", "redis://host:70000",
        "redis://host:6379/", "redis://host:6379/x", "redis://host:6379/-1", "redis://[::1:6379",
        "redis://:@host:6379", "redis://nocolon@host:6379", "redis://:pw@:6379"}) {
    try {
      make_redis_store(url);
      ADD_FAILURE() << "accepted '" << url << "'";
    } catch (const StoreUnavailable& e) {
      ADD_FAILURE() << "'" << url << "' is unavailable, not malformed: " << e.what();
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + redact_url(url) + "'"), std::string::npos)
          << e.what();
    }
  }
  for (const std::string url :
       {"redis://127.0.0.1:6379", "redis://localhost:6379/2", "redis://localhost",
        "redis://[::1]:6379", "redis://:pw@host:6379", "redis://user:p@ss@host:6379/1"}) {
    EXPECT_NO_THROW(make_redis_store(url)) << url;
  }
}

TEST(RedisStoreTest, PasswordsAreSentAndNeverShown) {
  RedisServer redis(RedisServer::Options{.extra_args = {"--requirepass", "s3cret-pw"}});
  const std::string at = "@127.0.0.1:" + std::to_string(redis.port());
  auto good = make_redis_store("redis://:s3cret-pw" + at);
  good->put("k", "v");
  EXPECT_EQ(good->get("k"), "v");
  EXPECT_EQ(good->describe(), "redis://:***" + at);
  auto good_db = make_redis_store("redis://:s3cret-pw" + at + "/2");
  EXPECT_EQ(good_db->get("k"), std::nullopt);
  // A wrong password: a StoreError (not "unavailable": retrying will not help) that says so,
  // without the password.
  auto wrong = make_redis_store("redis://:not-it" + at);
  std::string message = message_of<StoreError>([&] { wrong->ping(); });
  EXPECT_NE(message.find("refused the password"), std::string::npos) << message;
  EXPECT_EQ(message.find("not-it"), std::string::npos) << message;
  EXPECT_THROW(
      {
        try {
          wrong->ping();
        } catch (const StoreUnavailable&) {
          ADD_FAILURE() << "a wrong password is not a transient failure";
        }
      },
      StoreError);
  // None: the server wants one.
  auto none = make_redis_store("redis://127.0.0.1:" + std::to_string(redis.port()));
  message = message_of<StoreError>([&] { none->get("k"); });
  EXPECT_NE(message.find("requires a password"), std::string::npos) << message;
  EXPECT_NE(message.find("redis://:PASSWORD@HOST:PORT"), std::string::npos) << message;
}

TEST(RedisStoreTest, UnreachableServerIsUnavailableNamingTheUrl) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(loco::testing::free_tcp_port());
  auto store = make_redis_store(url, 500ms);  // lazy: does not throw
  EXPECT_EQ(store->describe(), url);
  const auto start = Clock::now();
  const std::string message = message_of<StoreUnavailable>([&] { store->ping(); });
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(message, url + ": Connection refused");
  EXPECT_THROW(store->put("k", "v"), StoreUnavailable);
  EXPECT_THROW(store->read("s", "0"), StoreUnavailable);
}

TEST(RedisStoreTest, SilentServerTimesOutWithinTheTimeout) {
  SilentListener silent;
  const std::string url = "redis://127.0.0.1:" + std::to_string(silent.port());
  auto store = make_redis_store(url, 300ms);
  const auto start = Clock::now();
  const std::string message = message_of<StoreUnavailable>([&] { store->get("k"); });
  const double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.25);
  EXPECT_LT(elapsed, 3.0);
  EXPECT_EQ(message, url + ": no reply to GET within 300 ms");
}

TEST(RedisStoreTest, HungServerIsUnavailableUntilItResumes) {
  RedisServer redis;
  auto store = make_redis_store(redis.url(), 300ms);
  store->put("k", "v");
  redis.pause();
  const auto start = Clock::now();
  EXPECT_THROW(store->get("k"), StoreUnavailable);
  EXPECT_LT(seconds_since(start), 3.0);
  redis.resume();
  EXPECT_EQ(store->get("k"), "v");
}

TEST(RedisStoreTest, ServerKilledThenRestartedOnTheSamePort) {
  RedisServer redis;
  const int port = redis.port();
  auto store = make_redis_store(redis.url(), 500ms);
  store->put("before", "1");

  redis.kill();  // Redis lost while running
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    const std::string message = message_of<StoreUnavailable>([&] { store->put("during", "2"); });
    EXPECT_EQ(message.rfind(redis.url() + ": ", 0), 0u) << message;
    EXPECT_LT(seconds_since(start), 2.0);
  }

  redis.restart();
  EXPECT_EQ(redis.port(), port);
  // The store reconnects on the next call after a failure.
  EXPECT_NO_THROW(store->put("after", "3"));
  EXPECT_EQ(store->get("after"), "3");
  EXPECT_EQ(store->get("before"), std::nullopt);  // nothing persisted
}

TEST(RedisStoreTest, LargeWriteToADeadServerIsUnavailableNotSigpipe) {
  // Writing megabytes to a socket whose peer is gone raises SIGPIPE, which
  // would end this process; the store must turn it into StoreUnavailable.
  RedisServer redis;
  auto store = make_redis_store(redis.url(), 500ms);
  store->ping();
  redis.kill();
  const std::string big(16 << 20, 'x');
  for (int i = 0; i < 3; ++i) EXPECT_THROW(store->put("big", big), StoreUnavailable);
}

TEST(RedisStoreTest, RestartBehindAnIdleConnectionFailsAtMostOneCall) {
  RedisServer redis;
  auto store = make_redis_store(redis.url(), 500ms);
  store->put("k", "v");
  redis.kill();
  redis.restart();
  // The old connection is dead; the first call may find out (StoreUnavailable),
  // the next one reconnects.
  int unavailable = 0;
  std::optional<std::string> value;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      store->put("k", "again");
      value = store->get("k");
      break;
    } catch (const StoreUnavailable&) {
      unavailable++;
    }
  }
  EXPECT_LE(unavailable, 1);
  EXPECT_EQ(value, "again");
}

TEST(RedisStoreTest, AppendOnlyServerKeepsDataAcrossAGracefulRestart) {
  RedisServer::Options options;
  options.appendonly = true;
  RedisServer redis(options);
  auto store = make_redis_store(redis.url());
  store->put("k", "kept");
  store->hput("h", "f", "v");
  redis.restart();
  // The server closed our connection when it stopped: the first call may find
  // out (StoreUnavailable), the next one reconnects.
  std::optional<std::string> value;
  try {
    value = store->get("k");
  } catch (const StoreUnavailable&) {
    value = store->get("k");
  }
  EXPECT_EQ(value, "kept");
  EXPECT_EQ(store->hget("h", "f"), "v");
}

TEST(RedisStoreTest, SelectsTheDatabaseOfTheUrl) {
  RedisServer redis;
  auto db0 = make_redis_store(redis.url());
  auto db3 = make_redis_store(redis.url(3));
  db3->put("k", "in 3");
  EXPECT_EQ(db3->get("k"), "in 3");
  EXPECT_EQ(db0->get("k"), std::nullopt);
  EXPECT_EQ(db3->describe(), redis.url(3));
}

TEST(RedisStoreTest, DatabaseOutOfRangeIsAnError) {
  RedisServer redis;
  auto store = make_redis_store(redis.url(99));
  const std::string message = message_of<StoreError>([&] { store->ping(); });
  EXPECT_NE(message.find(redis.url(99)), std::string::npos) << message;
  EXPECT_NE(message.find("SELECT"), std::string::npos) << message;
  try {
    store->ping();
    ADD_FAILURE() << "SELECT 99 succeeded";
  } catch (const StoreUnavailable& e) {
    ADD_FAILURE() << "a bad database is not a transient failure: " << e.what();
  } catch (const StoreError&) {
  }
}

}  // namespace
}  // namespace loco::membership
