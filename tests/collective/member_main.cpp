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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/collective/allreduce.hpp"
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

  const char* bind = getenv("LOCO_MEMBER_BIND");
  Communicator comm(bind ? bind : "tcp://127.0.0.1:0", opts);
  std::cout << "endpoint " << comm.endpoint() << std::endl;

  auto group_of = [&](uint64_t round_id, const std::vector<std::string>& peers) {
    Group g;
    g.round_id = round_id;
    for (const std::string& a : peers) {
      auto eq = a.find('=');
      std::string ep = a.substr(eq + 1);
      if (a.substr(0, eq) == name) g.rank = static_cast<int>(g.members.size());
      g.members.push_back({a.substr(0, eq), ep == "self" ? comm.endpoint() : ep});
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
    try {
      if (gather) {
        const auto blobs = comm.allgather(g, testing::make_blob(seed, rank, n), size_t(1) << 30);
        std::cout << "ok " << testing::hash_blobs(blobs) << std::endl;
        return;
      }
      comm.allreduce(g, std::span<float>(data));
      std::cout << "ok " << testing::hash_floats(data) << std::endl;
    } catch (const CollectiveError& e) {
      std::cout << "error " << e.member() << " " << e.what() << std::endl;
    }
  };

  if (mode.rfind("repeat:", 0) == 0) {
    const uint64_t times = std::strtoull(mode.c_str() + 7, nullptr, 10);
    std::vector<std::string> peers(argv + 10, argv + argc);
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
    try {
      comm.allreduce(g, std::span<float>(&one, 1));
    } catch (const CollectiveError&) {
    }
    return 0;
  }
  if (mode != "serve") {
    run_op(round, mode, std::vector<std::string>(argv + 10, argv + argc));
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
