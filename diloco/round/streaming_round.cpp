#include "diloco/round/streaming_round.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "diloco/round/trainer.hpp"

namespace loco::diloco {

namespace {

std::string in_flight_key(std::size_t i) { return "in_flight." + std::to_string(i) + "."; }

torch::Tensor tensor_of(const std::vector<float>& v) {
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<std::int64_t>(v.size())})
      .clone();
}

}  // namespace

void PendingLandings::hand_in(std::size_t i, InFlightCopy c) {
  std::lock_guard<std::mutex> lock(mu_);
  copies_[i] = std::move(c);
  cv_.notify_all();
}

void PendingLandings::abandon(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_.empty()) abandoned_ = std::move(why);
  cv_.notify_all();
}

std::vector<InFlightCopy> PendingLandings::wait(std::chrono::seconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ended = cv_.wait_for(lock, limit, [&] {
    return !abandoned_.empty() ||
           std::all_of(copies_.begin(), copies_.end(), [](auto& c) { return c.has_value(); });
  });
  if (!abandoned_.empty()) throw std::runtime_error(abandoned_);
  if (!ended)
    throw std::runtime_error("the fragments in flight at the round's end did not land within " +
                             std::to_string(limit.count()) + " s");
  std::vector<InFlightCopy> out;
  for (auto& c : copies_) out.push_back(std::move(*c));
  return out;
}

InFlightFragment::~InFlightFragment() {
  if (checkpoint)
    checkpoint->abandon("fragment " + std::to_string(fragment) + " of the round's end (" +
                        "synchronized at inner step " + std::to_string(synced) +
                        ") was dropped before it landed");
}

InFlightCopy InFlightFragment::copy() const {
  InFlightCopy c{fragment, synced, lands, {}, provisional};
  for (const auto& m : mean) c.mean.push_back(tensor_of(m));
  return c;
}

StreamingRound::StreamingRound(const JobConfig& cfg, std::vector<std::vector<Range>> fragments,
                               std::vector<Replica> replicas)
    : schedule_(cfg.sync.mode == SyncMode::blocking ? FragmentSchedule(cfg.inner.steps, 1, 0)
                                                    : FragmentSchedule(cfg)),
      mode_(cfg.sync.mode),
      mix_(cfg.sync.mix),
      fragments_(std::move(fragments)),
      replicas_(std::move(replicas)) {
  if (static_cast<int>(fragments_.size()) != schedule_.fragments())
    throw std::logic_error("StreamingRound: " + std::to_string(fragments_.size()) +
                           " fragments of ranges for sync.fragments " +
                           std::to_string(schedule_.fragments()));
  if (replicas_.empty()) throw std::logic_error("StreamingRound: no replica");
}

StreamingRound::~StreamingRound() { drain(); }

const std::vector<Range>& StreamingRound::ranges(int fragment) const {
  return fragments_.at(static_cast<std::size_t>(fragment));
}

std::int64_t StreamingRound::fragment_size(int fragment) const {
  std::int64_t n = 0;
  for (const Range& r : ranges(fragment)) n += r.size();
  return n;
}

void StreamingRound::drain() {
  for (auto& f : in_flight_)
    if (f->done.valid()) f->done.wait();
  in_flight_.clear();
}

StreamingRound::Result StreamingRound::run(const Round& r, FragmentAverager& averager,
                                           Driver& driver) {
  if (mode_ == SyncMode::blocking) {
    step_half(r, driver);
    return land_half(r, averager, driver);
  }
  Result out;
  const std::int64_t end = schedule_.end(r.round);
  // The events at step count `now`: the synchronizations first (with no overlap a fragment
  // lands at the step it synchronizes), then the landings; the job's last round lands all.
  auto events_at = [&](std::int64_t now) {
    driver.at_event(now);
    for (int f : schedule_.syncing_at(r.round, now)) synchronize(f, r, now, averager);
    const bool all = r.last && now == end;
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if ((*it)->lands != now && !all) {
        ++it;
        continue;
      }
      land(**it, now, out, driver);
      it = in_flight_.erase(it);
    }
  };
  std::int64_t now = schedule_.start(r.round);
  if (r.from_step >= 0) {
    now = r.from_step;
    events_at(now);
  }
  while (now < end) {
    driver.before_steps(now);
    std::optional<std::int64_t> earliest;
    for (const auto& f : in_flight_) earliest = std::min(earliest.value_or(f->lands), f->lands);
    const std::int64_t next = schedule_.next_event(r.round, now, earliest);
    driver.steps(now, static_cast<int>(next - now));
    now = next;
    events_at(now);
  }
  for (const Replica& k : replicas_) k.outer->end_round();
  return out;
}

std::unique_ptr<InFlightFragment> StreamingRound::write_delta(int fragment, std::int64_t now) {
  const auto& rs = ranges(fragment);
  const auto size = static_cast<std::size_t>(fragment_size(fragment));
  auto f = std::make_unique<InFlightFragment>();
  f->fragment = fragment;
  f->synced = now;
  f->lands = schedule_.lands(now);
  for (const Replica& k : replicas_) {
    auto& delta = f->delta.emplace_back(size);
    f->mean.emplace_back(size);
    std::size_t at = 0;
    for (const Range& range : rs) {
      k.trainer->pseudo_gradient(k.outer->theta(),
                                 {delta.data() + at, static_cast<std::size_t>(range.size())},
                                 range.begin);
      at += static_cast<std::size_t>(range.size());
    }
    // Eager: the replica goes on from its own Δ stepped, while the average is on its way.
    if (eager()) {
      f->provisional.push_back(k.outer->provisional_ranges(delta, rs));
      k.trainer->load_parameters(f->provisional.back());
    }
  }
  return f;
}

void StreamingRound::start_average(InFlightFragment& f, const Round& r,
                                   FragmentAverager& averager) {
  std::vector<std::span<const float>> deltas;
  std::vector<std::span<float>> means;
  for (std::size_t i = 0; i < replicas_.size(); ++i) {
    deltas.emplace_back(f.delta[i]);
    means.emplace_back(f.mean[i]);
  }
  f.op = r.op_base + static_cast<std::uint64_t>(f.fragment);
  f.done = averager.start(f.op, f.fragment, deltas, means);
}

void StreamingRound::synchronize(int fragment, const Round& r, std::int64_t now,
                                 FragmentAverager& averager) {
  auto f = write_delta(fragment, now);
  start_average(*f, r, averager);
  in_flight_.push_back(std::move(f));
}

void StreamingRound::step_half(const Round& r, Driver& driver) {
  if (mode_ != SyncMode::blocking) throw std::logic_error("StreamingRound::step_half: not blocking");
  const std::int64_t now = schedule_.start(r.round), end = schedule_.end(r.round);
  driver.before_steps(now);
  driver.steps(now, static_cast<int>(end - now));
  driver.at_event(end);
  kept_ = write_delta(0, end);
  kept_round_ = r.round;
}

StreamingRound::Result StreamingRound::land_half(const Round& r, FragmentAverager& averager,
                                                 Driver& driver) {
  if (!kept_ || kept_round_ != r.round)
    throw std::logic_error("StreamingRound::land_half: round " + std::to_string(r.round) +
                           ", but the Δ kept is of round " + std::to_string(kept_round_));
  start_average(*kept_, r, averager);
  kept_->done.get();  // a failure is rethrown here, before anything is stepped
  const bool redo = stepped_round_ == r.round;
  for (const Replica& k : replicas_) {
    if (redo)
      k.outer->undo_step();
    else
      k.outer->keep_before_step();
  }
  Result out;
  land(*kept_, kept_->lands, out, driver);
  for (const Replica& k : replicas_) k.outer->end_round();
  stepped_round_ = r.round;
  return out;
}

std::span<float> StreamingRound::kept_delta(std::size_t k) {
  if (!kept_) throw std::logic_error("StreamingRound::kept_delta: no Δ kept");
  return kept_->delta.at(k);
}

void StreamingRound::land(InFlightFragment& f, std::int64_t now, Result& out, Driver& driver) {
  const auto t = std::chrono::steady_clock::now();
  const std::uint64_t bytes = f.done.get();  // the fragment's average failed: so does the round
  out.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  out.bytes_sent += bytes;
  if (f.checkpoint) {  // its copy, before the driver may take the mean away
    f.checkpoint->hand_in(f.checkpoint_index, f.copy());
    f.checkpoint.reset();
  }
  const auto& rs = ranges(f.fragment);
  for (std::size_t i = 0; i < replicas_.size(); ++i) replicas_[i].outer->step_ranges(f.mean[i], rs);
  driver.landed(f, now);
  for (std::size_t i = 0; i < replicas_.size(); ++i) {
    const Replica& k = replicas_[i];
    if (mode_ == SyncMode::blocking)  // one fragment, all of θ: the replica goes on from it
      k.trainer->load_parameters(k.outer->theta());
    else if (!eager())
      k.trainer->merge_parameters(k.outer->theta(), rs, mix_);
    else if (now == f.synced)  // no step taken from the provisional θ: blocking, bit for bit
      k.trainer->load_parameters(k.outer->theta());
    else
      k.trainer->correct_parameters(k.outer->theta(), f.provisional[i]);
  }
}

void StreamingRound::land_outer(int fragment, std::span<const float> mean) {
  for (const Replica& k : replicas_) k.outer->step_ranges(mean, ranges(fragment));
}

void StreamingRound::write_in_flight(torch::serialize::OutputArchive& ar) const {
  std::vector<InFlightCopy> copies;
  for (const auto& f : in_flight_) {
    try {
      f->done.get();
    } catch (const std::exception& e) {
      throw std::runtime_error("the all-reduce of fragment " + std::to_string(f->fragment) +
                               " failed, so the outer state cannot be saved: " + e.what());
    }
    copies.push_back(f->copy());
  }
  write_copies(ar, copies);
}

void StreamingRound::write_copies(torch::serialize::OutputArchive& ar,
                                  const std::vector<InFlightCopy>& copies) {
  ar.write("in_flight", c10::IValue(static_cast<std::int64_t>(copies.size())));
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const InFlightCopy& f = copies[i];
    const std::string key = in_flight_key(i);
    ar.write(key + "fragment", c10::IValue(static_cast<std::int64_t>(f.fragment)));
    ar.write(key + "lands", c10::IValue(f.lands));
    ar.write(key + "synced", c10::IValue(f.synced));
    for (std::size_t k = 0; k < f.mean.size(); ++k) ar.write(key + std::to_string(k), f.mean[k]);
    for (std::size_t k = 0; k < f.provisional.size(); ++k)
      if (f.provisional[k].defined())
        ar.write(key + "provisional." + std::to_string(k), f.provisional[k]);
  }
}

void StreamingRound::read_in_flight(torch::serialize::InputArchive& ar) {
  drain();
  c10::IValue v;
  if (!ar.try_read("in_flight", v)) return;
  std::promise<std::uint64_t> ready;
  ready.set_value(0);  // their bytes were counted by whoever sent them
  const std::shared_future<std::uint64_t> done = ready.get_future().share();
  for (std::int64_t i = 0; i < v.toInt(); ++i) {
    const std::string key = in_flight_key(static_cast<std::size_t>(i));
    auto f = std::make_unique<InFlightFragment>();
    c10::IValue x;
    ar.read(key + "fragment", x);
    f->fragment = static_cast<int>(x.toInt());
    if (f->fragment < 0 || f->fragment >= schedule_.fragments())
      throw std::runtime_error("a fragment in flight is numbered " + std::to_string(f->fragment) +
                               ", but the job has " + std::to_string(schedule_.fragments()) +
                               " fragments");
    ar.read(key + "lands", x);
    f->lands = x.toInt();
    f->synced = ar.try_read(key + "synced", x) ? x.toInt() : -1;
    const std::int64_t size = fragment_size(f->fragment);
    for (std::size_t k = 0; k < replicas_.size(); ++k) {
      torch::Tensor t;
      ar.read(key + std::to_string(k), t);
      t = t.to(torch::kFloat32).contiguous();
      if (t.numel() != size)
        throw std::runtime_error("the average of fragment " + std::to_string(f->fragment) +
                                 " in flight holds " + std::to_string(t.numel()) +
                                 " values, not " + std::to_string(size));
      f->mean.emplace_back(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
      if (eager()) {
        // A fresh tensor: read() into a defined one set_()s it onto the archive's entry, which
        // `t` may still share (to() and contiguous() return it as it is).
        torch::Tensor p;
        ar.read(key + "provisional." + std::to_string(k), p);
        f->provisional.push_back(p.to(torch::kFloat32).contiguous());
      }
    }
    f->done = done;
    in_flight_.push_back(std::move(f));
  }
}

std::shared_ptr<PendingLandings> StreamingRound::await_landings() {
  auto landed = std::make_shared<PendingLandings>(in_flight_.size());
  for (std::size_t i = 0; i < in_flight_.size(); ++i) {
    InFlightFragment& f = *in_flight_[i];
    if (f.checkpoint) f.checkpoint->abandon("a later checkpoint was asked for first");
    f.checkpoint = landed;
    f.checkpoint_index = i;
  }
  return landed;
}

void StreamingRound::write_provisionals(torch::serialize::OutputArchive& ar) const {
  if (!eager()) return;
  for (std::size_t i = 0; i < in_flight_.size(); ++i)
    for (std::size_t k = 0; k < in_flight_[i]->provisional.size(); ++k)
      ar.write(in_flight_key(i) + "provisional." + std::to_string(k),
               in_flight_[i]->provisional[k]);
}

void StreamingRound::read_provisionals(torch::serialize::InputArchive& ar) {
  if (!eager()) return;
  for (std::size_t i = 0; i < in_flight_.size(); ++i)
    for (std::size_t k = 0; k < replicas_.size(); ++k) {
      torch::Tensor t;
      if (!ar.try_read(in_flight_key(i) + "provisional." + std::to_string(k), t)) continue;
      const auto n = replicas_[k].outer->theta().numel();
      if (t.numel() != n)
        throw std::runtime_error("the inner state's provisional θ " + std::to_string(i) +
                                 " has " + std::to_string(t.numel()) + " values, θ has " +
                                 std::to_string(n));
      in_flight_[i]->provisional[k] = t.to(torch::kFloat32).contiguous();
    }
}

}  // namespace loco::diloco
