// The group a worker's stream() call averages its fragments over, and the desk through which a
// worker joins another's round mid-way. Private to actors/ (InnerWorker's).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/messages.hpp"
#include "diloco/round/delta_averager.hpp"
#include "runtime/collective/allreduce.hpp"

namespace loco::actors {

// The members' names, in rank order (the guard's verdicts name them).
std::vector<std::string> names_of(const collective::Group& g);

// The members of one of a worker's averages as the policy sees them (diloco::AveragingGroup):
// `group` over this worker's communicator, one local member.
class CommMembers final : public diloco::AveragingGroup {
 public:
  CommMembers(collective::Communicator& comm, collective::Group group)
      : comm_(comm), group_(std::move(group)) {}
  std::size_t size() const override { return group_.members.size(); }
  std::vector<std::string> names() const override;
  std::uint64_t allgather(std::uint64_t round_id, std::span<const std::vector<std::uint8_t>> mine,
                          std::size_t max_bytes,
                          std::vector<std::vector<std::uint8_t>>& all) override;
  // Sets the communicator's codec for the operation (the all-gather's: fp32, which its header
  // carries): the caller runs one operation at a time on it.
  std::uint64_t allreduce(std::uint64_t round_id, collective::Codec codec,
                          std::span<const std::span<const float>> in,
                          std::span<const std::span<float>> out,
                          std::span<const std::uint8_t> left_out) override;

 private:
  collective::Communicator& comm_;
  collective::Group group_;
};

// The group a stream() call's fragments reduce over: the request's members, less those a
// fragment's all-reduce lost on the way, plus a worker admitted mid-round. Every survivor drops
// the member the failed operation names and runs it again without it (the collective lets a
// retry without the lost member keep its round id), so the fragment finishes as a smaller group
// and the worker's inner steps go on; later fragments of the call start without that member.
// The aggregator accepts the round only when the survivors end with the same group and the
// same θ (after_overlapped_round). A member admitted at a fragment boundary takes part in the
// operations from that fragment's on (`from_op`); its first one counts with weight zero, since
// it has taken no inner step yet (its Δ is zero): the others' mean is the sum over n − 1.
struct StreamGroup {
  std::mutex mu;
  std::vector<collective::Member> members;  // in rank order
  collective::RelayEndpoint relay;
  std::vector<uint64_t> from_op;            // each one's first operation (0: all of the call's)
  std::string self;
  std::string zero_member;  // whose Δ counts with weight zero in operation `zero_op`
  uint64_t zero_op = 0;
  std::vector<std::pair<std::string, uint64_t>> dropped;  // each with the operation it left

  // The group of a stream() call, `first` the operation a joiner takes part from (its Δ of
  // weight zero).
  static std::shared_ptr<StreamGroup> of(const StreamRequest& req, std::optional<uint64_t> first,
                                         collective::RelayEndpoint relay);
  // The group of operation `op`: the members that take part in it, this worker's rank.
  collective::Group at(uint64_t op);
  std::vector<std::string> names();
  // What a stream() call reports as its group (StreamResult::group): names(), with the members
  // back that an operation after `last_landed` dropped. Such an operation is still in flight as
  // the call returns, and it may have dropped a member on this worker and not yet on another
  // that returned first: every member reports the group its landed operations ended with. (The
  // soak's record, 2026-11-30: survivors of a head restart returned before and after dropping
  // the workers behind NAT, and the job went back to its checkpoint.)
  std::vector<std::string> names_as_landed(uint64_t last_landed);
  void add(const std::string& name, const std::string& endpoint, uint64_t op);
  // With the guard on: the joiner's zero Δ in operation `op` is left out of g's mean (the
  // others' mean, exactly), instead of weight_correction's factor.
  void leave_out_zero(collective::Group& g, uint64_t op);
  // The factor that turns the collective's mean over `g` into the mean over the members whose
  // Δ counts: n / (n − 1) when operation g.round_id has a member of weight zero, else 1.
  float weight_correction(const collective::Group& g);
  // `lost` is gone: drop it, unless it is this worker. False when the group of `tried`'s
  // operation is not smaller than `tried` (nothing new to try).
  bool drop(const std::string& lost, const collective::Group& tried);
};

// sync.mode streaming: what stream() shares with the concurrent methods through which a worker
// joins mid-round (offer_state, snapshot_part, landed, landed_mean, progress, admit), all
// under `mu`. A donor takes a snapshot of its state between two inner steps when asked, then
// keeps the average of every fragment it lands after it, so that a joiner that copied the
// snapshot can bring it up to date; an admission says from which fragment boundary the joiner
// is in the group.
struct JoinDesk {
  std::mutex mu;
  std::condition_variable cv;
  int64_t round = -1;    // the round stream() runs (-1: none)
  int64_t reached = -1;  // the inner step count its loop reached (events there done or doing)
  bool wanted = false;   // offer_state asks for a snapshot at the loop's next boundary
  std::shared_ptr<const std::string> snapshot;
  int64_t snapshot_round = -1, snapshot_step = -1;
  struct Landing {
    int fragment = 0;
    int64_t lands = 0;
    std::shared_ptr<const std::vector<float>> mean;
  };
  std::vector<Landing> landed;  // since the snapshot, in order
  size_t landed_floats = 0;
  std::optional<AdmitRequest> admit;  // phase: prepare (undecided), commit or abort

  // stream() of `round` begins, its loop at step count `reached`; as the returned guard goes,
  // however the call ends, nobody waits on that round's desk any longer.
  struct Open {
    JoinDesk& d;
    ~Open() {
      std::lock_guard<std::mutex> lock(d.mu);
      d.round = -1;
      d.forget();
      d.admit.reset();
      d.cv.notify_all();
    }
  };
  [[nodiscard]] Open open(int64_t r, int64_t at);

  void forget();  // with the lock held
};

}  // namespace loco::actors
