#include "runtime/collective/gather.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace loco::collective::detail {
namespace {

std::string too_long(const std::string& member, uint64_t bytes, size_t max_bytes,
                     uint64_t round_id) {
  return "member " + member + " has a blob of " + std::to_string(bytes) +
         " bytes, more than max_bytes (" + std::to_string(max_bytes) + ") in round " +
         std::to_string(round_id);
}

// The all-gather of one member (gather.hpp): its schedule over an Operation.
class GatherOp final : public Operation {
 public:
  // `out` gets every member's blob, in group order.
  GatherOp(Transport& t, Workspace& ws, const Options& options, const Group& group,
           std::span<const uint8_t> mine, size_t max_bytes, std::vector<std::vector<uint8_t>>& out)
      // Its control messages carry no vector: a vector of 0 floats in fp32.
      : Operation(t, ws, options, group, Codec::fp32, 0),
        mine_(mine),
        max_bytes_(max_bytes),
        piece_(blob_piece_bytes(options)),
        out_(out) {}

 private:
  void begin() override;
  bool expecting(int p) const override { return !complete_[p]; }
  bool produced_all() const override {
    return std::all_of(next_.begin(), next_.end(), [&](size_t n) { return n == pieces_; });
  }
  bool produce() override;
  void handle_data(int s, Message& m) override;
  std::string shape(const Header& h) const override {
    if (h.codec == codec_ && h.total_n == total_n_) return "an all-gather";
    return "an all-reduce of " + std::to_string(h.total_n) + " floats in codec " +
           std::string(to_string(h.codec));
  }

  std::span<const uint8_t> mine_;
  size_t max_bytes_;
  size_t piece_;
  std::vector<std::vector<uint8_t>>& out_;
  std::shared_ptr<Bytes> send_;  // a copy of mine_, which the pieces point into
  size_t pieces_ = 0;            // of mine_, at least one
  std::vector<size_t> next_;     // the next piece of mine_ for each peer
  std::vector<uint64_t> total_;  // each peer's blob length, as its first piece said
  std::vector<bool> started_, complete_;
};

void GatherOp::begin() {
  if (mine_.size() > max_bytes_) {
    throw OpFailure{AbortKind::error, g_.members[me_].name,
                    too_long(who(me_), mine_.size(), max_bytes_, g_.round_id), true};
  }
  pieces_ = std::max<size_t>(1, (mine_.size() + piece_ - 1) / piece_);
  // A copy that the transport may hold after this call returns (the caller's may be gone).
  send_ = ws_.send_buffer(mine_.size());
  if (!mine_.empty()) std::memcpy(send_->data.get(), mine_.data(), mine_.size());
  next_.assign(k_, 0);
  next_[me_] = pieces_;
  total_.assign(k_, 0);
  started_.assign(k_, false);
  complete_.assign(k_, false);
  complete_[me_] = true;
  out_.assign(k_, {});
  out_[me_].assign(mine_.begin(), mine_.end());
  bulk_total_ = static_cast<size_t>(k_ - 1) * pieces_;
}

// One piece to each peer whose queue has room, in turn: a slow peer does not hold back the
// others.
bool GatherOp::produce() {
  bool produced = false;
  for (int step = 1; step < k_; ++step) {
    const int p = (me_ + step) % k_;
    if (next_[p] == pieces_ || backlog(p)) continue;
    const size_t at = next_[p] * piece_;
    const size_t len = std::min(piece_, mine_.size() - at);
    Header h = header(MsgType::blob, 0, at, len);
    h.total_n = mine_.size();
    enqueue(p, h, shared_slice(send_, at, len), false);
    ++next_[p];
    produced = true;
  }
  return produced;
}

void GatherOp::handle_data(int s, Message& m) {
  const Header& h = m.header;
  if (h.type != MsgType::blob) {
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + who(s) + " sent all-reduce data in round " +
                        std::to_string(g_.round_id) + ", which this member runs as an all-gather",
                    true};
  }
  if (complete_[s]) return;  // a duplicate: ignore, as the all-reduce does
  if (!started_[s]) {
    // Checked from the header, before anything is allocated for it.
    if (h.total_n > max_bytes_) {
      throw OpFailure{AbortKind::error, m.sender,
                      too_long(who(s), h.total_n, max_bytes_, g_.round_id), true};
    }
    total_[s] = h.total_n;
    out_[s].reserve(h.total_n);
    started_[s] = true;
  }
  // A connection delivers in order: each piece follows the one before.
  if (h.total_n != total_[s] || h.offset != out_[s].size()) {
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + who(s) + " sent bytes " + std::to_string(h.offset) + " to " +
                        std::to_string(h.offset + h.count) + " of a blob of " +
                        std::to_string(h.total_n) + "; expected bytes from " +
                        std::to_string(out_[s].size()) + " of " + std::to_string(total_[s]) +
                        " in round " + std::to_string(g_.round_id) + " (a piece lost on its way?)",
                    true};
  }
  out_[s].insert(out_[s].end(), m.payload.data, m.payload.data + m.payload.size);
  if (out_[s].size() == total_[s]) complete_[s] = true;
}

}  // namespace

size_t blob_piece_bytes(const Options& options) {
  return std::max<size_t>(1, std::min(options.chunk_bytes, max_payload_bytes(options)));
}

std::vector<std::vector<uint8_t>> gather_blobs(Transport& t, Workspace& ws, const Options& options,
                                               const Group& group, std::span<const uint8_t> mine,
                                               size_t max_bytes) {
  begin_operation(t, ws, options, group, "allgather");
  if (group.members.size() == 1) {
    check_not_left(ws, group);
    const std::string& name = group.members[0].name;
    if (mine.size() > max_bytes)
      throw CollectiveError(too_long(name, mine.size(), max_bytes, group.round_id), name);
    return {std::vector<uint8_t>(mine.begin(), mine.end())};
  }
  std::vector<std::vector<uint8_t>> out;
  GatherOp op(t, ws, options, group, mine, max_bytes, out);
  run_operation(t, ws, op);
  return out;
}

}  // namespace loco::collective::detail
