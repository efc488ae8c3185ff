// Distributed word count on a loco cluster:
//   loco up --workers 3 -- build/bin/wordcount [FILE]
// spawns one Tally per node, counts the file's chunks in parallel, and keeps
// the totals in a named KvStore that any later client can look up.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "examples/wordcount/actors.hpp"
#include "runtime/core/runtime.hpp"

using wordcount::KvStore;
using wordcount::Tally;

int main(int argc, char** argv) {
  const char* addr = std::getenv("LOCO_ADDRESS");
  std::string file = argc > 1 ? argv[1] : "/usr/share/common-licenses/GPL-3";
  std::ifstream in(file);
  if (!in) {
    std::cerr << "wordcount: cannot read " << file << "\n";
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();

  try {
    loco::Runtime rt = loco::Runtime::connect(addr ? addr : "127.0.0.1:7070");
    int nodes = 0;
    for (auto& n : rt.status().nodes) nodes += n.node.state == loco::NodeState::alive;
    if (nodes == 0) throw loco::ClusterError("the cluster has no live node");

    auto totals = rt.spawn<KvStore>(loco::ActorOptions().with_name("wordcount-totals"));
    std::vector<loco::ActorHandle<Tally>> tallies;
    for (int i = 0; i < nodes; ++i)
      tallies.push_back(rt.spawn<Tally>(loco::ActorOptions().with_resources({{"cpu", 1}})));

    // One chunk per tally, cut at whitespace; all counted at once.
    std::vector<loco::Future<std::map<std::string, int64_t>>> parts;
    size_t begin = 0;
    for (size_t i = 0; i < tallies.size(); ++i) {
      size_t end = i + 1 == tallies.size() ? text.size() : (i + 1) * text.size() / tallies.size();
      while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
      parts.push_back(tallies[i].call(&Tally::count, text.substr(begin, end - begin)));
      begin = end;
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      auto counts = parts[i].get(loco::Millis(30000));
      for (auto& [word, n] : counts) totals.tell(&KvStore::incr, word, n);
      std::cout << "tally " << i << " on " << tallies[i].call(&Tally::host).get() << " counted "
                << tallies[i].call(&Tally::words_seen).get() << " words\n";
    }
    totals.call(&KvStore::put, std::string("source"), file).get();

    // Anyone can find the totals by name.
    auto found = rt.get_actor<KvStore>("wordcount-totals");
    std::cout << "\nmost frequent words in "
              << *found.call(&KvStore::get, std::string("source")).get() << ":\n";
    for (auto& [word, n] : found.call(&KvStore::top, 10).get())
      std::cout << "  " << word << " " << n << "\n";
    return 0;
  } catch (const loco::Error& e) {
    std::cerr << "wordcount: " << e.what() << "\n";
    return 1;
  }
}
