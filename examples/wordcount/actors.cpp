#include "examples/wordcount/actors.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>

namespace wordcount {

std::optional<std::string> KvStore::get(std::string key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<std::string, int64_t>> KvStore::top(int n) const {
  std::vector<std::pair<std::string, int64_t>> all(counters_.begin(), counters_.end());
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (int(all.size()) > n) all.resize(n);
  return all;
}

std::map<std::string, int64_t> Tally::count(std::string text) {
  std::map<std::string, int64_t> counts;
  std::string word;
  auto flush = [&] {
    if (word.size() > 1) {
      counts[word]++;
      words_++;
    }
    word.clear();
  };
  for (char c : text) {
    if (std::isalpha(static_cast<unsigned char>(c)))
      word.push_back(char(std::tolower(static_cast<unsigned char>(c))));
    else
      flush();
  }
  flush();
  return counts;
}

std::string Tally::host() const {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return std::string(buf) + " pid " + std::to_string(getpid());
}

LOCO_REGISTER(KvStore, loco::ActorClass<KvStore>("wordcount.KvStore")
                           .method("put", &KvStore::put)
                           .method("get", &KvStore::get)
                           .method("incr", &KvStore::incr)
                           .method("top", &KvStore::top)
                           .method("size", &KvStore::size));
LOCO_REGISTER(Tally, loco::ActorClass<Tally>("wordcount.Tally")
                         .method("count", &Tally::count)
                         .method("words_seen", &Tally::words_seen)
                         .method("host", &Tally::host));

}  // namespace wordcount
