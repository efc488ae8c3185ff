// In-process groups (one thread per member) over inproc and tcp loopback.
#include "runtime/collective/allreduce.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <future>
#include <thread>
#include <zmq.hpp>

#include "runtime/collective/codec.hpp"
#include "runtime/collective/local.hpp"
#include "tests/collective/members.hpp"
#include "tests/collective/test_util.hpp"

namespace loco::collective {
namespace {

using testing::expect_error_naming;
using testing::iota;
using testing::make_data;
using testing::Members;
using testing::rethrow_any;
using testing::Transport;

// Checks that every member holds the same bytes, within `tol` of the exact mean.
void expect_mean(const std::vector<std::vector<float>>& inputs,
                 const std::vector<std::vector<float>>& outputs, double tol_rel) {
  const size_t k = inputs.size();
  const size_t n = inputs[0].size();
  for (size_t r = 1; r < k; ++r) {
    ASSERT_EQ(outputs[r].size(), n);
    ASSERT_EQ(std::memcmp(outputs[r].data(), outputs[0].data(), n * sizeof(float)), 0)
        << "member " << r << " differs from member 0";
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    double sum = 0, maxabs = 0;
    for (size_t r = 0; r < k; ++r) {
      sum += inputs[r][i];
      maxabs = std::max(maxabs, std::fabs(static_cast<double>(inputs[r][i])));
    }
    double err = std::fabs(outputs[0][i] - sum / static_cast<double>(k));
    worst = std::max(worst, err);
    ASSERT_LE(err, tol_rel * std::max(maxabs, 1e-30)) << "element " << i;
  }
}

struct Case {
  Transport transport;
  int k;
};

class AllreduceMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(AllreduceMatrix, MeanIsExactAndIdenticalForAllLengths) {
  const auto [transport, k] = GetParam();
  Options opts;
  opts.chunk_bytes = 256;  // many chunks even for short vectors
  Members m(k, transport, opts);
  uint64_t round = 1;
  for (size_t n : {size_t{0}, size_t{1}, static_cast<size_t>(k - 1), size_t{13}, size_t{101},
                   size_t{7919}, size_t{100003}}) {
    std::vector<std::vector<float>> in, out;
    for (int r = 0; r < k; ++r) in.push_back(make_data(n + 7, r, n));
    out = in;
    rethrow_any(m.run(iota(k), round++, out));
    // Float sum of K terms, then a division: K+1 roundings.
    expect_mean(in, out, (k + 1) * 1.2e-7);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AllreduceMatrix,
                         ::testing::Values(Case{Transport::inproc, 1}, Case{Transport::inproc, 2},
                                           Case{Transport::inproc, 3}, Case{Transport::inproc, 4},
                                           Case{Transport::inproc, 5}, Case{Transport::inproc, 6},
                                           Case{Transport::inproc, 7}, Case{Transport::inproc, 8},
                                           Case{Transport::tcp, 1}, Case{Transport::tcp, 2},
                                           Case{Transport::tcp, 3}, Case{Transport::tcp, 4},
                                           Case{Transport::tcp, 5}, Case{Transport::tcp, 6},
                                           Case{Transport::tcp, 7}, Case{Transport::tcp, 8}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.transport == Transport::tcp ? "tcp"
                                                                                     : "inproc") +
                                  "_K" + std::to_string(info.param.k);
                         });

class TenMillion : public ::testing::TestWithParam<int> {};

TEST_P(TenMillion, MeanOfTenMillionFloatsOverTcp) {
  const int k = GetParam();
  const size_t n = 10'000'000;
  Members m(k, Transport::tcp);
  std::vector<std::vector<float>> in, out;
  for (int r = 0; r < k; ++r) in.push_back(make_data(99, r, n));
  out = in;
  rethrow_any(m.run(iota(k), 5, out));
  expect_mean(in, out, (k + 1) * 1.2e-7);
}

INSTANTIATE_TEST_SUITE_P(All, TenMillion, ::testing::Values(2, 3, 8));

TEST(Allreduce, SeveralTensorsInOneCall) {
  const int k = 3;
  Members m(k, Transport::inproc);
  const std::vector<size_t> sizes = {15, 0, 1000, 7, 4096};
  std::vector<std::vector<std::vector<float>>> tensors(k);  // [rank][tensor]
  for (int r = 0; r < k; ++r)
    for (size_t t = 0; t < sizes.size(); ++t) tensors[r].push_back(make_data(t, r, sizes[t]));
  auto original = tensors;
  std::vector<std::exception_ptr> errors(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<std::span<float>> spans;
        for (auto& t : tensors[r]) spans.emplace_back(t);
        m.comms[r]->allreduce(m.group(iota(k), 3, r), spans);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  rethrow_any(errors);
  for (size_t t = 0; t < sizes.size(); ++t) {
    std::vector<std::vector<float>> in, out;
    for (int r = 0; r < k; ++r) {
      in.push_back(original[r][t]);
      out.push_back(tensors[r][t]);
    }
    if (sizes[t] > 0) expect_mean(in, out, 4 * 1.2e-7);
  }
}

TEST(Allreduce, OutOfPlaceLeavesTheInputAndMatchesInPlace) {
  const int k = 3;
  const size_t n = 300'007;
  Members m(k, Transport::tcp);
  std::vector<std::vector<float>> in, out(k, std::vector<float>(n)), inplace;
  for (int r = 0; r < k; ++r) in.push_back(make_data(21, r, n));
  inplace = in;
  rethrow_any(m.run(iota(k), 1, inplace));
  std::vector<std::exception_ptr> errors(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      try {
        m.comms[r]->allreduce(m.group(iota(k), 2, r), std::span<const float>(in[r]),
                              std::span<float>(out[r]));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  rethrow_any(errors);
  for (int r = 0; r < k; ++r) {
    EXPECT_EQ(in[r], make_data(21, r, n));
    EXPECT_EQ(out[r], inplace[r]);
  }
  std::vector<float> a(10), b(10);
  EXPECT_THROW(m.comms[0]->allreduce(m.group(iota(k), 3, 0), std::span<const float>(a),
                                     std::span<float>(b).first(9)),
               CollectiveError);
}

TEST(Allreduce, SendsTwoTimesKMinusOneOverKOfThePayload) {
  for (int k : {2, 4, 5}) {
    const size_t n = 1'000'003;
    Members m(k, Transport::tcp);
    std::vector<std::vector<float>> data;
    for (int r = 0; r < k; ++r) data.push_back(make_data(1, r, n));
    rethrow_any(m.run(iota(k), 9, data));
    for (int r = 0; r < k; ++r) {
      const Stats& s = m.comms[r]->last_stats();
      size_t mine = (static_cast<size_t>(r) + 1) * n / k - static_cast<size_t>(r) * n / k;
      // Reduce-scatter: everything but my part once; all-gather: my part to K-1 peers.
      uint64_t exact = 4 * ((n - mine) + (k - 1) * mine);
      EXPECT_EQ(s.payload_bytes_sent, exact) << "K=" << k << " rank " << r;
      double ideal = 2.0 * (k - 1) / k * 4.0 * n;
      EXPECT_GE(s.bytes_sent, exact);
      EXPECT_LT(static_cast<double>(s.bytes_sent), 1.01 * ideal) << "K=" << k << " rank " << r;
      EXPECT_LT(static_cast<double>(s.bytes_received), 1.01 * ideal);
      // Every reduce-scatter byte was taken before the rate was read off, and not more than
      // everything.
      EXPECT_GE(s.rate_bytes, 4 * (n - mine));
      EXPECT_LE(s.rate_bytes, exact);
      EXPECT_GT(s.rate_seconds, 0.0);
      EXPECT_LE(s.rate_seconds, s.seconds);
    }
  }
}

// Parts cut by weights (zeros included): the same floats as equal parts (fp32 adds in rank
// order whoever owns an element), and each member sends what its part implies.
TEST(Allreduce, WeightedPartsGiveTheSameMeanAndTheBytesTheyPromise) {
  for (int k : {3, 5, 8}) {
    Members m(k, Transport::tcp);
    uint64_t round = 1;
    for (size_t n : {size_t{0}, size_t{1}, size_t{13}, size_t{100003}}) {
      std::vector<std::vector<float>> in, equal, weighted;
      for (int r = 0; r < k; ++r) in.push_back(make_data(n + 3, r, n));
      equal = in;
      weighted = in;
      m.weights.clear();
      rethrow_any(m.run(iota(k), round++, equal));
      m.weights.assign(static_cast<size_t>(k), 1.0);
      m.weights[0] = 0.0;  // a member too slow to own anything
      m.weights[1] = 3.5;  // a fast one
      m.weights[k - 1] = 0.25;
      rethrow_any(m.run(iota(k), round++, weighted));
      for (int r = 0; r < k; ++r) {
        ASSERT_EQ(std::memcmp(weighted[r].data(), equal[0].data(), n * sizeof(float)), 0)
            << "K=" << k << " n=" << n << " member " << r;
        EXPECT_EQ(m.comms[r]->last_stats().payload_bytes_sent,
                  allreduce_payload_bytes_of(n, k, r, Codec::fp32, m.weights))
            << "K=" << k << " n=" << n << " member " << r;
      }
    }
    // The member with no part sends n floats, the one with the largest part the most.
    EXPECT_EQ(m.comms[0]->last_stats().payload_bytes_sent, 4u * 100003u);
    for (int r = 2; r < k; ++r)
      EXPECT_GT(m.comms[1]->last_stats().payload_bytes_sent,
                m.comms[r]->last_stats().payload_bytes_sent);
  }
}

TEST(Allreduce, BadPartWeightsAreRejectedBeforeAnythingIsSent) {
  const std::vector<std::pair<std::vector<double>, std::string>> cases = {
      {{1.0}, "1 weights for 2 members"},
      {{1.0, -1.0}, "weight 1 is -1"},
      {{1.0, std::nan("")}, "weight 1 is nan"},
      {{0.0, 0.0}, "sum to 0"},
  };
  Members m(2, Transport::tcp);
  for (const auto& [weights, text] : cases) {
    m.weights = weights;
    std::vector<float> v(10, 1.0f);
    try {
      m.comms[0]->allreduce(m.group(iota(2), 1, 0), std::span<float>(v));
      ADD_FAILURE() << "accepted " << text;
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      EXPECT_EQ(m.comms[0]->last_stats().bytes_sent, 0u);
    }
  }
}

TEST(PartWeights, BoundsFollowTheWeights) {
  EXPECT_EQ(part_bounds(10, 4), (std::vector<size_t>{0, 2, 5, 7, 10}));
  EXPECT_EQ(part_bounds(10, 4, std::vector<double>{0, 1, 1, 0}),
            (std::vector<size_t>{0, 0, 5, 10, 10}));
  EXPECT_EQ(part_bounds(3, 2, std::vector<double>{1, 2}), (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(part_bounds(0, 3, std::vector<double>{1, 2, 3}), (std::vector<size_t>{0, 0, 0, 0}));
}

// Sending n + (k-2) p at its rate, every member with a part finishes at the same time, and a
// member left without one could not have finished earlier.
TEST(PartWeights, ForRatesEqualizeSendingTimes) {
  auto times = [](const std::vector<double>& rates, const std::vector<double>& parts) {
    std::vector<double> t;
    for (size_t i = 0; i < rates.size(); ++i)
      t.push_back((1.0 + static_cast<double>(rates.size() - 2) * parts[i]) / rates[i]);
    return t;
  };
  {
    std::vector<double> rates{1, 1, 1, 2};
    auto w = part_weights_for_rates(rates);
    double sum = 0;
    for (double x : w) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-12);
    auto t = times(rates, w);
    for (double x : t) EXPECT_NEAR(x, t[0], 1e-12);
    EXPECT_GT(w[3], w[0]);
  }
  {
    // One site at a quarter of the others' rate: it owns nothing, the others a third each.
    std::vector<double> rates{0.25, 1, 1, 1};
    auto w = part_weights_for_rates(rates);
    EXPECT_EQ(w[0], 0.0);
    for (int i = 1; i < 4; ++i) EXPECT_NEAR(w[i], 1.0 / 3, 1e-12);
    auto t = times(rates, w);
    EXPECT_GT(t[0], t[1]);  // the slow one is the bound: 4 against 6 with equal parts
    EXPECT_NEAR(t[0], 4.0, 1e-12);
  }
  // Rates within 10 % (noise), two members, or a rate that says nothing: equal parts.
  EXPECT_EQ(part_weights_for_rates(std::vector<double>{3, 3.2, 2.95}),
            (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(part_weights_for_rates(std::vector<double>{1, 9}), (std::vector<double>{1, 1}));
  EXPECT_EQ(part_weights_for_rates(std::vector<double>{1, 0, 2}), (std::vector<double>{1, 1, 1}));
}

struct CodecCase {
  Codec codec;
  double tol;  // absolute, inputs in [-1, 1)
};

class CodecBounds : public ::testing::TestWithParam<CodecCase> {};

TEST_P(CodecBounds, ErrorIsBoundedAndOutputIdentical) {
  const auto [codec, tol] = GetParam();
  for (int k : {2, 4, 7}) {
    Options opts;
    opts.codec = codec;
    opts.chunk_bytes = 16 * 1024;
    Members m(k, Transport::inproc, opts);
    const size_t n = 100'003;
    std::vector<std::vector<float>> in, out;
    for (int r = 0; r < k; ++r) in.push_back(make_data(17, r, n));
    out = in;
    rethrow_any(m.run(iota(k), 11, out));
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int r = 0; r < k; ++r) sum += in[r][i];
      worst = std::max(worst, std::fabs(out[0][i] - sum / k));
    }
    EXPECT_LE(worst, tol) << to_string(codec) << " K=" << k;
    for (int r = 1; r < k; ++r)
      ASSERT_EQ(std::memcmp(out[r].data(), out[0].data(), n * 4), 0)
          << to_string(codec) << " member " << r;
    // Compressed codecs send proportionally fewer bytes.
    double ratio = static_cast<double>(m.comms[0]->last_stats().payload_bytes_sent) /
                   (2.0 * (k - 1) / k * 4.0 * n);
    double expected = static_cast<double>(encoded_bytes(codec, 1024 * 1024)) / (4.0 * 1024 * 1024);
    EXPECT_NEAR(ratio, expected, 0.02) << to_string(codec);
  }
}

// Bounds: each contribution and the result are rounded once by the codec.
// fp16: 2 x 2^-11 relative to |x| <= 1; bf16: 2 x 2^-8; int8: 2 x (range/255/2) with range 2.
INSTANTIATE_TEST_SUITE_P(All, CodecBounds,
                         ::testing::Values(CodecCase{Codec::fp32, 1e-6},
                                           CodecCase{Codec::fp16, 2 * 0.00049 + 1e-6},
                                           CodecCase{Codec::bf16, 2 * 0.0039 + 1e-6},
                                           CodecCase{Codec::int8, 2 * (2.0 / 255 / 2) + 1e-5}),
                         [](const ::testing::TestParamInfo<CodecCase>& info) {
                           return std::string(to_string(info.param.codec));
                         });

TEST(Allreduce, CodecNames) {
  for (Codec c : {Codec::fp32, Codec::fp16, Codec::bf16, Codec::int8})
    EXPECT_EQ(parse_codec(to_string(c)), c);
  EXPECT_FALSE(parse_codec("fp8").has_value());
}

TEST(Allreduce, ReusableAcrossRoundsWithDifferentGroups) {
  Members m(5, Transport::tcp);
  uint64_t round = 100;
  for (const std::vector<int>& ranks :
       {std::vector<int>{0, 1, 2, 3, 4}, {0, 2, 4}, {4, 3, 1}, {1, 0}, {0, 1, 2, 3, 4}}) {
    const size_t n = 50'000;
    std::vector<std::vector<float>> in, out;
    for (int r : ranks) in.push_back(make_data(round, r, n));
    out = in;
    rethrow_any(m.run(ranks, round++, out));
    expect_mean(in, out, 8 * 1.2e-7);
  }
}

// Small chunks (many messages per operation) and the silence window `peer_timeout`.
Options small_chunks(std::chrono::milliseconds peer_timeout) {
  Options o;
  o.peer_timeout = peer_timeout;
  o.chunk_bytes = 4096;
  return o;
}
Options quick() { return small_chunks(std::chrono::milliseconds(800)); }

TEST(AllreduceErrors, NaNIsRejectedNamingItsSender) {
  Members m(4, Transport::tcp, quick());
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 4; ++r) data.push_back(make_data(3, r, 20000));
  data[2][12345] = std::nanf("");
  auto errors = m.run(iota(4), 41, data);
  for (int r = 0; r < 4; ++r) expect_error_naming<CollectiveError>(errors[r], "w2", "NaN");
  // Usable at once: the next round succeeds.
  for (int r = 0; r < 4; ++r) data[r] = make_data(4, r, 20000);
  auto in = data;
  rethrow_any(m.run(iota(4), 42, data));
  expect_mean(in, data, 5 * 1.2e-7);
}

TEST(AllreduceErrors, InfIsRejectedInCompressedCodecs) {
  for (Codec c : {Codec::fp16, Codec::int8}) {
    Options o = quick();
    o.codec = c;
    Members m(3, Transport::inproc, o);
    std::vector<std::vector<float>> data;
    for (int r = 0; r < 3; ++r) data.push_back(make_data(3, r, 5000));
    data[1][4000] = INFINITY;
    auto errors = m.run(iota(3), 7, data);
    for (int r = 0; r < 3; ++r) expect_error_naming<CollectiveError>(errors[r], "w1", "NaN/Inf");
  }
}

TEST(AllreduceErrors, WrongLengthNamesTheMember) {
  Members m(4, Transport::tcp, quick());
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 4; ++r) data.push_back(make_data(3, r, r == 1 ? 10003 : 10000));
  auto original = data;
  auto errors = m.run(iota(4), 8, data);
  for (int r : {0, 2, 3}) {
    expect_error_naming<CollectiveError>(errors[r], "w1", "w1");
    EXPECT_EQ(data[r], original[r]) << "a failed operation must leave the input unchanged";
  }
  EXPECT_TRUE(errors[1]);
}

TEST(AllreduceErrors, WrongRoundNamesTheMember) {
  for (int delta : {+1, -1}) {
    Members m(3, Transport::tcp, quick());
    std::vector<std::vector<float>> data;
    for (int r = 0; r < 3; ++r) data.push_back(make_data(3, r, 30000));
    auto errors = m.run(iota(3), 50, data, {50, 50, static_cast<uint64_t>(50 + delta)});
    for (int r : {0, 1}) expect_error_naming<CollectiveError>(errors[r], "w2", "round");
    EXPECT_TRUE(errors[2]);
  }
}

TEST(AllreduceErrors, AbsentMemberIsLostWithinTheTimeout) {
  Members m(4, Transport::tcp, quick());
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 3; ++r) data.push_back(make_data(3, r, 30000));
  // w3 is in the group but never calls.
  std::vector<std::exception_ptr> errors;
  auto start = std::chrono::steady_clock::now();
  for (auto& t : m.start_some(iota(4), 3, 60, data, errors)) t.join();
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(800 + 1500));
  for (int r = 0; r < 3; ++r) {
    expect_error_naming<PeerLostError>(errors[r], "w3", "lost member w3");
  }
  // The survivors run again at once as a group of 3.
  auto in = data;
  rethrow_any(m.run({0, 1, 2}, 60, data));
  expect_mean(in, data, 4 * 1.2e-7);
}

// Communicator::leave (a worker whose node is stopping): the member's operation fails and its
// peers are told at once that it is lost, instead of waiting out its silence window (60 s here,
// so a test that waited would fail on the message, and on ctest's timeout).
Options patient() { return small_chunks(std::chrono::milliseconds(60000)); }

TEST(CollectiveLeave, AMemberThatLeavesMidOperationIsNamedLostByTheOthersAtOnce) {
  Members m(4, Transport::tcp, patient());
  // w3 leaves after its first data message, on the operation's own thread.
  m.comms[3]->hooks().after_send = [&](uint64_t) { m.comms[3]->leave("its node is stopping"); };
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 4; ++r) data.push_back(make_data(5, r, 200000));
  const auto original = data;
  auto errors = m.run(iota(4), 70, data);
  for (int r = 0; r < 4; ++r) {
    expect_error_naming<PeerLostError>(errors[r], "w3", "left in round 70: its node is stopping");
    EXPECT_EQ(data[r], original[r]) << "a failed operation must leave the input unchanged";
  }
  EXPECT_TRUE(m.comms[3]->has_left());
  // The others go on without it, keeping the round id, as after any lost member.
  auto in = std::vector<std::vector<float>>(data.begin(), data.begin() + 3);
  auto three = in;
  rethrow_any(m.run({0, 1, 2}, 70, three));
  expect_mean(in, three, 4 * 1.2e-7);
  // Every later operation that counts w3 fails at once on every member, naming it.
  m.comms[3]->hooks().after_send = nullptr;
  errors = m.run(iota(4), 71, data);
  for (int r = 0; r < 4; ++r)
    expect_error_naming<PeerLostError>(errors[r], "w3", "left in round 71");
  std::vector<float> alone = original[3];
  EXPECT_THROW(m.comms[3]->allreduce(m.group({3}, 72, 0), std::span<float>(alone)), PeerLostError);
}

// Ready once `c` has sent its first message of an operation (its after_send hook).
std::future<void> first_send(Communicator& c) {
  auto sending = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::atomic<bool>>(false);
  c.hooks().after_send = [sending, once](uint64_t) {
    if (!once->exchange(true)) sending->set_value();
  };
  return sending->get_future();
}

TEST(CollectiveLeave, LeavingFromAnotherThreadEndsAWaitOnAnAbsentMember) {
  Members m(3, Transport::tcp, patient());
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 2; ++r) data.push_back(make_data(6, r, 30000));
  // w2 is in the group but never calls; w1 leaves from this thread once its operation sends.
  std::future<void> sending = first_send(*m.comms[1]);
  std::vector<std::exception_ptr> errors;
  std::vector<std::thread> threads = m.start_some(iota(3), 2, 80, data, errors);
  const bool sent = sending.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  m.comms[1]->leave("stopping");  // ends both operations, whatever happened
  for (auto& t : threads) t.join();
  ASSERT_TRUE(sent) << "w1 sent nothing in 30 s";
  // w0 learns it from w1's notice, not from w2's silence (60 s away).
  expect_error_naming<PeerLostError>(errors[0], "w1", "left in round 80: stopping");
  expect_error_naming<PeerLostError>(errors[1], "w1", "left in round 80: stopping");
}

// Communicator::peer_gone (the job's aggregator, told by the head that a member's node died):
// the members waiting for one that never enters the operation (behind a relay, it closes no
// connection of theirs) fail at once naming it, not after its 60 s entry window, and go on
// without it. A member said gone by an endpoint it no longer has (it came back with a new one)
// is not lost.
TEST(CollectiveLeave, AMemberSaidGoneEndsTheOthersWaitForItAtOnce) {
  Members m(3, Transport::tcp, patient());
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 2; ++r) data.push_back(make_data(7, r, 30000));
  // w2 is in the group but never calls.
  std::future<void> sending = first_send(*m.comms[0]);
  std::vector<std::exception_ptr> errors;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads = m.start_some(iota(3), 2, 90, data, errors);
  const bool sent = sending.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  for (int r = 0; r < 2; ++r) m.comms[r]->peer_gone(m.comms[2]->endpoint(), "its node died");
  for (auto& t : threads) t.join();
  ASSERT_TRUE(sent) << "w0 sent nothing in 30 s";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  for (int r = 0; r < 2; ++r) expect_error_naming<PeerLostError>(errors[r], "w2", "its node died");
  // The two go on as a group of two; an operation naming w2 at its old endpoint fails at once.
  auto in = data;
  rethrow_any(m.run({0, 1}, 91, data));
  expect_mean(in, data, 4 * 1.2e-7);
  m.comms[0]->hooks().after_send = nullptr;
  errors.clear();
  for (auto& t : m.start_some(iota(3), 2, 92, data, errors)) t.join();
  for (int r = 0; r < 2; ++r)
    expect_error_naming<PeerLostError>(errors[r], "w2", "in round 92: its node died");
  // Said gone by an endpoint that is not w2's: the three finish.
  Members n(3, Transport::tcp, patient());
  for (int r = 0; r < 3; ++r) n.comms[r]->peer_gone("tcp://127.0.0.1:1", "another member");
  std::vector<std::vector<float>> three;
  for (int r = 0; r < 3; ++r) three.push_back(make_data(8, r, 30000));
  auto three_in = three;
  rethrow_any(n.run(iota(3), 93, three));
  expect_mean(three_in, three, 4 * 1.2e-7);
}

// A job's aggregator lost a member's answer (a restarting head forwarded the call): the member
// is out of the rounds planned so far, and only of those. Told to leave them as lost
// (give_up_below with as_lost), it fails them and the others learn from its notice that it is
// lost, not that the round failed, so a streaming group finishes without it; the others told it
// is gone below a round id (peer_gone with a bound) fail at once without it, even where it never
// comes. From the bound on, the same endpoint is a member again.
TEST(CollectiveLeave, AMemberDroppedFromTheRoundsPlannedSoFarIsBackInTheNextOnes) {
  Members m(3, Transport::tcp, patient());
  std::vector<std::vector<float>> data;
  for (int r = 0; r < 3; ++r) data.push_back(make_data(9, r, 30000));
  m.comms[2]->give_up_below(101, "its answer was lost", /*as_lost=*/true);
  const auto start = std::chrono::steady_clock::now();
  auto errors = m.run(iota(3), 100, data);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  expect_error_naming<PeerLostError>(errors[2], "w2", "left round 100: its answer was lost");
  for (int r = 0; r < 2; ++r) expect_error_naming<PeerLostError>(errors[r], "w2", "w2");
  auto in = data;
  rethrow_any(m.run(iota(3), 101, data));
  expect_mean(in, data, 4 * 1.2e-7);
  // Said gone below round 103: w0 and w1 do not wait for it in round 102, where it never
  // comes, and in round 103 the three finish together.
  for (int r = 0; r < 2; ++r) m.comms[r]->peer_gone(m.comms[2]->endpoint(), "answer lost", 103);
  std::vector<std::exception_ptr> waiting;
  const auto t102 = std::chrono::steady_clock::now();
  for (auto& t : m.start_some(iota(3), 2, 102, data, waiting)) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t102, std::chrono::seconds(30));
  for (int r = 0; r < 2; ++r)
    expect_error_naming<PeerLostError>(waiting[r], "w2", "in round 102: answer lost");
  in = data;
  rethrow_any(m.run(iota(3), 103, data));
  expect_mean(in, data, 4 * 1.2e-7);
}

TEST(AllreduceErrors, GroupWithoutThisCommunicatorIsRejected) {
  Members m(2, Transport::inproc);
  Group g = m.group({0, 1}, 1, 1);
  std::vector<float> v(10);
  EXPECT_THROW(m.comms[0]->allreduce(g, std::span<float>(v)), CollectiveError);
  EXPECT_THROW(Communicator("tcp://256.1.1.1:0"), CollectiveError);
  Group twice = m.group({0, 1}, 1, 0);
  twice.members[1].name = twice.members[0].name;
  EXPECT_THROW(m.comms[0]->allreduce(twice, std::span<float>(v)), CollectiveError);
}

// Group::left_out: members whose contributions a robustness guard leaves out of the mean.

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> local_mean(const std::vector<std::vector<float>>& in, const Options& o,
                              std::span<const uint8_t> left_out = {}) {
  std::vector<std::span<const float>> spans(in.begin(), in.end());
  std::vector<float> out(in[0].size());
  local_allreduce(spans, out, o, left_out);
  return out;
}

// K = 4, member 2 left out with an input full of NaN (reject_nonfinite on): every member holds
// local_allreduce's floats with the same mask, the mean of the other three; the left-out
// member sent only its part's all-gather, no reduce-scatter chunk.
TEST(LeftOut, TheMeanOfTheOthersBitForBitAsLocalAllreduceAndOnlyTheAllGatherSent) {
  const int k = 4;
  const size_t n = 20'000;
  const std::vector<uint8_t> mask{0, 0, 1, 0};
  for (Transport transport : {Transport::inproc, Transport::tcp}) {
    for (const auto& [codec, tol] :
         {std::pair{Codec::fp32, 1e-6}, {Codec::int8, 2.0 / 255 + 1e-5}}) {
      Options o = quick();
      o.codec = codec;
      Members m(k, transport, o);
      m.left_out = mask;
      std::vector<std::vector<float>> in;
      for (int r = 0; r < k; ++r) in.push_back(make_data(31, r, n));
      std::fill(in[2].begin(), in[2].end(), std::nanf(""));
      auto out = in;
      rethrow_any(m.run(iota(k), 1, out));
      const std::vector<float> want = local_mean(in, o, mask);
      const std::string what =
          std::string(to_string(codec)) + (transport == Transport::tcp ? " tcp" : " inproc");
      for (int r = 0; r < k; ++r) EXPECT_TRUE(same_bits(out[r], want)) << what << " member " << r;
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        const double by_hand = (double{in[0][i]} + in[1][i] + in[3][i]) / 3;
        worst = std::max(worst, std::fabs(out[0][i] - by_hand));
      }
      EXPECT_LE(worst, tol) << what;
      // Parts of 5,000 floats, chunks of 1,024: 5 chunks to each of the 3 others.
      const Stats& left = m.comms[2]->last_stats();
      EXPECT_EQ(left.payload_bytes_sent,
                3 * (4 * encoded_bytes(codec, 1024) + encoded_bytes(codec, 5000 - 4 * 1024)))
          << what;
      EXPECT_EQ(left.payload_bytes_sent,
                allreduce_payload_bytes_of(n, k, 2, codec, {}, mask, o.chunk_bytes))
          << what;
      EXPECT_EQ(left.messages_sent, 3u * 5u) << what;
      EXPECT_EQ(left.rate_bytes, 0u) << what << ": a reduce-scatter chunk was sent";
      for (int r : {0, 1, 3}) {
        const Stats& s = m.comms[r]->last_stats();
        EXPECT_LT(left.bytes_sent, s.bytes_sent) << what << " member " << r;
        EXPECT_EQ(s.payload_bytes_sent,
                  allreduce_payload_bytes_of(n, k, r, codec, {}, mask, o.chunk_bytes))
            << what << " member " << r;
        // An included member sends what it sends without a mask.
        EXPECT_EQ(s.payload_bytes_sent,
                  allreduce_payload_bytes_of(n, k, r, codec, {}, {}, o.chunk_bytes));
      }
    }
  }
}

// An empty mask and one of zeros leave nobody out: today's mean, bit for bit (fp32: the float
// sum in rank order divided by K, as before the field existed).
TEST(LeftOut, NobodyLeftOutIsThePlainMeanBitForBit) {
  const int k = 4;
  const size_t n = 10'007;
  for (Codec codec : {Codec::fp32, Codec::int8}) {
    Options o = quick();
    o.codec = codec;
    Members m(k, Transport::inproc, o);
    std::vector<std::vector<float>> in;
    for (int r = 0; r < k; ++r) in.push_back(make_data(41, r, n));
    const std::vector<float> want = local_mean(in, o);
    uint64_t round = 1;
    for (const std::vector<uint8_t>& mask : {std::vector<uint8_t>{}, {0, 0, 0, 0}}) {
      m.left_out = mask;
      auto out = in;
      rethrow_any(m.run(iota(k), round++, out));
      for (int r = 0; r < k; ++r)
        EXPECT_TRUE(same_bits(out[r], want)) << to_string(codec) << " mask of " << mask.size();
      EXPECT_TRUE(same_bits(local_mean(in, o, mask), want));
    }
    if (codec == Codec::fp32) {
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(want[i]),
                  std::bit_cast<uint32_t>((in[0][i] + in[1][i] + in[2][i] + in[3][i]) / 4.0f))
            << i;
    }
  }
}

// Everyone left out: zeros (no contribution, nothing to divide), every codec's round trip of 0.
TEST(LeftOut, EveryoneLeftOutGivesZeros) {
  for (Codec codec : {Codec::fp32, Codec::int8}) {
    for (int k : {1, 3}) {
      Options o = quick();
      o.codec = codec;
      Members m(k, Transport::inproc, o);
      m.left_out.assign(static_cast<size_t>(k), 1);
      std::vector<std::vector<float>> in;
      for (int r = 0; r < k; ++r) in.push_back(make_data(51, r, 5000));
      auto out = in;
      rethrow_any(m.run(iota(k), 1, out));
      const std::vector<float> zeros(5000, 0.0f);
      for (int r = 0; r < k; ++r) EXPECT_TRUE(same_bits(out[r], zeros)) << "K=" << k;
      EXPECT_TRUE(same_bits(local_mean(in, o, m.left_out), zeros)) << "K=" << k;
    }
  }
}

// Members that disagree on the mask are in different groups (the mask is in the fingerprint):
// neither takes the other's data, and the operation fails within the silence window instead
// of hanging or mixing; the same members go on at once with a mask they agree on.
TEST(LeftOut, MembersThatDisagreeOnTheMaskFailInsteadOfMixing) {
  const int k = 4;
  Members m(k, Transport::tcp, small_chunks(std::chrono::milliseconds(300)));
  std::vector<std::vector<float>> in;
  for (int r = 0; r < k; ++r) in.push_back(make_data(61, r, 20'000));
  auto data = in;
  const auto start = std::chrono::steady_clock::now();
  auto errors = testing::on_threads(k, [&](size_t i) {
    Group g = m.group(iota(k), 5, static_cast<int>(i));
    if (i != 2) g.left_out = {0, 0, 1, 0};  // w2 believes that nobody is left out
    m.comms[i]->allreduce(g, std::span<float>(data[i]));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
  for (int r : {0, 1, 3}) expect_error_naming<PeerLostError>(errors[r], "w2", "in another group");
  EXPECT_TRUE(errors[2]);
  for (int r = 0; r < k; ++r) EXPECT_EQ(data[r], in[r]) << "member " << r;
  m.left_out = {0, 0, 1, 0};
  rethrow_any(m.run(iota(k), 6, data));
  Options o;
  o.chunk_bytes = 4096;
  for (int r = 0; r < k; ++r) EXPECT_TRUE(same_bits(data[r], local_mean(in, o, m.left_out)));
}

TEST(LeftOut, AMaskOfAnotherLengthIsRejectedBeforeAnythingIsSent) {
  Members m(2, Transport::tcp);
  m.left_out = {0, 1, 0};
  std::vector<float> v(10, 1.0f);
  try {
    m.comms[0]->allreduce(m.group(iota(2), 1, 0), std::span<float>(v));
    ADD_FAILURE() << "accepted 3 flags for 2 members";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("3 flags for 2 members"), std::string::npos) << e.what();
    EXPECT_EQ(m.comms[0]->last_stats().bytes_sent, 0u);
  }
  std::vector<std::vector<float>> in{v, v};
  std::vector<float> out(10);
  std::vector<std::span<const float>> spans(in.begin(), in.end());
  EXPECT_THROW(local_allreduce(spans, out, Options{}, m.left_out), CollectiveError);
}

}  // namespace
}  // namespace loco::collective

// The vectorized codec paths give exactly the bits of the reference formulas.

namespace loco::collective {
namespace {

TEST(Codec, Int8MatchesTheReferenceFormula) {
  for (size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{1000}, size_t{4099}}) {
    std::vector<float> x = make_data(n, 0, n);
    std::vector<uint8_t> enc(encoded_bytes(Codec::int8, n));
    detail::encode(Codec::int8, x.data(), n, enc.data());
    float lo = *std::min_element(x.begin(), x.end());
    float hi = *std::max_element(x.begin(), x.end());
    float scale = (hi - lo) / 255.0f;
    if (!(scale > 0)) scale = 0;
    float inv = scale > 0 ? 1.0f / scale : 0.0f;
    float got_lo, got_scale;
    std::memcpy(&got_lo, enc.data(), 4);
    std::memcpy(&got_scale, enc.data() + 4, 4);
    ASSERT_EQ(got_lo, lo);
    ASSERT_EQ(got_scale, scale);
    std::vector<float> dec(n);
    detail::decode(Codec::int8, enc.data(), n, dec.data());
    for (size_t i = 0; i < n; ++i) {
      volatile float v = (x[i] - lo) * inv;  // volatile: no contraction into an FMA
      float w = std::min(std::max(v + 0.5f, 0.0f), 255.0f);
      ASSERT_EQ(enc[detail::kInt8Header + i], static_cast<uint8_t>(static_cast<int>(w))) << i;
      ASSERT_LE(std::fabs(dec[i] - x[i]), scale * 0.5001f + 1e-7f) << i;
    }
  }
}

TEST(Codec, Fp16RoundsToNearestEvenLikeTheCompiler) {
  std::vector<float> x = make_data(3, 1, 10000);
  for (float& v : x) v *= 70000.0f;  // also beyond the fp16 range
  for (float v : {0.0f, -0.0f, 1e-8f, 6.1e-5f, 65504.0f, 65520.0f, INFINITY, -INFINITY})
    x.push_back(v);
  std::vector<uint8_t> enc(2 * x.size());
  detail::encode(Codec::fp16, x.data(), x.size(), enc.data());
  std::vector<float> dec(x.size());
  detail::decode(Codec::fp16, enc.data(), x.size(), dec.data());
  for (size_t i = 0; i < x.size(); ++i) {
    _Float16 h = static_cast<_Float16>(x[i]);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    uint16_t got;
    std::memcpy(&got, enc.data() + 2 * i, 2);
    ASSERT_EQ(got, bits) << x[i];
    ASSERT_EQ(dec[i], static_cast<float>(h)) << x[i];
  }
}

// mean_of (a fused AVX pass for fp32, blocks of 2048 otherwise) gives exactly the floats of
// adding the decoded addends one by one in the given order and dividing, for every codec,
// with the raw (owner's) addend anywhere, and lengths that are not multiples of 8 or 2048.
TEST(Codec, MeanOfIsTheSequentialSumBitForBit) {
  for (Codec codec : {Codec::fp32, Codec::fp16, Codec::bf16, Codec::int8}) {
    for (size_t m : {size_t{1}, size_t{2}, size_t{3}, size_t{8}, size_t{9}}) {
      for (size_t n : {size_t{0}, size_t{7}, size_t{4099}}) {
        std::vector<std::vector<float>> xs;
        std::vector<std::vector<uint8_t>> enc(m);
        std::vector<detail::Addend> addends(m);
        const size_t raw = m / 2;
        for (size_t r = 0; r < m; ++r) {
          xs.push_back(make_data(m, static_cast<int>(r), n));
          for (float& v : xs[r]) v *= 1.0f + 0.37f * static_cast<float>(r);
          enc[r].resize(encoded_bytes(codec, n));
          detail::encode(codec, xs[r].data(), n, enc[r].data());
          addends[r] =
              r == raw ? detail::Addend{xs[r].data(), true} : detail::Addend{enc[r].data(), false};
        }
        std::vector<float> want(n), term(n);
        for (size_t r = 0; r < m; ++r) {
          if (r == raw) {
            term = xs[r];
          } else {
            detail::decode(codec, enc[r].data(), n, term.data());
          }
          for (size_t i = 0; i < n; ++i) want[i] = r == 0 ? term[i] : want[i] + term[i];
        }
        for (float& v : want) v = v / static_cast<float>(m);
        std::vector<float> got(n, -1.0f);
        detail::mean_of(codec, addends, n, got.data());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
              << to_string(codec) << " m=" << m << " n=" << n << " i=" << i;
        }
      }
    }
  }
}

TEST(Codec, NonFiniteInt8ChunkDecodesToNaN) {
  std::vector<float> x(100, 1.0f);
  x[50] = INFINITY;
  std::vector<uint8_t> enc(encoded_bytes(Codec::int8, x.size()));
  detail::encode(Codec::int8, x.data(), x.size(), enc.data());
  std::vector<float> dec(x.size());
  detail::decode(Codec::int8, enc.data(), x.size(), dec.data());
  EXPECT_FALSE(detail::all_finite(dec.data(), dec.size()));
}

}  // namespace
}  // namespace loco::collective
