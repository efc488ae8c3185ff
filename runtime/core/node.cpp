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

}  // namespace

int run_node(const NodeConfig& cfg, const std::atomic<bool>& stop,
             const std::function<void(const std::string&)>& on_ready) {
  std::shared_ptr<Plugins> plugins;
  try {
    plugins = std::make_shared<Plugins>(cfg.plugins);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  PathRoots roots = PathRoots::at(".");
  if (!cfg.data_root.empty()) roots.data = PathRoots::at(cfg.data_root).data;
  if (!cfg.checkpoint_root.empty()) roots.checkpoints = PathRoots::at(cfg.checkpoint_root).data;
  spdlog::info("node: jobs read and write data under {} and checkpoints under {}", roots.data,
               roots.checkpoints);
  std::string node_id = random_id("n");
  detail::CoreOptions co;
  co.bind = cfg.listen ? cfg.bind : std::string();
  co.advertise = cfg.advertise;
  co.head_address = cfg.head_address;
  co.self_name = "node " + node_id;
  co.max_message_bytes = cfg.max_message_bytes;
  co.security = cfg.security;
  std::shared_ptr<detail::Core> core;
  try {
    core = std::make_shared<detail::Core>(co);
  } catch (const std::exception& e) {
    spdlog::error("node: {}", e.what());
    return 1;
  }
  detail::current_core() = core;

  ClusterInfo info;
  try {
    info = core->head_call<ClusterInfo>("hello", Millis(cfg.connect_timeout_ms));
  } catch (const Error& e) {
    spdlog::error("node: cannot join the cluster: {}", e.what());
    core->shutdown();
    return 1;
  }
  // Calls from this node's actors detect dead peers as fast as the head does.
  core->set_detection(info.detect_ms, info.heartbeat_ms);
  auto store = membership::make_redis_store(info.redis_url);
  try {
    store->ping();
  } catch (const membership::StoreError& e) {
    spdlog::error("node: cannot reach Redis at {} (as told by the head at {}): {}",
                  membership::redact_url(info.redis_url), cfg.head_address, e.what());
    core->shutdown();
    return 1;
  }

  NodeRecord rec;
  rec.id = node_id;
  rec.address = core->address();
  // Whether the head reaches us at that address, or only over our connection to it.
  if (!cfg.listen) {
    rec.reachability = Reachability::reverse;
    spdlog::info(
        "node {}: --no-listen: not reachable from the head: reverse connections through "
        "the head",
        node_id);
  } else {
    try {
      rec.reachability = core->head_call<Reachability>(
          "reachability", Millis(cfg.connect_timeout_ms), node_id, rec.address);
    } catch (const MethodNotFoundError&) {
      rec.reachability = Reachability::direct;  // a head from before the probe: as it was
    } catch (const Error& e) {
      spdlog::error("node: the head could not tell whether it reaches {}: {}", rec.address,
                    e.what());
      core->shutdown();
      return 1;
    }
    if (rec.reachability == Reachability::direct)
      spdlog::info("node {}: reachable at {}", node_id, rec.address);
    else
      spdlog::warn(
          "node {}: not reachable from the head at {}: reverse connections through the "
          "head (every call to its actors crosses the head twice)",
          node_id, rec.address);
  }
  if (behind_nat(rec.reachability)) {
    core->attach_as(node_id);
    if (!core->wait_attached(Millis(cfg.connect_timeout_ms))) {
      spdlog::error("node: the head at {} did not take this node's connection for calls within {}",
                    cfg.head_address, human_ms(cfg.connect_timeout_ms));
      core->shutdown();
      return 1;
    }
  }
  // What this node's actors need for their own sockets: a job's collective behind NAT binds
  // nothing and meets its peers behind NAT at the head's relay.
  if (behind_nat(rec.reachability) && !info.relay.endpoint.empty()) {
    rec.reachability = Reachability::relayed;
    spdlog::info("node {}: its actors meet peers behind NAT at the relay {}", node_id,
                 info.relay.endpoint);
  }
  core->set_network(NodeNetwork{rec.reachability, info.relay});
  if (behind_nat(rec.reachability) && info.relay.endpoint.empty())
    spdlog::warn(
        "node {}: behind NAT and the head names no relay (loco start --head --relay): a job's "
        "workers here reach workers on other nodes behind NAT not at all",
        node_id);
  rec.resources = cfg.resources;
  if (rec.resources.empty()) rec.resources["cpu"] = std::thread::hardware_concurrency();
  // What a job's size is held against at submission (a DiLoCo job's memory estimate).
  if (!rec.resources.count("memory"))
    if (double m = memory_total_bytes(); m > 0) rec.resources["memory"] = m;
  rec.spawnable = cfg.spawnable;
  rec.state = NodeState::alive;
  rec.hostname = host_name();
  rec.pid = ::getpid();
  rec.started_unix_ms = unix_ms();
  auto packed = [](const NodeRecord& r) {
    msgpack::sbuffer b;
    msgpack::pack(b, r);
    return std::string(b.data(), b.size());
  };
  const auto ttl = Millis(info.detect_ms);
  uint64_t beat = 0;
  auto heartbeat = [&] { store->put(keys::alive(node_id), std::to_string(++beat), ttl); };
  auto serve = [&] {
    core->host("@node", detail::class_entry<NodeService>(),
               std::make_shared<NodeService>(node_id, rec.address, roots, plugins, cfg.spawnable));
  };
  auto join = [&] {
    store->hput(keys::kNodes, node_id, packed(rec));
    heartbeat();
    store->append(keys::kEvents, {{"type", "join"},
                                  {"node", node_id},
                                  {"address", rec.address},
                                  {"resources", format_resources(rec.resources)}});
  };
  try {
    join();
    serve();
  } catch (const membership::StoreError& e) {
    spdlog::error("node: cannot register in Redis at {}: {}",
                  membership::redact_url(info.redis_url), e.what());
    core->shutdown();
    return 1;
  }
  spdlog::info("node {} serving at {} with {} ({} plugins known, {} loaded)", node_id,
               rec.address.empty() ? "no port of its own (--no-listen)" : rec.address,
               format_resources(rec.resources), plugins->known(), plugins->loaded().size());
  // A node without a port is named by where its calls go ("head/<id>").
  if (on_ready) on_ready(rec.address.empty() ? call_address(rec) : rec.address);

  const Millis period(std::max<int64_t>(20, info.heartbeat_ms));
  Backoff backoff(Millis(100), Millis(2000));
  bool store_down = false;
  int64_t next_beat = now_ms();
  int64_t last_beat = now_ms();  // of the last heartbeat the store took
  while (!stop.load()) {
    int64_t now = now_ms();
    if (now < next_beat) {
      std::this_thread::sleep_for(std::min<Millis>(Millis(next_beat - now), Millis(50)));
      continue;
    }
    try {
      // How long the store has taken no heartbeat of ours (an outage, or this process stopped).
      const int64_t silent = now_ms() - last_beat;
      if (store_down || beat % 16 == 0 || silent >= info.detect_ms) {
        // After an outage (or every few beats): make sure our record is there, and
        // that the head has not declared us dead in the meantime.
        auto cur = store->hget(keys::kNodes, node_id);
        // Silent for the detection time or longer (cut off, stopped), and the record gone: the
        // head declared this node dead and forgot it after its retention time.
        const bool forgotten = !cur && silent >= info.detect_ms;
        if (cur || forgotten) {
          NodeRecord r;
          if (cur) {
            r = detail::unpack_bounded(cur->data(), cur->size(), "a node record")
                    .get()
                    .as<NodeRecord>();
          } else {
            r.state = NodeState::dead;
            r.reason = "its record is gone after " + human_ms(silent) + " of silence";
          }
          if (r.state == NodeState::dead) {
            // Cut off for longer than the detection time: the cluster has moved on
            // (our actors were restarted elsewhere or declared dead). Drop them and
            // join again as a new node, so that a host whose link comes back serves again.
            std::string old_id = node_id;
            for (const std::string& id : core->hosted()) core->unhost(id, /*wait=*/false);
            core->unhost("@node");
            node_id = random_id("n");
            rec.id = node_id;
            if (behind_nat(rec.reachability)) {
              core->attach_as(node_id);
              if (!core->wait_attached(period * 16))
                spdlog::warn("node {}: the head has not confirmed yet that it forwards calls here",
                             node_id);
            }
            rec.started_unix_ms = unix_ms();
            spdlog::warn(
                "node {}: the head declared this node dead ({}); dropped its actors and "
                "joining again as node {}",
                old_id, r.reason, node_id);
            serve();
            join();
            last_beat = now_ms();
            next_beat = now_ms() + period.count();
            continue;
          }
        } else {
          store->hput(keys::kNodes, node_id, packed(rec));
        }
      }
      heartbeat();
      last_beat = now_ms();
      if (store_down)
        spdlog::info("node {}: Redis at {} is back", node_id,
                     membership::redact_url(info.redis_url));
      store_down = false;
      backoff.reset();
      next_beat = now_ms() + period.count();
    } catch (const membership::StoreError& e) {
      if (!store_down) spdlog::warn("node {}: Redis unreachable, retrying: {}", node_id, e.what());
      store_down = true;
      next_beat = now_ms() + backoff.next().count();
    }
  }

  // Leave cleanly: the head moves our restartable actors elsewhere. Their methods in progress
  // are asked to end (on_stop) and get the grace time; one that does not end by then does not
  // hold the node, whose peers (a collective waiting on its worker, say) rely on it leaving.
  auto record_left = [&] {
    try {
      rec.state = NodeState::left;
      rec.reason = "stopped";
      store->hput(keys::kNodes, node_id, packed(rec));
      store->erase(keys::alive(node_id));
      store->append(keys::kEvents, {{"type", "leave"}, {"node", node_id}});
    } catch (const membership::StoreError& e) {
      spdlog::warn("node {}: could not record leaving: {}", node_id, e.what());
    }
  };
  {
    // One thread per actor, so that every actor is asked to stop at once.
    struct Stopping {
      std::mutex mu;
      std::condition_variable cv;
      std::set<std::string> left;  // the actors not stopped yet
    };
    auto st = std::make_shared<Stopping>();
    const std::vector<std::string> ids = core->hosted();
    st->left.insert(ids.begin(), ids.end());
    std::vector<std::thread> stoppers;
    for (const std::string& id : ids) {
      stoppers.emplace_back([core, st, id] {
        core->unhost(id);
        std::lock_guard<std::mutex> lock(st->mu);
        st->left.erase(id);
        st->cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(st->mu);
    auto all_stopped = [&] { return st->left.empty(); };
    if (cfg.stop_grace_ms <= 0)
      st->cv.wait(lock, all_stopped);
    else if (!st->cv.wait_for(lock, Millis(cfg.stop_grace_ms), all_stopped)) {
      std::string names;
      for (const std::string& id : st->left) names += (names.empty() ? "" : ", ") + id;
      spdlog::error("node {}: {} still in a method {} after the stop began; leaving without them",
                    node_id, names, human_ms(cfg.stop_grace_ms));
      lock.unlock();
      record_left();
      spdlog::shutdown();
      std::_Exit(0);  // the stoppers still wait on those methods: not joined
    }
    lock.unlock();
    for (std::thread& t : stoppers) t.join();
  }
  record_left();
  core->shutdown();
  detail::current_core().reset();
  spdlog::info("node {} stopped", node_id);
  return 0;
}

}  // namespace loco
