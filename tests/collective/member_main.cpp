// A group member in its own process, for the multi-process tests.
//
//   collective_member NAME RANK ROUND N SEED CODEC TIMEOUT_MS CHUNK_BYTES MODE PEERS...
//
// PEERS are "name=endpoint" in group order; the entry "NAME=self" is this process. It binds
// tcp://127.0.0.1:0, prints "endpoint EP", runs one all-reduce and prints "ok HASH" or
// "error MEMBER MESSAGE". MODE: normal | nan | longer | round+1 | stall:N (after N data
// messages print "stalled" and wait on stdin, for at most 60 s, to be killed) | pause:N (the
// same, but go on with the operation once a line arrives on stdin) | serve (no PEERS: runs
// the operations that stdin asks for, one line each, as a worker runs the aggregator's, on the
// same communicator: "op ROUND MODE PEER..." with the endpoints spelled out, and the member's
// own data (by RANK) whatever its rank in that group; "quit" ends it) | repeat:N (N operations
// on PEERS, round ids ROUND, ROUND+1, ..., one result line each, once every peer listens).
// A mode after "gather:" (gather:normal, gather:stall:N) runs an all-gather instead: its blob is
// N bytes by (SEED, RANK) (make_blob), and it prints "ok HASH" of all blobs (hash_blobs).
// LOCO_MEMBER_BIND, if set, is the endpoint to bind instead of tcp://127.0.0.1:0.
// Members behind NAT, and production's security, for benchmarks (bench/nat/netns.sh):
//   LOCO_MEMBER_OUTBOUND=1      outbound-only (Options::outbound_only): binds nothing, its
//                               endpoint is "nat://KX"; peers' endpoints are read with member_at
//   LOCO_MEMBER_RELAY=tcp://H:P and LOCO_MEMBER_RELAY_KEY=Z85: the groups' relay
//   LOCO_MEMBER_KEY=FILE        CURVE with the cluster key file FILE (else plain TCP)
//   LOCO_MEMBER_RENDEZVOUS=DIR  writes its endpoint to DIR/NAME; a peer given as "name=?" is
//                               read from DIR/name, waited for (at most 60 s)
//   LOCO_MEMBER_TIMES=1         after each operation's result line, "seconds S": the time
//                               allreduce()/allgather() took on this member; in repeat mode,
//                               at the end, "barrier S ok|error ..." (the last operation, as a
//                               barrier) and "cpu S": the process's CPU seconds (user + system)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/collective/allreduce.hpp"
#include "runtime/security/keys.hpp"
#include "tests/collective/test_util.hpp"

using namespace loco::collective;

// Waits until every tcp:// peer accepts connections (bounded by `limit`): members started
// together must not connect to one that has not bound yet, which a member would take for a
// peer that is gone. False on timeout.
bool wait_for_peers(const std::vector<std::string>& peers, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (const std::string& p : peers) {
    const std::string ep = p.substr(p.find('=') + 1);
    if (ep.rfind("tcp://", 0) != 0) continue;
    const auto colon = ep.rfind(':');
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::atoi(ep.c_str() + colon + 1)));
    if (inet_pton(AF_INET, ep.substr(6, colon - 6).c_str(), &a.sin_addr) != 1) return false;
    while (true) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      const bool up = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      if (fd >= 0) close(fd);
      if (up) break;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a port, bounded
    }
  }
  return true;
}

// LOCO_MEMBER_RENDEZVOUS: publishes this member's endpoint as DIR/NAME (written aside, then
// renamed: a reader never sees half of it).
void publish_endpoint(const std::string& dir, const std::string& name, const std::string& ep) {
  const std::string tmp = dir + "/." + name + ".tmp";
  std::ofstream(tmp) << ep << "\n";
  std::filesystem::rename(tmp, dir + "/" + name);
}

// Replaces each "name=?" by "name=ENDPOINT" read from DIR/name, waiting for the file (bounded
// by `limit`). False on timeout.
bool resolve_peers(const std::string& dir, std::vector<std::string>& peers,
                   std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (std::string& p : peers) {
    const auto eq = p.find('=');
    if (p.substr(eq + 1) != "?") continue;
    const std::string file = dir + "/" + p.substr(0, eq);
    std::string ep;
    while (!(std::ifstream(file) >> ep) || ep.empty()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a file, bounded
    }
    p = p.substr(0, eq + 1) + ep;
  }
  return true;
}

int main(int argc, char** argv) {
  if (argc < 10 || (argc < 11 && std::string(argv[9]) != "serve")) {
    std::cerr
        << "usage: collective_member NAME RANK ROUND N SEED CODEC TIMEOUT_MS CHUNK MODE PEERS...\n";
    return 2;
  }
  std::string name = argv[1];
  int rank = std::atoi(argv[2]);
  uint64_t round = std::strtoull(argv[3], nullptr, 10);
  size_t n = std::strtoull(argv[4], nullptr, 10);
  uint64_t seed = std::strtoull(argv[5], nullptr, 10);
  Options opts;
  opts.codec = parse_codec(argv[6]).value_or(Codec::fp32);
  opts.peer_timeout = std::chrono::milliseconds(std::atoi(argv[7]));
  opts.chunk_bytes = std::strtoull(argv[8], nullptr, 10);
  std::string mode = argv[9];

  const char* env_outbound = getenv("LOCO_MEMBER_OUTBOUND");
  opts.outbound_only = env_outbound && std::string(env_outbound) == "1";
  if (const char* key = getenv("LOCO_MEMBER_KEY"); key && *key) {
    opts.security = loco::security::read_key_file(key);
  }
  RelayEndpoint relay;
  if (const char* r = getenv("LOCO_MEMBER_RELAY")) relay.endpoint = r;
  if (const char* r = getenv("LOCO_MEMBER_RELAY_KEY")) relay.public_key = r;
  const char* env_times = getenv("LOCO_MEMBER_TIMES");
  const bool print_times = env_times && std::string(env_times) == "1";
  const char* env_rendezvous = getenv("LOCO_MEMBER_RENDEZVOUS");
  const std::string rendezvous = env_rendezvous ? env_rendezvous : "";

  const char* bind = getenv("LOCO_MEMBER_BIND");
  Communicator comm(bind ? bind : "tcp://127.0.0.1:0", opts);
  std::cout << "endpoint " << comm.endpoint() << std::endl;
  if (!rendezvous.empty()) publish_endpoint(rendezvous, name, comm.endpoint());

  auto group_of = [&](uint64_t round_id, const std::vector<std::string>& peers) {
    Group g;
    g.round_id = round_id;
    g.relay = relay;
    for (const std::string& a : peers) {
      auto eq = a.find('=');
      std::string ep = a.substr(eq + 1);
      if (a.substr(0, eq) == name) g.rank = static_cast<int>(g.members.size());
      g.members.push_back(member_at(a.substr(0, eq), ep == "self" ? comm.endpoint() : ep));
    }
    return g;
  };
  auto run_op = [&](uint64_t round_id, std::string op_mode, const std::vector<std::string>& peers) {
    const bool gather = op_mode.rfind("gather:", 0) == 0;
    if (gather) op_mode = op_mode.substr(7);
    Group g = group_of(op_mode == "round+1" ? round_id + 1 : round_id, peers);
    std::vector<float> data = testing::make_data(seed, rank, op_mode == "longer" ? n + 5 : n);
    if (op_mode == "nan" && !data.empty()) data[data.size() / 2] = std::nanf("");
    comm.hooks().after_send = nullptr;
    if (op_mode.rfind("stall:", 0) == 0 || op_mode.rfind("pause:", 0) == 0) {
      uint64_t after = std::strtoull(op_mode.c_str() + 6, nullptr, 10);
      bool resume = op_mode[0] == 'p';
      comm.hooks().after_send = [after, resume](uint64_t sent) {
        if (sent != after) return;
        std::cout << "stalled" << std::endl;
        pollfd p{0, POLLIN, 0};
        ::poll(&p, 1, 60'000);  // the test kills or resumes us long before
        if (!resume) std::_Exit(3);
        std::string line;
        std::getline(std::cin, line);
      };
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] {
      if (!print_times) return;
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
      std::printf("seconds %.4f\n", d.count());
      std::fflush(stdout);
    };
    try {
      if (gather) {
        const auto blobs = comm.allgather(g, testing::make_blob(seed, rank, n), size_t(1) << 30);
        std::cout << "ok " << testing::hash_blobs(blobs) << std::endl;
        seconds();
        return;
      }
      comm.allreduce(g, std::span<float>(data));
      std::cout << "ok " << testing::hash_floats(data) << std::endl;
      seconds();
    } catch (const CollectiveError& e) {
      std::cout << "error " << e.member() << " " << e.what() << std::endl;
      seconds();
    }
  };

  if (mode.rfind("repeat:", 0) == 0) {
    const uint64_t times = std::strtoull(mode.c_str() + 7, nullptr, 10);
    std::vector<std::string> peers(argv + 10, argv + argc);
    if (!rendezvous.empty() && !resolve_peers(rendezvous, peers, std::chrono::seconds(60))) {
      std::cout << "error peers' endpoints not in " << rendezvous << " after 60 s" << std::endl;
      return 1;
    }
    if (!wait_for_peers(peers, std::chrono::seconds(30))) {
      std::cout << "error peers not listening after 30 s" << std::endl;
      return 1;
    }
    for (uint64_t i = 0; i < times; ++i) run_op(round + i, "normal", peers);
    // A last operation as a barrier before exiting: a member that closes its sockets while
    // data of the last operation is still on its way to it is lost to the others. Its own
    // result is not reported.
    Group g = group_of(round + times, peers);
    float one = 1;
    const auto b0 = std::chrono::steady_clock::now();
    std::string barrier = "ok";
    try {
      comm.allreduce(g, std::span<float>(&one, 1));
    } catch (const CollectiveError& e) {
      barrier = std::string("error ") + e.what();
    }
    if (print_times) {
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - b0;
      std::printf("barrier %.4f %s\n", d.count(), barrier.c_str());
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
      std::printf("cpu %.3f\n", secs(u.ru_utime) + secs(u.ru_stime));
      std::fflush(stdout);
    }
    return 0;
  }
  if (mode != "serve") {
    std::vector<std::string> peers(argv + 10, argv + argc);
    if (!rendezvous.empty() && !resolve_peers(rendezvous, peers, std::chrono::seconds(60))) {
      std::cout << "error peers' endpoints not in " << rendezvous << " after 60 s" << std::endl;
      return 1;
    }
    run_op(round, mode, peers);
    return 0;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string verb, op_mode;
    uint64_t op_round = 0;
    words >> verb;
    if (verb == "quit") break;
    if (verb != "op" || !(words >> op_round >> op_mode)) {
      std::cout << "error - bad command: " << line << std::endl;
      continue;
    }
    std::vector<std::string> peers;
    for (std::string p; words >> p;) peers.push_back(p);
    run_op(op_round, op_mode, peers);
  }
  return 0;
}
