// A node: hosts actors, advertises its resources, heartbeats into the store.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "runtime/core/actor.hpp"
#include "runtime/core/core.hpp"
#include "runtime/core/decisions.hpp"
#include "runtime/core/plugins.hpp"
#include "runtime/core/server.hpp"
#include "runtime/membership/store.hpp"

namespace loco {
namespace {

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// The node's built-in service, at actor id "@node": the head calls it to
// create and kill actors here.
class NodeService {
 public:
  NodeService(std::string node_id, std::string address, PathRoots roots,
              std::shared_ptr<Plugins> plugins, std::vector<std::string> spawnable)
      : node_id_(std::move(node_id)),
        address_(std::move(address)),
        roots_(std::move(roots)),
        plugins_(std::move(plugins)),
        spawnable_(std::move(spawnable)) {}

  void create_actor(CreateActorRequest req) {
    // Asked again (a restarted head re-sends the creations it finds pending): already done.
    auto hosted = detail::current_core()->hosted();
    if (std::find(hosted.begin(), hosted.end(), req.actor_id) != hosted.end()) return;
    // The head places a client's own actor only where --spawnable names its class; checked here
    // again, before any plugin is loaded for it.
    if (!req.owner.empty() && req.job.empty() && !class_matches(spawnable_, req.class_name))
      throw PermissionError("node " + node_id_ + " does not let clients spawn " +
                            escape_remote(req.class_name, 64) + " (its --spawnable: " +
                            (spawnable_.empty() ? std::string("none") : join(spawnable_)) + ")");
    // Loads the plugin that offers the class, the first time one of its classes is asked for.
    plugins_->provide(req.class_name);
    const detail::ClassEntry* cls = detail::Registry::instance().find(req.class_name);
    if (!cls || !cls->factory) {
      std::string known;
      for (auto& n : plugins_->offered()) known += (known.empty() ? "" : ", ") + n;
      throw ActorNotFoundError("actor class '" + req.class_name + "' is not available on node " +
                               node_id_ + " (" + address_ + "); it has: " +
                               (known.empty() ? "none (load a plugin with --plugin)" : known));
    }
    detail::Payload args;
    args.body = std::move(req.ctor_args);
    // A client's actors (its jobs' too) see only that user's folder of each root.
    ActorContext context{req.actor_id,
                         req.gpus,
                         req.owner.empty() ? roots_ : roots_.for_user(req.owner, req.owner_name),
                         req.job,
                         req.owner,
                         req.owner_name};
    std::shared_ptr<void> instance;
    {
      detail::ActorContextScope scope(&context);  // the constructor sees its own placement
      instance = cls->factory(args);
    }
    detail::current_core()->host(req.actor_id, *cls, std::move(instance), std::move(context));
    spdlog::info("node {}: created {} ({}){}", node_id_, req.class_name, req.actor_id,
                 req.gpus.empty() ? "" : " with gpu " + format_gpus(req.gpus));
  }

  bool kill_actor(std::string actor_id) {
    if (actor_id.rfind('@', 0) == 0)
      throw PermissionError("kill_actor: " + escape_remote(actor_id, 64) +
                            " is the node's own service; stop the node instead");
    // Without waiting for the method in progress: the node's own service (create, kill) never
    // waits behind an actor. The calls still queued are answered ActorDiedError at once.
    bool found = detail::current_core()->unhost(actor_id, /*wait=*/false);
    if (found) spdlog::info("node {}: killed actor {}", node_id_, actor_id);
    return found;
  }

  std::vector<std::string> actors() const { return detail::current_core()->hosted(); }

 private:
  std::string node_id_, address_;
  PathRoots roots_;
  std::shared_ptr<Plugins> plugins_;
  std::vector<std::string> spawnable_;

  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ",") + x;
    return out;
  }
};

// MemTotal of /proc/meminfo in bytes, 0 when it cannot be read.
double memory_total_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024;
  return 0;
}

LOCO_REGISTER(NodeService, loco::ActorClass<NodeService>("loco.Node")
                               .internal_method("create_actor", &NodeService::create_actor)
                               .internal_method("kill_actor", &NodeService::kill_actor)
                               .internal_method("actors", &NodeService::actors));

// One node's life: start (the Core, the head's hello, Redis), find how the head reaches it,
// join, heartbeat until asked to stop (joining again as a new node if the head declared it
// dead), then leave. run_node() below reads as that sequence; each phase is a method here.
class NodeProcess {
 public:
  explicit NodeProcess(const NodeConfig& cfg) : cfg_(cfg) {}

  // Plugins, roots, the Core and the cluster's hello, Redis. False (logged) when one fails.
  bool start();
  // Whether the head reaches this node (rec_.reachability), and its connection for calls
  // when not. False (logged) when the head cannot say or does not take the connection.
  bool find_reachability();
  // Writes the record and the first heartbeat, and serves @node. False (logged) on Redis.
  bool join_cluster();
  // Heartbeats until `stop`; after an outage, every 16 beats and after a silence of the
  // detection time, checks that the head has not declared this node dead (then rejoins).
  // Returns early, with outlived_kill() true, when a killed actor is still in its method
  // cfg.kill_grace_ms after its kill.
  void heartbeat_until(const std::atomic<bool>& stop);
  bool outlived_kill() const { return outlived_kill_; }
  // Stops every actor at once, each given cfg.stop_grace_ms, records that it left, and ends.
  void leave();

  // What the node is called by: its address, or "head/<id>" when it has no port.
  std::string ready_address() const {
    return rec_.address.empty() ? call_address(rec_) : rec_.address;
  }
  void fail_start() { core_->shutdown(); }

 private:
  static std::string packed(const NodeRecord& r) {
    msgpack::sbuffer b;
    msgpack::pack(b, r);
    return std::string(b.data(), b.size());
  }
  Millis period() const { return Millis(std::max<int64_t>(20, info_.heartbeat_ms)); }
  void heartbeat() {
    store_->put(keys::alive(node_id_), std::to_string(++beat_), Millis(info_.detect_ms));
  }
  void serve() {
    core_->host(
        "@node", detail::class_entry<NodeService>(),
        std::make_shared<NodeService>(node_id_, rec_.address, roots_, plugins_, cfg_.spawnable));
  }
  void record_join() {
    store_->hput(keys::kNodes, node_id_, packed(rec_));
    heartbeat();
    store_->append(keys::kEvents, {{"type", "join"},
                                   {"node", node_id_},
                                   {"address", rec_.address},
                                   {"resources", format_resources(rec_.resources)}});
  }
  void describe_resources();
  // Whether the head declared this node dead (its record says so, or is gone after a silence
  // of the detection time): then `why`.
  bool declared_dead(int64_t silent, std::string* why);
  // Cut off for longer than the detection time: the cluster has moved on (our actors were
  // restarted elsewhere or declared dead). Drops them and joins again as a new node, so that
  // a host whose link comes back serves again.
  void rejoin(const std::string& why);
  void record_left();
  bool kill_outlived();

  const NodeConfig& cfg_;
  std::shared_ptr<Plugins> plugins_;
  PathRoots roots_;
  std::string node_id_ = random_id("n");
  std::shared_ptr<detail::Core> core_;
  ClusterInfo info_;
  std::shared_ptr<membership::Store> store_;
  NodeRecord rec_;
  uint64_t beat_ = 0;
  bool outlived_kill_ = false;
};

bool NodeProcess::start() {
  // Before the actors' threads: a few arenas, their free pages handed back every 30 s
  // (heartbeat_until), so that a node's RSS is what its actors hold (util.hpp).
  limit_malloc_arenas(kMallocArenas);
  try {
    plugins_ = std::make_shared<Plugins>(cfg_.plugins);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return false;
  }
  roots_ = PathRoots::at(".");
  if (!cfg_.data_root.empty()) roots_.data = PathRoots::at(cfg_.data_root).data;
  if (!cfg_.checkpoint_root.empty()) roots_.checkpoints = PathRoots::at(cfg_.checkpoint_root).data;
  spdlog::info("node: jobs read and write data under {} and checkpoints under {}", roots_.data,
               roots_.checkpoints);
  detail::CoreOptions co;
  co.bind = cfg_.listen ? cfg_.bind : std::string();
  co.advertise = cfg_.advertise;
  co.head_address = cfg_.head_address;
  co.self_name = "node " + node_id_;
  co.max_message_bytes = cfg_.max_message_bytes;
  co.max_connections_per_source = cfg_.max_connections_per_source;
  co.security = cfg_.security;
  try {
    core_ = std::make_shared<detail::Core>(co);
  } catch (const std::exception& e) {
    spdlog::error("node: {}", e.what());
    return false;
  }
  detail::current_core() = core_;
  try {
    info_ = core_->head_call<ClusterInfo>("hello", Millis(cfg_.connect_timeout_ms));
  } catch (const Error& e) {
    spdlog::error("node: cannot join the cluster: {}", e.what());
    core_->shutdown();
    return false;
  }
  // Calls from this node's actors detect dead peers as fast as the head does.
  core_->set_detection(info_.detect_ms, info_.heartbeat_ms);
  store_ = membership::make_redis_store(info_.redis_url);
  try {
    store_->ping();
  } catch (const membership::StoreError& e) {
    spdlog::error("node: cannot reach Redis at {} (as told by the head at {}): {}",
                  membership::redact_url(info_.redis_url), cfg_.head_address, e.what());
    core_->shutdown();
    return false;
  }
  rec_.id = node_id_;
  rec_.address = core_->address();
  return true;
}

bool NodeProcess::find_reachability() {
  if (!cfg_.listen) {
    rec_.reachability = Reachability::reverse;
    spdlog::info(
        "node {}: --no-listen: not reachable from the head: reverse connections through "
        "the head",
        node_id_);
  } else {
    try {
      rec_.reachability = core_->head_call<Reachability>(
          "reachability", Millis(cfg_.connect_timeout_ms), node_id_, rec_.address);
    } catch (const MethodNotFoundError&) {
      rec_.reachability = Reachability::direct;  // a head from before the probe: as it was
    } catch (const Error& e) {
      spdlog::error("node: the head could not tell whether it reaches {}: {}", rec_.address,
                    e.what());
      return false;
    }
    if (rec_.reachability == Reachability::direct)
      spdlog::info("node {}: reachable at {}", node_id_, rec_.address);
    else
      spdlog::warn(
          "node {}: not reachable from the head at {}: reverse connections through the "
          "head (every call to its actors crosses the head twice)",
          node_id_, rec_.address);
  }
  if (behind_nat(rec_.reachability)) {
    core_->attach_as(node_id_);
    if (!core_->wait_attached(Millis(cfg_.connect_timeout_ms))) {
      spdlog::error("node: the head at {} did not take this node's connection for calls within {}",
                    cfg_.head_address, human_ms(cfg_.connect_timeout_ms));
      return false;
    }
  }
  // What this node's actors need for their own sockets: a job's collective behind NAT binds
  // nothing and meets its peers behind NAT at the head's relay.
  if (behind_nat(rec_.reachability) && !info_.relay.endpoint.empty()) {
    rec_.reachability = Reachability::relayed;
    spdlog::info("node {}: its actors meet peers behind NAT at the relay {}", node_id_,
                 info_.relay.endpoint);
  }
  core_->set_network(NodeNetwork{rec_.reachability, info_.relay});
  if (behind_nat(rec_.reachability) && info_.relay.endpoint.empty())
    spdlog::warn(
        "node {}: behind NAT and the head names no relay (loco start --head --relay): a job's "
        "workers here reach workers on other nodes behind NAT not at all",
        node_id_);
  return true;
}

void NodeProcess::describe_resources() {
  rec_.resources = cfg_.resources;
  if (rec_.resources.empty()) rec_.resources["cpu"] = std::thread::hardware_concurrency();
  // What a job's size is held against at submission (a DiLoCo job's memory estimate).
  if (!rec_.resources.count("memory"))
    if (double m = memory_total_bytes(); m > 0) rec_.resources["memory"] = m;
  rec_.spawnable = cfg_.spawnable;
  rec_.state = NodeState::alive;
  rec_.hostname = host_name();
  rec_.pid = ::getpid();
  rec_.started_unix_ms = unix_ms();
}

bool NodeProcess::join_cluster() {
  describe_resources();
  try {
    record_join();
    serve();
  } catch (const membership::StoreError& e) {
    spdlog::error("node: cannot register in Redis at {}: {}",
                  membership::redact_url(info_.redis_url), e.what());
    return false;
  }
  spdlog::info("node {} serving at {} with {} ({} plugins known, {} loaded)", node_id_,
               rec_.address.empty() ? "no port of its own (--no-listen)" : rec_.address,
               format_resources(rec_.resources), plugins_->known(), plugins_->loaded().size());
  return true;
}

bool NodeProcess::declared_dead(int64_t silent, std::string* why) {
  auto cur = store_->hget(keys::kNodes, node_id_);
  // Silent for the detection time or longer (cut off, stopped), and the record gone: the head
  // declared this node dead and forgot it after its retention time.
  if (!cur && silent >= info_.detect_ms) {
    *why = "its record is gone after " + human_ms(silent) + " of silence";
    return true;
  }
  if (!cur) {
    store_->hput(keys::kNodes, node_id_, packed(rec_));
    return false;
  }
  const NodeRecord r =
      detail::unpack_bounded(cur->data(), cur->size(), "a node record").get().as<NodeRecord>();
  *why = r.reason;
  return r.state == NodeState::dead;
}

void NodeProcess::rejoin(const std::string& why) {
  const std::string old_id = node_id_;
  for (const std::string& id : core_->hosted()) core_->unhost(id, /*wait=*/false);
  core_->unhost("@node");
  node_id_ = random_id("n");
  rec_.id = node_id_;
  if (behind_nat(rec_.reachability)) {
    core_->attach_as(node_id_);
    if (!core_->wait_attached(period() * 16))
      spdlog::warn("node {}: the head has not confirmed yet that it forwards calls here", node_id_);
  }
  rec_.started_unix_ms = unix_ms();
  spdlog::warn(
      "node {}: the head declared this node dead ({}); dropped its actors and joining again as "
      "node {}",
      old_id, why, node_id_);
  serve();
  record_join();
}

void NodeProcess::heartbeat_until(const std::atomic<bool>& stop) {
  Backoff backoff(Millis(100), Millis(2000));
  bool store_down = false;
  int64_t next_beat = now_ms();
  int64_t last_beat = now_ms();  // of the last heartbeat the store took
  int64_t next_release = now_ms() + kReleaseMemoryMs;
  while (!stop.load()) {
    const int64_t now = now_ms();
    if (now >= next_release) {
      release_free_memory();
      next_release = now + kReleaseMemoryMs;
    }
    if (now < next_beat) {
      std::this_thread::sleep_for(std::min<Millis>(Millis(next_beat - now), Millis(50)));
      continue;
    }
    try {
      // How long the store has taken no heartbeat of ours (an outage, or this process stopped).
      const int64_t silent = now_ms() - last_beat;
      std::string why;
      if ((store_down || beat_ % 16 == 0 || silent >= info_.detect_ms) &&
          declared_dead(silent, &why)) {
        rejoin(why);
      } else {
        heartbeat();
        if (store_down)
          spdlog::info("node {}: Redis at {} is back", node_id_,
                       membership::redact_url(info_.redis_url));
      }
      last_beat = now_ms();
      store_down = false;
      if (kill_outlived()) return;
      backoff.reset();
      next_beat = now_ms() + period().count();
    } catch (const membership::StoreError& e) {
      if (!store_down) spdlog::warn("node {}: Redis unreachable, retrying: {}", node_id_, e.what());
      store_down = true;
      next_beat = now_ms() + backoff.next().count();
    }
  }
}

// A thread cannot be ended alone: a killed actor whose method ignores its stop hook (a user's
// model whose forward spins) is ended with its process. Logged once, with every such actor.
bool NodeProcess::kill_outlived() {
  if (cfg_.kill_grace_ms <= 0) return false;
  const std::vector<std::string> stuck = core_->outlived_kills(cfg_.kill_grace_ms);
  if (stuck.empty()) return false;
  std::string names;
  for (const std::string& s : stuck) names += (names.empty() ? "" : "; ") + s;
  spdlog::error("node {}: a killed actor is still in a method {} after its kill, ignoring its "
                "stop hook ({}); ending this node, the only way to end that thread: its other "
                "actors are stopped and restarted elsewhere, and it exits with code {} for its "
                "supervisor to start it again (loco start --kill-grace)",
                node_id_, human_ms(cfg_.kill_grace_ms), names, kExitActorOutlivedKill);
  outlived_kill_ = true;
  return true;
}

void NodeProcess::record_left() {
  try {
    rec_.state = NodeState::left;
    rec_.reason = "stopped";
    store_->hput(keys::kNodes, node_id_, packed(rec_));
    store_->erase(keys::alive(node_id_));
    store_->append(keys::kEvents, {{"type", "leave"}, {"node", node_id_}});
  } catch (const membership::StoreError& e) {
    spdlog::warn("node {}: could not record leaving: {}", node_id_, e.what());
  }
}

// Leave cleanly: the head moves our restartable actors elsewhere. Their methods in progress are
// asked to end (on_stop) and get the grace time; one that does not end by then does not hold
// the node, whose peers (a collective waiting on its worker, say) rely on it leaving.
void NodeProcess::leave() {
  // One thread per actor, so that every actor is asked to stop at once.
  struct Stopping {
    std::mutex mu;
    std::condition_variable cv;
    std::set<std::string> left;  // the actors not stopped yet
  };
  auto st = std::make_shared<Stopping>();
  const std::vector<std::string> ids = core_->hosted();
  st->left.insert(ids.begin(), ids.end());
  std::vector<std::thread> stoppers;
  for (const std::string& id : ids) {
    stoppers.emplace_back([core = core_, st, id] {
      core->unhost(id);
      std::lock_guard<std::mutex> lock(st->mu);
      st->left.erase(id);
      st->cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(st->mu);
  auto all_stopped = [&] { return st->left.empty(); };
  if (cfg_.stop_grace_ms <= 0) {
    st->cv.wait(lock, all_stopped);
  } else if (!st->cv.wait_for(lock, Millis(cfg_.stop_grace_ms), all_stopped)) {
    std::string names;
    for (const std::string& id : st->left) names += (names.empty() ? "" : ", ") + id;
    spdlog::error("node {}: {} still in a method {} after the stop began; leaving without them",
                  node_id_, names, human_ms(cfg_.stop_grace_ms));
    lock.unlock();
    record_left();
    spdlog::shutdown();
    std::_Exit(0);  // the stoppers still wait on those methods: not joined
  }
  lock.unlock();
  for (std::thread& t : stoppers) t.join();
  record_left();
  core_->shutdown();
  detail::current_core().reset();
  spdlog::info("node {} stopped", node_id_);
}

}  // namespace

int run_node(const NodeConfig& cfg, const std::atomic<bool>& stop,
             const std::function<void(const std::string&)>& on_ready) {
  NodeProcess node(cfg);
  if (!node.start()) return 1;
  if (!node.find_reachability() || !node.join_cluster()) {
    node.fail_start();
    return 1;
  }
  // A node without a port is named by where its calls go ("head/<id>").
  if (on_ready) on_ready(node.ready_address());
  node.heartbeat_until(stop);
  node.leave();
  if (node.outlived_kill()) {
    // Not a return: the killed actor's thread still runs in this process, which must not
    // unwind its statics under it.
    spdlog::shutdown();
    std::_Exit(kExitActorOutlivedKill);
  }
  return 0;
}

}  // namespace loco
