// Averaging pseudo-gradients across the workers of a round. No LibTorch here.
// The numerics are runtime/collective's (its codecs and local_allreduce, from
// loco_collective_codec, which has no sockets): the simulator computes what
// the distributed all-reduce computes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/round/guard.hpp"
#include "runtime/collective/types.hpp"

namespace loco::diloco {

// Replaces x by what a receiver of x, sent with compression c, decodes: the
// collective's codec round trip (runtime/collective/local.hpp), chunk by chunk
// as the collective sends it. fp32 leaves x unchanged.
void codec_roundtrip(std::span<float> x, collective::Codec c);

// Payload bytes one member sends in the collective's butterfly all-reduce
// (reduce-scatter + all-gather) of n elements among k members: 2 (k-1)/k of
// the encoded vector (int8: 1 byte a value + an 8-byte header per chunk),
// averaged over the members.
std::uint64_t allreduce_bytes_per_member(std::size_t n, int k, collective::Codec c);

// A member the guard left out of an average (diloco/round/guard.hpp), and why.
struct LeftOut {
  std::string member;  // its name in the operation's group (the simulator: its index)
  int fragment = 0;    // blocking rounds: 0
  std::string rule;    // "abstained", "non-finite", "malformed", "norm", "direction"
  std::string why;
};

// Those of `verdicts` that left their member out, as LeftOuts of `fragment`; names[i] is member
// i's (none: its index).
std::vector<LeftOut> left_outs(int fragment, std::span<const std::string> names,
                               std::span<const guard::Verdict> verdicts);

// The left-outs of a round's averages, from whichever threads ran them.
class GuardLog {
 public:
  // Those of `verdicts` that left their member out; names[i] is member i's (none: its index).
  void add(int fragment, std::span<const std::string> names,
           std::span<const guard::Verdict> verdicts);
  void add(LeftOut l);
  // Everything added since the last take(), in the order added.
  std::vector<LeftOut> take();
  // How close the members averaged since the last call came to the guard's bounds: the largest
  // norm ratio and the smallest relative agreement (guard::Verdict) among those not left out
  // (0 and none when nothing was judged). What `guard.max_norm_ratio` and `guard.opposed`
  // should keep clear of in fault-free runs (metrics.jsonl "guard_norm_ratio", "guard_agreement").
  struct Margins {
    double norm_ratio = 0;
    std::optional<double> agreement;
  };
  Margins take_margins();
  // Seconds spent exchanging summaries (a worker's), since the last call.
  void add_seconds(double s);
  double take_seconds();

 private:
  std::mutex mu_;
  std::vector<LeftOut> items_;
  Margins margins_;
  double seconds_ = 0;
};

struct AverageStats {
  int members = 0;               // workers in the round
  std::uint64_t bytes_sent = 0;  // by each member
};

// Averages one round's pseudo-gradients.
//
// Contract: `locals` are the buffers that this process holds (K of them in the
// simulator, one per process distributed), all of the same length. On return
// every buffer of every member of the round holds the same bytes: the mean
// over all members, computed bit for bit as runtime/collective's all-reduce
// computes it with codec c and default Options (the owner of each part
// sums its own values and the others' decoded contributions in member order,
// divides by the count, and everyone uses the decoding of that mean). Throws
// on failure (a member lost, a NaN/Inf contribution); the buffers are then
// unspecified.
class Averager {
 public:
  virtual ~Averager() = default;
  virtual AverageStats average(std::span<const std::span<float>> locals, collective::Codec c) = 0;
};

// The average of one fragment at a time, asynchronously (sync.mode streaming and eager,
// diloco/round/streaming_round.hpp). start() begins averaging `deltas` (one per replica this process
// holds: K in the simulator, one in a worker; all of one length; fragment `fragment`'s, or
// all of θ as fragment 0 in a blocking round) over every member of operation `op` into `means` (as many, as long), computed as Averager::average computes it;
// its handle is ready once every mean is written, with the bytes each member sent, and its
// get() rethrows a failure. The buffers stay in use until then.
class FragmentAverager {
 public:
  virtual ~FragmentAverager() = default;
  virtual std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                                  std::span<const std::span<const float>> deltas,
                                                  std::span<const std::span<float>> means) = 0;
};

// The simulator's Averager: every member is a local buffer, averaged with
// collective::local_allreduce, i.e. with the numerics of a distributed run: DeltaAverager's
// policy over LocalMembers (defined in delta_averager.cpp).
// As a FragmentAverager it averages at once, with options' codec: the handle is ready.
// With the guard on, each average first judges the members' summaries, as the workers do, and
// leaves out whom the rule names (into `log`, when given).
class LocalAverager final : public Averager, public FragmentAverager {
 public:
  // `options` as the distributed run's Communicator has them (average() sets the codec from
  // its argument).
  explicit LocalAverager(collective::Options options = {}, GuardConfig guard = GuardConfig{false},
                         GuardLog* log = nullptr)
      : options_(options), guard_(guard), log_(log) {}
  AverageStats average(std::span<const std::span<float>> locals, collective::Codec c) override;
  std::shared_future<std::uint64_t> start(std::uint64_t op, int fragment,
                                          std::span<const std::span<const float>> deltas,
                                          std::span<const std::span<float>> means) override;
  // start()'s codec from now on (compression auto, --codec-trace).
  void set_codec(collective::Codec c) { options_.codec = c; }

 private:
  AverageStats average(std::span<const std::span<float>> locals, collective::Codec c,
                       int fragment);

  collective::Options options_;
  GuardConfig guard_;
  GuardLog* log_;
};

}  // namespace loco::diloco
