// Communicator::allgather: in-process groups (one thread per member, members.hpp) over inproc
// and tcp loopback, with CURVE, a member lost mid-operation, the max_bytes bound, the counters,
// and all-gathers interleaved with all-reduces on the same communicators.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "runtime/collective/allreduce.hpp"
#include "runtime/collective/wire.hpp"
#include "runtime/security/keys.hpp"
#include "tests/collective/members.hpp"
#include "tests/collective/test_util.hpp"

namespace loco::collective {
namespace {

using testing::expect_error_naming;
using testing::iota;
using testing::make_blob;
using testing::make_data;
using testing::Members;
using testing::rethrow_any;
using testing::Transport;
using Blobs = std::vector<std::vector<uint8_t>>;

constexpr size_t kNoBound = size_t(1) << 30;

// Every member got every blob, in member order, bit for bit.
void expect_all_blobs(const Blobs& blobs, const std::vector<Blobs>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].size(), blobs.size()) << "member " << r;
    for (size_t s = 0; s < blobs.size(); ++s)
      ASSERT_EQ(results[r][s], blobs[s]) << "member " << r << ", blob of member " << s;
  }
}

Blobs make_blobs(uint64_t seed, const std::vector<size_t>& lengths) {
  Blobs b;
  for (size_t r = 0; r < lengths.size(); ++r)
    b.push_back(make_blob(seed, static_cast<int>(r), lengths[r]));
  return b;
}

struct Case {
  Transport transport;
  int k;
};

class AllgatherMatrix : public ::testing::TestWithParam<Case> {};

// Pieces of 256 bytes; blobs empty, shorter than a piece, of exactly one, one byte more, and of
// many pieces, a different length on each member; then all empty, and all alike.
TEST_P(AllgatherMatrix, EveryMemberGetsEveryBlobInOrderBitForBit) {
  const auto [transport, k] = GetParam();
  Options o;
  o.chunk_bytes = 256;
  Members m(k, transport, o);
  const std::vector<size_t> lengths = {0, 1, 255, 256, 257, 10007, 100003};
  std::vector<std::vector<size_t>> patterns;
  for (size_t p = 0; p < lengths.size(); ++p) {
    std::vector<size_t> pattern;
    for (int r = 0; r < k; ++r) pattern.push_back(lengths[(static_cast<size_t>(r) + p) % 7]);
    patterns.push_back(pattern);
  }
  patterns.push_back(std::vector<size_t>(k, 0));
  patterns.push_back(std::vector<size_t>(k, 4096));
  uint64_t round = 1;
  for (const auto& pattern : patterns) {
    const Blobs blobs = make_blobs(round, pattern);
    std::vector<Blobs> results;
    rethrow_any(m.gather(iota(k), round++, blobs, kNoBound, results));
    expect_all_blobs(blobs, results);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AllgatherMatrix,
                         ::testing::Values(Case{Transport::inproc, 1}, Case{Transport::inproc, 2},
                                           Case{Transport::inproc, 3}, Case{Transport::inproc, 5},
                                           Case{Transport::tcp, 1}, Case{Transport::tcp, 2},
                                           Case{Transport::tcp, 3}, Case{Transport::tcp, 5}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.transport == Transport::tcp ? "tcp"
                                                                                     : "inproc") +
                                  "_K" + std::to_string(info.param.k);
                         });

// Direct: each member sends its blob once to each of the K-1 others, and receives each of
// theirs once. The counters say so exactly: payload, pieces, and framing (a header and the
// sender's name per piece).
TEST(Allgather, SendsItsBlobToEachPeerOnceAndCountsTheBytes) {
  const int k = 4;
  Options o;
  o.chunk_bytes = 4096;
  Members m(k, Transport::tcp, o);
  const std::vector<size_t> lengths = {0, 5000, 100000, 12345};
  const Blobs blobs = make_blobs(3, lengths);
  std::vector<Blobs> results;
  rethrow_any(m.gather(iota(k), 1, blobs, kNoBound, results));
  expect_all_blobs(blobs, results);
  auto pieces = [](size_t n) { return std::max<size_t>(1, (n + 4095) / 4096); };
  const uint64_t framing = sizeof(detail::Header) + 2;  // names "w0".."w3"
  for (int r = 0; r < k; ++r) {
    const Stats& s = m.comms[r]->last_stats();
    EXPECT_EQ(s.payload_bytes_sent, (k - 1) * lengths[r]) << "member " << r;
    EXPECT_EQ(s.messages_sent, (k - 1) * pieces(lengths[r])) << "member " << r;
    uint64_t received = 0;
    for (int q = 0; q < k; ++q)
      if (q != r) received += lengths[q] + pieces(lengths[q]) * framing;
    EXPECT_EQ(s.bytes_received, received) << "member " << r;
    // Data, then the hellos and keepalives (a few per peer in a fast operation).
    const uint64_t data = s.payload_bytes_sent + s.messages_sent * framing;
    EXPECT_GE(s.bytes_sent, data + (k - 1) * framing) << "member " << r;
    EXPECT_LT(s.bytes_sent, data + 20 * (k - 1) * framing) << "member " << r;
    EXPECT_GT(s.seconds, 0.0);
  }
}

// Every member failed with a CollectiveError (not a lost member) naming `member`.
void expect_refused(const std::vector<std::exception_ptr>& errors, const std::string& member,
                    const std::string& text) {
  for (const auto& e : errors) {
    ASSERT_TRUE(e) << "expected an error naming " << member;
    try {
      std::rethrow_exception(e);
    } catch (const PeerLostError& err) {
      ADD_FAILURE() << "not a lost member: " << err.what();
    } catch (const CollectiveError& err) {
      EXPECT_EQ(err.member(), member) << err.what();
      EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
    }
  }
}

Options quick() {
  Options o;
  o.peer_timeout = std::chrono::milliseconds(800);
  o.chunk_bytes = 4096;
  return o;
}

TEST(Allgather, ABlobOverMaxBytesIsRefusedNamingItsMember) {
  const int k = 3;
  Members m(k, Transport::tcp, quick());
  const Blobs blobs = make_blobs(4, {100, 1000, 10});
  std::vector<Blobs> results;
  // Every member's bound is 999: w1 refuses its own blob before it sends any of it, and tells
  // the others.
  expect_refused(m.gather(iota(k), 1, blobs, 999, results), "w1", "max_bytes (999)");
  // w1 allows itself more: the others refuse its blob from the header of its first piece. (w1
  // itself may have all it needs before their notice comes, and succeed: the bound is meant to
  // be the same on every member.)
  auto errors = m.gather(iota(k), 2, blobs, {999, 5000, 999}, results);
  expect_refused({errors[0], errors[2]}, "w1", "a blob of 1000 bytes");
  // The same communicators, at once: blobs within the bound go through. When w1 finished
  // round 2, the others' notice that they gave it up may reach it as round 3 runs, and round 3
  // fails as the collective fails an operation after one that a member finished and the others
  // did not ("gave up round 2, which this member finished"; scripts/test, 2026-11-30, once in
  // 661 tests; under load about one run in ten). That can repeat once more for round 3; the
  // next round goes through.
  uint64_t next = 3;
  auto within = m.gather(iota(k), next++, blobs, 1000, results);
  const auto failed = [](const std::vector<std::exception_ptr>& es) {
    return std::any_of(es.begin(), es.end(), [](const auto& e) { return bool(e); });
  };
  for (int retry = 0; retry < 3 && !errors[1] && failed(within); ++retry) {
    for (const auto& e : within) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const CollectiveError& err) {
        EXPECT_NE(std::string(err.what()).find("which this member finished"), std::string::npos)
            << err.what();
      }
    }
    within = m.gather(iota(k), next++, blobs, 1000, results);
  }
  rethrow_any(within);
  expect_all_blobs(blobs, results);
  // A member alone refuses its own blob too.
  const std::vector<uint8_t> alone(11);
  try {
    (void)m.comms[2]->allgather(m.group({2}, next, 0), alone, 10);
    ADD_FAILURE() << "a blob of 11 bytes passed max_bytes 10";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.member(), "w2") << e.what();
  }
}

// A member that leaves mid-operation (its node is stopping) is lost to the others at once;
// they retry without it under the same round id, as after an all-reduce.
TEST(Allgather, AMemberLostMidOperationIsNamedAndTheOthersRetryUnderTheSameRound) {
  Options o = quick();
  o.peer_timeout = std::chrono::milliseconds(60000);  // a wait for its silence would fail
  const int k = 4;
  Members m(k, Transport::tcp, o);
  m.comms[3]->hooks().after_send = [&](uint64_t) { m.comms[3]->leave("its node is stopping"); };
  const Blobs blobs = make_blobs(5, {200000, 0, 70000, 150000});
  std::vector<Blobs> results;
  auto errors = m.gather(iota(k), 9, blobs, kNoBound, results);
  for (int r = 0; r < k; ++r)
    expect_error_naming<PeerLostError>(errors[r], "w3", "left in round 9: its node is stopping");
  const Blobs three(blobs.begin(), blobs.begin() + 3);
  rethrow_any(m.gather({0, 1, 2}, 9, three, kNoBound, results));
  expect_all_blobs(three, results);
}

TEST(Allgather, WithCurveEveryMemberGetsEveryBlob) {
  Options o;
  o.chunk_bytes = 16 * 1024;
  o.security = security::Settings::with_key(security::generate_key_pair());
  const int k = 3;
  Members m(k, Transport::tcp, o);
  for (uint64_t round = 1; round <= 2; ++round) {
    const Blobs blobs = make_blobs(round, {300000, 1, 0});
    std::vector<Blobs> results;
    rethrow_any(m.gather(iota(k), round, blobs, kNoBound, results));
    expect_all_blobs(blobs, results);
  }
  EXPECT_EQ(m.comms[0]->last_stats().payload_bytes_sent, 2u * 300000u);
}

// All-gathers and all-reduces in turn on the same communicators, each under its own round id.
// w2 enters each operation late, so the others' data of its next operation (of the other kind)
// reaches it early, while it still runs the one before or none: kept for its operation, never
// mixed into another.
TEST(Allgather, InterleavedWithAllreducesOnTheSameCommunicatorsNothingMixes) {
  const int k = 3;
  Options o;
  o.chunk_bytes = 4096;
  Members m(k, Transport::tcp, o);
  const int ops = 10;
  const size_t n = 20000;
  auto lengths = [](int op, int r) {
    return static_cast<size_t>((op * 7919 + r * 104729) % 50000);
  };
  std::vector<std::vector<Blobs>> gathered(k, std::vector<Blobs>(ops));
  std::vector<std::vector<std::vector<float>>> reduced(k, std::vector<std::vector<float>>(ops));
  std::vector<std::exception_ptr> errors(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      try {
        for (int op = 0; op < ops; ++op) {
          if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          const Group g = m.group(iota(k), 100 + static_cast<uint64_t>(op), r);
          if (op % 2 == 0) {
            gathered[r][op] = m.comms[r]->allgather(g, make_blob(op, r, lengths(op, r)), kNoBound);
          } else {
            reduced[r][op] = make_data(op, r, n);
            m.comms[r]->allreduce(g, std::span<float>(reduced[r][op]));
          }
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  rethrow_any(errors);
  for (int op = 0; op < ops; ++op) {
    if (op % 2 == 0) {
      Blobs blobs;
      for (int r = 0; r < k; ++r) blobs.push_back(make_blob(op, r, lengths(op, r)));
      std::vector<Blobs> results;
      for (int r = 0; r < k; ++r) results.push_back(gathered[r][op]);
      expect_all_blobs(blobs, results);
      continue;
    }
    for (int r = 1; r < k; ++r) ASSERT_EQ(reduced[r][op], reduced[0][op]) << "op " << op;
    for (size_t i = 0; i < n; i += 101) {
      float sum = 0;
      for (int r = 0; r < k; ++r) sum += make_data(op, r, n)[i];
      ASSERT_NEAR(reduced[0][op][i], sum / k, 1e-6) << "op " << op << " element " << i;
    }
  }
}

// One member runs an all-gather and the other an all-reduce under one round id: a caller's
// error. Each refuses the other's data (it never lands in a result), and both fail at once.
TEST(Allgather, AnAllgatherAndAnAllreduceUnderOneRoundIdFailInsteadOfMixing) {
  Members m(2, Transport::inproc, quick());
  std::exception_ptr gather_error, reduce_error;
  std::thread other([&] {
    std::vector<float> v = make_data(1, 1, 10000);
    try {
      m.comms[1]->allreduce(m.group(iota(2), 5, 1), std::span<float>(v));
    } catch (...) {
      reduce_error = std::current_exception();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)m.comms[0]->allgather(m.group(iota(2), 5, 0), make_blob(1, 0, 10000), kNoBound);
  } catch (...) {
    gather_error = std::current_exception();
  }
  other.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(800));
  // Each names the other (the first to see the other's data tells it so).
  expect_refused({gather_error}, "w1", "round 5");
  expect_refused({reduce_error}, "w0", "round 5");
  const Blobs blobs = make_blobs(6, {10, 20});
  std::vector<Blobs> results;
  rethrow_any(m.gather(iota(2), 6, blobs, kNoBound, results));
  expect_all_blobs(blobs, results);
}

}  // namespace
}  // namespace loco::collective
