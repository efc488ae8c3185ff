// The collective's decoders of network input: the frame header, the checks every received
// message goes through (check_message), abort notices, and decoding a chunk's payload in its
// codec. Input: the header's bytes, one byte of sender name length, the name, the payload.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/collective/codec.hpp"
#include "runtime/collective/wire.hpp"

using namespace loco::collective;
using namespace loco::collective::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(Header) + 1) return 0;
  auto header = parse_header({data, sizeof(Header)});
  if (!header) return 0;
  const size_t name_bytes = std::min<size_t>(data[sizeof(Header)], size - sizeof(Header) - 1);
  const uint8_t* payload = data + sizeof(Header) + 1 + name_bytes;
  const size_t payload_bytes = size - sizeof(Header) - 1 - name_bytes;
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
    case MsgType::abort:
      (void)decode_abort({payload, payload_bytes});
      break;
    default:
      break;
  }
  return 0;
}
