#include "runtime/collective/butterfly.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/collective/codec.hpp"
#include "runtime/collective/local.hpp"

namespace loco::collective::detail {
namespace {

// The butterfly all-reduce of one member (butterfly.hpp): its schedule over an Operation.
class ButterflyOp final : public Operation {
 public:
  ButterflyOp(Transport& t, Workspace& ws, const Options& options, const Group& group,
              const float* in, float* out, size_t n)
      : Operation(t, ws, options, group, options.codec, n),
        in_(in),
        out_(out),
        n_(n),
        bounds_(part_bounds(n, group.members.size(), group.part_weights)),
        chunk_(std::max<size_t>(1, options.chunk_bytes / sizeof(float))) {}

 private:
  void begin() override;
  bool expecting(int p) const override { return rs_left_[p] > 0 || ag_left_[p] > 0; }
  bool produced_all() const override {
    return rs_chunk_ >= rs_max_chunks_ && reduced_ >= chunks(me_);
  }
  bool produce() override;
  void handle_data(int s, Message& m) override;
  std::string shape(const Header& h) const override {
    return "a vector of " + std::to_string(h.total_n) + " floats in codec " +
           std::string(to_string(h.codec));
  }

  // Whether member r's contribution goes into the mean (Group::left_out).
  bool included(int r) const { return !is_left_out(g_.left_out, static_cast<size_t>(r)); }
  size_t part_begin(int p) const { return bounds_[static_cast<size_t>(p)]; }
  size_t part_len(int p) const { return part_begin(p + 1) - part_begin(p); }
  size_t chunks(int p) const { return (part_len(p) + chunk_ - 1) / chunk_; }
  size_t chunk_len(int p, size_t c) const { return std::min(chunk_, part_len(p) - c * chunk_); }
  // Where chunk c of part p is encoded in the send buffer.
  size_t enc_offset(int p, size_t c) const {
    return enc_part_[p] + c * encoded_bytes(codec_, chunk_);
  }
  void reduce_chunk(size_t c);
  [[noreturn]] void fail_nonfinite(size_t c, const float* acc);

  const float* in_;
  float* out_;
  size_t n_;
  std::vector<size_t> bounds_;  // where each member's part begins; n_ at the end
  size_t chunk_;
  std::vector<size_t> rs_left_, ag_left_;     // chunks still expected from each peer
  std::vector<std::vector<Buffer>> pending_;  // [chunk][rank] contributions to my part
  std::vector<Addend> addends_;               // reduce_chunk's, kept for its capacity
  std::vector<int> pending_count_;
  int contributors_ = 0;  // peers whose contributions each chunk of my part waits for
  size_t reduced_ = 0;
  std::shared_ptr<Bytes> send_;   // reduce-scatter chunks of other parts, my part's result
  std::vector<size_t> enc_part_;  // offset of each part in send_
  bool input_zero_copy_ = false;  // reduce-scatter chunks point into the input
  // reduce-scatter schedule position
  size_t rs_chunk_ = 0;
  int rs_step_ = 1;
  size_t rs_max_chunks_ = 0;
};

void ButterflyOp::begin() {
  rs_left_.assign(k_, 0);
  ag_left_.assign(k_, 0);
  // A member left out of the mean sends no contribution: nothing is expected from it, and
  // its own reduce-scatter schedule is empty.
  for (int p = 0; p < k_; ++p) {
    if (included(me_)) rs_max_chunks_ = std::max(rs_max_chunks_, chunks(p));
    if (p == me_) continue;
    ag_left_[p] = chunks(p);
    if (included(p)) {
      rs_left_[p] = chunks(me_);
      ++contributors_;
    }
    if (included(me_)) bulk_total_ += chunks(p);
  }
  pending_.resize(chunks(me_));
  for (auto& v : pending_) v.resize(k_);
  pending_count_.assign(chunks(me_), 0);
  enc_part_.assign(k_ + 1, 0);
  for (int p = 0; p < k_; ++p) {
    size_t c = chunks(p);
    enc_part_[p + 1] = enc_part_[p] + (c == 0 ? 0
                                              : (c - 1) * encoded_bytes(codec_, chunk_) +
                                                    encoded_bytes(codec_, chunk_len(p, c - 1)));
  }
  input_zero_copy_ = codec_ == Codec::fp32 && ws_.input_zero_copy &&
                     std::all_of(g_.members.begin(), g_.members.end(), [&](const Member& m) {
                       return t_.releases_sent_payloads(m.endpoint);
                     });
  // With zero-copy fp32, or nothing of mine to send, the send buffer only holds my part's
  // result.
  send_ = ws_.send_buffer(input_zero_copy_ || !included(me_) ? enc_part_[me_ + 1] : enc_part_[k_]);
}

// The next reduce-scatter chunk, unless that peer is still congested. When no peer contributes
// to my part (every other member left out of the mean), its chunks reduce here, one per call.
bool ButterflyOp::produce() {
  if (contributors_ == 0 && reduced_ < chunks(me_)) {
    reduce_chunk(reduced_);
    return true;
  }
  bool produced = false;
  while (rs_chunk_ < rs_max_chunks_) {
    int p = (me_ + rs_step_) % k_;
    if (rs_chunk_ < chunks(p)) {
      if (backlog(p)) break;
      size_t len = chunk_len(p, rs_chunk_);
      const float* src = in_ + part_begin(p) + rs_chunk_ * chunk_;
      Buffer payload;
      if (input_zero_copy_) {
        payload = Buffer{reinterpret_cast<const uint8_t*>(src), len * sizeof(float),
                         InputRefs::take(ws_.input_refs)};
      } else {
        const size_t at = enc_offset(p, rs_chunk_);
        encode(codec_, src, len, send_->data.get() + at);
        payload = shared_slice(send_, at, encoded_bytes(codec_, len));
      }
      enqueue(p, header(MsgType::reduce_scatter, p, rs_chunk_ * chunk_, len), std::move(payload),
              false);
      produced = true;
    }
    if (++rs_step_ == k_) {
      rs_step_ = 1;
      ++rs_chunk_;
    }
    if (produced) break;
  }
  return produced;
}

void ButterflyOp::handle_data(int s, Message& m) {
  const Header& h = m.header;
  if (h.type != MsgType::reduce_scatter && h.type != MsgType::all_gather) {
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + who(s) + " sent all-gather data (a blob) in round " +
                        std::to_string(g_.round_id) + ", which this member runs as an all-reduce",
                    true};
  }
  const int part = static_cast<int>(h.part);
  const int expected_part = h.type == MsgType::reduce_scatter ? me_ : s;
  if (h.codec != codec_ || h.total_n != n_ || part != expected_part) {
    std::string msg = "member " + who(s) + " sent ";
    if (h.codec != codec_) {
      msg += "codec " + std::string(to_string(h.codec)) + ", expected " +
             std::string(to_string(codec_));
    } else {
      msg += "data for part " + std::to_string(part) + " of a vector of " +
             std::to_string(h.total_n) + " floats; expected part " + std::to_string(expected_part) +
             " of " + std::to_string(n_) + " floats";
    }
    msg += " in round " + std::to_string(g_.round_id);
    throw OpFailure{AbortKind::mismatch, m.sender, msg, true};
  }
  const size_t c = h.offset / chunk_;
  const bool grid_ok = h.offset % chunk_ == 0 && c < chunks(part) &&
                       h.count == chunk_len(part, c) &&
                       m.payload.size == encoded_bytes(codec_, h.count);
  if (!grid_ok) {
    throw OpFailure{AbortKind::mismatch, m.sender,
                    "member " + who(s) + " sent a malformed chunk (offset " +
                        std::to_string(h.offset) + ", " + std::to_string(h.count) + " floats, " +
                        std::to_string(m.payload.size) + " bytes) for part " +
                        std::to_string(part) + " in round " + std::to_string(g_.round_id) +
                        "; chunk size differs?",
                    true};
  }
  if (h.type == MsgType::reduce_scatter) {
    if (!included(s)) {
      // Every member computes the same mask (it is part of the fingerprint): a contribution
      // from a member it leaves out is a broken sender, refused like a chunk off the grid.
      throw OpFailure{AbortKind::mismatch, m.sender,
                      "member " + who(s) + " sent a contribution in round " +
                          std::to_string(g_.round_id) +
                          ", but the group leaves it out of the mean (Group::left_out)",
                      true};
    }
    Buffer& slot = pending_[c][s];
    if (slot.data != nullptr || rs_left_[s] == 0) return;  // duplicate: ignore
    slot = std::move(m.payload);
    --rs_left_[s];
    if (++pending_count_[c] == contributors_) reduce_chunk(c);
  } else if (h.type == MsgType::all_gather) {
    if (ag_left_[s] == 0) return;
    decode(codec_, m.payload.data, h.count, out_ + part_begin(s) + h.offset);
    --ag_left_[s];
  }
}

void ButterflyOp::fail_nonfinite(size_t c, const float* acc) {
  const size_t begin = part_begin(me_) + c * chunk_;
  const size_t len = chunk_len(me_, c);
  for (int r = 0; r < k_; ++r) {
    if (!included(r)) continue;  // not in the sum
    const float* v = in_ + begin;
    if (r != me_) {
      ws_.scratch.resize(len);
      decode(codec_, pending_[c][r].data, len, ws_.scratch.data());
      v = ws_.scratch.data();
    }
    size_t i = first_nonfinite(v, len);
    if (i < len) {
      throw OpFailure{AbortKind::error, g_.members[r].name,
                      "member " + who(r) + " sent NaN/Inf in round " + std::to_string(g_.round_id) +
                          " (element " + std::to_string(begin + i) + ")",
                      true};
    }
  }
  size_t i = first_nonfinite(acc, len);
  throw OpFailure{AbortKind::error, "",
                  "the sum overflowed to Inf at element " + std::to_string(begin + i) +
                      " in round " + std::to_string(g_.round_id),
                  true};
}

void ButterflyOp::reduce_chunk(size_t c) {
  const size_t begin = part_begin(me_) + c * chunk_;
  const size_t len = chunk_len(me_, c);
  float* acc = out_ + begin;
  // Rank order, so that the result does not depend on arrival order; the members left out of
  // the mean are not among the addends (none: zeros).
  addends_.clear();
  for (int r = 0; r < k_; ++r) {
    if (!included(r)) continue;
    addends_.push_back(r == me_ ? Addend{in_ + begin, true} : Addend{pending_[c][r].data, false});
  }
  mean_of(codec_, addends_, len, acc);
  if (options_.reject_nonfinite && !all_finite(acc, len)) fail_nonfinite(c, acc);
  for (auto& b : pending_[c]) b = Buffer{};
  // Encode once; every member, this one too, uses the decoded bytes.
  const size_t at = enc_offset(me_, c);
  uint8_t* enc = send_->data.get() + at;
  const size_t enc_len = encoded_bytes(codec_, len);
  encode(codec_, acc, len, enc);
  for (int step = 1; step < k_; ++step) {
    int p = (me_ + step) % k_;
    enqueue(p, header(MsgType::all_gather, me_, c * chunk_, len), shared_slice(send_, at, enc_len),
            true);
  }
  if (codec_ != Codec::fp32) decode(codec_, enc, len, acc);
  ++reduced_;
}

}  // namespace

void butterfly_allreduce(Transport& t, Workspace& ws, const Options& options, const Group& group,
                         const float* in, float* out, size_t n) {
  begin_operation(t, ws, options, group, "allreduce");
  if (group.members.size() == 1) {
    check_not_left(ws, group);
    if (is_left_out(group.left_out, 0)) {
      std::fill(out, out + n, 0.0f);
    } else {
      std::memcpy(out, in, n * sizeof(float));
    }
    return;
  }
  ButterflyOp op(t, ws, options, group, in, out, n);
  run_operation(t, ws, op);
  // Success means that every peer received all our reduce-scatter chunks (it sent us the
  // results they went into), so all the bytes are out of the input; the transport lets go of
  // the last one within microseconds. Bounded all the same.
  if (!ws.input_refs->wait_released(options.peer_timeout)) {
    spdlog::warn(
        "collective: the transport still referenced the input {} after a successful "
        "operation",
        seconds_str(options.peer_timeout));
    abandon(t, ws, op);
    ws.last_ok = true;
  }
}

}  // namespace loco::collective::detail
