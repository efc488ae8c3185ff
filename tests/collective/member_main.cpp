// A group member in its own process, for the multi-process tests.
//
//   collective_member NAME RANK ROUND N SEED CODEC TIMEOUT_MS CHUNK_BYTES MODE PEERS...
//
// PEERS are "name=endpoint" in group order; the entry "NAME=self" is this process. It binds
// tcp://127.0.0.1:0, prints "endpoint EP", runs one all-reduce and prints "ok HASH" or
// "error MEMBER MESSAGE". MODE: normal | nan | longer | round+1 | stall:N (after N data
// messages print "stalled" and wait on stdin, for at most 60 s, to be killed) | pause:N (the
// same, but go on with the operation once a line arrives on stdin).
#include <poll.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "runtime/collective/allreduce.hpp"
#include "tests/collective/test_util.hpp"

using namespace loco::collective;

int main(int argc, char** argv) {
  if (argc < 11) {
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

  Communicator comm("tcp://127.0.0.1:0", opts);
  std::cout << "endpoint " << comm.endpoint() << std::endl;

  Group g;
  g.rank = rank;
  g.round_id = mode == "round+1" ? round + 1 : round;
  for (int i = 10; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string ep = a.substr(eq + 1);
    g.members.push_back({a.substr(0, eq), ep == "self" ? comm.endpoint() : ep});
  }
  std::vector<float> data = testing::make_data(seed, rank, mode == "longer" ? n + 5 : n);
  if (mode == "nan" && !data.empty()) data[data.size() / 2] = std::nanf("");
  if (mode.rfind("stall:", 0) == 0 || mode.rfind("pause:", 0) == 0) {
    uint64_t after = std::strtoull(mode.c_str() + 6, nullptr, 10);
    bool resume = mode[0] == 'p';
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
    comm.allreduce(g, std::span<float>(data));
    std::cout << "ok " << testing::hash_floats(data) << std::endl;
  } catch (const CollectiveError& e) {
    std::cout << "error " << e.member() << " " << e.what() << std::endl;
  }
  return 0;
}
