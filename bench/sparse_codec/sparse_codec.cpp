// bench/sparse_codec: the sparse top-k codec (runtime/collective/sparse.hpp) against the
// all-reduce's int8 codec (codec.hpp), on one core, over one vector of the 124M preset's size
// (124 M floats of gradient-like data: roughly normal, a sum of four uniforms):
//   sparse  encode (selection, binning, packing, writing `sent`) and decode_add into a vector
//   int8    detail::encode and detail::decode chunk by chunk of the all-reduce's chunk_bytes
//           (512 KiB of fp32 by default), as the all-reduce encodes and decodes a vector
// The four alternate run by run, so that load from other processes hits all alike; prints the
// median of the runs of each, the ratio sparse / int8, and the bytes per parameter.
//   bench_sparse_codec [--floats 124000000] [--runs 5] [--chunk 4096] [--k 64] [--bits 2]
#include <sched.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/stats.hpp"
#include "runtime/collective/codec.hpp"
#include "runtime/collective/sparse.hpp"
#include "runtime/collective/types.hpp"

using namespace loco::collective;

using loco::bench::gradient_like;
using loco::bench::median;
using loco::bench::seconds_of;

int main(int argc, char** argv) {
  CLI::App app{"bench/sparse_codec: the sparse top-k codec against int8, one core"};
  size_t floats = 124'000'000;
  int runs = 5;
  sparse::Params p;
  app.add_option("--floats", floats, "vector length");
  app.add_option("--runs", runs, "timed runs of each");
  app.add_option("--chunk", p.chunk);
  app.add_option("--k", p.k);
  app.add_option("--bits", p.bits);
  CLI11_PARSE(app, argc, argv);
  p.validate();

  // One core: stay on the one we started on.
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  sched_setaffinity(0, sizeof one, &one);

  const std::vector<float> x = gradient_like(floats);
  std::vector<float> sent(floats), acc(floats), int8_out(floats);
  const size_t chunk_floats = Options{}.chunk_bytes / 4;
  size_t int8_bytes = 0;
  for (size_t o = 0; o < floats; o += chunk_floats)
    int8_bytes += encoded_bytes(Codec::int8, std::min(chunk_floats, floats - o));
  std::vector<uint8_t> int8_wire(int8_bytes), sparse_wire;

  std::vector<double> enc, dec, enc8, dec8;
  bool round_trip = true;
  for (int r = 0; r < runs; ++r) {
    enc.push_back(seconds_of([&] { sparse_wire = sparse::encode(x, p, sent); }));
    std::memset(acc.data(), 0, 4 * floats);
    dec.push_back(seconds_of([&] { sparse::decode_add(sparse_wire, p, 1.0f, acc); }));
    round_trip = round_trip && std::memcmp(acc.data(), sent.data(), 4 * floats) == 0;
    enc8.push_back(seconds_of([&] {
      uint8_t* dst = int8_wire.data();
      for (size_t o = 0; o < floats; o += chunk_floats) {
        const size_t c = std::min(chunk_floats, floats - o);
        detail::encode(Codec::int8, x.data() + o, c, dst);
        dst += encoded_bytes(Codec::int8, c);
      }
    }));
    dec8.push_back(seconds_of([&] {
      const uint8_t* src = int8_wire.data();
      for (size_t o = 0; o < floats; o += chunk_floats) {
        const size_t c = std::min(chunk_floats, floats - o);
        detail::decode(Codec::int8, src, c, int8_out.data() + o);
        src += encoded_bytes(Codec::int8, c);
      }
    }));
  }
  const double e = median(enc), d = median(dec), e8 = median(enc8), d8 = median(dec8);
  std::printf(
      "bench/sparse_codec: %zu floats, chunk %u, k %u, bits %u; medians of %d runs, one core\n",
      floats, p.chunk, p.k, p.bits, runs);
  std::printf("  %-8s %10s %10s %10s %14s\n", "codec", "encode s", "decode s", "total s",
              "bytes/param");
  std::printf("  %-8s %10.4f %10.4f %10.4f %14.5f\n", "sparse", e, d, e + d,
              static_cast<double>(sparse_wire.size()) / static_cast<double>(floats));
  std::printf("  %-8s %10.4f %10.4f %10.4f %14.5f\n", "int8", e8, d8, e8 + d8,
              static_cast<double>(int8_bytes) / static_cast<double>(floats));
  std::printf("  ratio sparse/int8: encode %.2f, decode %.2f, total %.2f; wire %.1fx smaller\n",
              e / e8, d / d8, (e + d) / (e8 + d8),
              static_cast<double>(int8_bytes) / static_cast<double>(sparse_wire.size()));
  std::printf("  decode_add(encode(x)) == sent bit for bit: %s\n", round_trip ? "yes" : "NO");
  return round_trip ? 0 : 1;
}
