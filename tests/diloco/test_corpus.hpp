// A small deterministic English-like corpus in a temporary data folder.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "diloco/data/data.hpp"
#include "diloco/job/config.hpp"

namespace loco::diloco::testing {

inline std::string make_corpus_dir(const std::string& tag, std::size_t bytes = 200000) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("loco-diloco-" + tag + "-" + std::to_string(::getpid()));
  remove_tree(dir.string());
  fs::create_directories(dir / "corpus");
  static const char* words[] = {
      "and",    "the",   "lord", "said",    "unto", "moses", "in",    "beginning", "god", "created",
      "heaven", "earth", "was",  "without", "form", "void",  "light", "darkness",  "of",  "day"};
  std::ofstream out(dir / "corpus" / "a.txt");
  std::uint64_t x = 42;
  std::size_t n = 0, in_line = 0;
  while (n < bytes) {
    x = splitmix64(x);
    const std::string w = words[x % 20];
    out << w;
    n += w.size() + 1;
    if (++in_line == 12) {
      out << ".\n";
      in_line = 0;
    } else {
      out << ' ';
    }
  }
  return dir.string();
}

// The tests' small job over the corpus in `dir`: a 2-layer GPT of width 32, 4 inner steps of
// 4 sequences, 4 rounds. Not validated: callers change what they need, then validate().
inline JobConfig small_job(const std::string& dir) {
  JobConfig c;
  c.seed = 11;
  c.model = {.layers = 2,
             .d_model = 32,
             .heads = 2,
             .context = 16,
             .vocab = 0,
             .tied_embeddings = true,
             .mlp_ratio = 4};
  c.data.dir = dir;
  c.data.shards = 8;
  c.data.val_fraction = 0.05;
  c.inner.steps = 4;
  c.inner.batch_size = 4;
  c.inner.lr = 3e-3;
  c.inner.warmup = 3;
  c.rounds = 4;
  c.eval.every = 4;
  c.eval.batches = 2;
  return c;
}

}  // namespace loco::diloco::testing
