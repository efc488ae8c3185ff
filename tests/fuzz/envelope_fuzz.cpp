// The runtime's decoders of network input: the envelope (decode, salvage_corr) and a body
// (unpack_payload) of the shapes loco's calls carry. Input: one byte saying how many bytes
// of the rest are the envelope (in 1/256ths), the envelope frame, then the body frame.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/codec.hpp"
#include "runtime/core/wire.hpp"

using namespace loco;
using namespace loco::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t rest = size - 1;
  const size_t env_bytes = rest * data[0] / 255;
  const char* env = reinterpret_cast<const char*>(data + 1);
  const char* body = env + env_bytes;
  const size_t body_bytes = rest - env_bytes;

  std::vector<zmq::message_t> frames;
  frames.emplace_back(env, env_bytes);
  (void)salvage_corr(frames[0]);
  frames.emplace_back(body, body_bytes);
  frames.emplace_back(body, body_bytes / 2);  // a blob frame
  try {
    Decoded d = decode(std::move(frames), size_t(1) << 20);
    try {
      (void)unpack_payload<std::tuple<std::string, int64_t, std::vector<std::string>>>(d.payload,
                                                                                       "fuzz");
    } catch (const Error&) {
    }
    try {
      (void)unpack_payload<std::map<std::string, std::vector<double>>>(d.payload, "fuzz");
    } catch (const Error&) {
    }
    try {
      (void)unpack_payload<std::tuple<Blob, std::string>>(d.payload, "fuzz");
    } catch (const Error&) {
    }
  } catch (const ProtocolError&) {
  }
  return 0;
}
