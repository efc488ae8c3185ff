// Bounded decoding of network input: every limit refuses its input before msgpack allocates,
// with an error naming the limit; remote text in log lines is escaped and cut; repeated
// warnings are rate-limited.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <tuple>

#include "runtime/core/codec.hpp"
#include "runtime/core/core.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"
#include "runtime/core/wire.hpp"
#include "tests/runtime/core/test_actors.hpp"

namespace loco::detail {
namespace {

std::string refusal(const std::string& bytes, const UnpackLimits& limits = {}) {
  try {
    unpack_bounded(bytes.data(), bytes.size(), "test input", limits);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// array 32 (0xdd) / map 32 (0xdf) / str 32 (0xdb) / bin 32 (0xc6) / ext 32 (0xc9) headers
// declaring 2^32 - 1 items, padded to 42 bytes: the probe's "42 bytes that ask for 128 GB".
std::string declares_huge(char type) {
  std::string s(1, type);
  s += std::string(4, '\xff');
  if (type == '\xc9') s += '\x01';  // ext type
  s.resize(42, '\xc0');             // nils
  return s;
}

TEST(UnpackBounded, DeclaredLengthsBeyondTheInputAreRefusedBeforeAllocating) {
  const auto start = std::chrono::steady_clock::now();
  const std::string array = refusal(declares_huge('\xdd'));
  EXPECT_TRUE(contains(array, "test input of 42 bytes refused: an array of 4294967295 elements"))
      << array;
  const std::string map = refusal(declares_huge('\xdf'));
  EXPECT_TRUE(contains(map, "a map of 4294967295 entries in 42 bytes")) << map;
  for (char t : {'\xdb', '\xc6', '\xc9'}) {
    const std::string e = refusal(declares_huge(t));
    EXPECT_TRUE(contains(e, "truncated msgpack")) << e;
  }
  // Cheap: no 100 GB allocation was tried (that alone takes seconds, or kills the process).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(UnpackBounded, DeepNestingIsRefusedNamingTheLimit) {
  const std::string deep(100000, '\x91');  // [[[[...
  const std::string e = refusal(deep + '\xc0');
  EXPECT_TRUE(contains(e, "nesting deeper than the limit of 32 arrays or maps")) << e;
  std::string ok(32, '\x91');
  EXPECT_EQ(refusal(ok + '\xc0'), "");
}

TEST(UnpackBounded, ManySmallObjectsAreHeldToTheDecodeBudget) {
  // 5 M nils: 5 MB of input that would take 80 MB of msgpack objects.
  std::string nils = "\xdd";
  const uint32_t n = 5'000'000;
  for (int shift : {24, 16, 8, 0}) nils.push_back(static_cast<char>((n >> shift) & 0xff));
  nils.append(n, '\xc0');
  const std::string e = refusal(nils);
  EXPECT_TRUE(contains(e, "more than the budget of 64 MiB for one message")) << e;
  EXPECT_EQ(refusal(nils, UnpackLimits{32, size_t(128) << 20}), "");
}

TEST(UnpackBounded, GarbageAndTruncationAreNamed) {
  EXPECT_TRUE(contains(refusal(std::string("\xc1", 1)), "not msgpack")) << refusal("\xc1");
  EXPECT_TRUE(contains(refusal(std::string("\x92\x01", 2)), "truncated msgpack"));
}

TEST(UnpackBounded, PayloadsStillRoundTrip) {
  auto p = pack_payload(std::make_tuple(std::string("abc"), 42, std::vector<int>{1, 2, 3}));
  auto t = unpack_payload<std::tuple<std::string, int, std::vector<int>>>(p, "test");
  EXPECT_EQ(std::get<0>(t), "abc");
  EXPECT_EQ(std::get<2>(t).size(), 3u);
}

// The probe: a 200 MB envelope of nils took a node from 0.64 to 5.56 GB before the version
// was even read. The envelope's frame is refused by its size now (1 MB here, same path).
TEST(Envelope, OversizedEnvelopeFrameIsRefusedBeforeDecoding) {
  std::string nils = "\xdd";
  const uint32_t n = 1'000'000;
  for (int shift : {24, 16, 8, 0}) nils.push_back(static_cast<char>((n >> shift) & 0xff));
  nils.append(n, '\xc0');
  std::vector<zmq::message_t> frames;
  frames.emplace_back(nils.data(), nils.size());
  try {
    decode(std::move(frames), size_t(1) << 30);
    FAIL() << "decoded";
  } catch (const ProtocolError& e) {
    EXPECT_TRUE(contains(e.what(), "envelope of 1000005 bytes exceeds the limit of 65536 bytes"))
        << e.what();
  }
  // An envelope that nests is refused too (an envelope is one flat array).
  std::string nested = "\x98\x01\x91\x01";
  std::vector<zmq::message_t> f2;
  f2.emplace_back(nested.data(), nested.size());
  try {
    decode(std::move(f2), size_t(1) << 30);
    FAIL() << "decoded";
  } catch (const ProtocolError& e) {
    EXPECT_TRUE(contains(e.what(), "malformed envelope")) << e.what();
  }
}

TEST(Envelope, LongErrorMessagesAreCutToFit) {
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Error);
  env.error_message = std::string(1 << 20, 'e');
  auto frames = encode(env);
  EXPECT_LE(frames[0].size(), kMaxEnvelopeBytes);
  auto d = decode(std::move(frames), size_t(1) << 30);
  EXPECT_EQ(d.env.error_message.size(), kMaxErrorMessageBytes + 8);
}

}  // namespace
}  // namespace loco::detail

namespace loco {
namespace {

// A mailbox holds at most max_mailbox_messages calls from the network: past that a request
// gets an error naming the bound, and the actor keeps serving.
TEST(Mailbox, IsBoundedAndAFullOneRefusesRequestsNamingTheLimit) {
  detail::CoreOptions node_opts;
  node_opts.bind = "tcp://127.0.0.1:0";
  node_opts.self_name = "node test";
  node_opts.max_mailbox_messages = 2;
  auto node = std::make_shared<detail::Core>(node_opts);
  node->host("a-counter", detail::class_entry<testing::Counter>(),
             std::make_shared<testing::Counter>(0));
  detail::CoreOptions caller_opts;
  caller_opts.head_address = node->address();
  caller_opts.self_name = "caller";
  auto caller = std::make_shared<detail::Core>(caller_opts);
  auto ref = std::make_shared<detail::ActorRef>();
  ref->id = "a-counter";
  ref->class_name = "test.Counter";
  ref->address = node->address();
  ActorHandle<testing::Counter> counter(caller, ref);

  // The actor is busy for 3 s (far longer than sending a few calls over loopback takes). The
  // box holds two calls at a time, and the actor takes at most two out with the busy call (if
  // it takes that one late) before it sleeps: at least three of the six calls are refused.
  auto busy = counter.call(&testing::Counter::sleep_ms, 3000);
  std::vector<Future<int>> calls;
  for (int i = 0; i < 6; ++i) calls.push_back(counter.call(&testing::Counter::get));
  int refused = 0, served = 0;
  for (auto& f : calls) {
    try {
      (void)f.get(Millis(20000));
      ++served;
    } catch (const RemoteError& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find("refused: the mailbox of actor a-counter holds"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("(limits 2 calls"), std::string::npos) << e.what();
    }
  }
  EXPECT_GE(refused, 3);
  EXPECT_EQ(refused + served, 6);
  EXPECT_GE(served, 1);
  (void)busy.get(Millis(20000));
  EXPECT_EQ(counter.call(&testing::Counter::get).get(Millis(5000)), 0);
  caller->shutdown();
  node->shutdown();
}

TEST(RemoteText, EscapedAndCut) {
  EXPECT_EQ(escape_remote("plain name"), "plain name");
  EXPECT_EQ(escape_remote("a\nb\x1b[31m\\"), "a\\x0ab\\x1b[31m\\\\");
  EXPECT_EQ(escape_remote(std::string(1000, 'x'), 10), "xxxxxxxxxx...(990 more bytes)");
}

TEST(RemoteText, RateLimitLetsOneLinePerIntervalAndCountsTheRest) {
  RateLimit r(1000);
  uint64_t held = 99;
  EXPECT_TRUE(r.allow(5, &held));
  EXPECT_EQ(held, 0u);
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(r.allow(10 + i));
  EXPECT_FALSE(r.allow(1004));
  EXPECT_TRUE(r.allow(1005, &held));
  EXPECT_EQ(held, 51u);
}

}  // namespace
}  // namespace loco
