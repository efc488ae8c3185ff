#pragma once
// Two actor classes with nothing to do with training, built only on loco's
// public API: a key-value store and a word counter.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/actor.hpp"

namespace wordcount {

// A named key-value store with counters.
class KvStore {
 public:
  void put(std::string key, std::string value) { values_[std::move(key)] = std::move(value); }
  std::optional<std::string> get(std::string key) const;
  int64_t incr(std::string key, int64_t by) { return counters_[std::move(key)] += by; }
  // The n largest counters, largest first.
  std::vector<std::pair<std::string, int64_t>> top(int n) const;
  size_t size() const { return values_.size() + counters_.size(); }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, int64_t> counters_;
};

// Counts the words of the text it is given (lower-cased, letters only).
class Tally {
 public:
  std::map<std::string, int64_t> count(std::string text);
  int64_t words_seen() const { return words_; }
  std::string host() const;

 private:
  int64_t words_ = 0;
};

}  // namespace wordcount
