// Multi-process tests: a real redis-server, a head and nodes as processes on
// loopback, this test as the driver.
#include "tests/runtime/core/cluster.hpp"
#include "tests/runtime/core/head_probe.hpp"
#include "tests/runtime/core/raw_peer.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "runtime/core/server.hpp"
#include "runtime/core/wire.hpp"
#include "runtime/membership/store.hpp"
#include "runtime/security/curve.hpp"
#include "tests/runtime/core/test_actors.hpp"
#include "tests/support/eventually.hpp"

namespace loco::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Cluster, SpawnCallTellNamedLookupAndStatus) {
  LocalCluster c;
  Runtime& rt = c.runtime();
  auto counter = rt.spawn<Counter>(ActorOptions().with_name("c").with_resources({{"cpu", 2}}), 10);
  EXPECT_EQ(counter.call(&Counter::add, 5).get(Millis(5000)), 15);
  counter.tell(&Counter::add, 1);
  EXPECT_EQ(counter.call(&Counter::get).get(Millis(5000)), 16);

  auto again = rt.get_actor<Counter>("c");
  EXPECT_EQ(again.id(), counter.id());
  EXPECT_EQ(again.call(&Counter::get).get(Millis(5000)), 16);
  EXPECT_THROW(rt.get_actor<Counter>("nobody"), ActorNotFoundError);
  // Names are unique while their actor lives.
  EXPECT_THROW(rt.spawn<Counter>(ActorOptions().with_name("c"), 0), ClusterError);

  // The actor runs in a node process, not here.
  EXPECT_NE(counter.call(&Counter::whoami).get(Millis(5000)), std::to_string(::getpid()));

  // 32 MB of floats through one call and back.
  std::vector<float> v(8 << 20, 0.25f);
  Blob back = counter.call(&Counter::echo, Blob::from_values(std::move(v))).get(Millis(30000));
  ASSERT_EQ(back.as<float>().size(), size_t(8) << 20);
  EXPECT_EQ(back.as<float>()[(8 << 20) - 1], 0.25f);

  ClusterStatus st = rt.status();
  EXPECT_EQ(st.nodes.size(), 3u);
  ASSERT_EQ(st.actors.size(), 1u);
  EXPECT_EQ(st.actors[0].name, "c");
  EXPECT_EQ(st.actors[0].state, ActorState::alive);
  double used = 0;
  for (auto& n : st.nodes) used += n.used.count("cpu") ? n.used.at("cpu") : 0;
  EXPECT_EQ(used, 2);

  // The CLI prints the same.
  std::string out = c.log_dir() + "/status.txt";
  std::string cmd = loco_binary() + " status --address " + c.head_address() + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_TRUE(contains(text, counter.id())) << text;
  EXPECT_TRUE(contains(text, "cpu=2/4")) << text;
}

TEST(Cluster, PlacementSpreadsAndSaysWhichResourceIsShort) {
  LocalCluster c;
  Runtime& rt = c.runtime();
  std::set<std::string> nodes;
  for (int i = 0; i < 3; ++i) {
    auto a = rt.spawn<Counter>(ActorOptions().with_resources({{"cpu", 3}}), 0);
    nodes.insert(a.address());
  }
  EXPECT_EQ(nodes.size(), 3u);  // 3 cpu each: one per node
  try {
    rt.spawn<Counter>(ActorOptions().with_resources({{"cpu", 2}}), 0);
    FAIL();
  } catch (const SchedulingError& e) {
    EXPECT_TRUE(contains(e.what(), "no node has 2 free cpu")) << e.what();
  }
  try {
    rt.spawn<Counter>(ActorOptions().with_resources({{"gpu", 1}}), 0);
    FAIL();
  } catch (const SchedulingError& e) {
    EXPECT_TRUE(contains(e.what(), "1 free gpu")) << e.what();
  }
}

// Nodes started with --resources gpu=N hand each actor that asks for GPUs its
// own indices; `loco status` shows who holds which.
TEST(Cluster, GpuIndicesAreHandedOutOncePerNodeAndFreedWhenTheActorDies) {
  ClusterOptions o;
  o.nodes = 2;
  o.node_resources = "cpu=8,gpu=2";
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  std::set<std::pair<std::string, int>> taken;
  std::vector<ActorHandle<Counter>> held;
  for (int k = 0; k < 4; ++k) {
    auto a = rt.spawn<Counter>(ActorOptions().with_resources({{"cpu", 1}, {"gpu", 1}}), 0);
    auto gpus = a.call(&Counter::gpus).get(Millis(5000));
    ASSERT_EQ(gpus.size(), 1u);
    EXPECT_TRUE(taken.insert({a.address(), gpus[0]}).second) << a.address() << " " << gpus[0];
    held.push_back(a);
  }
  try {
    rt.spawn<Counter>(ActorOptions().with_resources({{"gpu", 1}}), 0);
    FAIL() << "a fifth GPU actor on 4 GPUs";
  } catch (const SchedulingError& e) {
    EXPECT_TRUE(contains(e.what(), "no node has 1 free gpu")) << e.what();
  }
  // Actors that ask for none get none.
  EXPECT_TRUE(rt.spawn<Counter>(ActorOptions(), 0).call(&Counter::gpus).get(Millis(5000)).empty());

  ClusterStatus st = rt.status();
  for (auto& n : st.nodes) EXPECT_EQ(n.used.at("gpu"), 2) << n.node.id;
  std::string out = c.log_dir() + "/status-gpus.txt";
  std::string cmd = loco_binary() + " status --address " + c.head_address() + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  EXPECT_TRUE(contains(text.str(), "GPUS")) << text.str();
  EXPECT_TRUE(contains(text.str(), "gpu=2/2")) << text.str();

  // Killed, its index goes to the next actor.
  auto freed = held[1].call(&Counter::gpus).get(Millis(5000));
  std::string freed_node = held[1].address();
  rt.kill(held[1].id());
  auto next = rt.spawn<Counter>(ActorOptions().with_resources({{"gpu", 1}}), 0);
  EXPECT_EQ(next.address(), freed_node);
  EXPECT_EQ(next.call(&Counter::gpus).get(Millis(5000)), freed);
}

TEST(Cluster, SharedGpuActorsFitOnOneGpu) {
  ClusterOptions o;
  o.nodes = 1;
  o.node_resources = "cpu=8,gpu=1";
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  for (int k = 0; k < 3; ++k) {
    auto a = rt.spawn<Counter>(
        ActorOptions().with_resources({{"cpu", 1}, {"gpu", 1}}).with_shared_gpus(), 0);
    EXPECT_EQ(a.call(&Counter::gpus).get(Millis(5000)), std::vector<int>{0});
  }
  EXPECT_THROW(rt.spawn<Counter>(ActorOptions().with_resources({{"gpu", 1}}), 0), SchedulingError);
  ClusterStatus st = rt.status();
  ASSERT_EQ(st.nodes.size(), 1u);
  EXPECT_EQ(st.nodes[0].used.at("gpu"), 1);
}

TEST(Cluster, KilledNodeGivesActorDiedErrorWithinBoundAndActorRestartsElsewhere) {
  ClusterOptions o;
  o.detect_ms = 1000;
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  auto fragile = rt.spawn<Counter>(ActorOptions().with_name("fragile"), 1);
  auto sturdy = rt.spawn<Counter>(ActorOptions().with_name("sturdy").with_max_restarts(1), 1);
  // Put both on the same node by killing the node of `sturdy` only when shared;
  // simplest: kill the node of `sturdy` and check `fragile` separately if it lived there.
  std::string victim = sturdy.address();
  auto in_flight = sturdy.call(&Counter::sleep_ms, 30000);
  auto t0 = Clock::now();
  c.node(victim).kill();
  try {
    in_flight.get(Millis(10000));
    FAIL() << "a call to an actor on a killed node returned";
  } catch (const ActorDiedError& e) {
    int64_t took = ms_since(t0);
    EXPECT_LE(took, 3000) << "detection bound";
    EXPECT_TRUE(contains(e.what(), sturdy.id())) << e.what();
    EXPECT_TRUE(contains(e.what(), victim)) << e.what();
    std::cout << "ActorDiedError after " << took << " ms: " << e.what() << "\n";
  }
  // Later calls through the same handle reach the restarted actor on another node.
  auto t1 = Clock::now();
  int v = sturdy.call(&Counter::add, 1).get(Millis(15000));
  EXPECT_EQ(v, 2);  // a fresh instance, constructed again with 1
  EXPECT_NE(sturdy.address(), victim);
  std::cout << "restarted and answering after " << ms_since(t1) << " ms\n";
  ActorInfo info = rt.locate(sturdy.id());
  EXPECT_EQ(info.restarts, 1);
  EXPECT_EQ(info.state, ActorState::alive);

  if (fragile.address() == victim) {
    EXPECT_THROW((void)fragile.call(&Counter::get).get(Millis(10000)), ActorDiedError);
    EXPECT_EQ(rt.locate(fragile.id()).state, ActorState::dead);
  } else {
    EXPECT_EQ(fragile.call(&Counter::get).get(Millis(5000)), 1);
  }
  // The head marked the node dead and says why.
  std::string victim_id;
  for (auto& n : rt.status().nodes)
    if (n.node.address == victim) {
      victim_id = n.node.id;
      EXPECT_EQ(n.node.state, NodeState::dead);
      EXPECT_TRUE(contains(n.node.reason, "missed heartbeats")) << n.node.reason;
    }
  ASSERT_FALSE(victim_id.empty());
  // Joins and the death are events in the Redis stream.
  auto store = membership::make_redis_store(c.redis().url());
  int joins = 0, deaths = 0, restarts = 0;
  for (auto& e : store->read(keys::kEvents, "0", 1000)) {
    joins += e.fields["type"] == "join";
    deaths += e.fields["type"] == "death" && e.fields["node"] == victim_id;
    restarts += e.fields["type"] == "actor_restarted" && e.fields["actor"] == sturdy.id();
  }
  EXPECT_EQ(joins, 3);
  EXPECT_EQ(deaths, 1);
  EXPECT_EQ(restarts, 1);
}

TEST(Cluster, ActorWithoutRestartsIsDeadAfterItsNodeDies) {
  LocalCluster c(ClusterOptions{.nodes = 2});
  Runtime& rt = c.runtime();
  auto a = rt.spawn<Counter>(ActorOptions(), 0);
  c.node(a.address()).kill();
  EXPECT_THROW((void)a.call(&Counter::sleep_ms, 20000).get(Millis(10000)), ActorDiedError);
  // Once the head has caught up, the handle says the actor is dead, and why.
  (void)eventually([&] { return rt.locate(a.id()).state == ActorState::dead; },
                   std::chrono::seconds(10));
  // A call that cannot be sent is not thrown where it is made: it ends at once with the error,
  // raised where its outcome is taken, so that a caller gathering several calls (an
  // aggregator's workers) sees this one fail among them.
  std::optional<Future<int>> f;
  ASSERT_NO_THROW(f.emplace(a.call(&Counter::get)));
  EXPECT_TRUE(f->ready());
  try {
    (void)f->get(Millis(5000));
    FAIL();
  } catch (const ActorDiedError& e) {
    EXPECT_TRUE(contains(e.what(), "is dead")) << e.what();
    EXPECT_TRUE(contains(e.what(), "died")) << e.what();
  }
}

TEST(Cluster, HeadRestartKeepsNodesAndActors) {
  LocalCluster c;
  Runtime& rt = c.runtime();
  auto a = rt.spawn<Counter>(ActorOptions().with_name("keep"), 100);
  ClusterStatus before = rt.status();
  c.kill_head();
  // Actors keep answering while the head is down: calls do not go through it.
  EXPECT_EQ(a.call(&Counter::add, 1).get(Millis(5000)), 101);
  c.start_head();
  ClusterStatus after = rt.status();
  ASSERT_EQ(after.nodes.size(), before.nodes.size());
  for (size_t i = 0; i < after.nodes.size(); ++i) {
    EXPECT_EQ(after.nodes[i].node.id, before.nodes[i].node.id);
    EXPECT_EQ(after.nodes[i].node.state, NodeState::alive);
  }
  ASSERT_EQ(after.actors.size(), 1u);
  EXPECT_EQ(after.actors[0].id, a.id());
  EXPECT_EQ(rt.get_actor<Counter>("keep").call(&Counter::add, 1).get(Millis(5000)), 102);
  // And it keeps scheduling.
  auto b = rt.spawn<Counter>(ActorOptions(), 7);
  EXPECT_EQ(b.call(&Counter::get).get(Millis(5000)), 7);
  // No node was declared dead across the restart.
  EXPECT_TRUE(c.wait_alive_nodes(3, Millis(3000)));
}

// "Recent events" are the newest ones, however long the stream is (status once showed the
// last 20 of the oldest 1,000).
TEST(Cluster, StatusShowsTheNewestEvents) {
  ClusterOptions o;
  o.nodes = 1;
  LocalCluster c(o);
  auto store = membership::make_redis_store(c.redis().url());
  for (int i = 0; i < 1100; ++i)
    store->append(keys::kEvents, {{"type", "test"}, {"i", std::to_string(i)}});
  auto events = c.runtime().status().recent_events;
  ASSERT_EQ(events.size(), 20u);
  EXPECT_EQ(events.front(), "i=1080 type=test");
  EXPECT_EQ(events.back(), "i=1099 type=test");
}

// A node stopped for more than half the detection time and then continued is not declared dead:
// the head counts its heartbeat late and shows how long it was silent (loco status --json, the
// dashboard's /metrics).
TEST(Cluster, ANodeSilentForHalfTheDetectionTimeIsCountedLateNotDead) {
  ClusterOptions o;
  o.nodes = 2;
  o.detect_ms = 4000;
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  const NodeStatus first = rt.status().nodes.at(0);
  auto of = [&](const std::string& id) {
    for (const NodeStatus& n : rt.status().nodes)
      if (n.node.id == id) return n;
    throw std::runtime_error("node " + id + " is gone from status");
  };
  ASSERT_TRUE(eventually([&] { return of(first.node.id).heartbeat_silent_ms >= 0; },
                         Millis(5000), Millis(20)));
  EXPECT_EQ(of(first.node.id).heartbeat_late, 0);
  ASSERT_EQ(::kill(c.node(first.node.address).pid(), SIGSTOP), 0);
  // Silent for 2.2 s of the head's clock: past half the detection time, well short of it.
  const bool silent = eventually(
      [&] { return of(first.node.id).heartbeat_silent_ms >= 2200; }, Millis(4000), Millis(20));
  ASSERT_EQ(::kill(c.node(first.node.address).pid(), SIGCONT), 0);
  ASSERT_TRUE(silent);
  ASSERT_TRUE(eventually([&] { return of(first.node.id).heartbeat_late == 1; }, Millis(5000),
                         Millis(20)));
  const NodeStatus back = of(first.node.id);
  EXPECT_EQ(back.node.state, NodeState::alive);
  EXPECT_GE(back.heartbeat_longest_ms, 2200);
  EXPECT_LT(back.heartbeat_longest_ms, o.detect_ms);
}

std::string text_of(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// SIGTERM asks a node's actors to stop (ActorClass::on_stop): a method that listens ends at
// once, its caller gets ActorDiedError saying so, and the node leaves long before its grace
// time (30 s by default) would run out. Without the hook the method would run its 60 s.
TEST(Cluster, SigtermedNodeAsksItsActorsToStopAndLeavesWithinItsGrace) {
  ClusterOptions o;
  o.nodes = 1;
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  auto a = rt.spawn<Counter>(ActorOptions(), 0);
  const std::string marker = c.log_dir() + "/running";
  auto call = a.call(&Counter::wait_for_stop, marker, 60000, true);
  ASSERT_TRUE(
      eventually([&] { return std::filesystem::exists(marker); }, Millis(20000), Millis(10)));
  Subprocess& node = c.node(a.address());
  ASSERT_EQ(::kill(node.pid(), SIGTERM), 0);
  try {
    (void)call.get(Millis(20000));
    FAIL() << "the call returned";
  } catch (const ActorDiedError& e) {
    EXPECT_TRUE(contains(e.what(), "was stopped on")) << e.what();
    EXPECT_TRUE(contains(e.what(), "asked to stop")) << e.what();
  }
  EXPECT_EQ(node.wait(Millis(20000)).value_or(-1), 0) << "the node did not exit in 20 s";
  const std::string log = text_of(c.log_dir() + "/node-0.log");
  EXPECT_FALSE(contains(log, "leaving without them")) << log;
}

// A method that does not listen holds the node only for its grace time (--stop-grace): then
// the node records that it left and exits, and the caller learns that the actor died.
// One node with a stop grace of 1 s (and `more` node options), and a Counter on it in a method
// that ignores its stop hook for 120 s (started: its marker written).
struct StuckActor {
  explicit StuckActor(std::vector<std::string> more = {}) : c(options(std::move(more))) {}
  static ClusterOptions options(std::vector<std::string> more) {
    more.insert(more.begin(), {"--stop-grace", "1"});
    return ClusterOptions{.nodes = 1, .extra_node_args = more};
  }
  LocalCluster c;
  Runtime& rt = c.runtime();
  ActorHandle<Counter> a = rt.spawn<Counter>(ActorOptions(), 0);
  Future<int> call = a.call(&Counter::wait_for_stop, c.log_dir() + "/running", 120000, false);
  bool started = eventually([&] { return std::filesystem::exists(c.log_dir() + "/running"); },
                            Millis(20000), Millis(10));
  Subprocess& node = c.node(a.address());
};

TEST(Cluster, ANodeWhoseActorIgnoresTheStopLeavesAfterItsGrace) {
  StuckActor s;
  ASSERT_TRUE(s.started);
  auto& [c, rt, a, call, started, node] = s;
  const std::string id = rt.status().nodes.at(0).node.id;
  ASSERT_EQ(::kill(node.pid(), SIGTERM), 0);
  EXPECT_EQ(node.wait(Millis(20000)).value_or(-1), 0) << "the node did not exit in 20 s";
  EXPECT_THROW((void)call.get(Millis(20000)), ActorDiedError);
  const std::string log = text_of(c.log_dir() + "/node-0.log");
  EXPECT_TRUE(contains(log, "still in a method 1.0 s after the stop began")) << log;
  bool left = false;
  for (const NodeStatus& n : rt.status().nodes)
    if (n.node.id == id) left = n.node.state == NodeState::left;
  EXPECT_TRUE(left) << "the node did not record that it left";
}

// An actor killed in a method that ignores its stop hook (a kill does not wait for it: issue
// "21 ·") does not hold up its node's stop either: SIGTERM ends the node within its grace,
// saying it did not wait for that method, instead of waiting for the method to return.
TEST(Cluster, ANodeStopsAlthoughAKilledActorIsStillInAMethod) {
  StuckActor s;
  ASSERT_TRUE(s.started);
  auto& [c, rt, a, call, started, node] = s;
  rt.kill(a.id());
  ASSERT_TRUE(eventually(
      [&] { return contains(text_of(c.log_dir() + "/node-0.log"), "killed actor " + a.id()); },
      Millis(10000)));
  ASSERT_EQ(::kill(node.pid(), SIGTERM), 0);
  EXPECT_EQ(node.wait(Millis(20000)).value_or(-1), 0) << "the node did not exit in 20 s";
  EXPECT_TRUE(contains(text_of(c.log_dir() + "/node-0.log"),
                       "a killed actor is still in a method; not waiting for it"));
}

// A cancel ends a method that never returns (issue "21 ·", finding 2: a TorchScript forward
// that spins kept its thread and its CPU after the job's cancel, for good). An actor is a
// thread of its node's process and cannot be ended alone, so a killed actor still in its method
// after the node's kill grace (--kill-grace, 1 s here, 60 s by default) ends the node: it
// leaves as on a stop and exits with code 3, which its supervisor restarts.
TEST(Cluster, AKilledActorStillInItsMethodAfterTheKillGraceEndsItsNode) {
  StuckActor s({"--kill-grace", "1"});
  ASSERT_TRUE(s.started);
  auto& [c, rt, a, call, started, node] = s;
  const std::string id = rt.status().nodes.at(0).node.id;
  rt.kill(a.id());
  EXPECT_EQ(node.wait(Millis(20000)).value_or(-1), kExitActorOutlivedKill)
      << "the node did not end in 20 s";
  const std::string log = text_of(c.log_dir() + "/node-0.log");
  EXPECT_TRUE(contains(log, "a killed actor is still in a method 1.0 s after its kill")) << log;
  EXPECT_TRUE(contains(log, a.id() + " (test.Counter)")) << log;
  bool left = false;
  for (const NodeStatus& n : rt.status().nodes)
    if (n.node.id == id) left = n.node.state == NodeState::left;
  EXPECT_TRUE(left) << "the node did not record that it left";
}

// The head never waits on a node: with one node stopped (SIGSTOP: its sockets accept, nothing
// answers), spawns placed there and the restarts of its actors leave the head answering
// status and hello at once. (It once waited on each create_actor, up to the detection time.)
TEST(Cluster, TheHeadKeepsAnsweringWhileANodeIsStoppedAndItsActorsRestart) {
  ClusterOptions o;
  o.nodes = 3;
  o.detect_ms = 1000;
  o.node_resources = "cpu=64";
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  std::vector<ActorHandle<Counter>> before;
  for (int i = 0; i < 30; ++i)
    before.push_back(rt.spawn<Counter>(ActorOptions().with_max_restarts(1), i));
  const std::string stopped = before[0].address();
  std::string stopped_id;
  for (auto& n : rt.status().nodes)
    if (n.node.address == stopped) stopped_id = n.node.id;
  int on_stopped = 0;
  for (auto& a : before) on_stopped += a.address() == stopped;
  ASSERT_GE(on_stopped, 5);

  // A second client measures how long the head takes to answer, all along.
  Runtime probe = Runtime::connect(c.head_address(), ConnectOptions{Millis(10000), o.detect_ms});
  HeadProbe prober(
      [&] {
        (void)probe.status();
        (void)probe.core()->call_head("hello", detail::pack_payload(std::tuple<>()), Millis(10000));
      },
      Millis(10), [](const Error& e) { ADD_FAILURE() << "the head did not answer: " << e.what(); });

  auto t0 = Clock::now();
  ASSERT_EQ(::kill(c.node(stopped).pid(), SIGSTOP), 0);
  // Spawned right away, some land on the stopped node before it is suspected; their spawns
  // answer once the head has moved them (restarting) or they are alive elsewhere.
  std::vector<ActorHandle<Counter>> after;
  for (int i = 0; i < 6; ++i)
    after.push_back(rt.spawn<Counter>(ActorOptions().with_max_restarts(1), 100 + i));

  // Every actor of the stopped node runs again elsewhere within detection + 5 s.
  auto all_moved = [&] {
    for (auto& a : rt.status().actors)
      if (a.state != ActorState::alive || a.node_id == stopped_id) return false;
    return true;
  };
  EXPECT_TRUE(eventually(all_moved, Millis(o.detect_ms + 5000), Millis(20)));
  int64_t moved_ms = ms_since(t0);
  // Fresh handles (the old ones still point at the stopped node: their first call would be an
  // ActorDiedError) reach every actor, restarted ones constructed again with their arguments.
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(rt.actor<Counter>(after[i].id()).call(&Counter::get).get(Millis(10000)),
              100 + int(i));
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(rt.actor<Counter>(before[i].id()).call(&Counter::get).get(Millis(10000)), int(i));
  for (auto& a : rt.status().actors) EXPECT_LE(a.restarts, 1) << a.id;
  std::vector<double> waits = prober.stop();

  ASSERT_GE(waits.size(), 10u);
  std::sort(waits.begin(), waits.end());
  double p99 = waits[waits.size() * 99 / 100], worst = waits.back();
  std::cout << on_stopped << " actors on the stopped node; all running elsewhere after " << moved_ms
            << " ms; head status+hello over " << waits.size() << " probes: median "
            << waits[waits.size() / 2] << " ms, p99 " << p99 << " ms, max " << worst << " ms\n";
  EXPECT_LT(worst, 500) << "the head stalled";
}

// A quarter of the nodes killed (SIGKILL), all but one at once and the last half a detection
// time later, so that when the others are declared dead it is suspected but not yet dead: every
// one is declared dead within its detection time (+1 s), every actor of theirs runs again on a
// live node within detection + 5 s of the last kill, none is placed on the suspected node and
// lost, and status keeps answering. (With 32 nodes and 2,000 actors the head once restarted
// onto such a node, blocking 2 s per actor: silent 15.5 minutes, 422 of 496 actors dead.)
TEST(Cluster, AQuarterOfTheNodesKilledAtOnceLoseNoRestartableActor) {
  constexpr int kNodes = 16, kActors = 500, kKilled = kNodes / 4;
  ClusterOptions o;
  o.nodes = kNodes;
  o.detect_ms = 1500;
  o.node_resources = "cpu=64";
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  auto t_spawn = Clock::now();
  std::vector<std::string> ids;
  for (int i = 0; i < kActors; ++i)
    ids.push_back(rt.spawn<Counter>(ActorOptions().with_max_restarts(1), i).id());
  int64_t spawn_ms = ms_since(t_spawn);

  ClusterStatus before = rt.status();
  std::map<std::string, std::string> node_of;  // actor -> node id
  for (auto& a : before.actors) node_of[a.id] = a.node_id;
  std::vector<std::string> victims;  // addresses
  std::set<std::string> victim_ids;
  for (auto& n : before.nodes)
    if (int(victims.size()) < kKilled) {
      victims.push_back(n.node.address);
      victim_ids.insert(n.node.id);
    }
  int moving = 0;
  for (auto& [a, n] : node_of) moving += victim_ids.count(n);
  ASSERT_GT(moving, kActors / 8);

  Runtime probe = Runtime::connect(c.head_address(), ConnectOptions{Millis(10000), o.detect_ms});
  HeadProbe prober([&] { (void)probe.status(); }, Millis(20),
                   [](const Error& e) { ADD_FAILURE() << "status failed: " << e.what(); });

  auto t0 = Clock::now();
  for (int k = 0; k + 1 < kKilled; ++k) c.node(victims[k]).signal(SIGKILL);
  // Fault injection, not synchronisation: the last victim dies half a detection time later.
  std::this_thread::sleep_for(Millis(o.detect_ms / 2));
  const int64_t last_kill_ms = ms_since(t0);
  c.node(victims.back()).signal(SIGKILL);
  std::string last_id;
  for (auto& n : before.nodes)
    if (n.node.address == victims.back()) last_id = n.node.id;
  std::map<std::string, int64_t> declared;  // node id -> ms after the kill
  int64_t all_running_ms = -1;
  auto settled = [&] {
    ClusterStatus st = rt.status();
    int64_t now = ms_since(t0);
    for (auto& n : st.nodes)
      if (victim_ids.count(n.node.id) && n.node.state == NodeState::dead &&
          !declared.count(n.node.id))
        declared[n.node.id] = now;
    int running = 0;
    for (auto& a : st.actors)
      running += a.state == ActorState::alive && !victim_ids.count(a.node_id);
    if (running == kActors && all_running_ms < 0) all_running_ms = now;
    return all_running_ms >= 0 && declared.size() == victim_ids.size();
  };
  EXPECT_TRUE(eventually(settled, Millis(o.detect_ms + 15000), Millis(50)));
  std::vector<double> waits = prober.stop();

  ClusterStatus after = rt.status();
  int restarted = 0, dead = 0;
  for (auto& a : after.actors) {
    dead += a.state == ActorState::dead;
    if (victim_ids.count(node_of[a.id])) {
      restarted += a.restarts == 1;
      EXPECT_EQ(a.restarts, 1) << a.id << " " << a.reason;
    } else {
      EXPECT_EQ(a.restarts, 0) << a.id << " " << a.reason;
    }
  }
  int64_t worst_declared = 0;  // after its own kill
  for (auto& [n, ms] : declared)
    worst_declared = std::max(worst_declared, ms - (n == last_id ? last_kill_ms : 0));
  ASSERT_FALSE(waits.empty());
  std::sort(waits.begin(), waits.end());
  double p99 = waits[waits.size() * 99 / 100];
  std::cout << kNodes << " nodes, " << kActors << " actors spawned in " << spawn_ms << " ms ("
            << kActors * 1000 / std::max<int64_t>(1, spawn_ms) << "/s); killed " << kKilled
            << " nodes holding " << moving << " actors (the last " << last_kill_ms
            << " ms after the others): each declared dead at most " << worst_declared
            << " ms after its kill, all " << kActors << " running after " << all_running_ms
            << " ms (detect " << o.detect_ms << " ms); " << restarted << " restarted, " << dead
            << " dead; status over " << waits.size() << " probes: median "
            << waits[waits.size() / 2] << " ms, p99 " << p99 << " ms, max " << waits.back()
            << " ms\n";
  EXPECT_EQ(dead, 0);
  EXPECT_EQ(restarted, moving);
  EXPECT_EQ(declared.size(), victim_ids.size());
  EXPECT_LE(worst_declared, o.detect_ms + 1000);
  EXPECT_GE(all_running_ms, 0);
  EXPECT_LE(all_running_ms, last_kill_ms + o.detect_ms + 5000);
  EXPECT_LT(waits.back(), 1000) << "status stalled";
}

// Dead actors and departed nodes are forgotten after the retention time (here 1 s): the
// store's tables and the head's passes over them stay the size of the live cluster.
TEST(Cluster, DeadActorsAndDepartedNodesAreForgottenAfterTheRetentionTime) {
  ClusterOptions o;
  o.nodes = 2;
  o.extra_head_args = {"--retention-s=1"};
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  auto gone = rt.spawn<Counter>(ActorOptions().with_name("gone"), 1);
  auto kept = rt.spawn<Counter>(ActorOptions().with_name("kept"), 2);
  rt.kill(gone.id());
  EXPECT_EQ(rt.locate(gone.id()).state, ActorState::dead);
  std::string leaving = c.node_addresses()[0];
  if (leaving == kept.address()) leaving = c.node_addresses()[1];
  c.node(leaving).signal(SIGTERM);
  ASSERT_TRUE(c.node(leaving).wait(Millis(10000)));

  auto store = membership::make_redis_store(c.redis().url());
  auto forgotten = [&] {
    ClusterStatus st = rt.status();
    bool node_listed = false;
    for (auto& n : st.nodes) node_listed |= n.node.address == leaving;
    return st.actors.size() == 1 && st.nodes.size() == 1 && !node_listed;
  };
  EXPECT_TRUE(eventually(forgotten, Millis(10000), Millis(50)));
  EXPECT_FALSE(store->hget(keys::kActors, gone.id()));
  EXPECT_FALSE(store->hget(keys::kNames, "gone"));
  EXPECT_EQ(store->hgetall(keys::kNodes).size(), 1u);
  EXPECT_THROW(rt.locate(gone.id()), ActorNotFoundError);
  // The living are untouched, and the name is free again.
  EXPECT_EQ(kept.call(&Counter::get).get(Millis(5000)), 2);
  EXPECT_EQ(
      rt.spawn<Counter>(ActorOptions().with_name("gone"), 3).call(&Counter::get).get(Millis(5000)),
      3);
}

// Status reads a page of the actors it is asked for: by state, by node, from an offset.
TEST(Cluster, StatusIsFilteredAndPaginated) {
  ClusterOptions o;
  o.nodes = 2;
  o.node_resources = "cpu=64";
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  std::vector<std::string> ids;
  for (int i = 0; i < 25; ++i) ids.push_back(rt.spawn<Counter>(ActorOptions(), i).id());
  for (int i = 0; i < 5; ++i) rt.kill(ids[i]);

  std::vector<std::string> paged;
  for (uint64_t offset = 0;; offset += 8) {
    ClusterStatus page = rt.status(StatusQuery{"alive", "", offset, 8});
    EXPECT_EQ(page.actors_total, 20u);
    EXPECT_EQ(page.nodes.size(), 2u);
    EXPECT_LE(page.actors.size(), 8u);
    for (auto& a : page.actors) {
      EXPECT_EQ(a.state, ActorState::alive);
      paged.push_back(a.id);
    }
    if (page.actors.empty()) break;
  }
  std::vector<std::string> alive(ids.begin() + 5, ids.end());
  std::sort(alive.begin(), alive.end());
  EXPECT_EQ(paged, alive);  // every one once, sorted by id

  EXPECT_EQ(rt.status(StatusQuery{"dead", "", 0, 0}).actors.size(), 5u);
  std::string node = rt.status().nodes[0].node.id;
  size_t on_node = 0;
  for (auto& a : rt.status().actors) on_node += a.node_id == node && a.state == ActorState::alive;
  ClusterStatus mine = rt.status(StatusQuery{"alive", node, 0, 0});
  EXPECT_EQ(mine.actors.size(), on_node);
  for (auto& a : mine.actors) EXPECT_EQ(a.node_id, node);
  EXPECT_THROW(rt.status(StatusQuery{"sleeping", "", 0, 0}), Error);

  std::string out = c.log_dir() + "/status-page.txt";
  std::string cmd =
      loco_binary() + " status --address " + c.head_address() + " --state dead --limit 2 > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  EXPECT_TRUE(contains(text.str(), "(2 of 5 actors")) << text.str();
}

// A restart sent to a node that then turns out dead does not use up the restart: the actor is
// placed again and runs, counted as restarted once (it was once marked dead "no restarts left").
TEST(Cluster, AFailedStartOnALostNodeUsesUpNoRestart) {
  ClusterOptions o;
  o.nodes = 1;
  o.detect_ms = 1000;
  o.node_resources = "cpu=2";
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  auto a = rt.spawn<Counter>(ActorOptions().with_max_restarts(1), 7);
  const std::string first = a.address();
  // A bigger node joins: placement prefers it (most free cpu). Stopped, it takes the restart
  // and never answers.
  const std::string big = c.add_node({"--resources=cpu=64"});
  ASSERT_TRUE(c.wait_alive_nodes(2));
  ASSERT_EQ(::kill(c.node(big).pid(), SIGSTOP), 0);
  rt.kill(a.id(), /*allow_restart=*/true);
  auto back = [&] {
    ActorInfo info = rt.locate(a.id());
    return info.state == ActorState::alive || info.state == ActorState::dead;
  };
  ASSERT_TRUE(eventually(back, Millis(10000), Millis(20)));
  ActorInfo info = rt.locate(a.id());
  EXPECT_EQ(info.state, ActorState::alive) << info.reason;
  EXPECT_EQ(info.address, first);
  EXPECT_EQ(info.restarts, 1);
  EXPECT_EQ(rt.actor<Counter>(a.id()).call(&Counter::get).get(Millis(5000)), 7);
  // It went by the stopped node: the head says so.
  auto store = membership::make_redis_store(c.redis().url());
  bool via_stopped = false;
  for (auto& e : store->read(keys::kEvents, "0", 10000))
    via_stopped |= e.fields["type"] == "actor_restarting" &&
                   contains(e.fields["reason"], "could not be created on node") &&
                   contains(e.fields["reason"], big);
  EXPECT_TRUE(via_stopped);
}

std::string maps_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// A node started on the plugin folder maps no plugin until it is asked to host one of the
// classes a plugin offers, and then only that plugin (an idle node once mapped LibTorch:
// 357 MB).
TEST(Cluster, AnIdleNodeLoadsNoPluginAndAHostLoadsOnlyWhatItsActorsNeed) {
  ClusterOptions o;
  o.nodes = 1;
  o.plugins = LOCO_PLUGIN_DIR_STR ":" LOCO_TEST_PLUGIN_DIR_STR;
  LocalCluster c(o);
  pid_t pid = c.node(c.node_addresses()[0]).pid();
  std::string maps = maps_of(pid);
  ASSERT_TRUE(contains(maps, "libloco_runtime")) << maps;  // the file is readable
  EXPECT_FALSE(contains(maps, "libloco_test_actors")) << maps;
  EXPECT_FALSE(contains(maps, "libtorch")) << maps;

  auto counter = c.runtime().spawn<Counter>(ActorOptions(), 5);
  EXPECT_EQ(counter.call(&Counter::get).get(Millis(5000)), 5);
  maps = maps_of(pid);
  EXPECT_TRUE(contains(maps, "libloco_test_actors")) << maps;
  EXPECT_FALSE(contains(maps, "libtorch")) << maps;
  EXPECT_FALSE(contains(maps, "libloco_diloco_actors")) << maps;

  // A class no plugin offers: the error lists what the node could host.
  try {
    SpawnRequest req;
    req.class_name = "test.Nobody";
    (void)c.runtime().core()->call_head("spawn", detail::pack_payload(std::make_tuple(req)),
                                        Millis(10000));
    FAIL() << "spawned a class nobody offers";
  } catch (const ActorNotFoundError& e) {
    EXPECT_TRUE(contains(e.what(), "test.Counter")) << e.what();
  }

  // A training actor: the node loads the DiLoCo plugin (and LibTorch) when asked to host
  // one, even if its constructor then refuses these arguments.
  if (!std::filesystem::exists(LOCO_PLUGIN_DIR_STR "/libloco_diloco_actors.so"))
    GTEST_SKIP() << "the DiLoCo plugin is not built; the rest needs it";
  SpawnRequest req;
  req.class_name = "diloco.InnerWorker";
  req.resources = {{"cpu", 0}};
  try {
    (void)c.runtime().core()->call_head("spawn", detail::pack_payload(std::make_tuple(req)),
                                        Millis(60000));
  } catch (const Error&) {
    // Constructed without arguments it fails; the plugin is loaded by then.
  }
  maps = maps_of(pid);
  EXPECT_TRUE(contains(maps, "libloco_diloco_actors")) << maps;
  EXPECT_TRUE(contains(maps, "libtorch")) << maps;
}


detail::Envelope request(const std::string& target, const std::string& method, uint64_t corr) {
  detail::Envelope e;
  e.kind = static_cast<uint8_t>(detail::Kind::Request);
  e.target = target;
  e.method = method;
  e.corr = corr;
  e.sender = "raw";
  return e;
}

TEST(Cluster, BadInputGetsAnErrorReplyAndTheNodeKeepsServing) {
  ClusterOptions o;
  o.nodes = 1;
  o.extra_node_args = {"--max-message-bytes=1000000"};
  LocalCluster c(o);
  auto a = c.runtime().spawn<Counter>(ActorOptions(), 0);
  RawPeer raw(a.address());
  auto still_serving = [&] { EXPECT_EQ(a.call(&Counter::add, 1).get(Millis(5000)) > 0, true); };

  // Truncated envelope.
  auto whole = detail::encode(request(a.id(), "get", 5));
  std::string bytes(static_cast<const char*>(whole[0].data()), whole[0].size());
  raw.send_bytes(bytes.substr(0, bytes.size() / 2));
  auto r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  EXPECT_TRUE(contains(r.error_message, "malformed envelope")) << r.error_message;
  still_serving();

  // Not msgpack at all.
  raw.send_bytes(std::string("\xc1garbage", 8));
  EXPECT_EQ(raw.reply().error_type, "ProtocolError");
  still_serving();

  // Another protocol version.
  auto v2 = request(a.id(), "get", 6);
  v2.version = 2;
  raw.send(detail::encode(v2, detail::pack_payload(std::tuple<>())));
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  EXPECT_EQ(r.corr, 6u);
  EXPECT_TRUE(contains(r.error_message, "protocol version 2")) << r.error_message;
  still_serving();

  // Unknown actor, unknown method, wrong argument types.
  raw.send(detail::encode(request("a-missing", "get", 7), detail::pack_payload(std::tuple<>())));
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ActorNotFoundError");
  EXPECT_EQ(r.corr, 7u);
  raw.send(detail::encode(request(a.id(), "explode", 8), detail::pack_payload(std::tuple<>())));
  r = raw.reply();
  EXPECT_EQ(r.error_type, "MethodNotFoundError");
  EXPECT_TRUE(contains(r.error_message, "it has: add, get")) << r.error_message;
  raw.send(detail::encode(request(a.id(), "add", 9),
                          detail::pack_payload(std::make_tuple(std::string("not an int")))));
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  EXPECT_TRUE(contains(r.error_message, "arguments of test.Counter.add")) << r.error_message;
  // A body that refers to a blob frame that is not there.
  raw.send(detail::encode(request(a.id(), "sum", 10), [] {
    detail::Payload p = detail::pack_payload(std::make_tuple(Blob::copy_of("abcd", 4)));
    p.blobs.clear();
    return p;
  }()));
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  still_serving();

  // Oversized: 2 MB against the node's 1 MB limit.
  raw.send(detail::encode(
      request(a.id(), "echo", 11),
      detail::pack_payload(std::make_tuple(Blob::from_vector(std::vector<uint8_t>(2 << 20))))));
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  EXPECT_TRUE(contains(r.error_message, "exceeds the limit")) << r.error_message;
  still_serving();

  // The probe's inputs. 42 bytes that declare an array of 2^32 - 1 elements (128 GB of
  // msgpack objects): refused by the declared length against the bytes there.
  std::string huge = "\xdd\xff\xff\xff\xff";
  huge.resize(42, '\xc0');
  raw.send_bytes(huge);
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  EXPECT_TRUE(contains(r.error_message, "an array of 4294967295 elements in 42 bytes"))
      << r.error_message;
  still_serving();
  // An envelope of 900 KB of nils (the probe sent 200 MB): refused by its size, undecoded.
  std::string nils = "\xdd";
  for (int shift : {24, 16, 8, 0}) nils.push_back(static_cast<char>((900000 >> shift) & 0xff));
  nils.append(900000, '\xc0');
  raw.send_bytes(nils);
  r = raw.reply();
  EXPECT_EQ(r.error_type, "ProtocolError");
  EXPECT_TRUE(contains(r.error_message, "envelope of 900005 bytes exceeds the limit of 65536"))
      << r.error_message;
  still_serving();
}

TEST(Cluster, RedisUnreachableAtStartExitsNonZeroWithAClearMessage) {
  int port = free_tcp_port();
  char tmpl[] = "/tmp/loco-noredis-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  Subprocess::Options o;
  o.log_path = dir + "/head.log";
  // --insecure: this is about Redis, and run alone (as ctest does) no test before it has
  // pointed $LOCO_KEY at a key.
  Subprocess head({loco_binary(), "start", "--head", "--block", "--host=127.0.0.1", "--port=0",
                   "--insecure", "--redis=redis://127.0.0.1:" + std::to_string(port)},
                  o);
  auto rc = head.wait(Millis(10000));
  ASSERT_TRUE(rc) << "the head kept running without Redis";
  EXPECT_NE(*rc, 0);
  std::ifstream f(o.log_path);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_TRUE(contains(text, "cannot reach Redis")) << text;
  EXPECT_TRUE(contains(text, std::to_string(port))) << text;
  std::filesystem::remove_all(dir);
}

TEST(Cluster, RedisLostWhileRunningNodesRetryAndCarryOn) {
  ClusterOptions o;
  o.redis_appendonly = true;
  LocalCluster c(o);
  Runtime& rt = c.runtime();
  auto a = rt.spawn<Counter>(ActorOptions().with_name("survivor"), 0);
  c.redis().kill();
  // The data path does not need Redis.
  EXPECT_EQ(a.call(&Counter::add, 1).get(Millis(5000)), 1);
  // The control path says what is wrong instead of hanging.
  try {
    rt.status();
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "Redis")) << e.what();
  }
  // Outlast the detection time, then bring Redis back.
  std::this_thread::sleep_for(Millis(2500));
  c.redis().start();
  auto recovered = [&] {
    try {
      ClusterStatus st = rt.status();
      int alive = 0;
      for (auto& n : st.nodes) alive += n.node.state == NodeState::alive;
      return alive == 3 && st.actors.size() == 1 && st.actors[0].state == ActorState::alive;
    } catch (const Error&) {
      return false;
    }
  };
  EXPECT_TRUE(eventually(recovered, std::chrono::seconds(15), Millis(50)))
      << "cluster did not recover after Redis came back";
  EXPECT_EQ(rt.get_actor<Counter>("survivor").call(&Counter::add, 1).get(Millis(5000)), 2);
  auto b = rt.spawn<Counter>(ActorOptions(), 3);
  EXPECT_EQ(b.call(&Counter::get).get(Millis(5000)), 3);
}

}  // namespace
}  // namespace loco::testing

namespace loco::testing {
namespace {

// Polls `path` until it contains `needle` or `timeout` passes.
bool wait_for_text(const std::string& path, const std::string& needle, Millis timeout) {
  return eventually([&] { return read_file(path).find(needle) != std::string::npos; }, timeout);
}

TEST(Cli, UpStartsAWholeClusterAndCtrlCStopsAllOfIt) {
  char tmpl[] = "/tmp/loco-up-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  Subprocess::Options o;
  o.log_path = dir + "/up.log";
  o.env["LOCO_STATE_DIR"] = dir;
  // No key there yet: `loco up` makes one, and the cluster uses it.
  const std::string key = dir + "/keys/cluster.key";
  o.env["LOCO_KEY"] = key;
  ::setenv("LOCO_KEY", key.c_str(), 1);
  ::unsetenv("LOCO_INSECURE");
  Subprocess up({loco_binary(), "up", "--workers", "2"}, o);
  ASSERT_TRUE(wait_for_text(o.log_path, "press Ctrl-C", Millis(30000))) << read_file(o.log_path);
  std::string log = read_file(o.log_path);
  EXPECT_TRUE(contains(log, "made a cluster key at " + key)) << log;
  // Its Redis wants a password, which the output does not show.
  EXPECT_TRUE(contains(log, "redis redis://:***@127.0.0.1:")) << log;
  EXPECT_NO_THROW(security::read_key_file(key));
  auto at = log.find("head ") + 5;
  std::string head = log.substr(at, log.find(',', at) - at);
  auto r = log.find("redis ", at) + 6;
  std::string redis_url = log.substr(r, log.find(' ', r) - r);
  {
    Runtime rt = Runtime::connect(head);
    EXPECT_EQ(rt.status().nodes.size(), 2u);
  }
  // Without the password its Redis refuses us, saying why.
  const std::string no_password = "redis://" + redis_url.substr(redis_url.find('@') + 1);
  try {
    membership::make_redis_store(no_password, Millis(2000))->ping();
    ADD_FAILURE() << "Redis of loco up answered without a password";
  } catch (const membership::StoreError& e) {
    EXPECT_TRUE(contains(e.what(), "requires a password")) << e.what();
  }
  up.signal(SIGINT);
  auto rc = up.wait(Millis(20000));
  ASSERT_TRUE(rc) << "loco up did not stop on Ctrl-C";
  EXPECT_EQ(*rc, 0);
  // Nothing answers any more: not the head, not its redis-server.
  EXPECT_THROW(Runtime::connect(head, ConnectOptions{Millis(1500)}), ClusterError);
  auto store = membership::make_redis_store(redis_url, Millis(500));
  EXPECT_THROW(store->ping(), membership::StoreUnavailable);
  std::filesystem::remove_all(dir);
}

TEST(Cli, StartDaemonsThenStopStopsThem) {
  RedisServer redis;
  char tmpl[] = "/tmp/loco-daemons-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  setenv("LOCO_STATE_DIR", dir.c_str(), 1);
  security::write_key_file(dir + "/cluster.key", security::generate_key_pair());
  setenv("LOCO_KEY", (dir + "/cluster.key").c_str(), 1);
  unsetenv("LOCO_INSECURE");
  int port = free_tcp_port();
  std::string head = "127.0.0.1:" + std::to_string(port);
  std::string start_head = loco_binary() + " start --head --host 127.0.0.1 --port " +
                           std::to_string(port) + " --redis " + redis.url() + " > " + dir + "/out";
  ASSERT_EQ(std::system(start_head.c_str()), 0) << read_file(dir + "/out");
  std::string start_node =
      loco_binary() + " start --host 127.0.0.1 --resources cpu=1 >> " + dir + "/out";
  ASSERT_EQ(std::system(start_node.c_str()), 0) << read_file(dir + "/out");
  EXPECT_TRUE(contains(read_file(dir + "/out"), "head serving at " + head));
  {
    Runtime rt = Runtime::connect(head);
    ASSERT_EQ(rt.status().nodes.size(), 1u);
  }
  std::string stop = loco_binary() + " stop > " + dir + "/stop";
  ASSERT_EQ(std::system(stop.c_str()), 0);
  std::string out = read_file(dir + "/stop");
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_FALSE(contains(out, "killed")) << "a process needed SIGKILL: " << out;
  EXPECT_THROW(Runtime::connect(head, ConnectOptions{Millis(1500)}), ClusterError);
  unsetenv("LOCO_STATE_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loco::testing
