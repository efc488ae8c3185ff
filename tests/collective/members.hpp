// In-process groups of Communicators (one thread per member) over inproc or tcp loopback, for
// the all-reduce and all-gather tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "runtime/collective/allreduce.hpp"
#include "tests/collective/test_util.hpp"

namespace loco::collective::testing {

enum class Transport { inproc, tcp };

// K communicators of one process.
class Members {
 public:
  Members(int k, Transport t, Options opts = {}) {
    auto ctx = std::make_shared<zmq::context_t>(1);
    static int instance = 0;
    ++instance;
    for (int r = 0; r < k; ++r) {
      std::string bind = t == Transport::tcp ? "tcp://127.0.0.1:0"
                                             : "inproc://coll-" + std::to_string(instance) + "-" +
                                                   std::to_string(r);
      comms.push_back(std::make_unique<Communicator>(bind, opts, ctx));
    }
  }

  Group group(const std::vector<int>& ranks, uint64_t round, int me) const {
    Group g;
    g.part_weights = weights;
    g.left_out = left_out;
    for (int r : ranks) g.members.push_back({"w" + std::to_string(r), comms[r]->endpoint()});
    g.rank = me;
    g.round_id = round;
    return g;
  }

  // Runs one operation on the members `ranks`; data[i] belongs to ranks[i].
  std::vector<std::exception_ptr> run(const std::vector<int>& ranks, uint64_t round,
                                      std::vector<std::vector<float>>& data,
                                      std::vector<uint64_t> rounds = {}) {
    return on_threads(ranks.size(), [&](size_t i) {
      Group g = group(ranks, rounds.empty() ? round : rounds[i], static_cast<int>(i));
      comms[ranks[i]]->allreduce(g, std::span<float>(data[i]));
    });
  }

  // Starts one operation of the group `ranks` on its first `calling` members only, each on a
  // thread of its own (the others never call); the caller joins them. data[i] and errors[i]
  // belong to ranks[i].
  std::vector<std::thread> start_some(const std::vector<int>& ranks, size_t calling, uint64_t round,
                                      std::vector<std::vector<float>>& data,
                                      std::vector<std::exception_ptr>& errors) {
    errors.assign(calling, nullptr);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < calling; ++i) {
      // ranks and round by value: the threads outlive this call.
      threads.emplace_back([this, ranks, round, &data, &errors, i] {
        try {
          comms[ranks[i]]->allreduce(group(ranks, round, static_cast<int>(i)),
                                     std::span<float>(data[i]));
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    return threads;
  }

  // Runs one all-gather on the members `ranks`; blobs[i] and max_bytes[i] belong to ranks[i],
  // and so do results[i] and the error returned at i.
  std::vector<std::exception_ptr> gather(const std::vector<int>& ranks, uint64_t round,
                                         const std::vector<std::vector<uint8_t>>& blobs,
                                         const std::vector<size_t>& max_bytes,
                                         std::vector<std::vector<std::vector<uint8_t>>>& results) {
    results.assign(ranks.size(), {});
    return on_threads(ranks.size(), [&](size_t i) {
      results[i] = comms[ranks[i]]->allgather(group(ranks, round, static_cast<int>(i)), blobs[i],
                                              max_bytes[i]);
    });
  }
  // The same, every member with the same max_bytes.
  std::vector<std::exception_ptr> gather(const std::vector<int>& ranks, uint64_t round,
                                         const std::vector<std::vector<uint8_t>>& blobs,
                                         size_t max_bytes,
                                         std::vector<std::vector<std::vector<uint8_t>>>& results) {
    return gather(ranks, round, blobs, std::vector<size_t>(ranks.size(), max_bytes), results);
  }

  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<double> weights;    // Group::part_weights of every operation
  std::vector<uint8_t> left_out;  // Group::left_out of every operation
};

inline std::vector<int> iota(int k) {
  std::vector<int> v(k);
  for (int i = 0; i < k; ++i) v[i] = i;
  return v;
}

inline void rethrow_any(const std::vector<std::exception_ptr>& errors) {
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

template <typename E>
void expect_error_naming(const std::exception_ptr& e, const std::string& name,
                         const std::string& text) {
  ASSERT_TRUE(e) << "expected an error naming " << name;
  try {
    std::rethrow_exception(e);
  } catch (const E& err) {
    EXPECT_EQ(err.member(), name) << err.what();
    EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
  } catch (const std::exception& err) {
    ADD_FAILURE() << "unexpected error type: " << err.what();
  }
}

}  // namespace loco::collective::testing
