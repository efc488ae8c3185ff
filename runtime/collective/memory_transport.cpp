#include "runtime/collective/memory_transport.hpp"

#include <algorithm>

namespace loco::collective::detail {

MemoryTransport::MemoryTransport(std::shared_ptr<MemoryHub> hub, std::string endpoint)
    : hub_(std::move(hub)), endpoint_(std::move(endpoint)) {
  std::lock_guard lock(hub_->m_);
  if (!hub_->members_.emplace(endpoint_, MemoryHub::Inbox{}).second)
    throw CollectiveError("collective: memory endpoint " + endpoint_ + " is taken");
}

MemoryTransport::~MemoryTransport() { close(); }

void MemoryTransport::close() {
  std::lock_guard lock(hub_->m_);
  if (!open_) return;
  open_ = false;
  hub_->members_.erase(endpoint_);
  for (auto& [ep, inbox] : hub_->members_) {
    if (inbox.connected.count(endpoint_)) inbox.events[endpoint_] = PeerEvent::closed;
    // What it sent and nobody read yet stays: a process's last messages outlive it.
  }
  hub_->cv_.notify_all();
}

void MemoryTransport::keep_only(std::span<const std::string> peers, std::chrono::milliseconds) {
  std::lock_guard lock(hub_->m_);
  auto self = hub_->members_.find(endpoint_);
  if (self == hub_->members_.end()) return;
  self->second.connected = std::set<std::string>(peers.begin(), peers.end());
}

bool MemoryTransport::room_locked(const std::string& peer, Channel channel) {
  auto it = hub_->members_.find(peer);
  if (it == hub_->members_.end()) return true;  // taken and lost, as by a socket to a dead peer
  const size_t limit = channel == Channel::data ? hub_->data_queue_ : 64;
  return it->second.queued[{endpoint_, channel}] < limit;
}

bool MemoryTransport::try_send(const std::string& peer, Channel channel, const Header& header,
                               const std::string& sender, Buffer payload) {
  std::lock_guard lock(hub_->m_);
  auto self = hub_->members_.find(endpoint_);
  if (self == hub_->members_.end()) return true;  // closed: nothing leaves any more
  self->second.connected.insert(peer);
  if (!room_locked(peer, channel)) return false;
  auto it = hub_->members_.find(peer);
  if (it == hub_->members_.end()) return true;
  ++it->second.queued[{endpoint_, channel}];
  const Clock::time_point now = Clock::now();
  Clock::time_point begins = now, at = now;
  if (channel == Channel::data && hub_->data_latency_ > Clock::duration::zero()) {
    Clock::time_point& free_at = it->second.data_free_at[endpoint_];
    begins = std::max(now, free_at);
    at = begins + (payload.size > 0 ? hub_->data_latency_ : Clock::duration::zero());
    free_at = at;
  } else if (channel == Channel::control) {
    at = begins = now + hub_->control_latency_;  // held back, then there at once
  }
  uint64_t& link = it->second.links[{endpoint_, channel}];
  if (link == 0) {
    link = hub_->links_.size() + 1;
    hub_->links_[link] = MemoryHub::Link{peer, endpoint_, channel};
  }
  const size_t bytes = sizeof header + sender.size() + payload.size;
  Message m{header, sender, std::move(payload), link};
  it->second.messages.push_back({std::move(m), endpoint_, channel, begins, at, bytes});
  hub_->cv_.notify_all();
  return true;
}

bool MemoryTransport::try_receive(Message& out) {
  std::lock_guard lock(hub_->m_);
  auto self = hub_->members_.find(endpoint_);
  if (self == hub_->members_.end()) return false;
  // Arrival order; a data message still on its slow link lets later control messages pass.
  auto& box = self->second.messages;
  const auto now = Clock::now();
  auto q = std::find_if(box.begin(), box.end(),
                        [&](const MemoryHub::Queued& m) { return m.visible_at <= now; });
  if (q == box.end()) return false;
  out = std::move(q->message);
  --self->second.queued[{q->from, q->channel}];
  hub_->links_[out.link].read += q->bytes;
  box.erase(q);
  hub_->cv_.notify_all();
  return true;
}

uint64_t MemoryTransport::link_bytes(uint64_t link) {
  std::lock_guard lock(hub_->m_);
  auto l = hub_->links_.find(link);
  if (l == hub_->links_.end() || l->second.to != endpoint_) return 0;
  auto self = hub_->members_.find(endpoint_);
  if (self == hub_->members_.end() || !hub_->members_.count(l->second.from)) return 0;
  uint64_t total = l->second.read;
  const auto now = Clock::now();
  for (const MemoryHub::Queued& q : self->second.messages) {
    if (q.from != l->second.from || q.channel != l->second.channel || now <= q.begins_at) continue;
    if (now >= q.visible_at) {
      total += q.bytes;
    } else {
      const double f = std::chrono::duration<double>(now - q.begins_at) /
                       std::chrono::duration<double>(q.visible_at - q.begins_at);
      total += static_cast<uint64_t>(f * static_cast<double>(q.bytes));
    }
  }
  return total;
}

PeerEvent MemoryTransport::take_event(const std::string& peer) {
  std::lock_guard lock(hub_->m_);
  auto self = hub_->members_.find(endpoint_);
  if (self == hub_->members_.end()) return PeerEvent::none;
  auto it = self->second.events.find(peer);
  if (it == self->second.events.end()) {
    // Like a socket's reconnection attempts, a peer that is not there refuses again and again.
    bool absent = self->second.connected.count(peer) && !hub_->members_.count(peer);
    return absent ? PeerEvent::refused : PeerEvent::none;
  }
  PeerEvent e = it->second;
  self->second.events.erase(it);
  return e;
}

void MemoryTransport::wait(std::span<const std::string> writable, std::chrono::milliseconds limit) {
  std::unique_lock lock(hub_->m_);
  Clock::time_point until = Clock::now() + limit;
  auto self = hub_->members_.find(endpoint_);
  if (self != hub_->members_.end()) {
    for (const MemoryHub::Queued& q : self->second.messages) until = std::min(until, q.visible_at);
  }
  hub_->cv_.wait_until(lock, until, [&] {
    auto self = hub_->members_.find(endpoint_);
    if (self == hub_->members_.end()) return true;
    const auto now = Clock::now();
    if (!self->second.events.empty()) return true;
    for (const MemoryHub::Queued& q : self->second.messages)
      if (q.visible_at <= now) return true;
    return std::any_of(writable.begin(), writable.end(),
                       [&](const std::string& p) { return room_locked(p, Channel::data); });
  });
}

void MemoryTransport::drop_all() {
  std::lock_guard lock(hub_->m_);
  // What this member queued for others and they have not read is dropped, as closing a socket
  // with linger 0 drops it.
  for (auto& member : hub_->members_) {
    if (member.first == endpoint_) continue;
    MemoryHub::Inbox& inbox = member.second;  // clang 14 cannot capture a structured binding
    std::erase_if(inbox.messages, [&](const MemoryHub::Queued& q) {
      if (q.from != endpoint_) return false;
      --inbox.queued[{q.from, q.channel}];
      return true;
    });
  }
  auto self = hub_->members_.find(endpoint_);
  if (self != hub_->members_.end()) self->second.connected.clear();
  hub_->cv_.notify_all();
}

}  // namespace loco::collective::detail
