// The head: places actors on nodes, keeps the actor and node tables in the
// store, decides which nodes are dead and restarts their actors. It holds no
// state of its own that is not in the store, so a restarted head resumes.
#include <spdlog/spdlog.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <set>
#include <thread>

#include "runtime/core/actor.hpp"
#include "runtime/core/core.hpp"
#include "runtime/core/decisions.hpp"
#include "runtime/core/server.hpp"
#include "runtime/core/wire.hpp"
#include "runtime/membership/store.hpp"
#include "runtime/security/curve.hpp"

namespace loco {
namespace {

template <class T>
std::string pack_str(const T& v) {
  msgpack::sbuffer b;
  msgpack::pack(b, v);
  return std::string(b.data(), b.size());
}

template <class T>
T unpack_str(const std::string& s) {
  return detail::unpack_bounded(s.data(), s.size(), "a record in the store").get().as<T>();
}

// Refuses a field over its bound before it reaches the store.
void check_size(const char* field, size_t bytes, size_t limit) {
  if (std::string over = size_over(field, bytes, limit); !over.empty()) throw ClusterError(over);
}

// Whether a TCP connection to "tcp://HOST:PORT" opens within timeout_ms (closed at once: the
// relay's handshake deadline drops such a connection; it holds nothing).
bool tcp_opens(const std::string& endpoint, int timeout_ms) {
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.rfind(kTcp, 0) != 0) return false;
  const std::string rest = endpoint.substr(kTcp.size());
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(rest.substr(0, colon).c_str(), rest.substr(colon + 1).c_str(), &hints,
                    &found) != 0)
    return false;
  bool opened = false;
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      opened = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      opened = ::poll(&p, 1, timeout_ms) == 1 &&
               ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return opened;
}

// The relay as the head sees it: a TCP connection tried every kRelayProbeMs from a thread of
// its own (the head never waits on it). Its outages go into every running job, as the head's
// restarts do; the soak bench (issue 25) restarts it and checks that they are there.
struct RelayWatch {
  std::atomic<bool> busy{false};
  std::atomic<int> up{-1};  // -1: not probed yet
};
constexpr int64_t kRelayProbeMs = 500;
constexpr int kRelayProbeTimeoutMs = 400;

// Runs on the head's thread once a node has answered create_actor: the actor as recorded
// then (alive, restarting or dead) and, when it failed, the error's type and message.
using Started = std::function<void(const ActorInfo& info, const std::string& error_type,
                                   const std::string& error)>;

struct Creation {
  uint64_t seq = 0;
  std::string node_id, address;
  int64_t sent_ms = 0;
  bool restart = false;
  Started done;
};

// A node that has not answered create_actor in this long while still heartbeating: the
// actor is recorded dead (a constructor that loads LibTorch takes seconds, not minutes).
constexpr int64_t kCreateTimeoutMs = 60000;
// Two nodes lost within this while creating the same actor: the actor is not placed again.
constexpr int64_t kCreationLossWindowMs = 120000;
// Actors a tick starts or declares dead at most; the others wait for the next tick.
constexpr int64_t kMaxStartsPerTick = 64;

// How long the head waits for a joining node to answer its probe, and how many probes run at
// once (each on a thread of its own, never the head's).
constexpr int64_t kProbeTimeoutMs = 2000;
constexpr int kMaxProbes = 64;

// Whether a ping sent on a fresh connection to `address` ("HOST:PORT") is answered within
// `timeout_ms`: the handshake (CURVE with `security`) and the node's I/O thread both work.
// Blocks up to the timeout: run off the head's thread.
bool answers_ping(const std::string& address, const security::Settings& security,
                  int64_t timeout_ms) {
  try {
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    security::make_client(s, security);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(detail::kMaxEnvelopeBytes));
    s.connect("tcp://" + address);
    detail::Envelope ping;
    ping.kind = static_cast<uint8_t>(detail::Kind::Ping);
    ping.corr = 1;
    ping.sender = "head (probe)";
    auto frames = detail::encode(ping);
    for (size_t i = 0; i < frames.size(); ++i)
      s.send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    const int64_t deadline = now_ms() + timeout_ms;
    for (int64_t left = timeout_ms; left > 0; left = deadline - now_ms()) {
      zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, Millis(left));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> got;
      while (true) {
        zmq::message_t m;
        if (!s.recv(m, zmq::recv_flags::dontwait)) break;
        const bool more = m.more();
        if (got.size() < 8) got.push_back(std::move(m));
        if (!more) break;
      }
      try {
        if (detail::decode(std::move(got), detail::kMaxEnvelopeBytes).env.k() == detail::Kind::Pong)
          return true;
      } catch (const ProtocolError&) {
        return false;  // something answers there, not a node of ours
      }
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("head: probe of {}: {}", escape_remote(address), e.what());
  }
  return false;
}

// "HOST:PORT" with a numeric port, at most 256 bytes: what a node may ask the head to dial.
bool plausible_address(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (a.size() > 256 || colon == std::string::npos || colon == 0 || colon + 1 == a.size() ||
      colon + 6 < a.size())
    return false;
  for (size_t i = colon + 1; i < a.size(); ++i)
    if (a[i] < '0' || a[i] > '9') return false;
  for (char c : a)
    if (c == '/' || c <= ' ' || c > '~') return false;
  return std::stoi(a.substr(colon + 1)) > 0 && std::stoi(a.substr(colon + 1)) < 65536;
}

class HeadService {
 public:
  HeadService(HeadConfig cfg, std::shared_ptr<membership::Store> store, std::string address)
      : cfg_(std::move(cfg)),
        store_(std::move(store)),
        address_(std::move(address)),
        detector_(cfg_.detect_ms) {}

  // Nodes learn where Redis is (with its password); a client learns only the timings.
  ClusterInfo hello() const {
    const bool member = detail::current_caller().member();
    return ClusterInfo{member ? cfg_.redis_url : std::string(), cfg_.detect_ms,
                       std::max<int64_t>(20, cfg_.detect_ms / 5),
                       member ? cfg_.relay : RelayInfo{}};
  }

  // A joining node asks whether the head reaches it at the address it announces. Answered once
  // a probe has tried (at most kProbeTimeoutMs), from the probe's own thread: the head never
  // waits on a node. `direct` when the node answered a ping on a fresh connection, `reverse`
  // when not (the node is then reached over the connection it opened: Core::attach_as).
  Reachability reachability(std::string node_id, std::string address) {
    if (!plausible_address(address))
      throw ClusterError("reachability: '" + escape_remote(address, 64) +
                         "' is not a HOST:PORT the head can dial");
    if (probes_->fetch_add(1) >= kMaxProbes) {
      probes_->fetch_sub(1);
      throw ClusterError("reachability: the head is probing " + std::to_string(kMaxProbes) +
                         " nodes already; try again");
    }
    auto reply = detail::defer_reply();
    try {
      // Owns what it uses: the head may stop while a probe runs.
      std::thread([probes = probes_, security = cfg_.security, reply,
                   node_id = escape_remote(node_id, 64), address] {
        const bool direct = answers_ping(address, security, kProbeTimeoutMs);
        probes->fetch_sub(1);
        spdlog::info("head: node {} at {}: {}", node_id, address,
                     direct ? "reached (direct)"
                            : "no answer within " + human_ms(kProbeTimeoutMs) +
                                  " (reverse: calls to it go through the head)");
        if (reply)
          reply->ok(detail::pack_payload(direct ? Reachability::direct : Reachability::reverse));
      }).detach();
    } catch (const std::system_error& e) {
      probes_->fetch_sub(1);
      throw ClusterError(std::string("reachability: cannot start a probe: ") + e.what());
    }
    return Reachability::direct;  // dropped: the probe answers
  }

  ActorInfo spawn(SpawnRequest req) {
    // The runtime's own classes are hosted by the head and the nodes, never spawned.
    if (req.class_name.rfind("loco.", 0) == 0)
      throw PermissionError("spawn: " + escape_remote(req.class_name, 64) +
                            " is one of the runtime's own classes; it cannot be spawned");
    // Answered once the node has created the actor (or failed to): the head does not wait.
    auto reply = detail::defer_reply();
    with_store([&] {
      Owner whose = owner_of_caller();
      // Actors named "<job id>.<...>" are the job's: nobody outside the job places one there.
      if (auto dot = req.name.find('.'); dot != std::string::npos) {
        const std::string job = req.name.substr(0, dot);
        if (job != whose.job && store_->hget(keys::kJobs, job))
          throw PermissionError("spawn: the name " + escape_remote(req.name, 64) +
                                " is under job " + job +
                                ", whose actors only the job itself starts");
      }
      return spawn_impl(std::move(req), whose,
                        [reply](const ActorInfo& info, const std::string& type,
                                const std::string& error) {
                          if (!reply) return;
                          if (info.state == ActorState::dead)
                            reply->error(type.empty() ? "ClusterError" : type,
                                         reply->what() + ": " + error);
                          else
                            reply->ok(detail::pack_payload(info));  // alive, or restarting
                        });
    });
    return {};
  }

  // Whose a new actor is, from who asks (never from the request): a client's own (no job); an
  // actor's, its job and owner (the head's record of the calling actor); the operator's else.
  struct Owner {
    std::string job, key, name;
    bool client = false;  // a client asks: only classes a node lets clients spawn
  };
  Owner owner_of_caller() {
    const detail::CallerInfo& c = detail::current_caller();
    if (!c.member()) return Owner{"", c.who.key, c.who.name, true};
    if (c.from_actor && !c.sender.empty())
      if (auto rec = actor(c.sender)) return Owner{rec->info.job, rec->info.owner, rec->info.owner_name};
    return Owner{};
  }

  // Whether `job_id` names a job that has ended (or left the store): a finished job holds
  // nothing, so it starts no actor, and none of its actors is restarted or created again
  // (issue "21 ·", finding 7: a cancelled job's aggregator spawned a worker 4 s after the
  // cancel, and the head restarted such workers when their nodes died). A job runs from its
  // submission, before its entry actor is spawned.
  bool job_over(const std::string& job_id) {
    return !job_id.empty() && !jobs_index().running.count(job_id);
  }

  // Refuses `what` on job `job` unless the caller may act on it: its owner's key, an admin's, or
  // a member. Names the job and its owner, never the owner's key.
  void check_owner(const JobInfo& job, const std::string& what) {
    const auto& who = detail::current_caller().who;
    if (who.may_act_on(job.owner)) return;
    throw PermissionError(what + ": job " + job.id + " belongs to " + owner_label(job.owner_name, job.owner) +
                          "; only its owner or an admin may " + what + " it, not " + who.name);
  }
  static std::string owner_label(const std::string& name, const std::string& key) {
    return key.empty() ? std::string("the cluster's operator") : name;
  }

  // Places the actor and asks its node to create it; `done` runs when the node has answered.
  // Returns the new actor's id.
  std::string spawn_impl(SpawnRequest req, const Owner& whose, Started done) {
    // Sizes and numbers before the store is touched; resource names once the nodes are read.
    if (std::string bad = check_spawn_request(req, nullptr); !bad.empty())
      throw ClusterError("spawn: " + bad);
    guard_store();
    auto nodes = live_nodes();
    if (std::string bad = check_resources(req.resources, declared_resources(nodes)); !bad.empty())
      throw ClusterError("spawn: " + bad);
    if (!req.name.empty()) {
      if (auto id = store_->hget(keys::kNames, req.name)) {
        if (auto rec = actor(*id); rec && rec->info.state != ActorState::dead)
          throw ClusterError("an actor named '" + req.name + "' already exists (" + *id + ", " +
                             to_string(rec->info.state) + ")");
      }
    }
    ActorRecord rec;
    rec.info.id = random_id("a");
    rec.info.name = req.name;
    rec.info.class_name = req.class_name;
    rec.info.max_restarts = req.max_restarts;
    rec.info.resources = req.resources.empty() ? Resources{{"cpu", 1}} : req.resources;
    rec.info.share_gpus = req.share_gpus;
    rec.info.job = whose.job;
    if (job_over(whose.job))
      throw ClusterError("spawn: job " + whose.job + " has ended; it starts no more actors");
    rec.info.owner = whose.key;
    rec.info.owner_name = whose.key.empty() ? std::string() : whose.name;
    rec.ctor_args = req.ctor_args;
    std::vector<NodeView> placement = views(nodes);
    // A client's own actor goes only where a node lets clients spawn its class.
    if (whose.client) {
      std::erase_if(placement, [&](const NodeView& v) {
        return !class_matches(nodes.at(v.id).spawnable, req.class_name);
      });
      if (placement.empty())
        throw PermissionError("spawn: no node lets clients spawn " +
                              escape_remote(req.class_name, 64) +
                              " (a node's --spawnable names the classes users may spawn; jobs' "
                              "actors are started by the head for a submitted job)");
    }
    Placement where = place_on(placement, rec.info);
    if (!where.node)
      throw SchedulingError("cannot place " + describe(rec.info) + " needing " +
                            format_resources(rec.info.resources) +
                            (rec.info.share_gpus ? " (gpus shared)" : "") + ": " + where.reason);
    if (!req.name.empty()) store_->hput(keys::kNames, req.name, rec.info.id);
    const bool views_were_clean = !views_dirty_;
    start_on(rec, nodes.at(*where.node), where.gpus, false, std::move(done));
    if (views_were_clean) {
      occupy(views_cache_, rec.info);  // the only change since views() computed them
      views_dirty_ = false;
    }
    event({{"type", "spawn"},
           {"actor", rec.info.id},
           {"class", rec.info.class_name},
           {"node", rec.info.node_id}});
    return rec.info.id;
  }

  ActorInfo locate(std::string id) {
    return with_store([&] { return locate_impl(id); });
  }

  ActorInfo locate_impl(std::string id) {
    guard_store();
    auto rec = actor(id);
    if (!rec) throw ActorNotFoundError("no actor with id " + id);
    ActorInfo info = rec->info;
    // A node reached only through the head whose connection went silent is being lost: the
    // head forwards nothing to it, and it is declared dead (its actors restarted) a little
    // later, by the heartbeats in the store. Until then its actors are not callable, and a
    // handle waits for the outcome (Core::resolve), as it does for a listening node's.
    if (info.state == ActorState::alive && !through_head_node(info.address).empty() &&
        !detail::current_core()->forwards_to(info.node_id)) {
      info.state = ActorState::pending;
      info.reason = "its node " + info.node_id +
                    " is reached only through the head, whose connection to it is silent: "
                    "waiting for it to attach again or be declared dead";
    }
    return info;
  }

  ActorInfo lookup(std::string name) {
    return with_store([&] { return lookup_impl(name); });
  }

  ActorInfo lookup_impl(std::string name) {
    guard_store();
    auto id = store_->hget(keys::kNames, name);
    if (!id) throw ActorNotFoundError("no actor named '" + name + "'");
    return locate_impl(*id);
  }

  void kill(std::string id, bool allow_restart) {
    return with_store([&] { return kill_impl(id, allow_restart); });
  }

  void kill_impl(std::string id, bool allow_restart) {
    guard_store();
    auto rec = actor(id);
    if (!rec) throw ActorNotFoundError("no actor with id " + id);
    if (const auto& who = detail::current_caller().who; !who.may_act_on(rec->info.owner))
      throw PermissionError("kill: " + describe(rec->info) +
                            (rec->info.job.empty() ? "" : " of job " + rec->info.job) +
                            " belongs to " + owner_label(rec->info.owner_name, rec->info.owner) +
                            "; only its owner or an admin may kill it, not " + who.name);
    // One that is still being created is killed after its creation (the node handles both in
    // order); whoever waits on that creation learns the outcome below.
    Creation creating = take_creation(id);
    kill_on_node(*rec, "killed by request");
    if (allow_restart && rec->info.restarts < rec->info.max_restarts) {
      to_restart(*rec, "killed by request");
      auto nodes = live_nodes();
      auto placement = views(nodes);
      try_restart(*rec, nodes, placement);
    } else {
      rec->info.state = ActorState::dead;
      rec->info.reason = "killed by request";
      save(*rec);
    }
    report(creating, rec->info, "ActorDiedError", "killed by request");
  }

  ClusterStatus status() {
    return with_store([&] { return status_impl(StatusQuery{}); });
  }

  ClusterStatus status_query(StatusQuery q) {
    if (!q.state.empty()) (void)parse_actor_state(q.state);  // an unknown state is an error
    return with_store([&] { return status_impl(q); });
  }

  ClusterStatus status_impl(const StatusQuery& q) {
    guard_store();
    ClusterStatus st;
    st.head_address = address_;
    st.redis_url = membership::redact_url(cfg_.redis_url);
    std::map<std::string, NodeRecord> nodes = all_nodes();
    auto used = views_of(nodes, actors_index());
    size_t i = 0;
    const int64_t now = now_ms();
    for (auto& [id, n] : nodes) {
      NodeStatus ns{n, used[i++].used};
      if (auto h = detector_.health(id, now)) {
        ns.heartbeat_silent_ms = h->silent_ms;
        ns.heartbeat_late = h->late;
        ns.heartbeat_longest_ms = h->longest_ms;
      }
      st.nodes.push_back(std::move(ns));
    }
    for (auto& [id, a] : actors_index()) {
      if (!q.state.empty() && to_string(a.info.state) != q.state) continue;
      if (!q.node.empty() && a.info.node_id != q.node) continue;
      if (st.actors_total++ < q.offset) continue;
      if (q.limit == 0 || st.actors.size() < q.limit) st.actors.push_back(a.info);
    }
    for (auto& e : store_->read_last(keys::kEvents, 20)) {
      std::string line;
      for (auto& [k, v] : e.fields) line += (line.empty() ? "" : " ") + k + "=" + v;
      st.recent_events.push_back(line);
    }
    return st;
  }

  // Answered once the entry actor is created (or failed to be).
  JobInfo submit_job(JobSubmission sub) {
    auto reply = detail::defer_reply();
    return with_store([&] { return submit_job_impl(std::move(sub), reply); });
  }

  JobInfo submit_job_impl(JobSubmission sub, std::shared_ptr<detail::DeferredReply> reply) {
    guard_store();
    if (sub.entry_class.empty()) throw ClusterError("submit: the job names no entry actor class");
    check_size("submit: name", sub.name.size(), kMaxJobNameBytes);
    check_size("submit: entry_class", sub.entry_class.size(), kMaxJobNameBytes);
    check_size("submit: spec (the job file)", sub.spec.size(), kMaxJobSpecBytes);
    const auto& who = detail::current_caller().who;
    if (!who.member() && !class_matches(cfg_.job_entry_classes, sub.entry_class))
      throw PermissionError("submit: a client may run jobs of " +
                            (cfg_.job_entry_classes.empty()
                                 ? std::string("no entry class")
                                 : cfg_.job_entry_classes.front()) +
                            (cfg_.job_entry_classes.size() > 1 ? " (and the others the head allows)" : "") +
                            ", not " + escape_remote(sub.entry_class, 64));
    if (sub.max_workers < 0)
      throw ClusterError("submit: max_workers " + std::to_string(sub.max_workers) + " is negative");
    const std::string key = who.member() ? std::string() : who.key;
    // A submission seen before (a client's retry after a lost answer): its job, not a second.
    check_size("submit: submission_id", sub.submission_id.size(), kMaxJobNameBytes);
    const std::string once =
        sub.submission_id.empty() ? std::string() : keys::submission(key, sub.submission_id);
    if (!once.empty()) {
      if (auto seen = store_->get(once)) {
        spdlog::info("head: submission {} again: it started job {}",
                     escape_remote(sub.submission_id, 64), *seen);
        JobInfo earlier = job_record(*seen);
        if (earlier.state == JobState::failed)
          throw ClusterError("submit: this submission started job " + earlier.id +
                             ", which failed: " + earlier.message);
        if (reply) reply->ok(detail::pack_payload(earlier));
        return earlier;
      }
    }
    // Bounded per key before anything is stored: a refused submission leaves no record.
    int running = 0;
    for (const auto& [id, r] : jobs_index().running)
      if (r.owner == key) ++running;
    if (std::string why = limits_.admit(key, who.member() ? "the operator" : who.name, running,
                                        now_ms());
        !why.empty())
      throw ClusterError("submit: " + why);
    JobInfo job;
    job.id = random_id("job").substr(0, 16);
    job.name = sub.name.empty() ? job.id : sub.name;
    job.entry_class = sub.entry_class;
    job.state = JobState::running;
    job.submitted_unix_ms = unix_ms();
    job.owner = key;
    job.owner_name = key.empty() ? std::string() : who.name;
    job.max_workers = std::min(sub.max_workers > 0 ? sub.max_workers : cfg_.max_job_workers,
                               cfg_.max_job_workers);
    save_job(job);
    if (!once.empty())
      store_->put(once, job.id, std::chrono::milliseconds(std::max<int64_t>(
                                    cfg_.job_retention_ms, 600000)));
    SpawnRequest req;
    req.class_name = sub.entry_class;
    msgpack::sbuffer args;
    msgpack::pack(args, std::make_tuple(job.id, sub.spec));
    req.ctor_args = std::string(args.data(), args.size());
    req.name = job.id + ".entry";
    req.resources = sub.resources;
    req.max_restarts = sub.max_restarts;
    std::string job_id = job.id;
    auto started = [this, job_id, reply](const ActorInfo& info, const std::string& type,
                                         const std::string& error) {
      if (info.state == ActorState::dead) {
        JobInfo j = job_record(job_id);
        if (!j.finished()) finish(j, JobState::failed, "could not start the job: " + error);
        if (reply)
          reply->error(type.empty() ? "ClusterError" : type,
                       reply->what() + ": could not start the job: " + error);
      } else if (reply) {
        reply->ok(detail::pack_payload(job_record(job_id)));
      }
    };
    try {
      job.entry_actor = spawn_impl(req, Owner{job.id, job.owner, job.owner_name}, started);
    } catch (const std::exception& e) {
      finish(job, JobState::failed, std::string("could not start the job: ") + e.what());
      throw;
    }
    save_job(job);
    event({{"type", "job_submitted"}, {"job", job.id}, {"name", job.name}});
    return job;
  }

  // Called by a job's actors: appends to the job's event log.
  void job_event(std::string job_id, std::string kind, std::string data) {
    check_size("job_event: job id", job_id.size(), kMaxJobNameBytes);
    check_size("job_event: kind", kind.size(), kMaxJobNameBytes);
    check_size("job_event: data", data.size(), kMaxJobEventBytes);
    with_store([&] {
      const JobInfo job = job_record(job_id);
      check_author(job_id, "job_event");
      // A job's log ends with its end: what its actors say while they are being stopped
      // (cancelled, failed) would read as events of a job that is over.
      if (job.finished())
        throw ClusterError("job_event: job " + job_id + " has " + to_string(job.state) +
                           "; its log is closed");
      job_log(job_id, kind, data);
      return 0;
    });
  }

  // Called by the entry actor when the job ends.
  void job_finished(std::string job_id, JobState state, std::string message) {
    check_size("job_finished: job id", job_id.size(), kMaxJobNameBytes);
    check_size("job_finished: message", message.size(), kMaxJobEventBytes);
    with_store([&] {
      JobInfo job = job_record(job_id);
      check_author(job_id, "job_finished");
      if (!job.finished()) finish(job, state, message);
      return 0;
    });
  }

  JobEvents job_events(std::string job_id, std::string after, int max) {
    return with_store([&] {
      JobEvents out;
      out.job = job_record(job_id);
      check_owner(out.job, "read the log of");
      for (auto& e : store_->read(keys::job_events(job_id), after.empty() ? "0" : after,
                                  size_t(std::max(1, max)))) {
        JobEvent je;
        je.id = e.id;
        je.kind = e.fields["kind"];
        je.data = e.fields["data"];
        out.events.push_back(std::move(je));
      }
      return out;
    });
  }

  JobInfo job_info(std::string job_id) {
    return with_store([&] { return job_record(job_id); });
  }

  JobInfo scale_job(std::string job_id, int workers) {
    return with_store([&] {
      JobInfo job = job_record(job_id);
      check_owner(job, "scale");
      if (std::string bad = check_scale(workers, job.max_workers, cfg_.max_job_workers);
          !bad.empty())
        throw ClusterError("scale: job " + job_id + ": " + bad);
      if (job.finished())
        throw ClusterError("scale: job " + job_id + " has " + to_string(job.state) +
                           "; nothing to scale");
      job.scale = workers;
      save_job(job);
      job_log(job.id, "log", "scale: " + std::to_string(workers) + " workers requested");
      event({{"type", "job_scale"}, {"job", job.id}, {"workers", std::to_string(workers)}});
      return job;
    });
  }

  std::vector<JobInfo> list_jobs() {
    return with_store([&] {
      std::vector<JobInfo> out;
      for (auto& [id, v] : store_->hgetall(keys::kJobs)) out.push_back(unpack_str<JobInfo>(v));
      std::sort(out.begin(), out.end(),
                [](auto& a, auto& b) { return a.submitted_unix_ms < b.submitted_unix_ms; });
      return out;
    });
  }

  JobInfo cancel_job(std::string job_id) {
    return with_store([&] {
      JobInfo job = job_record(job_id);
      check_owner(job, "cancel");
      if (job.finished()) return job;
      kill_job_actors(job.id, "job cancelled");
      finish(job, JobState::cancelled, "cancelled by request");
      return job;
    });
  }

  // What a node answered to create_actor, posted by start_on's callback to the head's own
  // mailbox, so that it never races a request. An answer to a creation that was superseded (the
  // node was declared dead meanwhile, the actor killed) is dropped.
  void created(std::string id, uint64_t seq, std::string error_type, std::string error) {
    auto it = creating_.find(id);
    if (it == creating_.end() || it->second.seq != seq) return;
    Creation c = std::move(it->second);
    creating_.erase(it);
    try {
      auto rec = actor(id);
      if (!rec) return;
      if (!error_type.empty()) {
        start_failed(*rec, c, error_type, error);
        return;
      }
      rec->info.state = ActorState::alive;
      rec->info.reason.clear();
      save(*rec);
      if (c.restart) {
        event({{"type", "actor_restarted"}, {"actor", id}, {"node", rec->info.node_id}});
        spdlog::info("head: restarted {} on node {} (restart {}/{})", describe(rec->info),
                     rec->info.node_id, rec->info.restarts, rec->info.max_restarts);
      }
      report(c, rec->info, "", "");
    } catch (const membership::StoreError& e) {
      // The record stays pending: the next tick asks the node again (create_actor is
      // idempotent). Whoever waits learns that this attempt could not be recorded.
      mark_store_down();
      ActorInfo unknown;
      unknown.id = id;
      unknown.state = ActorState::dead;
      report(c, unknown, "ClusterError", std::string("the head cannot reach Redis: ") + e.what());
    }
  }

  // Posts a tick unless one is queued or running: a slow tick absorbs the next ones instead
  // of letting them pile up behind it.
  bool claim_tick() { return !tick_queued_.exchange(true); }

  // Runs every tick_ms on the head's own mailbox thread, so it never races a request.
  void tick() {
    struct Release {
      std::atomic<bool>& flag;
      ~Release() { flag = false; }
    } release{tick_queued_};
    int64_t now = now_ms();
    if (now >= next_release_ms_) {  // malloc's free pages back to the system (util.hpp)
      release_free_memory();
      next_release_ms_ = now + kReleaseMemoryMs;
    }
    try {
      auto nodes = all_nodes();
      if (store_was_down_) {
        spdlog::info("head: Redis at {} is reachable again",
                     membership::redact_url(cfg_.redis_url));
        detector_.grace(now);
        index_valid_ = false;  // read the actor table again: the store is the truth
        jobs_valid_ = false;
        store_was_down_ = false;
        char text[160];
        std::snprintf(text, sizeof text,
                      "the head's Redis is reachable again after %.1f s; the head read the "
                      "cluster's state from it again",
                      double(now - store_down_since_ms_) / 1000.0);
        note_running_jobs("redis", text);
        store_down_since_ms_ = 0;
      }
      watch_relay(now);
      if (!started_noted_) {
        // A head that starts while jobs run (one restarted after a crash) says so in them.
        int alive = 0;
        for (const auto& [id, n] : nodes) alive += n.state == NodeState::alive;
        note_running_jobs("head", "the head started; it read the cluster's state from Redis (" +
                                      std::to_string(alive) + " nodes alive)");
        started_noted_ = true;
      }
      watch_heartbeats(nodes, now);
      tend_actors(nodes, now);
      check_jobs(actors_index());
      expire_jobs();
      forget_the_dead(nodes, now);
    } catch (const membership::StoreUnavailable& e) {
      if (!store_was_down_) spdlog::warn("head: Redis unreachable, will retry: {}", e.what());
      mark_store_down();
      index_valid_ = false;
      jobs_valid_ = false;
    } catch (const std::exception& e) {
      spdlog::error("head: tick failed: {}", e.what());
    }
  }

 private:
  // The failure detector reads every live node's heartbeat; the nodes it finds silent for the
  // detection time are declared dead (in `nodes` too), and the head forwards to them no more.
  void watch_heartbeats(std::map<std::string, NodeRecord>& nodes, int64_t now) {
    for (auto& [id, n] : nodes) {
      if (n.state == NodeState::alive)
        detector_.observe(id, store_->get(keys::alive(id)), now);
      else
        detector_.forget(id);
    }
    for (auto& v : detector_.dead(now)) {
      auto it = nodes.find(v.node);
      if (it == nodes.end()) continue;
      NodeRecord& n = it->second;
      n.state = NodeState::dead;
      n.reason = v.reason;
      store_->hput(keys::kNodes, n.id, pack_str(n));
      detector_.forget(n.id);
      if (behind_nat(n.reachability))
        detail::current_core()->drop_route(n.id,
                                           "node " + n.id + " was declared dead: " + v.reason);
      event({{"type", "death"}, {"node", n.id}, {"reason", v.reason}});
      spdlog::warn("head: node {} ({}) {}: declared dead", n.id, n.address, v.reason);
    }
  }

  // Actors on nodes that are gone: restart (when allowed) or mark dead. Every start is
  // asynchronous; the tick only sends them, placing on views it updates as it goes.
  void tend_actors(const std::map<std::string, NodeRecord>& nodes, int64_t now) {
    std::map<std::string, NodeRecord> live;
    for (auto& [id, n] : nodes)
      if (n.state == NodeState::alive) live.emplace(id, n);
    // The cached views (a copy: the restarts below occupy it as they go), not views_of() over
    // the whole table, which would cost every tick the number of actors.
    auto placement = views(live);
    // The few actors that need work: not dead, and not simply alive on a live node. Only the
    // actors not dead are looked at: the dead ones wait for forget_the_dead.
    std::vector<std::string> todo;
    const auto& index = actors_index();
    for (const std::string& id : not_dead_) {
      auto r = index.find(id);
      if (r != index.end() &&
          (r->second.info.state != ActorState::alive || !live.count(r->second.info.node_id)))
        todo.push_back(id);
    }
    const uint64_t first_creation = creations_;
    int deaths = 0;
    for (const std::string& id : todo) {
      // Bounded work per tick: the rest waits for the next one, 100 ms later, so that a mass
      // failure never holds the head's thread (and every request) for long.
      if (int64_t(creations_ - first_creation) + deaths >= kMaxStartsPerTick) break;
      auto found = index_.find(id);
      if (found == index_.end()) continue;
      deaths += tend(found->second, nodes, live, placement, now) ? 1 : 0;
    }
  }

  // One actor that is not simply alive on a live node: its job over, restarting, being created,
  // or on a node that is gone. True when the actor died here.
  bool tend(ActorRecord rec, const std::map<std::string, NodeRecord>& nodes,
            const std::map<std::string, NodeRecord>& live, std::vector<NodeView>& placement,
            int64_t now) {
    const std::string& id = rec.info.id;
    if (job_over(rec.info.job)) {
      // Its job ended while it was being created, restarted or on a dying node.
      const std::string why = "its job " + rec.info.job + " has ended";
      end_actor(std::move(rec), why);
      return true;
    }
    if (rec.info.state == ActorState::restarting) {
      try_restart(rec, live, placement);
      return false;
    }
    auto n = nodes.find(rec.info.node_id);
    const bool node_alive = n != nodes.end() && n->second.state == NodeState::alive;
    if (rec.info.state == ActorState::pending) {
      auto c = creating_.find(id);
      if (c == creating_.end() && node_alive) {
        // The head restarted while the node was creating it: ask again (idempotent).
        start_on(rec, n->second, rec.info.gpus, rec.info.restarts > 0, nullptr);
        return false;
      }
      if (c != creating_.end() && node_alive) {
        if (now - c->second.sent_ms < kCreateTimeoutMs) return false;
        Creation late = take_creation(id);
        start_failed(rec, late, "TimeoutError",
                     "create_actor got no answer within " + human_ms(kCreateTimeoutMs));
        return false;
      }
      if (c != creating_.end()) {
        Creation lost = take_creation(id);
        start_failed(rec, lost, "ActorDiedError", "the node died or left");
        if (rec.info.state == ActorState::restarting) try_restart(rec, live, placement);
        return false;
      }
    }
    if (node_alive) return false;
    std::string why = n == nodes.end()
                          ? "its node is unknown"
                          : "node " + n->second.id + " (" + n->second.address + ") " +
                                (n->second.state == NodeState::left ? "left" : "died") +
                                (n->second.reason.empty() ? "" : ": " + n->second.reason);
    if (rec.info.restarts < rec.info.max_restarts) {
      to_restart(rec, why);
      try_restart(rec, live, placement);
      return false;
    }
    rec.info.state = ActorState::dead;
    rec.info.reason = why + (rec.info.max_restarts ? "; no restarts left" : "");
    save(rec);
    event({{"type", "actor_dead"}, {"actor", rec.info.id}, {"reason", rec.info.reason}});
    spdlog::warn("head: {} is dead: {}", describe(rec.info), rec.info.reason);
    return true;
  }

  // Writes through, as save() does: the store, then the job index.
  void save_job(const JobInfo& job) {
    store_->hput(keys::kJobs, job.id, pack_str(job));
    if (!jobs_valid_) return;
    index_job(jobs_, job);
  }
  struct JobsIndex {
    struct Running {
      std::string owner, entry_actor;
    };
    std::map<std::string, Running> running;  // by job id
    std::multimap<int64_t, std::string> ended;   // finished_unix_ms -> job id, for expiry
  };
  static void index_job(JobsIndex& ix, const JobInfo& job) {
    if (job.finished()) {
      if (ix.running.erase(job.id) || job.finished_unix_ms > 0)
        ix.ended.emplace(job.finished_unix_ms, job.id);
    } else {
      ix.running[job.id] = {job.owner, job.entry_actor};
    }
  }
  // Which jobs run and which ended when, held in memory so that no tick or submission reads the
  // whole job table: read from the store when the head starts and after the store was lost.
  const JobsIndex& jobs_index() {
    if (!jobs_valid_) {
      JobsIndex fresh;
      for (auto& [id, v] : store_->hgetall(keys::kJobs)) {
        JobInfo job = unpack_str<JobInfo>(v);
        index_job(fresh, job);
      }
      jobs_ = std::move(fresh);
      jobs_valid_ = true;
    }
    return jobs_;
  }
  // Finished jobs leave the store `job_retention_ms` after they ended (their folder keeps their
  // records): the table and its readers stay the size of recent work. Costs what expires.
  void expire_jobs() {
    (void)jobs_index();
    const int64_t cutoff = unix_ms() - cfg_.job_retention_ms;
    while (!jobs_.ended.empty() && jobs_.ended.begin()->first <= cutoff) {
      const std::string id = jobs_.ended.begin()->second;
      auto v = store_->hget(keys::kJobs, id);
      if (v && unpack_str<JobInfo>(*v).finished()) {
        store_->hdel(keys::kJobs, id);
        store_->erase(keys::job_events(id));
      }
      jobs_.ended.erase(jobs_.ended.begin());
    }
  }
  // A job's log and state are written only by its own actors (those the head created for it):
  // the call must come from one. The sender is the caller's word, believed because only members
  // reach an internal method.
  void check_author(const std::string& job_id, const char* what) {
    const std::string& sender = detail::current_caller().sender;
    auto rec = sender.empty() ? std::nullopt : actor(sender);
    if (!rec || rec->info.job != job_id)
      throw PermissionError(std::string(what) + ": job " + job_id +
                            " is written only by its own actors, and the call came from " +
                            (sender.empty() ? std::string("no actor") : escape_remote(sender, 64)) +
                            ", which is not one of them");
  }
  JobInfo job_record(const std::string& id) {
    auto v = store_->hget(keys::kJobs, id);
    if (!v) throw ClusterError("no job " + id);
    return unpack_str<JobInfo>(*v);
  }
  void job_log(const std::string& job_id, const std::string& kind, const std::string& data) {
    store_->append(keys::job_events(job_id), {{"kind", kind}, {"data", data}}, 100000);
  }
  // What happened to the cluster, in each running job's log ("cluster: ...") and as a "cluster"
  // record of its events ([text, what]: the dashboard's timeline; the aggregator puts it in the
  // round's metrics): a user reading one job sees the head's restarts and Redis's.
  void note_running_jobs(const std::string& what, const std::string& text) {
    for (const auto& [id, r] : jobs_index().running) {
      job_log(id, "log", "cluster: " + text);
      job_log(id, kClusterRecord, pack_str(std::make_tuple(text, what)));
    }
  }
  // Starts a probe of the relay every kRelayProbeMs and notes the running jobs when it goes
  // away and comes back (only once it was seen up: a relay the head cannot reach from where it
  // runs is not an outage).
  void watch_relay(int64_t now) {
    if (cfg_.relay.endpoint.empty()) return;
    const int up = relay_->up.load();
    if (up == 1 && relay_seen_up_ && relay_down_since_ms_ > 0) {
      char text[200];
      std::snprintf(text, sizeof text, "the relay at %s is reachable again after %.1f s",
                    cfg_.relay.endpoint.c_str(), double(now - relay_down_since_ms_) / 1000.0);
      note_running_jobs("relay", text);
      relay_down_since_ms_ = 0;
    } else if (up == 0 && relay_seen_up_ && relay_down_since_ms_ == 0) {
      relay_down_since_ms_ = now;
      note_running_jobs("relay", "the relay at " + cfg_.relay.endpoint +
                                     " does not accept connections from the head");
    }
    relay_seen_up_ = relay_seen_up_ || up == 1;
    if (now - relay_probed_ms_ < kRelayProbeMs || relay_->busy.exchange(true)) return;
    relay_probed_ms_ = now;
    try {
      std::thread([watch = relay_, endpoint = cfg_.relay.endpoint] {
        watch->up = tcp_opens(endpoint, kRelayProbeTimeoutMs) ? 1 : 0;
        watch->busy = false;
      }).detach();
    } catch (const std::system_error&) {
      relay_->busy = false;
    }
  }
  void mark_store_down() {
    if (!store_was_down_) store_down_since_ms_ = now_ms();
    store_was_down_ = true;
  }
  void finish(JobInfo& job, JobState state, const std::string& message) {
    job.state = state;
    job.message = message;
    job.finished_unix_ms = unix_ms();
    save_job(job);
    job_log(job.id, "log", "job " + to_string(state) + (message.empty() ? "" : ": " + message));
    event({{"type", "job_" + to_string(state)}, {"job", job.id}, {"message", message}});
    spdlog::info("head: job {} {}{}", job.id, to_string(state),
                 message.empty() ? "" : ": " + message);
    // A finished job holds nothing: the head never restarts its actors.
    kill_job_actors(job.id, "job " + to_string(state));
  }
  // Kills every live actor named "<job id>.*", without restarts.
  void kill_job_actors(const std::string& job_id, const std::string& why) {
    std::vector<std::string> ids;
    for (auto& [id, r] : actors_index())
      if ((r.info.job == job_id || r.info.name.rfind(job_id + ".", 0) == 0) &&
          r.info.state != ActorState::dead)
        ids.push_back(id);
    for (const std::string& id : ids) end_actor(index_.at(id), why);
  }
  // An actor of a job that has ended, dead for good: its node told to drop it (while it is
  // alive or being created there), and whoever waits on its creation answered.
  void end_actor(ActorRecord rec, const std::string& why) {
    Creation creating = take_creation(rec.info.id);
    kill_on_node(rec, why);
    rec.info.state = ActorState::dead;
    rec.info.reason = why;
    save(rec);
    report(creating, rec.info, "ActorDiedError", why);
  }
  // A running job whose entry actor is dead has failed. Looks at the running jobs only, in
  // memory; reads a job's record only when its entry actor is dead.
  void check_jobs(const std::map<std::string, ActorRecord>& actors) {
    std::vector<std::pair<std::string, const ActorInfo*>> failed;
    for (const auto& [id, r] : jobs_index().running) {
      auto it = actors.find(r.entry_actor);
      if (it != actors.end() && it->second.info.state == ActorState::dead)
        failed.emplace_back(id, &it->second.info);
    }
    for (const auto& [id, entry] : failed) {
      auto v = store_->hget(keys::kJobs, id);
      if (!v) {
        jobs_.running.erase(id);
        continue;
      }
      JobInfo job = unpack_str<JobInfo>(*v);
      if (!job.finished())
        finish(job, JobState::failed, "its " + entry->class_name + " died: " + entry->reason);
      else
        index_job(jobs_, job);
    }
  }

  // Requests that meet a lost Redis fail with a ClusterError that says so.
  template <class F>
  auto with_store(F f) -> decltype(f()) {
    try {
      return f();
    } catch (const membership::StoreError& e) {
      mark_store_down();
      index_valid_ = false;
      jobs_valid_ = false;
      throw ClusterError(std::string("the head cannot reach Redis: ") + e.what());
    }
  }

  static std::string describe(const ActorInfo& a) {
    return a.class_name + (a.name.empty() ? "" : " '" + a.name + "'") + " (" + a.id + ")";
  }

  void guard_store() {
    if (store_was_down_) {
      try {
        store_->ping();
      } catch (const membership::StoreError& e) {
        throw ClusterError(std::string("the head cannot reach Redis: ") + e.what());
      }
    }
  }

  void event(const std::map<std::string, std::string>& fields) {
    store_->append(keys::kEvents, fields);
  }

  // Writes through: the store first, then the index (a failed write leaves both as they were).
  void save(const ActorRecord& rec) {
    store_->hput(keys::kActors, rec.info.id, pack_str(rec));
    if (!index_valid_) return;
    auto& slot = index_[rec.info.id];
    // What the actor occupies changed: placement's cached views no longer hold.
    if (occupies(slot.info) != occupies(rec.info) ||
        (occupies(rec.info) &&
         (slot.info.node_id != rec.info.node_id || slot.info.gpus != rec.info.gpus)))
      views_dirty_ = true;
    slot = rec;
    if (rec.info.state == ActorState::dead) {
      mark_dead(rec.info.id, now_ms());
    } else {
      dead_since_.erase(rec.info.id);
      not_dead_.insert(rec.info.id);
    }
  }
  // Dead since `at` (kept if it already was): off the tick's list, on the forgetting queue.
  void mark_dead(const std::string& id, int64_t at) {
    not_dead_.erase(id);
    if (dead_since_.emplace(id, at).second) dead_queue_.emplace(at, id);
  }

  // The actor table, held in memory so that no request or tick decodes it all: read from the
  // store when the head starts and again after the store was lost (the store is the truth).
  const std::map<std::string, ActorRecord>& actors_index() {
    if (!index_valid_) {
      std::map<std::string, ActorRecord> fresh;
      for (auto& [id, v] : store_->hgetall(keys::kActors)) fresh[id] = unpack_str<ActorRecord>(v);
      index_.swap(fresh);
      int64_t now = now_ms();
      std::map<std::string, int64_t> was;
      was.swap(dead_since_);
      dead_queue_.clear();
      not_dead_.clear();
      for (auto& [id, r] : index_) {
        if (r.info.state != ActorState::dead) {
          not_dead_.insert(id);
          continue;
        }
        auto since = was.find(id);
        mark_dead(id, since == was.end() ? now : since->second);
      }
      index_valid_ = true;
      views_dirty_ = true;
    }
    return index_;
  }
  std::optional<ActorRecord> actor(const std::string& id) {
    auto& index = actors_index();
    auto it = index.find(id);
    if (it == index.end()) return std::nullopt;
    return it->second;
  }

  // Dead actors, and nodes dead or gone, are forgotten `retention_ms` after the head saw them so
  // (by its own clock; a restarted head starts counting again): the tables and every pass over
  // them stay the size of the live cluster.
  void forget_the_dead(const std::map<std::string, NodeRecord>& nodes, int64_t now) {
    const int64_t keep = cfg_.retention_ms;
    // In the order they died: each tick costs what it forgets, not what it keeps.
    while (!dead_queue_.empty() && now - dead_queue_.begin()->first >= keep) {
      const auto [at, id] = *dead_queue_.begin();
      dead_queue_.erase(dead_queue_.begin());
      auto since = dead_since_.find(id);
      if (since == dead_since_.end() || since->second != at) continue;  // came back since
      dead_since_.erase(since);
      auto rec = index_.find(id);
      if (rec == index_.end()) continue;
      const std::string& name = rec->second.info.name;
      if (!name.empty() && store_->hget(keys::kNames, name) == id) store_->hdel(keys::kNames, name);
      store_->hdel(keys::kActors, id);
      index_.erase(rec);
    }
    for (auto& [id, n] : nodes) {
      if (n.state == NodeState::alive) {
        node_gone_since_.erase(id);
        continue;
      }
      auto [it, fresh] = node_gone_since_.emplace(id, now);
      if (fresh || now - it->second < keep) continue;
      store_->hdel(keys::kNodes, id);
      store_->erase(keys::alive(id));
      node_gone_since_.erase(it);
    }
    std::erase_if(node_gone_since_, [&](auto& kv) { return !nodes.count(kv.first); });
  }
  std::map<std::string, NodeRecord> all_nodes() {
    std::map<std::string, NodeRecord> out;
    for (auto& [id, v] : store_->hgetall(keys::kNodes)) out[id] = unpack_str<NodeRecord>(v);
    return out;
  }
  std::optional<NodeRecord> node_record(const std::string& id) {
    auto v = store_->hget(keys::kNodes, id);
    if (!v) return std::nullopt;
    return unpack_str<NodeRecord>(*v);
  }
  std::map<std::string, NodeRecord> live_nodes() {
    auto nodes = all_nodes();
    std::erase_if(nodes, [](auto& kv) { return kv.second.state != NodeState::alive; });
    return nodes;
  }
  // The resource names the nodes declare (besides the builtin ones).
  static std::set<std::string> declared_resources(const std::map<std::string, NodeRecord>& nodes) {
    std::set<std::string> out;
    for (const auto& [id, n] : nodes)
      for (const auto& [name, amount] : n.resources) out.insert(name);
    return out;
  }
  static bool occupies(const ActorInfo& a) {
    return a.state == ActorState::alive || a.state == ActorState::pending;
  }
  // Placement's view of `nodes`, computed from the whole index only when what actors occupy
  // changed other than by the spawns that update it themselves (spawn_impl): a spawn costs
  // the number of nodes, not of actors.
  std::vector<NodeView> views(const std::map<std::string, NodeRecord>& nodes) {
    std::set<std::string> ids;
    for (auto& [id, n] : nodes) ids.insert(id);
    const auto& index = actors_index();
    if (views_dirty_ || ids != views_nodes_) {
      views_cache_ = views_of(nodes, index);
      views_nodes_ = std::move(ids);
      views_dirty_ = false;
    }
    return views_cache_;
  }
  static std::vector<NodeView> views_of(const std::map<std::string, NodeRecord>& nodes,
                                        const std::map<std::string, ActorRecord>& actors) {
    std::vector<NodeRecord> ns;
    for (auto& [id, n] : nodes) ns.push_back(n);
    std::vector<ActorInfo> infos;  // only those that occupy one of `nodes`
    for (auto& [id, a] : actors)
      if ((a.info.state == ActorState::alive || a.info.state == ActorState::pending) &&
          nodes.count(a.info.node_id))
        infos.push_back(a.info);
    return node_views(ns, infos);
  }

  // The node's built-in service, at a known address.
  static std::shared_ptr<detail::ActorRef> node_ref(const NodeRecord& node) {
    auto ref = std::make_shared<detail::ActorRef>();
    ref->id = "@node";
    ref->class_name = "node";
    ref->fixed = true;
    ref->address = call_address(node);  // "head/<id>" for a node reached through the head
    ref->node_id = node.id;
    return ref;
  }

  // Tells the node of a live (or starting) actor to kill it; the calls the head forwards to it
  // (a node behind NAT) fail at once instead of waiting for the node's answers.
  void kill_on_node(const ActorRecord& rec, const std::string& why) {
    if (rec.info.state != ActorState::alive && rec.info.state != ActorState::pending) return;
    auto node = node_record(rec.info.node_id);
    if (!node) return;
    tell_node(*node, "kill_actor", rec.info.id);
    if (behind_nat(node->reachability))
      detail::current_core()->drop_forwarded_to(rec.info.id, "it was killed: " + why);
  }

  // One-way: the head never waits on a kill, because the actor being killed may
  // itself be waiting on the head (its destructor, say) and the head has one thread.
  template <class... A>
  void tell_node(const NodeRecord& node, const std::string& method, const A&... args) {
    detail::current_core()->call(node_ref(node), method,
                                 detail::pack_payload(std::make_tuple(args...)), true);
  }

  // Records the actor pending on `node` with the node's GPU indices `gpus` and asks the node
  // to create it, without waiting: created() takes the answer on the head's thread, records
  // the actor alive (or start_failed) and then runs `done`.
  void start_on(ActorRecord& rec, const NodeRecord& node, const std::vector<int>& gpus,
                bool restart, Started done) {
    rec.info.state = ActorState::pending;
    rec.info.node_id = node.id;
    rec.info.address = call_address(node);
    rec.info.gpus = gpus;
    save(rec);
    const uint64_t seq = ++creations_;
    const std::string id = rec.info.id;
    creating_[id] = Creation{seq, node.id, node.address, now_ms(), restart, std::move(done)};
    auto core = detail::current_core();
    std::weak_ptr<detail::Core> weak = core;
    core->call_async(node_ref(node), "create_actor",
                     detail::pack_payload(std::make_tuple(CreateActorRequest{
                         rec.info.id, rec.info.class_name, rec.ctor_args, gpus, rec.info.job,
                         rec.info.owner, rec.info.owner_name})),
                     [weak, id, seq](detail::CallState& st) {
                       if (auto c = weak.lock())
                         c->post("@head", "created",
                                 detail::pack_payload(
                                     std::make_tuple(id, seq, st.error_type, st.error_message)));
                     });
  }

  // A start that failed. When its node was lost (declared dead, left, suspected, or it
  // stopped answering) the actor did not fail: the attempt uses up no restart, and an actor
  // with restarts is placed again. Otherwise (its constructor threw, its class is unknown
  // there, no answer in time) it is dead.
  void start_failed(ActorRecord& rec, Creation& c, const std::string& type,
                    const std::string& error) {
    auto node = node_record(c.node_id);
    // The head could not forward the creation to a node behind NAT (its connection was down
    // or silent): it never reached the node, so it cannot have taken the node down. Placed
    // again like an actor whose node was lost, but not counted as a loss in its creation.
    const bool undelivered =
        type == "ActorDiedError" && error.find(detail::kNotForwarded) != std::string::npos;
    bool node_lost = type == "ActorDiedError" || !node || node->state != NodeState::alive ||
                     detector_.suspects(now_ms()).count(c.node_id);
    std::string why =
        "could not be created on node " + c.node_id + " (" + c.address + "): " + error;
    // The second node lost while creating this actor: it is not placed again (below, as dead)
    // and its job fails, saying why.
    const bool poisoned = node_lost && !undelivered && lost_twice(rec.info, c.node_id, &why);
    if (node_lost && !poisoned && c.restart && rec.info.restarts > 0) rec.info.restarts--;
    if (node_lost && !poisoned && rec.info.restarts < rec.info.max_restarts) {
      to_restart(rec, why);
    } else {
      rec.info.state = ActorState::dead;
      rec.info.reason = why;
      save(rec);
      event({{"type", "actor_dead"}, {"actor", rec.info.id}, {"reason", why}});
      spdlog::warn("head: {} is dead: {}", describe(rec.info), why);
    }
    report(c, rec.info, poisoned ? "ClusterError" : type, why);
    if (poisoned && !rec.info.job.empty()) {
      JobInfo job = job_record(rec.info.job);
      if (!job.finished()) finish(job, JobState::failed, why);
    }
  }

  // Records that `node` was lost while creating `a`. A node lost once while it created an actor
  // is bad luck; twice for the same actor within kCreationLossWindowMs is the actor's doing (a
  // job file that crashes the process that reads it): then true, with the cause in `why`.
  bool lost_twice(const ActorInfo& a, const std::string& node, std::string* why) {
    const int64_t now = now_ms();
    std::erase_if(lost_creations_, [&](const auto& entry) {
      return now - entry.second.back().first > kCreationLossWindowMs;
    });
    auto& lost = lost_creations_[a.id];
    lost.emplace_back(now, node);
    if (lost.size() < 2) return false;
    std::string nodes;
    for (const auto& [at, n] : lost) nodes += (nodes.empty() ? "" : " and ") + n;
    *why = describe(a) + " was being created on nodes " + nodes + " when each was lost, within " +
           human_ms(now - lost.front().first) +
           ": an actor whose creation takes its node down is not placed again (the job's files "
           "may crash the process that reads them)";
    lost_creations_.erase(a.id);
    return true;
  }

  // Tells whoever waits on a creation how it ended, once.
  void report(Creation& c, const ActorInfo& info, const std::string& type,
              const std::string& error) {
    Started done = std::move(c.done);
    c.done = nullptr;
    if (!done) return;
    try {
      done(info, type, error);
    } catch (const std::exception& e) {
      spdlog::warn("head: after the start of {}: {}", describe(info), e.what());
    }
  }

  // Places on a node the failure detector does not suspect when one fits, else on any
  // (after an outage of Redis every node may be silent for a while, and none is dead). Never
  // on a node behind NAT whose connection to the head is not up (it has just joined again
  // after its uplink came back, and its record is in Redis before its connection is here):
  // nothing sent there would arrive.
  Placement place_on(const std::vector<NodeView>& placement, const ActorInfo& a) {
    return place_reachable(
        placement, a.resources, detector_.suspects(now_ms()),
        [](const std::string& id) { return detail::current_core()->forwards_to(id); },
        a.share_gpus);
  }

  Creation take_creation(const std::string& id) {
    auto it = creating_.find(id);
    if (it == creating_.end()) return {};
    Creation c = std::move(it->second);
    creating_.erase(it);
    return c;
  }

  void to_restart(ActorRecord& rec, const std::string& why) {
    rec.info.state = ActorState::restarting;
    rec.info.reason = why;
    save(rec);
    event({{"type", "actor_restarting"}, {"actor", rec.info.id}, {"reason", why}});
    spdlog::warn("head: restarting {}: {}", describe(rec.info), why);
  }

  // Places a restarting actor on a live node that the failure detector does not suspect and
  // starts it there (asynchronously), counting it in `placement`.
  void try_restart(ActorRecord& rec, const std::map<std::string, NodeRecord>& live,
                   std::vector<NodeView>& placement) {
    Placement where = place_on(placement, rec.info);
    if (!where.node) {
      if (rec.info.reason.find("waiting:") == std::string::npos) {
        rec.info.reason += "; waiting: " + where.reason;
        save(rec);
      }
      return;
    }
    rec.info.restarts++;
    start_on(rec, live.at(*where.node), where.gpus, true, nullptr);
    occupy(placement, rec.info);
  }

  HeadConfig cfg_;
  std::shared_ptr<membership::Store> store_;
  std::string address_;
  FailureDetector detector_;
  // Per actor, the nodes lost while they created it, and when (start_failed), within
  // kCreationLossWindowMs.
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>> lost_creations_;
  bool store_was_down_ = false;
  int64_t store_down_since_ms_ = 0;
  bool started_noted_ = false;  // the running jobs were told of this head's start
  int64_t next_release_ms_ = 0;
  std::shared_ptr<RelayWatch> relay_ = std::make_shared<RelayWatch>();
  bool relay_seen_up_ = false;
  int64_t relay_down_since_ms_ = 0, relay_probed_ms_ = 0;
  // Creations sent to nodes and not answered yet, by actor id (in memory: a restarted head
  // asks the nodes again for the actors the store shows pending).
  std::map<std::string, Creation> creating_;
  uint64_t creations_ = 0;
  std::atomic<bool> tick_queued_{false};
  // The actor table (actors_index()), and since when (head clock) each dead actor and each
  // node not alive has been so, for forget_the_dead().
  std::map<std::string, ActorRecord> index_;
  bool index_valid_ = false;
  std::map<std::string, int64_t> dead_since_, node_gone_since_;
  std::multimap<int64_t, std::string> dead_queue_;  // dead_since_ by time, for forget_the_dead
  std::set<std::string> not_dead_;                   // the index's actors that are not dead
  // views(): placement's view of the nodes `views_nodes_`, valid unless `views_dirty_`.
  std::vector<NodeView> views_cache_;
  std::set<std::string> views_nodes_;
  bool views_dirty_ = true;
  // jobs_index(): running jobs and when finished ones ended, valid unless `jobs_valid_` is false.
  JobsIndex jobs_;
  bool jobs_valid_ = false;
  SubmissionLimits limits_{cfg_.max_jobs_per_key, cfg_.max_submissions_per_minute};
  // Reachability probes running (shared with their threads).
  std::shared_ptr<std::atomic<int>> probes_ = std::make_shared<std::atomic<int>>(0);
};

LOCO_REGISTER(HeadService, loco::ActorClass<HeadService>("loco.Head")
                               .method("hello", &HeadService::hello)
                               .internal_method("reachability", &HeadService::reachability)
                               .method("spawn", &HeadService::spawn)
                               .method("locate", &HeadService::locate)
                               .method("lookup", &HeadService::lookup)
                               .method("kill", &HeadService::kill)
                               .method("status", &HeadService::status)
                               .method("status_query", &HeadService::status_query)
                               .internal_method("tick", &HeadService::tick)
                               .internal_method("created", &HeadService::created)
                               .method("submit_job", &HeadService::submit_job)
                               .internal_method("job_event", &HeadService::job_event)
                               .internal_method("job_finished", &HeadService::job_finished)
                               .method("job_events", &HeadService::job_events)
                               .method("list_jobs", &HeadService::list_jobs)
                               .method("job_info", &HeadService::job_info)
                               .method("scale_job", &HeadService::scale_job)
                               .method("cancel_job", &HeadService::cancel_job));

}  // namespace

int run_head(const HeadConfig& cfg, const std::atomic<bool>& stop,
             const std::function<void(const std::string&)>& on_ready) {
  if (cfg.redis_url.empty()) {
    spdlog::error("head: no Redis given (--redis redis://HOST:PORT)");
    return 1;
  }
  limit_malloc_arenas(kMallocArenas);
  std::shared_ptr<membership::Store> store;
  try {
    store = membership::make_redis_store(cfg.redis_url);
    store->ping();
  } catch (const membership::StoreError& e) {
    spdlog::error("head: cannot reach Redis: {}", e.what());
    return 1;
  }
  detail::CoreOptions co;
  co.bind = cfg.bind;
  co.advertise = cfg.advertise;
  co.self_name = "head";
  co.detect_ms = cfg.detect_ms;
  co.heartbeat_ms = std::max<int64_t>(20, cfg.detect_ms / 5);
  co.max_message_bytes = cfg.max_message_bytes;
  co.max_connections_per_source = cfg.max_connections_per_source;
  co.security = cfg.security;
  co.forward = true;  // calls to the actors of nodes behind NAT go through the head
  std::shared_ptr<detail::Core> core;
  try {
    core = std::make_shared<detail::Core>(co);
  } catch (const std::exception& e) {
    spdlog::error("head: {}", e.what());
    return 1;
  }
  detail::current_core() = core;
  auto service = std::make_shared<HeadService>(cfg, store, core->address());
  core->host("@head", detail::class_entry<HeadService>(), service);
  spdlog::info("head serving at {} ({}) with Redis at {}", core->address(),
               cfg.security.curve
                   ? "CURVE, cluster key " + security::short_key(cfg.security.cluster.public_key)
                   : std::string("plain TCP: --insecure"),
               membership::redact_url(cfg.redis_url));
  if (on_ready) on_ready(core->address());
  while (!stop.load()) {
    if (service->claim_tick()) core->post("@head", "tick", detail::pack_payload(std::tuple<>()));
    std::this_thread::sleep_for(Millis(cfg.tick_ms));
  }
  core->shutdown();
  detail::current_core().reset();
  spdlog::info("head stopped");
  return 0;
}

}  // namespace loco
