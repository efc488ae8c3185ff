// The collective's decoders of network input: the frame header, the checks every received
// message goes through (check_message), abort notices, and decoding a chunk's payload in its
// codec. Then the frame between operations: it is sent (as it is, whatever the checks said) to
// a member of a pair over MemoryTransport that has run an operation and is idle, which takes
// it with receive_between_operations; then the pair runs its next operations, an all-reduce and
// an all-gather of blobs (either may be the one the frame claims to belong to), which must end
// (in a result or an error) without a crash. Input: the header's bytes, one byte of sender
// name length, the name, the payload.
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collective/butterfly.hpp"
#include "runtime/collective/codec.hpp"
#include "runtime/collective/gather.hpp"
#include "runtime/collective/memory_transport.hpp"
#include "runtime/collective/wire.hpp"

using namespace loco::collective;
using namespace loco::collective::detail;

namespace {

// Two members and a stranger on one hub, kept from one input to the next.
struct Pair {
  Pair() {
    spdlog::set_level(spdlog::level::off);
    options.chunk_bytes = 64;  // 16 floats: several chunks for a vector of 40
    options.max_floats = 40;
    options.peer_timeout = std::chrono::milliseconds(200);
    for (int r = 0; r < 2; ++r) {
      members.push_back(std::make_unique<MemoryTransport>(hub, "mem://w" + std::to_string(r)));
      workspaces.push_back(std::make_unique<Workspace>());
    }
    run();  // the members have a last operation, as an idle worker has
  }
  // Runs `op(member)` on both members at once, each on a thread; errors are expected.
  template <typename Op>
  void both(Op op) {
    std::thread other([&] {
      try {
        op(1);
      } catch (const CollectiveError&) {
      }
    });
    try {
      op(0);
    } catch (const CollectiveError&) {
    }
    other.join();
  }
  Group group(int me) const {
    Group g;
    g.members = {{"w0", "mem://w0"}, {"w1", "mem://w1"}};
    g.rank = me;
    g.round_id = round;
    return g;
  }
  // An all-reduce, then an all-gather of blobs of different lengths (one empty), each under a
  // round id of its own.
  void run() {
    ++round;
    std::vector<float> in[2] = {std::vector<float>(40, 1.0f), std::vector<float>(40, 2.0f)};
    std::vector<float> out[2] = {std::vector<float>(40), std::vector<float>(40)};
    both([&](int me) {
      butterfly_allreduce(*members[me], *workspaces[me], options, group(me), in[me].data(),
                          out[me].data(), in[me].size());
    });
    ++round;
    const std::vector<uint8_t> blob[2] = {std::vector<uint8_t>(150, 7), {}};
    both([&](int me) {
      (void)gather_blobs(*members[me], *workspaces[me], options, group(me), blob[me], 200);
    });
  }

  Options options;
  std::shared_ptr<MemoryHub> hub = std::make_shared<MemoryHub>(64);
  std::vector<std::unique_ptr<MemoryTransport>> members;
  std::vector<std::unique_ptr<Workspace>> workspaces;
  MemoryTransport stranger{hub, "mem://x"};
  uint64_t round = 0;
};

void between_operations(const Header& header, const std::string& sender, const uint8_t* payload,
                        size_t payload_bytes) {
  static Pair pair;
  auto bytes = std::make_shared<std::vector<uint8_t>>(payload, payload + payload_bytes);
  Buffer b{bytes->data(), bytes->size(), bytes};
  if (!pair.stranger.try_send("mem://w0", Channel::data, header, sender, b)) return;
  (void)receive_between_operations(*pair.members[0], *pair.workspaces[0], pair.options,
                                   Clock::now());
  pair.run();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(Header) + 1) return 0;
  auto header = parse_header({data, sizeof(Header)});
  if (!header) return 0;
  const size_t name_bytes = std::min<size_t>(data[sizeof(Header)], size - sizeof(Header) - 1);
  const uint8_t* payload = data + sizeof(Header) + 1 + name_bytes;
  const size_t payload_bytes = size - sizeof(Header) - 1 - name_bytes;
  between_operations(
      *header, std::string(reinterpret_cast<const char*>(data + sizeof(Header) + 1), name_bytes),
      payload, payload_bytes);
  if (!check_message(*header, name_bytes, payload_bytes).empty()) return 0;
  switch (header->type) {
    case MsgType::reduce_scatter:
    case MsgType::all_gather: {
      // check_message holds the payload to exactly the bytes of `count` values.
      std::vector<float> out(header->count);
      decode(header->codec, payload, header->count, out.data());
      (void)all_finite(out.data(), out.size());
      break;
    }
    case MsgType::blob:
      // check_message holds the payload to exactly `count` bytes within the blob; they are
      // copied as they are (pair.run() above took this one if it belongs to its all-gather).
      break;
    case MsgType::abort:
      (void)decode_abort({payload, payload_bytes});
      break;
    default:
      break;
  }
  return 0;
}
