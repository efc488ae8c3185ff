#include "actors/stream_group.hpp"

namespace loco::actors {

std::vector<std::string> CommMembers::names() const { return names_of(group_); }

namespace {

// `group` under `round_id`, one of the exchanges of its operation.
collective::Group with_phases(const collective::Group& group, std::uint64_t round_id) {
  collective::Group g = group;
  g.round_id = round_id;
  g.first_phase = diloco::plan_round(diloco::op_of_round(round_id));
  g.last_phase = diloco::data_round(diloco::op_of_round(round_id));
  return g;
}

}  // namespace

std::uint64_t CommMembers::allgather(std::uint64_t round_id,
                                     std::span<const std::vector<std::uint8_t>> mine,
                                     std::size_t max_bytes,
                                     std::vector<std::vector<std::uint8_t>>& all) {
  if (mine.size() != 1) throw std::logic_error("CommMembers: one local member per worker");
  collective::Group g = with_phases(group_, round_id);
  comm_.options().codec = collective::Codec::fp32;
  all = comm_.allgather(g, mine[0], max_bytes);
  return comm_.last_stats().bytes_sent;
}

std::uint64_t CommMembers::allreduce(std::uint64_t round_id, collective::Codec codec,
                                     std::span<const std::span<const float>> in,
                                     std::span<const std::span<float>> out,
                                     std::span<const std::uint8_t> left_out) {
  if (in.size() != 1 || out.size() != 1)
    throw std::logic_error("CommMembers: one local member per worker");
  collective::Group g = with_phases(group_, round_id);
  g.left_out.assign(left_out.begin(), left_out.end());
  comm_.options().codec = codec;
  if (in[0].data() == out[0].data())
    comm_.allreduce(g, out[0]);
  else
    comm_.allreduce(g, in[0], out[0]);
  return comm_.last_stats().bytes_sent;
}

std::shared_ptr<StreamGroup> StreamGroup::of(const StreamRequest& req, std::optional<uint64_t> first,
                                         collective::RelayEndpoint relay) {
  auto g = std::make_shared<StreamGroup>();
  g->relay = std::move(relay);
  for (size_t i = 0; i < req.names.size(); ++i) {
    g->members.push_back(collective::member_at(req.names[i], req.endpoints[i][0]));
    g->from_op.push_back(0);
  }
  g->self = req.names[size_t(req.rank)];
  if (first) {
    g->zero_member = g->self;
    g->zero_op = *first;
  }
  return g;
}

collective::Group StreamGroup::at(uint64_t op) {
  std::lock_guard<std::mutex> lock(mu);
  collective::Group g;
  g.round_id = op;
  g.relay = relay;
  for (size_t i = 0; i < members.size(); ++i) {
    if (from_op[i] > op) continue;
    if (members[i].name == self) g.rank = int(g.members.size());
    g.members.push_back(members[i]);
  }
  return g;
}

std::vector<std::string> StreamGroup::names() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::string> out;
  for (const auto& m : members) out.push_back(m.name);
  return out;
}

void StreamGroup::add(const std::string& name, const std::string& endpoint, uint64_t op) {
  std::lock_guard<std::mutex> lock(mu);
  members.push_back(collective::member_at(name, endpoint));
  from_op.push_back(op);
  zero_member = name;
  zero_op = op;
}

void StreamGroup::leave_out_zero(collective::Group& g, uint64_t op) {
  std::lock_guard<std::mutex> lock(mu);
  if (op != zero_op || zero_member.empty()) return;
  for (size_t i = 0; i < g.members.size(); ++i)
    if (g.members[i].name == zero_member) {
      g.left_out.resize(g.members.size(), 0);
      g.left_out[i] = 1;
    }
}

float StreamGroup::weight_correction(const collective::Group& g) {
  std::lock_guard<std::mutex> lock(mu);
  if (g.round_id != zero_op || g.members.size() < 2) return 1.0f;
  for (const auto& m : g.members)
    if (m.name == zero_member)
      return float(g.members.size()) / float(g.members.size() - 1);
  return 1.0f;
}

std::vector<std::string> StreamGroup::names_as_landed(uint64_t last_landed) {
  std::vector<std::string> out = names();
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [name, op] : dropped)
    if (op > last_landed) out.push_back(name);
  return out;
}

bool StreamGroup::drop(const std::string& lost, const collective::Group& tried) {
  std::lock_guard<std::mutex> lock(mu);
  if (lost.empty() || lost == self) return false;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].name == lost) {
      members.erase(members.begin() + std::ptrdiff_t(i));
      from_op.erase(from_op.begin() + std::ptrdiff_t(i));
      dropped.emplace_back(lost, tried.round_id);
      break;
    }
  size_t now = 0;
  for (uint64_t f : from_op) now += f <= tried.round_id ? 1 : 0;
  return now < tried.members.size();  // dropped here, or by another fragment meanwhile
}

JoinDesk::Open JoinDesk::open(int64_t r, int64_t at) {
  std::lock_guard<std::mutex> lock(mu);
  forget();
  admit.reset();
  round = r;
  reached = at;
  return Open{*this};
}

void JoinDesk::forget() {  // with the lock held
  snapshot.reset();
  snapshot_round = snapshot_step = -1;
  landed.clear();
  landed_floats = 0;
  wanted = false;
}

}  // namespace loco::actors
