// Unit tests of the runtime: codec, placement, failure detection, mailboxes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "runtime/core/core.hpp"
#include "runtime/core/decisions.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/run_after.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/wire.hpp"
#include "runtime/security/keys.hpp"
#include "tests/runtime/core/test_actors.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/zmq_probe.hpp"

namespace loco {
namespace {

using detail::Envelope;
using detail::Kind;

std::vector<zmq::message_t> frames_of(const Envelope& env, detail::Payload&& p) {
  return detail::encode(env, std::move(p));
}

TEST(Codec, EnvelopeAndPayloadRoundTrip) {
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Request);
  env.corr = 42;
  env.sender = "driver";
  env.target = "a-1";
  env.method = "add";
  auto frames = frames_of(env, detail::pack_payload(std::make_tuple(7, std::string("x"))));
  auto d = detail::decode(std::move(frames), 1 << 20);
  EXPECT_EQ(d.env.corr, 42u);
  EXPECT_EQ(d.env.method, "add");
  EXPECT_EQ(d.env.target, "a-1");
  auto args = detail::unpack_payload<std::tuple<int, std::string>>(d.payload, "args");
  EXPECT_EQ(std::get<0>(args), 7);
  EXPECT_EQ(std::get<1>(args), "x");
}

TEST(Codec, BlobsTravelAsTheirOwnFramesWithoutCopies) {
  std::vector<float> v(1 << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  Blob b = Blob::from_values(std::move(v));
  const uint8_t* original = b.data();
  auto p = detail::pack_payload(std::make_tuple(std::string("w"), b));
  ASSERT_EQ(p.blobs.size(), 1u);
  // The frame points at the blob's own memory: no copy on the way out.
  EXPECT_EQ(p.blobs[0].data(), static_cast<const void*>(original));
  EXPECT_LT(p.body.size(), 64u);  // the body holds a placeholder, not the floats
  Envelope env;
  env.kind = static_cast<uint8_t>(Kind::Reply);
  auto d = detail::decode(frames_of(env, std::move(p)), size_t(1) << 30);
  const void* frame_data = d.payload.blobs[0].data();
  auto t = detail::unpack_payload<std::tuple<std::string, Blob>>(d.payload, "reply");
  Blob got = std::get<1>(t);
  // On the way in the blob points into the received frame: no copy either.
  EXPECT_EQ(static_cast<const void*>(got.data()), frame_data);
  auto f = got.as<float>();
  ASSERT_EQ(f.size(), size_t(1) << 20);
  EXPECT_EQ(f[12345], 12345.0f);
}

TEST(Codec, RejectsEmptyGarbageWrongVersionUnknownKindAndOversized) {
  std::vector<zmq::message_t> none;
  EXPECT_THROW(detail::decode(std::move(none), 100), ProtocolError);

  std::vector<zmq::message_t> garbage;
  garbage.emplace_back("\xc1\xc1\xc1", 3);
  try {
    detail::decode(std::move(garbage), 100);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed envelope"), std::string::npos);
  }

  Envelope env;
  env.version = 99;
  env.kind = 1;
  try {
    detail::decode(detail::encode(env), 1000);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("version 99"), std::string::npos) << e.what();
  }

  Envelope bad_kind;
  bad_kind.kind = 77;
  EXPECT_THROW(detail::decode(detail::encode(bad_kind), 1000), ProtocolError);

  Envelope ok;
  ok.kind = 1;
  auto big = frames_of(ok, detail::pack_payload(std::string(5000, 'x')));
  try {
    detail::decode(std::move(big), 1000);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit"), std::string::npos);
  }
}

TEST(Codec, TruncatedEnvelopeIsAProtocolErrorAndCorrIsSalvaged) {
  Envelope env;
  env.kind = 1;
  env.corr = 9;
  env.method = "add";
  auto frames = detail::encode(env);
  std::string bytes(static_cast<const char*>(frames[0].data()), frames[0].size());
  std::vector<zmq::message_t> cut;
  cut.emplace_back(bytes.data(), bytes.size() - 3);
  EXPECT_THROW(detail::decode(std::move(cut), 1000), ProtocolError);
  zmq::message_t whole(bytes.data(), bytes.size());
  EXPECT_EQ(detail::salvage_corr(whole), 9u);
}

TEST(States, NamesRoundTripAndUnknownNamesAreRefused) {
  for (NodeState s : {NodeState::alive, NodeState::dead, NodeState::left})
    EXPECT_EQ(parse_node_state(to_string(s)), s);
  for (ActorState s :
       {ActorState::pending, ActorState::alive, ActorState::restarting, ActorState::dead})
    EXPECT_EQ(parse_actor_state(to_string(s)), s);
  for (JobState s : {JobState::running, JobState::succeeded, JobState::failed, JobState::cancelled})
    EXPECT_EQ(parse_job_state(to_string(s)), s);
  EXPECT_EQ(to_string(NodeState::left), "left");
  EXPECT_EQ(to_string(ActorState::restarting), "restarting");
  EXPECT_EQ(to_string(JobState::cancelled), "cancelled");
  try {
    parse_job_state("done");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown job state 'done'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("running, succeeded, failed, cancelled"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_node_state(""), std::invalid_argument);
  EXPECT_THROW(parse_actor_state("Alive"), std::invalid_argument);
}

// The records as they were before the states became enums: a string in the same place.
struct NodeRecordV0 {
  std::string id, address;
  Resources resources;
  std::string state, hostname;
  int64_t pid = 0, started_unix_ms = 0;
  std::string reason;
  MSGPACK_DEFINE(id, address, resources, state, hostname, pid, started_unix_ms, reason)
};
struct JobInfoV0 {
  std::string id, name, entry_class, state, message, entry_actor;
  int64_t submitted_unix_ms = 0, finished_unix_ms = 0;
  int scale = 0;
  MSGPACK_DEFINE(id, name, entry_class, state, message, entry_actor, submitted_unix_ms,
                 finished_unix_ms, scale)
};

template <class To, class From>
To repack(const From& v) {
  msgpack::sbuffer b;
  msgpack::pack(b, v);
  return msgpack::unpack(b.data(), b.size()).get().as<To>();
}

// What a node learns on joining, as a head from before the relay sent it: no relay. A head with
// one hands it to nodes as it was given.
struct ClusterInfoV0 {
  std::string redis_url;
  int64_t detect_ms = 0, heartbeat_ms = 0;
  MSGPACK_DEFINE(redis_url, detect_ms, heartbeat_ms)
};
TEST(States, ClusterInfoFromAHeadWithoutARelayNamesNone) {
  const ClusterInfo old = repack<ClusterInfo>(ClusterInfoV0{"redis://h:1", 1500, 300});
  EXPECT_EQ(old.redis_url, "redis://h:1");
  EXPECT_EQ(old.heartbeat_ms, 300);
  EXPECT_TRUE(old.relay.endpoint.empty());
  ClusterInfo with{"redis://h:1", 1500, 300, RelayInfo{"tcp://10.0.0.9:7300", std::string(40, 'k')}};
  const ClusterInfo again = repack<ClusterInfo>(with);
  EXPECT_EQ(again.relay.endpoint, "tcp://10.0.0.9:7300");
  EXPECT_EQ(again.relay.public_key, std::string(40, 'k'));
  EXPECT_EQ(repack<ClusterInfoV0>(with).detect_ms, 1500);  // an older node reads the rest
}

TEST(States, RecordsKeepTheirWireFormat) {
  NodeRecordV0 old_node;
  old_node.id = "n-1";
  old_node.state = "left";
  old_node.pid = 42;
  NodeRecord node = repack<NodeRecord>(old_node);
  EXPECT_EQ(node.state, NodeState::left);
  EXPECT_EQ(node.pid, 42);
  node.state = NodeState::dead;
  EXPECT_EQ(repack<NodeRecordV0>(node).state, "dead");
  {
    // Fields appended since (a node's spawnable classes) leave the old ones as they were: read
    // by an older reader, a new record is byte for byte the old one; an old one reads as new
    // with the appended fields empty.
    msgpack::sbuffer a, b;
    old_node.state = "dead";
    msgpack::pack(a, old_node);
    node.spawnable = {"wordcount.*"};
    msgpack::pack(b, repack<NodeRecordV0>(node));
    EXPECT_EQ(std::string(a.data(), a.size()), std::string(b.data(), b.size()));
    EXPECT_TRUE(repack<NodeRecord>(old_node).spawnable.empty());
    // A record from before reachability reads as direct; reachability travels as its name.
    EXPECT_EQ(repack<NodeRecord>(old_node).reachability, Reachability::direct);
    node.reachability = Reachability::reverse;
    EXPECT_EQ(repack<NodeRecord>(node).reachability, Reachability::reverse);
    EXPECT_EQ(parse_reachability("relayed"), Reachability::relayed);
    EXPECT_THROW(parse_reachability("sideways"), std::invalid_argument);
    EXPECT_EQ(call_address(node), "head/" + node.id);
    EXPECT_EQ(through_head_node(call_address(node)), node.id);
    EXPECT_EQ(through_head_node("10.0.0.2:7071"), "");
  }

  JobInfoV0 old_job;
  old_job.id = "job-1";
  old_job.state = "succeeded";
  JobInfo job = repack<JobInfo>(old_job);
  EXPECT_EQ(job.state, JobState::succeeded);
  EXPECT_TRUE(job.finished());
  EXPECT_TRUE(job.owner.empty());  // a job of before owners: the operator's
  EXPECT_EQ(repack<JobInfoV0>(job).state, "succeeded");

  old_job.state = "exploded";
  EXPECT_THROW(repack<JobInfo>(old_job), std::invalid_argument);
}

TEST(Resources, ParseAndReject) {
  auto r = parse_resources("cpu=2,gpu=0.5,ssd=1");
  EXPECT_EQ(r.at("cpu"), 2);
  EXPECT_EQ(r.at("gpu"), 0.5);
  EXPECT_EQ(format_resources(r), "cpu=2,gpu=0.5,ssd=1");
  EXPECT_THROW(parse_resources("cpu"), std::invalid_argument);
  EXPECT_THROW(parse_resources("cpu=-1"), std::invalid_argument);
  EXPECT_THROW(parse_resources("cpu=two"), std::invalid_argument);
}

TEST(Placement, SpreadsByFreeCpuAndRespectsEveryResource) {
  std::vector<NodeView> nodes = {
      {"n1", {{"cpu", 4}}, {{"cpu", 3}}, 3},
      {"n2", {{"cpu", 4}}, {{"cpu", 1}}, 1},
      {"n3", {{"cpu", 2}, {"gpu", 1}}, {}, 0},
  };
  EXPECT_EQ(place(nodes, {{"cpu", 1}}).node, "n2");
  EXPECT_EQ(place(nodes, {{"cpu", 1}, {"gpu", 1}}).node, "n3");
  EXPECT_EQ(place(nodes, {{"cpu", 1}}, {"n2"}).node, "n3");
  // Ties on free cpu go to the node with fewer actors.
  std::vector<NodeView> tie = {{"a", {{"cpu", 2}}, {}, 2}, {"b", {{"cpu", 2}}, {}, 1}};
  EXPECT_EQ(place(tie, {}).node, "b");
}

// A tie on free cpu goes to a node the head dials before one behind NAT, whatever their actors
// and ids: a job's aggregator (placed first, needing no cpu) does not land behind a site's
// uplink, which would stall the whole job when that uplink goes down (the soak bench's smoke:
// 155 s). The cpu still comes first.
TEST(Placement, ATieGoesToADirectNodeBeforeOneBehindNat) {
  std::vector<NodeView> nodes = {{"a-nat", {{"cpu", 1}}, {}, 0, {}, false},
                                 {"z-direct", {{"cpu", 1}}, {}, 3, {}, true}};
  EXPECT_EQ(place(nodes, {}).node, "z-direct");
  EXPECT_EQ(place(nodes, {{"cpu", 1}}).node, "z-direct");
  nodes[1].used = {{"cpu", 1}};
  EXPECT_EQ(place(nodes, {}).node, "a-nat");  // more cpu free there
  NodeRecord r;
  r.id = "n";
  r.reachability = Reachability::relayed;
  EXPECT_FALSE(node_views({r}, {}).at(0).direct);
  r.reachability = Reachability::direct;
  EXPECT_TRUE(node_views({r}, {}).at(0).direct);
}

// The soak bench's job failed here: site C's uplink came back, its nodes joined again under new
// ids, and the head placed an actor on one whose record was in Redis but whose connection was
// not up yet; the creation could not be forwarded, twice, and the actor was given up as one
// that crashes its nodes. Such a node is skipped until its connection is up; a suspect only
// while another fits.
TEST(Placement, NotOnANodeBehindNatBeforeItsConnectionIsUp) {
  std::vector<NodeView> nodes = {{"nat", {{"cpu", 1}}, {}, 0, {}, false},
                                 {"direct", {{"cpu", 1}}, {{"cpu", 1}}, 1, {}, true}};
  std::set<std::string> up;
  const auto connected = [&](const std::string& id) { return up.count(id) > 0; };
  Placement p = place_reachable(nodes, {{"cpu", 1}}, {}, connected);
  EXPECT_FALSE(p.node);
  EXPECT_NE(p.reason.find("1 node(s) behind NAT not connected to the head yet"), std::string::npos)
      << p.reason;
  up.insert("nat");
  EXPECT_EQ(place_reachable(nodes, {{"cpu", 1}}, {}, connected).node, "nat");
  // A suspect (a silent heartbeat) only when nothing else fits; a direct node needs no link.
  nodes[1].used.clear();
  EXPECT_EQ(place_reachable(nodes, {{"cpu", 1}}, {"direct"}, connected).node, "nat");
  EXPECT_EQ(place_reachable(nodes, {{"cpu", 1}}, {"nat", "direct"}, connected).node, "direct");
  up.clear();
  EXPECT_EQ(place_reachable(nodes, {{"cpu", 1}}, {"direct"}, connected).node, "direct");
}

// What a node does every 30 s (release_free_memory): buffers that many threads allocated and
// freed (a node's fragment all-reduces, checkpoint writers, evaluations), each in its thread's
// malloc arena behind one still held, stay resident until then; after it, the process holds
// about what it still uses. The soak bench's nodes grew by 16 such arenas of 50 MB.
TEST(Memory, WhatManyThreadsFreedGoesBackToTheSystem) {
  constexpr int kThreads = 8, kBlocks = 600;
  constexpr size_t kBlock = 64 << 10;  // under malloc's mmap threshold: in the arenas
  release_free_memory();
  const int64_t before = resident_bytes();
  ASSERT_GT(before, 0);
  std::vector<void*> held(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<void*> blocks;
      for (int i = 0; i < kBlocks; ++i) {
        blocks.push_back(std::malloc(kBlock));
        std::memset(blocks.back(), 1, kBlock);
      }
      for (int i = 0; i + 1 < kBlocks; ++i) std::free(blocks[size_t(i)]);
      held[size_t(t)] = blocks.back();  // the arena's top stays in use: no trim on free
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();  // all at once: one arena each
    });
  for (auto& t : threads) t.join();
  const int64_t freed = int64_t(kThreads) * (kBlocks - 1) * int64_t(kBlock);  // 300 MB
  const int64_t retained = resident_bytes() - before;
  release_free_memory();
  const int64_t after = resident_bytes() - before;
  for (void* p : held) std::free(p);
  EXPECT_GT(retained, freed / 2) << "the scenario must hold freed memory resident";
  EXPECT_LT(after, freed / 10) << "retained " << retained << " bytes; after the release " << after;
}

// What a spawn may ask: a negative, NaN or unknown resource would switch placement's accounting
// off (the probe placed 40 actors needing cpu=1 on 4 CPUs after {cpu: -100}).
TEST(Requests, ResourcesMustBeFiniteNonNegativeAndKnown) {
  const std::set<std::string> declared = {"cpu", "ssd"};
  EXPECT_EQ(check_resources({{"cpu", 2}, {"gpu", 1}, {"ssd", 0}, {"memory", 1e9}}, declared), "");
  EXPECT_NE(check_resources({{"cpu", -100}}, declared).find("resource 'cpu' is negative"),
            std::string::npos);
  EXPECT_NE(check_resources({{"cpu", std::nan("")}}, declared).find("'cpu' is not a finite"),
            std::string::npos);
  EXPECT_NE(check_resources({{"cpu", HUGE_VAL}}, declared).find("not a finite"),
            std::string::npos);
  EXPECT_NE(check_resources({{"x", 0}}, declared).find("resource 'x' is not one that any node"),
            std::string::npos);
  EXPECT_NE(check_resources({{"cpu", 2e15}}, declared).find("larger than 1e15"),
            std::string::npos);
  EXPECT_NE(check_resources({{"gpu", 1.5}}, declared).find("must be a whole number of GPUs"),
            std::string::npos);
  EXPECT_NE(check_resources({{"gpu", 2.8e14}}, declared).find("at most 4096"), std::string::npos);
  // Found by fuzz_spawn_request: placement counted 2.8e14 shared GPUs in an int (undefined).
  NodeRecord n;
  n.id = "n-1";
  n.resources = {{"cpu", 4}, {"gpu", 1}};
  const Placement p = place(node_views({n}, {}), {{"gpu", 2.8e14}}, {}, true);
  EXPECT_FALSE(p.node);
  EXPECT_NE(p.reason.find("at most 4096 per actor"), std::string::npos) << p.reason;
}

TEST(Requests, SpawnableClassesAreNamesOrPrefixes) {
  const std::vector<std::string> allow = {"wordcount.*", "test.Counter"};
  EXPECT_TRUE(class_matches(allow, "wordcount.Mapper"));
  EXPECT_TRUE(class_matches(allow, "test.Counter"));
  EXPECT_FALSE(class_matches(allow, "test.CounterX"));
  EXPECT_FALSE(class_matches(allow, "diloco.OuterAggregator"));
  EXPECT_FALSE(class_matches({}, "test.Counter"));
  EXPECT_TRUE(class_matches({"*"}, "anything"));
}

TEST(Requests, ScaleIsBoundedByTheJobAndTheCluster) {
  EXPECT_EQ(check_scale(4, 8, 1024), "");
  EXPECT_EQ(check_scale(900, 0, 1024), "");  // no bound of its own: the cluster's
  EXPECT_NE(check_scale(0, 8, 1024).find("at least 1 worker"), std::string::npos);
  EXPECT_NE(check_scale(9, 8, 1024).find("more than the job's workers.max of 8"),
            std::string::npos);
  EXPECT_NE(check_scale(2147483647, 0, 1024).find("more than this cluster allows a job (1024"),
            std::string::npos);
}

// Per key: jobs running at once and submissions per minute; another key is not held back, and
// a minute later the key may submit again (the clock is a parameter).
TEST(Requests, SubmissionsAreBoundedPerKey) {
  SubmissionLimits limits(2, 3);
  EXPECT_EQ(limits.admit("A", "alice", 0, 1000), "");
  EXPECT_EQ(limits.admit("A", "alice", 1, 2000), "");
  EXPECT_NE(limits.admit("A", "alice", 2, 3000).find("alice has 2 jobs running, the most one key"),
            std::string::npos);
  EXPECT_EQ(limits.admit("A", "alice", 1, 4000), "");
  const std::string fourth = limits.admit("A", "alice", 0, 5000);
  EXPECT_NE(fourth.find("alice submitted 3 jobs in the last minute"), std::string::npos) << fourth;
  EXPECT_NE(fourth.find("try again in 56 s"), std::string::npos) << fourth;
  EXPECT_EQ(limits.admit("B", "bob", 0, 5000), "");
  EXPECT_EQ(limits.admit("A", "alice", 0, 61001), "");  // the first has left the window
  EXPECT_EQ(limits.keys(), 2u);
  EXPECT_EQ(limits.admit("B", "bob", 0, 200000), "");   // forgets keys idle for a minute
  EXPECT_EQ(limits.keys(), 1u);
}

TEST(Placement, SaysWhichResourceIsShort) {
  std::vector<NodeView> nodes = {{"n1", {{"cpu", 4}}, {{"cpu", 4}}, 4},
                                 {"n2", {{"cpu", 2}, {"gpu", 1}}, {{"gpu", 1}}, 1}};
  auto p = place(nodes, {{"gpu", 2}});
  EXPECT_FALSE(p.node);
  EXPECT_NE(p.reason.find("no node has 2 free gpu"), std::string::npos) << p.reason;
  auto q = place(nodes, {{"cpu", 3}});
  EXPECT_FALSE(q.node);
  EXPECT_NE(q.reason.find("3 free cpu"), std::string::npos) << q.reason;
  EXPECT_NE(q.reason.find("most free: 2 on n2"), std::string::npos) << q.reason;
  EXPECT_EQ(place({}, {{"cpu", 1}}).reason, "no live node in the cluster");
}

namespace {
ActorInfo gpu_actor(std::string id, std::string node, std::vector<int> gpus, bool shared = false,
                    ActorState state = ActorState::alive) {
  ActorInfo a;
  a.id = std::move(id);
  a.node_id = std::move(node);
  a.state = state;
  a.resources = {{"cpu", 1}, {"gpu", double(gpus.size())}};
  a.gpus = std::move(gpus);
  a.share_gpus = shared;
  return a;
}
NodeRecord gpu_node(std::string id, double gpus) {
  NodeRecord n;
  n.id = std::move(id);
  n.resources = {{"cpu", 8}, {"gpu", gpus}};
  return n;
}
}  // namespace

TEST(GpuAssignment, ExclusiveActorsNeverShareAnIndex) {
  EXPECT_EQ(assign_gpus(4, {}, 2, false), (std::vector<int>{0, 1}));
  std::vector<GpuHold> held = {{{0}, false}, {{2}, false}};
  EXPECT_EQ(assign_gpus(4, held, 1, false), (std::vector<int>{1}));
  EXPECT_EQ(assign_gpus(4, held, 2, false), (std::vector<int>{1, 3}));
  EXPECT_EQ(assign_gpus(4, held, 3, false), std::nullopt);
  // Indices held by sharing actors are not free to an exclusive one either.
  EXPECT_EQ(assign_gpus(2, {{{0}, true}}, 2, false), std::nullopt);
  EXPECT_EQ(assign_gpus(2, {{{0}, true}}, 1, false), (std::vector<int>{1}));
  // Indices outside the node's count (a node restarted with fewer) are ignored.
  EXPECT_EQ(assign_gpus(1, {{{5}, false}}, 1, false), (std::vector<int>{0}));
  EXPECT_EQ(assign_gpus(0, {}, 1, false), std::nullopt);
  EXPECT_EQ(assign_gpus(3, {}, 0, false), (std::vector<int>{}));
}

TEST(GpuAssignment, SharingActorsSpreadAndAvoidExclusiveOnes) {
  // One GPU: any number of sharing actors, lowest index.
  std::vector<GpuHold> held;
  for (int k = 0; k < 4; ++k) {
    auto g = assign_gpus(1, held, 1, true);
    ASSERT_TRUE(g);
    EXPECT_EQ(*g, std::vector<int>{0});
    held.push_back({*g, true});
  }
  // Two GPUs: the least shared first.
  EXPECT_EQ(assign_gpus(2, {{{0}, true}}, 1, true), (std::vector<int>{1}));
  EXPECT_EQ(assign_gpus(2, {{{0}, true}, {{1}, true}, {{1}, true}}, 1, true),
            (std::vector<int>{0}));
  // Never an index an exclusive actor holds.
  EXPECT_EQ(assign_gpus(2, {{{1}, false}, {{0}, true}}, 1, true), (std::vector<int>{0}));
  EXPECT_EQ(assign_gpus(1, {{{0}, false}}, 1, true), std::nullopt);
}

TEST(GpuAssignment, PlacementSkipsNodesWithoutEnoughGpusAndHandsOutIndices) {
  std::vector<NodeRecord> nodes = {gpu_node("cpu-only", 0), gpu_node("one", 1), gpu_node("two", 2)};
  nodes[0].resources = {{"cpu", 16}};
  std::vector<ActorInfo> actors;
  std::set<std::pair<std::string, int>> taken;
  // Four exclusive one-GPU actors on three GPUs: three are placed, each on its own index.
  for (int k = 0; k < 3; ++k) {
    Placement p = place(node_views(nodes, actors), {{"cpu", 1}, {"gpu", 1}});
    ASSERT_TRUE(p.node) << p.reason;
    EXPECT_NE(*p.node, "cpu-only");
    ASSERT_EQ(p.gpus.size(), 1u);
    EXPECT_TRUE(taken.insert({*p.node, p.gpus[0]}).second) << *p.node << " " << p.gpus[0];
    actors.push_back(gpu_actor("a" + std::to_string(k), *p.node, p.gpus));
  }
  Placement full = place(node_views(nodes, actors), {{"cpu", 1}, {"gpu", 1}});
  EXPECT_FALSE(full.node);
  EXPECT_NE(full.reason.find("no node has 1 free gpu"), std::string::npos) << full.reason;
  // Two GPUs are only on "two", and only while both are free.
  std::vector<ActorInfo> none;
  Placement two = place(node_views(nodes, none), {{"gpu", 2}});
  EXPECT_EQ(two.node, "two");
  EXPECT_EQ(two.gpus, (std::vector<int>{0, 1}));
  EXPECT_FALSE(place(node_views(nodes, actors), {{"gpu", 2}}).node);
  // Whole GPUs only.
  Placement half = place(node_views(nodes, none), {{"gpu", 0.5}});
  EXPECT_FALSE(half.node);
  EXPECT_NE(half.reason.find("whole GPUs only"), std::string::npos) << half.reason;
  // Without a gpu demand, no indices.
  EXPECT_TRUE(place(node_views(nodes, actors), {{"cpu", 1}}).gpus.empty());
}

TEST(GpuAssignment, IndicesAreFreedWhenTheActorDiesOrRestarts) {
  std::vector<NodeRecord> nodes = {gpu_node("n", 1)};
  std::vector<ActorInfo> actors = {gpu_actor("a", "n", {0})};
  auto v = node_views(nodes, actors);
  EXPECT_EQ(v[0].used.at("gpu"), 1);
  EXPECT_EQ(v[0].used.at("cpu"), 1);
  EXPECT_FALSE(place(v, {{"gpu", 1}}).node);
  for (ActorState gone : {ActorState::dead, ActorState::restarting}) {
    actors[0].state = gone;
    auto w = node_views(nodes, actors);
    EXPECT_EQ(w[0].used.count("gpu"), 0u) << gone;
    Placement p = place(w, {{"gpu", 1}});
    EXPECT_EQ(p.node, "n") << gone;
    EXPECT_EQ(p.gpus, std::vector<int>{0}) << gone;
  }
  // A pending actor (being created) holds its index already.
  actors[0].state = ActorState::pending;
  EXPECT_FALSE(place(node_views(nodes, actors), {{"gpu", 1}}).node);
}

TEST(GpuAssignment, SharedActorsFitOnOneGpuAndCountItOnce) {
  std::vector<NodeRecord> nodes = {gpu_node("n", 1)};
  std::vector<ActorInfo> actors;
  for (int k = 0; k < 4; ++k) {
    Placement p = place(node_views(nodes, actors), {{"cpu", 1}, {"gpu", 1}}, {}, true);
    ASSERT_TRUE(p.node) << p.reason;
    EXPECT_EQ(p.gpus, std::vector<int>{0});
    actors.push_back(gpu_actor("s" + std::to_string(k), "n", p.gpus, true));
  }
  EXPECT_EQ(node_views(nodes, actors)[0].used.at("gpu"), 1);  // one GPU in use, not four
  // An exclusive actor finds no free GPU; sharing ones still fit.
  EXPECT_FALSE(place(node_views(nodes, actors), {{"gpu", 1}}).node);
  std::vector<ActorInfo> exclusive = {gpu_actor("x", "n", {0})};
  Placement p = place(node_views(nodes, exclusive), {{"gpu", 1}}, {}, true);
  EXPECT_FALSE(p.node);
  EXPECT_NE(p.reason.find("free or shared"), std::string::npos) << p.reason;
  EXPECT_EQ(format_gpus({0, 3}), "0,3");
  EXPECT_EQ(format_gpus({}), "-");
}

TEST(FailureDetector, DeadOnlyAfterTimeoutWithoutHeartbeatChange) {
  FailureDetector fd(2000);
  fd.observe("a", "1", 0);
  fd.observe("b", "1", 0);
  fd.observe("a", "2", 900);  // a beats, b does not
  fd.observe("b", "1", 1500);
  EXPECT_TRUE(fd.dead(1999).empty());
  auto v = fd.dead(2000);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].node, "b");
  EXPECT_EQ(v[0].reason, "missed heartbeats for 2.0 s");
  // A vanished key (TTL expired) is no heartbeat either.
  fd.observe("a", std::nullopt, 2500);
  EXPECT_EQ(fd.dead(2899).size(), 1u);  // b only
  EXPECT_EQ(fd.dead(2900).size(), 2u);  // a too: nothing new since 900
  fd.forget("b");
  EXPECT_EQ(fd.dead(3500).size(), 1u);
  // After an outage of the store, everyone gets a fresh window.
  fd.grace(10000);
  EXPECT_TRUE(fd.dead(11999).empty());
  EXPECT_EQ(fd.dead(12000).size(), 1u);
}

// Placement avoids a node silent for half the detection time, before it is declared dead.
TEST(FailureDetector, ANodeSilentForHalfTheTimeoutIsSuspectedBeforeItIsDead) {
  FailureDetector fd(2000);
  fd.observe("a", "1", 0);
  fd.observe("b", "1", 0);
  fd.observe("a", "2", 900);
  EXPECT_TRUE(fd.suspects(999).empty());
  EXPECT_EQ(fd.suspects(1000), std::set<std::string>{"b"});
  EXPECT_TRUE(fd.dead(1000).empty());
  EXPECT_EQ(fd.suspects(1900), (std::set<std::string>{"a", "b"}));
}

// A node whose heartbeats stalled and came back (its uplink full of a job's data) gets a window
// of twice its longest silence, at most four timeouts; one that never stalled keeps the
// timeout. The soak's record (2026-11-29) lost a worker and its round to a site at 2 Mbit/s
// whose heartbeats queued behind fp32 fragments for 3 s, though it was alive and came back
// 0.7 s later.
TEST(FailureDetector, TheWindowWidensWithTheSilencesANodeCameBackFromAndStaysBounded) {
  FailureDetector fd(2000);
  for (const char* n : {"a", "b"}) {
    fd.observe(n, "1", 0);
    fd.observe(n, "2", 300);
  }
  fd.observe("a", "3", 1800);  // back after 1.5 s: its window is 3 s
  fd.observe("b", "3", 600);
  EXPECT_EQ(fd.window_ms("a"), 3000);
  EXPECT_EQ(fd.window_ms("b"), 2000);
  EXPECT_EQ(fd.window_ms("unknown"), 2000);
  auto v = fd.dead(4799);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].node, "b");
  EXPECT_EQ(fd.suspects(3299), std::set<std::string>{"b"});
  EXPECT_EQ(fd.suspects(3300), (std::set<std::string>{"a", "b"}));
  v = fd.dead(4800);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].node, "a");
  EXPECT_EQ(v[0].reason,
            "missed heartbeats for 3.0 s (its window 3.0 s: it came back from 1.5 s before)");
  // Longer and longer silences widen it to four timeouts and no further.
  fd.observe("a", "4", 4700);   // 2.9 s: 5.8 s
  fd.observe("a", "5", 10400);  // 5.7 s: 8 s, not 11.4
  EXPECT_EQ(fd.window_ms("a"), 8000);
  EXPECT_TRUE(fd.dead(18399).size() == 1u);  // b only
  EXPECT_EQ(fd.dead(18400).size(), 2u);
}

// Heartbeats that come back after half the timeout or more of silence count as late (the
// node was a suspect, not dead); the silence so far and the longest one are kept.
TEST(FailureDetector, HealthCountsLateHeartbeatsAndTheLongestSilence) {
  FailureDetector fd(2000);
  EXPECT_FALSE(fd.health("a", 0));
  fd.observe("a", "1", 0);
  fd.observe("a", "2", 400);   // on time
  fd.observe("a", "2", 1300);  // silent 900 ms so far: not late yet
  auto h = fd.health("a", 1300);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->silent_ms, 900);
  EXPECT_EQ(h->late, 0);
  EXPECT_EQ(h->longest_ms, 400);
  fd.observe("a", "3", 1500);  // back after 1100 ms >= 1000: late
  fd.observe("a", "4", 1700);
  fd.observe("a", "5", 3200);  // 1500 ms: late again, and the longest
  h = fd.health("a", 3300);
  EXPECT_EQ(h->silent_ms, 100);
  EXPECT_EQ(h->late, 2);
  EXPECT_EQ(h->longest_ms, 1500);
  EXPECT_TRUE(fd.dead(3300).empty());
  fd.forget("a");
  EXPECT_FALSE(fd.health("a", 3300));
}

// A tick that places many actors updates its views as node_views() would count them.
TEST(Placement, OccupyCountsAnActorAsNodeViewsDoes) {
  std::vector<NodeRecord> nodes(2);
  nodes[0].id = "n1";
  nodes[0].resources = {{"cpu", 4}, {"gpu", 2}};
  nodes[1].id = "n2";
  nodes[1].resources = {{"cpu", 4}};
  ActorInfo a;
  a.id = "a1";
  a.node_id = "n1";
  a.state = ActorState::pending;
  a.resources = {{"cpu", 1}, {"gpu", 1}};
  a.gpus = {1};
  auto views = node_views(nodes, {});
  occupy(views, a);
  auto expected = node_views(nodes, {a});
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_EQ(views[i].used, expected[i].used) << views[i].id;
    EXPECT_EQ(views[i].actors, expected[i].actors) << views[i].id;
    EXPECT_EQ(views[i].gpus.size(), expected[i].gpus.size()) << views[i].id;
  }
  EXPECT_EQ(views[0].used.at("gpu"), 1);
  // The next exclusive GPU actor gets the other index.
  EXPECT_EQ(place(views, {{"gpu", 1}}).gpus, std::vector<int>{0});
}

// Two runtimes in one process: a "node" Core hosting a Counter, and a caller.
class InProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    detail::CoreOptions node;
    node.bind = "tcp://127.0.0.1:0";
    node.self_name = "node test";
    node_ = std::make_shared<detail::Core>(node);
    node_->host("a-counter", detail::class_entry<testing::Counter>(),
                std::make_shared<testing::Counter>(0));
    detail::CoreOptions caller;
    caller.head_address = node_->address();
    caller.self_name = "caller";
    caller_ = std::make_shared<detail::Core>(caller);
    ref_ = std::make_shared<detail::ActorRef>();
    ref_->id = "a-counter";
    ref_->class_name = "test.Counter";
    ref_->address = node_->address();
    counter_ = ActorHandle<testing::Counter>(caller_, ref_);
  }
  void TearDown() override {
    caller_->shutdown();
    node_->shutdown();
  }
  std::shared_ptr<detail::Core> node_, caller_;
  std::shared_ptr<detail::ActorRef> ref_;
  ActorHandle<testing::Counter> counter_;
};

TEST_F(InProcess, CallsAndTellsAreHandledInSendOrder) {
  std::vector<Future<void>> futures;
  for (int i = 0; i < 2000; ++i) {
    if (i % 2)
      counter_.tell(&testing::Counter::record, i);
    else
      futures.push_back(counter_.call(&testing::Counter::record, i));
  }
  for (auto& f : futures) f.get(Millis(10000));
  auto log = counter_.call(&testing::Counter::log).get(Millis(10000));
  ASSERT_EQ(log.size(), 2000u);
  for (int i = 0; i < 2000; ++i) EXPECT_EQ(log[i], i);
}

TEST_F(InProcess, OneMessageAtATimeEvenFromManyThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> max_seen{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        int at_once = counter_.call(&testing::Counter::busy, 2).get(Millis(10000));
        max_seen = std::max(max_seen.load(), at_once);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(max_seen.load(), 1);
}

TEST_F(InProcess, AConcurrentMethodRunsBesideTheMethodThatHoldsTheMailbox) {
  // wait_for_poke holds the actor's only mailbox thread for up to 60 s; poke, a concurrent
  // method, must not wait behind it: it ends the wait.
  auto waiting = counter_.call(&testing::Counter::wait_for_poke, 60000);
  auto later = counter_.call(&testing::Counter::get);  // an ordinary call queues behind it
  EXPECT_EQ(counter_.call(&testing::Counter::poke).get(Millis(10000)), 1);
  EXPECT_TRUE(waiting.get(Millis(10000)));
  EXPECT_EQ(later.get(Millis(10000)), 0);
}

TEST_F(InProcess, ErrorsArriveTyped) {
  try {
    (void)counter_.call(&testing::Counter::fail, std::string("boom")).get(Millis(5000));
    FAIL();
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("test.Counter.fail raised: boom"), std::string::npos)
        << e.what();
  }
  auto missing = std::make_shared<detail::ActorRef>();
  missing->id = "a-nobody";
  missing->address = node_->address();
  ActorHandle<testing::Counter> nobody(caller_, missing);
  EXPECT_THROW((void)nobody.call(&testing::Counter::get).get(Millis(5000)), ActorNotFoundError);
}

TEST_F(InProcess, GetTimesOutWithTimeoutError) {
  auto f = counter_.call(&testing::Counter::sleep_ms, 500);
  EXPECT_THROW(f.get(Millis(50)), TimeoutError);
}

TEST_F(InProcess, LargeBlobsRoundTrip) {
  std::vector<float> v(4 << 20, 0.5f);
  double s =
      counter_.call(&testing::Counter::sum, Blob::from_values(std::move(v))).get(Millis(20000));
  EXPECT_DOUBLE_EQ(s, 0.5 * (4 << 20));
}

// An actor whose methods take their answer to send it later (as the head answers a spawn once
// the node has answered).
class Deferring {
 public:
  ~Deferring() {
    for (auto& t : threads_) t.join();
  }
  int later(int v) {  // answered from another thread, after the method returned
    auto reply = detail::defer_reply();
    threads_.emplace_back([reply, v] { reply->ok(detail::pack_payload(v + 1)); });
    return 0;  // dropped: the answer is the one sent later
  }
  int dropped() {  // takes its answer and lets it go
    (void)detail::defer_reply();
    return 0;
  }
  int thrown() {
    (void)detail::defer_reply();
    throw std::runtime_error("boom");
  }

 private:
  std::vector<std::thread> threads_;
};
LOCO_REGISTER(Deferring, loco::ActorClass<Deferring>("test.Deferring")
                             .method("later", &Deferring::later)
                             .method("dropped", &Deferring::dropped)
                             .method("thrown", &Deferring::thrown));

TEST(DeferredReply, AMethodAnswersLaterFromAnotherThreadAndAnAnswerDroppedIsAnError) {
  detail::CoreOptions node;
  node.bind = "tcp://127.0.0.1:0";
  node.self_name = "node test";
  auto host = std::make_shared<detail::Core>(node);
  host->host("a-deferring", detail::class_entry<Deferring>(), std::make_shared<Deferring>());
  detail::CoreOptions caller_opts;
  caller_opts.self_name = "caller";
  auto caller = std::make_shared<detail::Core>(caller_opts);
  auto ref = std::make_shared<detail::ActorRef>();
  ref->id = "a-deferring";
  ref->address = host->address();
  ActorHandle<Deferring> d(caller, ref);
  EXPECT_EQ(d.call(&Deferring::later, 41).get(Millis(5000)), 42);
  try {
    (void)d.call(&Deferring::dropped).get(Millis(5000));
    FAIL() << "a dropped answer arrived";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("test.Deferring.dropped was dropped unanswered"),
              std::string::npos)
        << e.what();
  }
  try {
    (void)d.call(&Deferring::thrown).get(Millis(5000));
    FAIL() << "a method that threw answered";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  caller->shutdown();
  host->shutdown();
}

// A runtime that called peers which then went quiet closes its connections to them once idle
// (the head of a two-hour soak held one per node a worker ever ran on, five descriptors each),
// and a later call opens one again.
TEST(IdleConnections, AreClosedAfterTheIdleTimeAndOpenedAgainByTheNextCall) {
  std::vector<std::shared_ptr<detail::Core>> hosts;
  std::vector<ActorHandle<testing::Counter>> counters;
  detail::CoreOptions caller_opts;
  caller_opts.self_name = "caller";
  caller_opts.idle_close_ms = 300;
  auto caller = std::make_shared<detail::Core>(caller_opts);
  for (int i = 0; i < 3; ++i) {
    detail::CoreOptions node;
    node.bind = "tcp://127.0.0.1:0";
    node.self_name = "node " + std::to_string(i);
    hosts.push_back(std::make_shared<detail::Core>(node));
    hosts.back()->host("a-counter", detail::class_entry<testing::Counter>(),
                       std::make_shared<testing::Counter>(0));
    auto ref = std::make_shared<detail::ActorRef>();
    ref->id = "a-counter";
    ref->class_name = "test.Counter";
    ref->address = hosts.back()->address();
    counters.emplace_back(caller, ref);
  }
  for (auto& c : counters) c.call(&testing::Counter::record, 1).get(Millis(10000));
  EXPECT_EQ(caller->open_connections(), 3u);
  auto wait_for = [&](size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (caller->open_connections() != n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return caller->open_connections();
  };
  ASSERT_EQ(wait_for(0), 0u) << "idle connections were kept";
  EXPECT_EQ(counters[1].call(&testing::Counter::log).get(Millis(10000)), std::vector<int>{1});
  EXPECT_EQ(caller->open_connections(), 1u);
  caller->shutdown();
  for (auto& h : hosts) h->shutdown();
}

// Tasks chained one after another (the streaming worker's fragment operations) hold the one
// before only until it ended: a chain that captured each future kept every task's payload for
// as long as the last one lived (a soak's nodes grew 80 to 360 MB an hour).
TEST(RunAfter, AChainHoldsNoTaskItAlreadyWaitedFor) {
  std::vector<std::weak_ptr<std::vector<char>>> payloads;
  std::shared_future<int> last;
  for (int i = 0; i < 50; ++i) {
    auto payload = std::make_shared<std::vector<char>>(1 << 16, char(i));
    payloads.push_back(payload);
    last = run_after(last, true, [payload, i] { return int((*payload)[0]) + i; });
  }
  EXPECT_EQ(last.get(), 98);
  // The last task's future alone is left: its own payload may live with it, none before.
  int alive = 0;
  for (auto& p : payloads) alive += !p.expired();
  EXPECT_LE(alive, 1) << "payloads of tasks that ended are still held";
  // A failure of the task before is the next one's with rethrow, not without.
  auto failed =
      run_after(std::shared_future<int>(), true, []() -> int { throw std::runtime_error("boom"); });
  EXPECT_THROW(run_after(failed, true, [] { return 1; }).get(), std::runtime_error);
  EXPECT_EQ(run_after(failed, false, [] { return 1; }).get(), 1);
}

// An actor whose concurrent method waits until the test opens it, counting the calls that run
// at once.
class Gate {
 public:
  int hold() {
    const int now = ++running_;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(60), [&] { return open_; });
    }
    --running_;
    return 1;
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int most_at_once() const { return most_.load(); }

 private:
  std::atomic<int> running_{0}, most_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};
LOCO_REGISTER(Gate, loco::ActorClass<Gate>("test.Gate").concurrent_method("hold", &Gate::hold));

// A flood of calls of a concurrent method (a probe's 100,000 pokes killed a node that ran each
// on a thread of its own) runs on the actor's bounded pool: 8 at once, 1,024 wait, the rest are
// refused at once naming the limits; and once the running ones end, every waiting one answers.
TEST(ConcurrentCalls, AFloodRunsOnABoundedPoolAndCallsPastItsQueueAreRefusedNamingTheLimit) {
  detail::CoreOptions node;
  node.bind = "tcp://127.0.0.1:0";
  node.self_name = "node test";
  node.max_concurrent_calls = 8;
  node.max_waiting_concurrent_calls = 1024;
  auto host = std::make_shared<detail::Core>(node);
  auto gate = std::make_shared<Gate>();
  host->host("a-gate", detail::class_entry<Gate>(), gate);
  detail::CoreOptions caller_opts;
  caller_opts.self_name = "caller";
  auto caller = std::make_shared<detail::Core>(caller_opts);
  auto ref = std::make_shared<detail::ActorRef>();
  ref->id = "a-gate";
  ref->address = host->address();
  ActorHandle<Gate> g(caller, ref);

  constexpr int kCalls = 5000, kAdmitted = 8 + 1024;
  std::vector<Future<int>> calls;
  for (int i = 0; i < kCalls; ++i) calls.push_back(g.call(&Gate::hold));
  // One connection keeps them in order: the first 8 run, the next 1,024 wait, the rest do not.
  int refused = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int i = kAdmitted; i < kCalls; ++i) {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    try {
      (void)calls[size_t(i)].get(std::max(left, Millis(1)));
      ADD_FAILURE() << "call " << i << " past the bound ran";
    } catch (const TimeoutError&) {
      ADD_FAILURE() << "call " << i << " past the bound was neither refused nor answered in 30 s";
      break;
    } catch (const RemoteError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("call hold refused: "), std::string::npos) << what;
      EXPECT_NE(what.find("concurrent calls of actor a-gate (test.Gate) are running and 1024 wait"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("(limits 8 running, 1024 waiting"), std::string::npos) << what;
      ++refused;
    }
  }
  EXPECT_EQ(refused, kCalls - kAdmitted);
  EXPECT_LE(gate->most_at_once(), 8);
  gate->open();
  for (int i = 0; i < kAdmitted; ++i) EXPECT_EQ(calls[size_t(i)].get(Millis(30000)), 1) << i;
  EXPECT_EQ(gate->most_at_once(), 8);
  // A call after the flood runs at once; the actor goes only once its concurrent calls ended.
  EXPECT_EQ(g.call(&Gate::hold).get(Millis(30000)), 1);
  EXPECT_TRUE(host->unhost("a-gate"));
  caller->shutdown();
  host->shutdown();
}

// An actor whose calls each end when the test lets their key go: calls that end in the
// order the test chooses, with no sleeps.
class Latch {
 public:
  int hold(int key) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return open_.count(key) > 0; });
    if (key < 0) throw std::runtime_error("key " + std::to_string(key) + " fails");
    return key;
  }
  void open(int key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_.insert(key);
    }
    cv_.notify_all();
  }
  void open_all() {
    for (int key = -10; key <= 10; ++key) open(key);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> open_;
};
LOCO_REGISTER(Latch, loco::ActorClass<Latch>("test.Latch")
                         .concurrent_method("hold", &Latch::hold)
                         .method("open", &Latch::open));

// Two nodes, each hosting a Latch, and a caller.
class WaitOnCalls : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int n = 0; n < 2; ++n) {
      detail::CoreOptions node;
      node.bind = "tcp://127.0.0.1:0";
      node.self_name = "node " + std::to_string(n);
      nodes_[n] = std::make_shared<detail::Core>(node);
      latches_[n] = std::make_shared<Latch>();
      nodes_[n]->host("a-latch-" + std::to_string(n), detail::class_entry<Latch>(), latches_[n]);
    }
    detail::CoreOptions caller;
    caller.self_name = "caller";
    caller_ = std::make_shared<detail::Core>(caller);
    for (int n = 0; n < 2; ++n) {
      auto ref = std::make_shared<detail::ActorRef>();
      ref->id = "a-latch-" + std::to_string(n);
      ref->class_name = "test.Latch";
      ref->address = nodes_[n]->address();
      handles_[n] = ActorHandle<Latch>(caller_, ref);
    }
  }
  void TearDown() override {
    // No call outlives the test: an actor goes once its concurrent calls ended.
    for (int n = 0; n < 2; ++n) {
      latches_[n]->open_all();
      EXPECT_TRUE(nodes_[n]->unhost("a-latch-" + std::to_string(n)));
    }
    caller_->shutdown();
    for (auto& n : nodes_) n->shutdown();
  }
  Future<int> hold(int node, int key) { return handles_[node].call(&Latch::hold, key); }
  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  std::shared_ptr<detail::Core> nodes_[2], caller_;
  std::shared_ptr<Latch> latches_[2];
  ActorHandle<Latch> handles_[2];
};

using Ended = std::vector<size_t>;

TEST_F(WaitOnCalls, CallsThatEndedAreReturnedAtOnceAndZeroLooksWithoutWaiting) {
  std::vector<Future<int>> calls{hold(0, 1), hold(0, 2), hold(0, 3)};
  latches_[0]->open(1);
  latches_[0]->open(3);
  EXPECT_EQ(calls[0].get(Millis(10000)), 1);
  EXPECT_EQ(calls[2].get(Millis(10000)), 3);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(loco::wait(calls, 2, Millis(60000)), (Ended{0, 2}));  // enough ended: no wait
  EXPECT_EQ(loco::wait(calls, 1, Millis(60000)), (Ended{0, 2}));  // every one that ended
  EXPECT_EQ(loco::wait(calls, 3, Millis(0)), (Ended{0, 2}));      // a look
  EXPECT_EQ(loco::wait(calls, 0, Millis(60000)), (Ended{0, 2}));
  EXPECT_LT(seconds_since(t0), 30.0);  // none of them waited its 60 s
  EXPECT_FALSE(calls[1].ready());
}

TEST_F(WaitOnCalls, WaitsUntilTheNthCallEndsWithAResultOrAnError) {
  std::vector<Future<int>> calls{hold(0, 1), hold(0, -2), hold(0, 3)};
  latches_[0]->open(3);
  EXPECT_EQ(loco::wait(calls, 1, Millis(60000)), (Ended{2}));
  // The second to end fails: an error ends a call as a result does.
  std::thread opener([&] { latches_[0]->open(-2); });
  EXPECT_EQ(loco::wait(calls, 2, Millis(60000)), (Ended{1, 2}));
  opener.join();
  EXPECT_THROW(calls[1].get(Millis(1000)), RemoteError);
  EXPECT_FALSE(calls[0].ready());
  std::thread last([&] { latches_[0]->open(1); });
  EXPECT_EQ(loco::wait(calls, 10, Millis(60000)), (Ended{0, 1, 2}));  // more than there are: all
  last.join();
  EXPECT_EQ(calls[0].get(Millis(1000)), 1);
}

TEST_F(WaitOnCalls, ReturnsAtTheDeadlineWithTheCallsThatEndedSoFar) {
  std::vector<Future<int>> calls{hold(0, 1), hold(0, 2), hold(1, 3)};
  latches_[1]->open(3);
  EXPECT_EQ(calls[2].get(Millis(10000)), 3);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(loco::wait(calls, 2, Millis(300)), (Ended{2}));
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, 30.0);
  // Nothing was cancelled: the others still end, and a later wait sees them.
  latches_[0]->open(2);
  EXPECT_EQ(loco::wait(calls, 2, Millis(60000)), (Ended{1, 2}));
  EXPECT_EQ(calls[1].get(Millis(1000)), 2);
}

TEST_F(WaitOnCalls, WaitsOnCallsToDifferentActorsOfDifferentResultTypes) {
  std::vector<Future<int>> a{hold(0, 1), hold(0, 2)};
  std::vector<Future<int>> b{hold(1, 1)};
  std::thread opener([&] { latches_[1]->open(1); });
  std::vector<Future<int>> both{a[0], a[1], b[0]};
  EXPECT_EQ(loco::wait(both, 1, Millis(60000)), (Ended{2}));  // node 1's actor answered
  opener.join();
  EXPECT_FALSE(a[0].ready());
  // Futures of other result types wait together through FutureBase.
  auto poke = handles_[0].call(&Latch::open, 2);  // Future<void>
  std::vector<const FutureBase*> mixed{&a[1], &poke};
  EXPECT_EQ(loco::wait(mixed, 2, Millis(60000)), (Ended{0, 1}));
  EXPECT_EQ(a[1].get(Millis(1000)), 2);
  // Two waits on the same calls, from two threads, are both woken by the one end.
  std::vector<Future<int>> c{hold(0, 5), hold(1, 5)};
  Ended first, second;
  std::thread w1([&] { first = loco::wait(c, 1, Millis(60000)); });
  std::thread w2([&] { second = loco::wait(c, 1, Millis(60000)); });
  latches_[1]->open(5);
  w1.join();
  w2.join();
  EXPECT_EQ(first, (Ended{1}));
  EXPECT_EQ(second, (Ended{1}));
}

TEST_F(WaitOnCalls, AStopRequestedEndsTheWaitWithTheCallsThatEndedSoFar) {
  std::vector<Future<int>> calls{hold(0, 1), hold(1, 2)};
  std::stop_source stop;
  std::thread stopper([&] { stop.request_stop(); });
  EXPECT_EQ(loco::wait(calls, 1, Millis::max(), stop.get_token()), Ended{});
  stopper.join();
  // Requested before: the wait does not begin.
  EXPECT_EQ(loco::wait(calls, 2, Millis(60000), stop.get_token()), Ended{});
  latches_[1]->open(2);
  EXPECT_EQ(calls[1].get(Millis(10000)), 2);
  EXPECT_EQ(loco::wait(calls, 2, Millis(60000), stop.get_token()), Ended{1});
}

// A call to a node's service that gets no answer names that node, never "the head" (the
// head's own calls to nodes once read "create_actor on the head died ...").
TEST(Messages, ANodeThatDoesNotAnswerIsNamedAsTheNodeNotTheHead) {
  zmq::context_t ctx;
  zmq::socket_t silent(ctx, zmq::socket_type::router);  // takes calls, never answers
  silent.set(zmq::sockopt::linger, 0);
  silent.bind("tcp://127.0.0.1:*");
  std::string endpoint = silent.get(zmq::sockopt::last_endpoint);
  std::string address = endpoint.substr(endpoint.find("//") + 2);

  detail::CoreOptions opts;
  opts.self_name = "head";
  opts.detect_ms = 300;
  opts.heartbeat_ms = 60;
  auto core = std::make_shared<detail::Core>(opts);
  auto node = std::make_shared<detail::ActorRef>();
  node->id = "@node";
  node->class_name = "node";
  node->fixed = true;
  node->address = address;
  node->node_id = "n-silent";
  EXPECT_EQ(node->describe(), "node n-silent (" + address + ")");
  EXPECT_EQ(core->head_ref()->describe(), "the head");

  auto st = core->call(node, "create_actor", detail::pack_payload(std::make_tuple(1)), false);
  try {
    core->await(*st, Millis(10000));
    FAIL() << "a silent node answered";
  } catch (const ActorDiedError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.find("the head"), std::string::npos) << what;
    EXPECT_NE(what.find("node n-silent (" + address + ") died or is unreachable"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("create_actor on node n-silent"), std::string::npos) << what;
  }
  core->shutdown();
}

TEST(PathRoots, PathsResolveUnderTheRootOrAreRefusedNamingTheField) {
  namespace fs = std::filesystem;
  const fs::path base = fs::temp_directory_path() / ("loco-roots-" + std::to_string(::getpid()));
  fs::create_directories(base / "root/sub");
  fs::create_directories(base / "elsewhere");
  fs::create_directory_symlink(base / "elsewhere", base / "root/out");
  fs::create_directory_symlink(base / "root/sub", base / "root/in");
  const std::string root = (base / "root").string();
  EXPECT_EQ(resolve_under(root, "sub/x.pt", "f", "--checkpoint-root"), root + "/sub/x.pt");
  EXPECT_EQ(resolve_under(root, "new/deeper", "f", "--checkpoint-root"), root + "/new/deeper");
  EXPECT_EQ(resolve_under(root, root + "/sub/../sub", "f", "--checkpoint-root"), root + "/sub");
  EXPECT_EQ(resolve_under(root, ".", "f", "--checkpoint-root"), root);
  EXPECT_EQ(resolve_under(root, "in/x", "f", "--checkpoint-root"), root + "/sub/x");
  auto error = [&](const std::string& path) {
    try {
      resolve_under(root, path, "checkpoint.dir", "--checkpoint-root");
    } catch (const PathError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error("../elsewhere"),
            "checkpoint.dir: '../elsewhere' is outside this node's "
            "checkpoint root '" +
                root + "' (loco start --checkpoint-root)");
  EXPECT_NE(error("/etc").find("'/etc' is outside"), std::string::npos);
  EXPECT_NE(error("sub/../../elsewhere/x").find("is outside"), std::string::npos);
  EXPECT_NE(error("out/x.pt").find("is outside"), std::string::npos);           // a link leads out
  EXPECT_NE(error(root + "-sibling/x").find("is outside"), std::string::npos);  // not a prefix
  EXPECT_EQ(error(""), "checkpoint.dir: an empty path");
  EXPECT_EQ(error(std::string("a\0b", 3)), "checkpoint.dir: a path with a NUL byte");
  EXPECT_NE(error("/" + std::string(5000, 'x')).find("x..."), std::string::npos);  // truncated
  fs::remove_all(base);
}

// A client's actors get its own folder of each root (PathRoots::for_user): made 0700 when
// missing, named after the key's name when that is a plain one, and a path into another user's
// folder is refused naming that user.
TEST(PathRoots, AClientsRootsAreItsOwnFolderAndAnotherUsersIsRefusedNamingThem) {
  namespace fs = std::filesystem;
  const fs::path base = fs::temp_directory_path() / ("loco-users-" + std::to_string(::getpid()));
  fs::create_directories(base / "root/bob/ck");
  const PathRoots node = PathRoots::at((base / "root").string());
  const PathRoots alice = node.for_user("KEY-A", "alice");
  EXPECT_EQ(alice.user, "alice");
  EXPECT_EQ(alice.checkpoints, (base / "root/alice").string());
  EXPECT_EQ(fs::status(alice.checkpoints).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(resolve_checkpoint_path(alice, "ck", "checkpoint.dir"), alice.checkpoints + "/ck");
  auto error = [&](const std::string& path) {
    try {
      resolve_checkpoint_path(alice, path, "checkpoint.resume");
    } catch (const PathError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string bobs = (base / "root/bob/ck/x.pt").string();
  EXPECT_EQ(error(bobs), "checkpoint.resume: '" + bobs + "' is in the folder of user 'bob' (" +
                             (base / "root/bob").string() +
                             "); a client's job reads and writes only under its own, " +
                             alice.checkpoints + " (docs/security.md, \"Users' files apart\")");
  EXPECT_NE(error("../bob/ck/x.pt").find("in the folder of user 'bob'"), std::string::npos);
  EXPECT_NE(error("/etc/passwd").find("is outside this node's checkpoint root"),
            std::string::npos);
  // The operator's actors see the whole roots.
  EXPECT_EQ(resolve_checkpoint_path(node, bobs, "checkpoint.resume"), bobs);
  // Names that are not plain make no path of their own.
  EXPECT_EQ(user_folder("K", "alice_2-x"), "alice_2-x");
  const std::vector<std::string> odd = {"", "..", "a/b", "-rf", "al ice", std::string(65, 'a')};
  for (const std::string& name : odd)
    EXPECT_EQ(user_folder("K", name).rfind("key-", 0), 0u) << name;
  EXPECT_NE(user_folder("K1", ""), user_folder("K2", ""));
  fs::remove_all(base);
}

// ---- CURVE -----------------------------------------------------------------------------

std::string temp_dir() {
  char tmpl[] = "/tmp/loco-keys-XXXXXX";
  return ::mkdtemp(tmpl);
}

// A node's Core on loopback with `security`, hosting a Counter at "a-counter" when asked.
std::shared_ptr<detail::Core> secured_node(const security::Settings& security,
                                           bool with_counter = true) {
  detail::CoreOptions node;
  node.bind = "tcp://127.0.0.1:0";
  node.self_name = "node test";
  node.security = security;
  auto core = std::make_shared<detail::Core>(node);
  if (with_counter)
    core->host("a-counter", detail::class_entry<testing::Counter>(),
               std::make_shared<testing::Counter>(0));
  return core;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Keys, AKeyFileRoundTripsAndIsPrivate) {
  const std::string dir = temp_dir(), path = dir + "/sub/cluster.key";
  const auto key = security::generate_key_pair();
  security::write_key_file(path, key);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const auto s = security::read_key_file(path);
  EXPECT_TRUE(s.curve);
  EXPECT_EQ(s.cluster.public_key, key.public_key);
  EXPECT_EQ(s.cluster.secret_key, key.secret_key);
  // Never overwritten by accident.
  EXPECT_THROW(security::write_key_file(path, security::generate_key_pair()), security::KeyError);
  EXPECT_EQ(security::read_key_file(path).cluster.public_key, key.public_key);
  std::filesystem::remove_all(dir);
}

// Two `loco up` on a fresh machine make the same key at once (ctest -j did: one failed at once).
// Of several writers racing for one path, exactly one writes it, the file holds that writer's
// key whole, the others are told that it exists, and no temporary file is left. Before, they
// shared one temporary file and renamed over each other: some failed ("cannot write"), or two
// succeeded, each left believing in another key.
TEST(Keys, OfWritersRacingForOneKeyFileExactlyOneWinsAndTheFileIsItsKey) {
  const std::string dir = temp_dir();
  constexpr int kWriters = 8;
  for (int round = 0; round < 50; ++round) {
    const std::string path = dir + "/cluster-" + std::to_string(round) + ".key";
    std::vector<security::KeyPair> keys;
    for (int i = 0; i < kWriters; ++i) keys.push_back(security::generate_key_pair());
    std::atomic<int> ready{0}, wins{0}, winner{-1}, exists{0};
    std::vector<std::thread> writers;
    for (int i = 0; i < kWriters; ++i) {
      writers.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kWriters) std::this_thread::yield();  // all at once
        try {
          security::write_key_file(path, keys[i]);
          wins.fetch_add(1);
          winner = i;
        } catch (const security::KeyError& e) {
          if (std::string(e.what()).find("exists") != std::string::npos) exists.fetch_add(1);
        }
      });
    }
    for (auto& t : writers) t.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
    EXPECT_EQ(exists.load(), kWriters - 1) << "round " << round;
    EXPECT_EQ(security::read_key_file(path).cluster.public_key, keys[winner].public_key);
  }
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 50);
  std::filesystem::remove_all(dir);
}

TEST(Keys, BadOrMissingKeyFilesAreClearErrors) {
  const std::string dir = temp_dir();
  EXPECT_NE(message_of([&] { security::read_key_file(dir + "/none.key"); }).find("loco keygen"),
            std::string::npos);
  const auto a = security::generate_key_pair(), b = security::generate_key_pair();
  std::ofstream(dir + "/mixed.key")
      << "public-key = " << a.public_key << "\nsecret-key = " << b.secret_key << "\n";
  EXPECT_NE(message_of([&] {
              security::read_key_file(dir + "/mixed.key");
            }).find("public-key does not belong to secret-key"),
            std::string::npos);
  std::ofstream(dir + "/short.key") << "# comment\npublic-key = abc\n";
  const std::string m = message_of([&] { security::read_key_file(dir + "/short.key"); });
  EXPECT_NE(m.find(dir + "/short.key"), std::string::npos) << m;
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  std::ofstream(dir + "/half.key") << "public-key = " << a.public_key << "\n";
  EXPECT_NE(message_of([&] { security::read_key_file(dir + "/half.key"); }).find("no secret-key"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// A node Core with CURVE; probes that lack the key are refused before any of their bytes is
// decoded (the Core's count of decoded messages stays 0), and a caller with the key gets in.
TEST(Curve, APeerWithoutTheClusterKeyIsRefusedBeforeAnyOfItsBytesIsDecoded) {
  using testing::ZmqProbe;
  const auto cluster = security::Settings::with_key(security::generate_key_pair());
  auto core = secured_node(cluster);
  const std::string ep = "tcp://" + core->address();
  Envelope ping;
  ping.kind = static_cast<uint8_t>(Kind::Ping);
  ping.sender = "intruder";
  auto ping_frames = detail::encode(ping);
  std::vector<std::string> bytes;
  for (auto& f : ping_frames) bytes.push_back(f.to_string());

  ZmqProbe plain(ep);
  plain.send(bytes);
  EXPECT_EQ(plain.wait_handshake(Millis(5000)), ZmqProbe::Outcome::failed);
  const auto other = security::generate_key_pair();
  ZmqProbe stranger(ep, cluster.cluster.public_key, other.public_key, other.secret_key);
  stranger.send(bytes);
  EXPECT_EQ(stranger.wait_handshake(Millis(5000)), ZmqProbe::Outcome::refused_auth);
  EXPECT_TRUE(testing::eventually([&] { return core->handshakes_refused() >= 1; }, Millis(5000)));
  EXPECT_EQ(core->inbound_messages(), 0u);
  EXPECT_EQ(core->handshakes_admitted(), 0u);

  // A per-client key on the allow-list is admitted; the cluster's key is.
  detail::CoreOptions caller;
  caller.head_address = core->address();
  caller.self_name = "caller";
  caller.security = cluster;
  auto client = std::make_shared<detail::Core>(caller);
  auto ref = std::make_shared<detail::ActorRef>();
  ref->id = "a-counter";
  ref->class_name = "test.Counter";
  ref->address = core->address();
  ActorHandle<testing::Counter> counter(client, ref);
  EXPECT_EQ(counter.call(&testing::Counter::add, 5).get(Millis(10000)), 5);
  EXPECT_GE(core->inbound_messages(), 1u);
  EXPECT_GE(core->handshakes_admitted(), 1u);
  client->shutdown();
  core->shutdown();
}

TEST(Curve, KeysOnTheAllowListAreAdmitted) {
  using testing::ZmqProbe;
  auto settings = security::Settings::with_key(security::generate_key_pair());
  const auto client_key = security::generate_key_pair();
  settings.clients.push_back(client_key.public_key);
  auto core = secured_node(settings, false);
  ZmqProbe allowed("tcp://" + core->address(), settings.cluster.public_key, client_key.public_key,
                   client_key.secret_key);
  EXPECT_EQ(allowed.wait_handshake(Millis(5000)), ZmqProbe::Outcome::succeeded);
  core->shutdown();
}

// A driver with its own settings (a member's or a client's), calling the counter on `node`.
std::pair<std::shared_ptr<detail::Core>, ActorHandle<testing::Counter>> counter_caller(
    const std::shared_ptr<detail::Core>& node, const security::Settings& settings,
    const std::string& id = "a-counter") {
  detail::CoreOptions o;
  o.head_address = node->address();
  o.self_name = "caller";
  o.security = settings;
  auto core = std::make_shared<detail::Core>(o);
  auto ref = std::make_shared<detail::ActorRef>();
  ref->id = id;
  ref->class_name = "test.Counter";
  ref->address = node->address();
  return {core, ActorHandle<testing::Counter>(core, ref)};
}

// An actor the head created for alice's job answers alice and an admin, not bob, naming alice
// (not her key); its internal methods answer the operator's own processes and the actors of
// its job, not an actor of another job or of none. The job and owner are what the node was
// told when the actor was created, never what a caller says.
TEST(Roles, AnOwnedActorAnswersItsOwnerAndAdminsAndItsInternalsOnlyItsJob) {
  auto cluster = security::Settings::with_key(security::generate_key_pair());
  const auto alice = security::generate_key_pair(), bob = security::generate_key_pair(),
             carol = security::generate_key_pair();
  for (const auto& [key, name] : {std::pair{alice, "alice"}, {bob, "bob"}, {carol, "carol"}}) {
    cluster.clients.push_back(key.public_key);
    cluster.names[key.public_key] = name;
  }
  cluster.admins.push_back(carol.public_key);
  auto node = secured_node(cluster, false);
  ActorContext owned;
  owned.actor_id = "a-owned";
  owned.job = "job-1";
  owned.owner = alice.public_key;
  owned.owner_name = "alice";
  node->host("a-owned", detail::class_entry<testing::Counter>(),
             std::make_shared<testing::Counter>(0), owned);
  auto as = [&](const security::KeyPair& k) {
    return counter_caller(node, security::Settings::for_client(k, cluster.cluster.public_key),
                          "a-owned");
  };
  auto [alice_core, as_alice] = as(alice);
  auto [bob_core, as_bob] = as(bob);
  auto [carol_core, as_carol] = as(carol);
  EXPECT_EQ(as_alice.call(&testing::Counter::add, 2).get(Millis(10000)), 2);
  const std::string refused =
      message_of([&] { (void)as_bob.call(&testing::Counter::add, 100).get(Millis(10000)); });
  EXPECT_NE(refused.find("actor a-owned of job job-1 belongs to alice"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("not bob"), std::string::npos) << refused;
  EXPECT_EQ(refused.find(alice.public_key), std::string::npos) << "names the owner's key";
  EXPECT_THROW((void)as_bob.call(&testing::Counter::get).get(Millis(10000)), PermissionError);
  EXPECT_EQ(as_carol.call(&testing::Counter::add, 1).get(Millis(10000)), 3);  // an admin
  // An admin is still a client: no internal method.
  EXPECT_THROW((void)as_carol.call(&testing::Counter::reset).get(Millis(10000)), PermissionError);

  // Internal methods, from members: an actor of another job or of none is refused, an actor of
  // the job and the operator's own process (no actor) are not.
  auto [member_core, as_member] = counter_caller(node, cluster, "a-owned");
  auto from_actor = [&, &as_member = as_member](const std::string& job) {
    ActorContext caller;
    caller.actor_id = "a-caller";
    caller.job = job;
    detail::ActorContextScope scope(&caller);
    return message_of([&] { (void)as_member.call(&testing::Counter::reset).get(Millis(10000)); });
  };
  const std::string other_job = from_actor("job-2");
  EXPECT_NE(other_job.find("test.Counter.reset is internal to job job-1: actor a-caller of job "
                           "job-2 may not call it"),
            std::string::npos)
      << other_job;
  EXPECT_NE(from_actor("").find("of no job may not call it"), std::string::npos);
  EXPECT_EQ(as_member.call(&testing::Counter::get).get(Millis(10000)), 3);  // nothing reset
  EXPECT_EQ(from_actor("job-1"), "(no error)");
  EXPECT_EQ(as_member.call(&testing::Counter::get).get(Millis(10000)), 0);
  for (auto* c : {&alice_core, &bob_core, &carol_core, &member_core}) (*c)->shutdown();
  node->shutdown();
}

// Who a connection is travels as the ZAP user id: parsed back the same, a key with ':' in it
// included; anything else is a client with no key (it owns nothing).
TEST(Roles, UserIdsRoundTripAndAnythingElseIsAKeylessClient) {
  security::Identity alice;
  alice.role = security::Role::client;
  alice.key = std::string("abc:") + std::string(36, 'x');
  alice.name = "alice:the:first";
  alice.admin = true;
  const security::Identity back = security::parse_user_id(security::user_id_of(alice).c_str());
  EXPECT_EQ(back.key, alice.key);
  EXPECT_EQ(back.name, alice.name);
  EXPECT_TRUE(back.admin);
  EXPECT_FALSE(back.member());
  EXPECT_TRUE(security::parse_user_id("member").member());
  for (const char* bad : {"", "client", "client:short:x", "admin:", "members", "root"}) {
    const security::Identity who = security::parse_user_id(bad);
    EXPECT_FALSE(who.member()) << bad;
    EXPECT_TRUE(who.key.empty()) << bad;
    EXPECT_FALSE(who.may_act_on("")) << bad;
    EXPECT_FALSE(who.may_act_on("k")) << bad;
  }
  EXPECT_FALSE(security::parse_user_id(nullptr).member());
}

TEST(Roles, AClientMayCallPublicMethodsButNotInternalOnes) {
  auto cluster = security::Settings::with_key(security::generate_key_pair());
  const auto client_key = security::generate_key_pair();
  cluster.clients.push_back(client_key.public_key);
  auto node = secured_node(cluster);
  auto [client_core, as_client] =
      counter_caller(node, security::Settings::for_client(client_key, cluster.cluster.public_key));
  EXPECT_EQ(as_client.call(&testing::Counter::add, 5).get(Millis(10000)), 5);
  const std::string refused =
      message_of([&] { (void)as_client.call(&testing::Counter::reset).get(Millis(10000)); });
  EXPECT_NE(refused.find("test.Counter.reset is internal"), std::string::npos) << refused;
  EXPECT_THROW((void)as_client.call(&testing::Counter::reset).get(Millis(10000)), PermissionError);
  // A one-way call is dropped too: the counter still holds 5 when the client asks next.
  as_client.tell(&testing::Counter::reset);
  EXPECT_EQ(as_client.call(&testing::Counter::get).get(Millis(10000)), 5);
  // A member (the cluster key) may.
  auto [member_core, as_member] = counter_caller(node, cluster);
  EXPECT_EQ(as_member.call(&testing::Counter::reset).get(Millis(10000)), 5);
  EXPECT_EQ(as_member.call(&testing::Counter::get).get(Millis(10000)), 0);
  client_core->shutdown();
  member_core->shutdown();
  node->shutdown();
}

TEST(Roles, AClientKeyCannotServe) {
  const auto cluster = security::generate_key_pair();
  const auto client =
      security::Settings::for_client(security::generate_key_pair(), cluster.public_key);
  const std::string error = message_of([&] { secured_node(client, false); });
  EXPECT_NE(error.find("a client key cannot serve"), std::string::npos) << error;
}

TEST(Keys, AClientKeyFileRoundTripsAndTheClusterFileAdmitsIt) {
  char tmpl[] = "/tmp/loco-keys-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const auto cluster = security::generate_key_pair(), client = security::generate_key_pair();
  security::write_key_file(dir + "/cluster.key", cluster);
  security::write_client_key_file(dir + "/alice.key", client, cluster.public_key);
  const auto c = security::read_key_file(dir + "/alice.key");
  EXPECT_TRUE(c.is_client());
  EXPECT_EQ(c.cluster.public_key, cluster.public_key);
  EXPECT_TRUE(c.cluster.secret_key.empty());
  EXPECT_EQ(c.own().public_key, client.public_key);
  EXPECT_TRUE(security::read_key_file(dir + "/cluster.key").clients.empty());
  security::add_client_to_key_file(dir + "/cluster.key", client.public_key,
                                   "alice\nsecret-key = x");
  security::add_client_to_key_file(dir + "/cluster.key", client.public_key, "again");  // once
  const auto m = security::read_key_file(dir + "/cluster.key");
  EXPECT_FALSE(m.is_client());
  EXPECT_EQ(m.clients, std::vector<std::string>{client.public_key});
  EXPECT_EQ(std::filesystem::status(dir + "/cluster.key").permissions() &
                std::filesystem::perms::group_read,
            std::filesystem::perms::none);
  // A client file cannot admit clients, nor be the file they are added to.
  const std::string err = message_of(
      [&] { security::add_client_to_key_file(dir + "/alice.key", client.public_key, ""); });
  EXPECT_NE(err.find("is a client key"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// `loco keygen --client` adds a line to the cluster key file; the servers' ZAP handlers read it
// again when the file changes, so the new client gets in without a restart, and is refused
// again once its line is deleted.
TEST(Roles, AClientAddedToTheKeyFileGetsInWithoutARestartAndALineDeletedKeepsItOut) {
  using testing::ZmqProbe;
  char tmpl[] = "/tmp/loco-keys-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  security::write_key_file(dir + "/cluster.key", security::generate_key_pair());
  const auto settings = security::read_key_file(dir + "/cluster.key");
  auto node = secured_node(settings, false);
  const std::string ep = "tcp://" + node->address();
  const auto client = security::generate_key_pair();
  ZmqProbe before(ep, settings.cluster.public_key, client.public_key, client.secret_key);
  EXPECT_EQ(before.wait_handshake(Millis(5000)), ZmqProbe::Outcome::refused_auth);
  security::add_client_to_key_file(dir + "/cluster.key", client.public_key, "late");
  ZmqProbe after(ep, settings.cluster.public_key, client.public_key, client.secret_key);
  EXPECT_EQ(after.wait_handshake(Millis(5000)), ZmqProbe::Outcome::succeeded);
  // Deleting the line refuses the key's next connection.
  security::write_key_file(dir + "/cluster.key", settings.cluster, true);
  ZmqProbe deleted(ep, settings.cluster.public_key, client.public_key, client.secret_key);
  EXPECT_EQ(deleted.wait_handshake(Millis(5000)), ZmqProbe::Outcome::refused_auth);
  node->shutdown();
  std::filesystem::remove_all(dir);
}

// A caller whose key the peer refuses gets a ClusterError saying so, at once rather than after
// the failure detector's time, and the calls do not hang.
TEST(Curve, ACallerWithAnotherKeyOrNoneGetsAClearClusterError) {
  const auto cluster = security::Settings::with_key(security::generate_key_pair());
  auto core = secured_node(cluster);
  struct Case {
    security::Settings settings;
    std::string says;
  };
  const std::vector<Case> cases = {
      {security::Settings::insecure(), "CURVE on one side only"},
      {security::Settings::with_key(security::generate_key_pair()), "another cluster key"}};
  for (const Case& c : cases) {
    detail::CoreOptions caller;
    caller.head_address = core->address();
    caller.self_name = "caller";
    caller.security = c.settings;
    caller.detect_ms = 20000;  // the refusal, not the failure detector, must end the call
    auto client = std::make_shared<detail::Core>(caller);
    auto ref = std::make_shared<detail::ActorRef>();
    ref->id = "a-counter";
    ref->class_name = "test.Counter";
    ref->address = core->address();
    ActorHandle<testing::Counter> counter(client, ref);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)counter.call(&testing::Counter::add, 1).get(Millis(15000));
      ADD_FAILURE() << "the call went through";
    } catch (const ClusterError& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("loco keygen"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    client->shutdown();
  }
  EXPECT_EQ(core->inbound_messages(), 0u);
  core->shutdown();
}

}  // namespace
}  // namespace loco
