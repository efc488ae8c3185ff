// bench/token_rss: does a worker's memory stay flat as its data grows? Writes llm.c token
// files (uint16, sparse: the ids are zeros, which costs no disk and no time) of --gb in all,
// --file-gb each, plus a validation file; opens them as data.format: tokens with --shards
// shards, takes the shards of worker 0 of --workers, and reads --batches batches of --batch
// windows of --context + 1 tokens, as a worker's inner steps do. Prints RssAnon and RssFile
// (/proc/self/status) after opening and after the batches, and the highest RssFile seen.
//   build/bin/bench_token_rss --gb 4 --batches 2000
//   build/bin/bench_token_rss --gb 0.1 --batches 2000
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "diloco/data/data.hpp"

using namespace loco::diloco;

namespace {

// A field of /proc/self/status, in MiB.
double status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  throw std::runtime_error("no " + field + " in /proc/self/status");
}

void sparse_llmc_file(const std::string& path, std::uint64_t tokens) {
  std::int32_t h[256] = {};
  h[0] = 20240520;
  h[1] = 1;
  h[2] = static_cast<std::int32_t>(tokens);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, h, sizeof h) != static_cast<ssize_t>(sizeof h) ||
      ::ftruncate(fd, static_cast<off_t>(sizeof h + 2 * tokens)) != 0)
    throw std::runtime_error("cannot write " + path);
  ::close(fd);
}

void report(const char* when) {
  std::printf("%-22s RssAnon %8.1f MiB  RssFile %8.1f MiB  VmRSS %8.1f MiB\n", when,
              status_mib("RssAnon"), status_mib("RssFile"), status_mib("VmRSS"));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_token_rss: a worker's RSS against the size of its token files"};
  double gb = 4, file_gb = 1;
  int batches = 2000, batch = 8, context = 1024, shards = 64, workers = 4;
  std::string dir =
      (std::filesystem::temp_directory_path() / ("loco-token-rss-" + std::to_string(::getpid())))
          .string();
  app.add_option("--gb", gb, "training data, GB (1e9 bytes)");
  app.add_option("--file-gb", file_gb, "GB per token file");
  app.add_option("--batches", batches, "batches to read");
  app.add_option("--batch", batch, "windows per batch");
  app.add_option("--context", context, "tokens per window, less one");
  app.add_option("--shards", shards, "data.shards");
  app.add_option("--workers", workers, "workers the shards are dealt to (this is worker 0)");
  bool keep = false;
  app.add_option("--dir", dir, "folder for the token files (removed at the end)");
  app.add_flag("--keep", keep, "keep the token files (for bench_memory --tokens DIR)");
  CLI11_PARSE(app, argc, argv);

  std::filesystem::create_directories(dir);
  const auto total = static_cast<std::uint64_t>(gb * 1e9 / 2);
  const auto per_file = static_cast<std::uint64_t>(file_gb * 1e9 / 2);
  int files = 0;
  for (std::uint64_t done = 0; done < total; done += per_file, ++files) {
    char name[64];
    std::snprintf(name, sizeof name, "/bench_train_%06d.bin", files);
    sparse_llmc_file(dir + name, std::min(per_file, total - done));
  }
  sparse_llmc_file(dir + "/bench_val_000000.bin", 1 << 20);
  std::printf("data: %.2f GB of uint16 tokens in %d training files, %d shards, worker 0 of %d\n",
              static_cast<double>(total) * 2 / 1e9, files, shards, workers);

  report("before opening");
  DataConfig d;
  d.dir = dir;
  d.format = DataFormat::tokens;
  d.shards = shards;
  {
    const auto store = TokenStore::open(d, 50257);
    report("after opening");
    ShardSampler sampler(store, round_robin_shards(shards, 0, workers), context, 1, 0);
    std::vector<std::int64_t> out(static_cast<std::size_t>(batch) *
                                  static_cast<std::size_t>(context + 1));
    double peak = 0;
    for (int i = 0; i < batches; ++i) {
      sampler.next(batch, out);
      if (i % 100 == 99) peak = std::max(peak, status_mib("RssFile"));
    }
    char what[64];
    std::snprintf(what, sizeof what, "after %d batches", batches);
    report(what);
    std::printf("RssFile peak          %8.1f MiB (sampled every 100 batches)\n", peak);
    std::printf("read: %.1f MiB of windows (%d x %d x %d tokens)\n",
                static_cast<double>(batches) * batch * (context + 1) * 2 / (1024.0 * 1024.0),
                batches, batch, context + 1);
  }
  if (!keep) remove_tree(dir);
  return 0;
}
