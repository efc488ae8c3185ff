// Communicator: the butterfly all-reduce (butterfly.hpp) and the all-gather (gather.hpp) over a
// ZmqTransport.
#include "runtime/collective/allreduce.hpp"

#include <malloc.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "runtime/collective/butterfly.hpp"
#include "runtime/collective/gather.hpp"
#include "runtime/collective/zmq_transport.hpp"

namespace loco::collective {

struct detail::CommunicatorImpl {
  Options options;
  std::unique_ptr<ZmqTransport> transport;
  Workspace ws;
  std::unique_ptr<float[]> result;  // the in-place variants' output, copied back on success
  size_t result_capacity = 0;
  std::vector<float> input;  // concatenation of several tensors
  std::once_flag left;
  // Held by an operation, and by `receiver` while it reads between operations; it guards the
  // transport, `ws` and `receiver_options` (the options of the last operation: the caller may
  // change `options` meanwhile).
  std::mutex mu;
  Options receiver_options;
  std::condition_variable receiver_cv;
  bool stopping = false;
  std::thread receiver;

  // Between operations: takes what arrives, every 50 ms, into the bounded stash.
  void receive_between_operations_loop() {
    std::unique_lock lock(mu);
    while (!stopping) {
      const size_t taken =
          receive_between_operations(*transport, ws, receiver_options, Clock::now());
      if (taken < 4096) receiver_cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  float* result_buffer(size_t n) {
    if (n > result_capacity) {
      result.reset(new float[n]);
      result_capacity = n;
    }
    return result.get();
  }
  void run(const Group& group, const float* in, float* out, size_t n) {
    std::lock_guard lock(mu);
    receiver_options = options;
    transport->describe(group);
    butterfly_allreduce(*transport, ws, options, group, in, out, n);
  }
  std::vector<std::vector<uint8_t>> gather(const Group& group, std::span<const uint8_t> mine,
                                           size_t max_bytes) {
    std::lock_guard lock(mu);
    receiver_options = options;
    transport->describe(group);
    return gather_blobs(*transport, ws, options, group, mine, max_bytes);
  }
};

namespace {
// ZeroMQ allocates each received chunk in its I/O thread and we free it in ours. With glibc's
// default, adaptive thresholds those buffers keep going back to the kernel, and every chunk
// then costs page faults and page zeroing: measured 16x more faults and ~30% slower.
void tune_malloc_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (getenv("LOCO_COLLECTIVE_KEEP_MALLOC") != nullptr) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
}
}  // namespace

Communicator::Communicator(const std::string& bind_endpoint, Options options,
                           std::shared_ptr<zmq::context_t> context)
    : impl_(std::make_unique<detail::CommunicatorImpl>()) {
  tune_malloc_once();
  impl_->options = options;
  impl_->receiver_options = options;
  if (!context) context = std::make_shared<zmq::context_t>(std::max(1, options.io_threads));
  impl_->transport = std::make_unique<detail::ZmqTransport>(
      bind_endpoint, std::move(context), options.security, detail::max_payload_bytes(options),
      options.outbound_only);
  impl_->ws.configure(options);
  impl_->receiver = std::thread([impl = impl_.get()] { impl->receive_between_operations_loop(); });
}

Communicator::~Communicator() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->receiver_cv.notify_all();
  impl_->receiver.join();
  // After a success, let the last chunks reach slower peers, bounded by the peer timeout; after
  // a failure only abort notices are queued: give them a moment, their peers may be gone.
  auto linger = impl_->options.peer_timeout;
  if (!impl_->ws.last_ok) linger = std::min(linger, std::chrono::milliseconds(500));
  impl_->transport->set_linger_on_close(linger);
}

const std::string& Communicator::endpoint() const { return impl_->transport->endpoint(); }
std::string Communicator::kx_public() const { return impl_->transport->kx_public(); }

uint64_t Communicator::unauthentic_messages() const {
  std::lock_guard lock(impl_->mu);
  return impl_->transport->unauthentic();
}
Options& Communicator::options() { return impl_->options; }
detail::Hooks& Communicator::hooks() { return impl_->ws.hooks; }
const Stats& Communicator::last_stats() const { return impl_->ws.stats; }

size_t Communicator::held_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->ws.stash_bytes;
}

uint64_t Communicator::dropped_messages() const {
  std::lock_guard lock(impl_->mu);
  return impl_->ws.dropped;
}

void Communicator::leave(const std::string& reason) {
  std::call_once(impl_->left, [&] {
    impl_->ws.leave_reason = reason;
    impl_->ws.leaving.store(true, std::memory_order_release);
  });
}

bool Communicator::has_left() const { return impl_->ws.leaving.load(std::memory_order_acquire); }

void Communicator::peer_gone(const std::string& endpoint, const std::string& reason,
                             uint64_t below_round_id) {
  impl_->ws.note_gone(endpoint, reason, below_round_id);
}

void Communicator::give_up_below(uint64_t round_id, const std::string& reason, bool as_lost) {
  impl_->ws.give_up_below(round_id, reason, as_lost);
}

void Communicator::new_attempt() { impl_->ws.attempt_begun.store(true, std::memory_order_release); }

void Communicator::allreduce(const Group& group, std::span<float> data) {
  float* out = impl_->result_buffer(data.size());
  impl_->run(group, data.data(), out, data.size());
  std::memcpy(data.data(), out, data.size() * sizeof(float));
}

void Communicator::allreduce(const Group& group, std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size()) {
    throw CollectiveError("allreduce: input has " + std::to_string(in.size()) +
                          " floats but output " + std::to_string(out.size()));
  }
  const float* a = in.data();
  const float* b = out.data();
  if (!in.empty() && a < b + out.size() && b < a + in.size()) {
    throw CollectiveError("allreduce: input and output overlap; use the in-place overload");
  }
  impl_->run(group, in.data(), out.data(), in.size());
}

void Communicator::allreduce(const Group& group, const std::vector<std::span<float>>& tensors) {
  if (tensors.size() == 1) return allreduce(group, tensors[0]);
  size_t n = 0;
  for (auto t : tensors) n += t.size();
  impl_->input.resize(n);
  size_t at = 0;
  for (auto t : tensors) {
    std::copy(t.begin(), t.end(), impl_->input.begin() + static_cast<ptrdiff_t>(at));
    at += t.size();
  }
  float* out = impl_->result_buffer(n);
  impl_->run(group, impl_->input.data(), out, n);
  at = 0;
  for (auto t : tensors) {
    std::copy(out + at, out + at + t.size(), t.begin());
    at += t.size();
  }
}

std::vector<std::vector<uint8_t>> Communicator::allgather(const Group& group,
                                                          std::span<const uint8_t> mine,
                                                          size_t max_bytes) {
  return impl_->gather(group, mine, max_bytes);
}

}  // namespace loco::collective
