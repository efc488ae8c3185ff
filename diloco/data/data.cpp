#include "diloco/data/data.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/tokenizer_json.hpp"

namespace loco::diloco {

namespace fs = std::filesystem;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string hex64(std::uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

namespace {

// A link inside a job's data folder could lead out of the node's data root, which data.dir was
// checked against: the corpus folder, its files and the token cache are refused as links (issue
// "21 ·": a corpus file linked to a root-only file was tokenized, and its cache decoded to it).
void refuse_link(const fs::path& p, const std::string& what) {
  if (fs::is_symlink(p))
    throw std::runtime_error("data.dir: " + what + " " + p.string() +
                             " is a symbolic link, which could leave the node's data root; "
                             "refused (copy the file instead)");
}

std::vector<fs::path> corpus_files(const std::string& dir) {
  std::vector<fs::path> files;
  const fs::path c = fs::path(dir) / "corpus";
  refuse_link(c, "the corpus folder");
  if (fs::is_directory(c))
    for (const auto& e : fs::directory_iterator(c)) {
      if (e.path().extension() != ".txt") continue;
      refuse_link(e.path(), "corpus file");
      if (e.is_regular_file()) files.push_back(e.path());
    }
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw std::runtime_error("data.dir: no corpus in " + c.string() +
                             "/*.txt; run scripts/fetch-corpus " + dir);
  return files;
}

std::string read_all(const fs::path& p) {
  return read_bounded(p.string(), std::numeric_limits<std::uintmax_t>::max(),
                      "corpus file " + p.string());
}

class ByteTokenizer final : public Tokenizer {
 public:
  int vocab_size() const override { return 256; }
  std::vector<std::uint32_t> encode(const std::string& text) const override {
    std::vector<std::uint32_t> out(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(std::span<const std::uint32_t> tokens) const override {
    std::string s;
    s.reserve(tokens.size());
    for (auto t : tokens) s.push_back(static_cast<char>(t & 0xff));
    return s;
  }
};

// Sentencepiece drops line breaks; a user-defined piece keeps them.
constexpr const char* kNewline = "<nl>";

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& model) {
    const auto st = sp_.Load(model);
    if (!st.ok())
      throw std::runtime_error("bpe tokenizer: cannot load " + model + ": " + st.ToString());
    nl_ = sp_.PieceToId(kNewline);
  }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  std::vector<std::uint32_t> encode(const std::string& text) const override {
    std::vector<std::uint32_t> out;
    std::istringstream in(text);
    std::string line;
    std::vector<int> ids;
    bool first = true;
    while (std::getline(in, line)) {
      if (!first) out.push_back(static_cast<std::uint32_t>(nl_));
      first = false;
      sp_.Encode(line, &ids).IgnoreError();
      for (int id : ids) out.push_back(static_cast<std::uint32_t>(id));
    }
    if (!text.empty() && text.back() == '\n') out.push_back(static_cast<std::uint32_t>(nl_));
    return out;
  }
  std::string decode(std::span<const std::uint32_t> tokens) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      std::string s;
      sp_.Decode(run, &s).IgnoreError();
      out += s;
      run.clear();
    };
    for (auto t : tokens) {
      if (static_cast<int>(t) == nl_) {
        flush();
        out += '\n';
      } else {
        run.push_back(static_cast<int>(t));
      }
    }
    flush();
    return out;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  int nl_ = -1;
};

std::string bpe_model_path(const DataConfig& d) {
  return (fs::path(d.dir) / ("bpe-" + std::to_string(d.bpe_vocab) + ".model")).string();
}

void train_bpe(const DataConfig& d) {
  const auto files = corpus_files(d.dir);
  std::string inputs;
  for (const auto& f : files) inputs += (inputs.empty() ? "" : ",") + f.string();
  const std::string prefix = (fs::path(d.dir) / ("bpe-" + std::to_string(d.bpe_vocab) + ".tmp" +
                                                 std::to_string(::getpid())))
                                 .string();
  const std::string args =
      "--input=" + inputs + " --model_prefix=" + prefix +
      " --model_type=bpe --vocab_size=" + std::to_string(d.bpe_vocab) +
      " --character_coverage=1.0 --byte_fallback=true --input_sentence_size=200000"
      " --shuffle_input_sentence=true --seed_sentencepiece_size=200000 --num_threads=2"
      " --minloglevel=2 --user_defined_symbols=" +
      kNewline;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) throw std::runtime_error("bpe tokenizer: training failed: " + st.ToString());
  fs::rename(prefix + ".model", bpe_model_path(d));
  fs::remove(prefix + ".vocab");
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> make_tokenizer(const DataConfig& d) {
  if (d.tokenizer == TokenizerKind::byte) return make_byte_tokenizer();
  if (d.tokenizer == TokenizerKind::json) return load_tokenizer_json(d.tokenizer_json);
  const auto model = bpe_model_path(d);
  if (!fs::exists(model)) train_bpe(d);
  return std::make_unique<BpeTokenizer>(model);
}

namespace {

template <class T>
void write_raw(const std::string& path, const T* data, std::size_t bytes) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    auto out = open_job_stream(tmp, std::ios::out, "cannot write " + tmp);
    out->write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    out->flush();
    if (!*out) throw std::runtime_error("cannot write " + tmp);
  }
  fs::rename(tmp, path);
}

// FNV-1a of a file's bytes: names the token cache of a tokenizer.json.
std::uint64_t file_hash(const std::string& path) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : read_all(path)) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

constexpr std::size_t kLlmcHeaderBytes = 256 * sizeof(std::int32_t);
constexpr std::int32_t kLlmcMagicGpt2 = 20240520;    // version 1, uint16 ids
constexpr std::int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 ids

}  // namespace

void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens) {
  write_raw(path, tokens.data(), tokens.size_bytes());
}

void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, int width) {
  if (width == 4) return write_raw(path, tokens.data(), tokens.size_bytes());
  if (width != 2) throw std::invalid_argument("write_token_file: width must be 2 or 4");
  std::vector<std::uint16_t> narrow(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > 0xffff)
      throw std::invalid_argument("write_token_file: id " + std::to_string(tokens[i]) +
                                  " does not fit 2 bytes");
    narrow[i] = static_cast<std::uint16_t>(tokens[i]);
  }
  write_token_file(path, narrow);
}

TokenStore TokenStore::open(const DataConfig& d, int vocab) {
  if (d.format == DataFormat::tokens) {
    const fs::path dir(d.dir);
    if (!fs::is_directory(dir))
      throw std::runtime_error("data.dir: " + d.dir +
                               " is not a folder (format tokens: it holds the *.bin token files; "
                               "scripts/prepare-data writes them)");
    std::vector<std::string> train, val;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".bin") continue;
      // A link could lead out of the node's data root, which data.dir was checked against.
      if (e.is_symlink())
        throw std::runtime_error("data.dir: token file " + e.path().string() +
                                 " is a symbolic link; refused (copy the file instead)");
      if (!e.is_regular_file()) continue;
      (e.path().filename().string().find("val") != std::string::npos ? val : train)
          .push_back(e.path().string());
      if (train.size() + val.size() > kMaxTokenFiles)
        throw std::runtime_error("data.dir: more than " + std::to_string(kMaxTokenFiles) +
                                 " token files in " + d.dir);
    }
    std::sort(train.begin(), train.end());
    std::sort(val.begin(), val.end());
    if (train.empty())
      throw std::runtime_error(
          "data.dir: no training token files (*.bin without \"val\" in the "
          "name) in " +
          d.dir + "; scripts/prepare-data writes them");
    return open_files(train, val, d.dtype, d.val_fraction, d.shards, vocab);
  }
  std::string name;
  int width = 2;
  if (d.tokenizer == TokenizerKind::byte) {
    name = "tokens-byte.bin";
  } else if (d.tokenizer == TokenizerKind::bpe) {
    name = "tokens-bpe-" + std::to_string(d.bpe_vocab) + ".bin";
  }
  std::unique_ptr<Tokenizer> tok;
  if (d.tokenizer == TokenizerKind::json) {
    if (!fs::is_regular_file(d.tokenizer_json))
      throw std::runtime_error("data.tokenizer: no file " + d.tokenizer_json);
    tok = make_tokenizer(d);  // first: it bounds the file's size before the hash reads it
    name = "tokens-json-" + hex64(file_hash(d.tokenizer_json));
    if (tok->vocab_size() > 65536) {
      width = 4;
      name += "-u32";
    }
    name += ".bin";
  }
  const std::string path = (fs::path(d.dir) / name).string();
  refuse_link(path, "token cache");
  if (!fs::exists(path)) {
    if (!tok) tok = make_tokenizer(d);
    std::vector<std::uint32_t> all;
    for (const auto& f : corpus_files(d.dir)) {
      std::vector<std::uint32_t> t;
      try {
        t = tok->encode(read_all(f));
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(f.string() + ": " + e.what());
      }
      all.insert(all.end(), t.begin(), t.end());
    }
    write_token_file(path, all, width);
  }
  return open_files({path}, {}, width == 2 ? TokenDtype::uint16 : TokenDtype::uint32,
                    d.val_fraction, d.shards, vocab, false);
}

TokenStore TokenStore::open_file(const std::string& path, double val_fraction, int shards) {
  return open_files({path}, {}, TokenDtype::uint16, val_fraction, shards, 0, false);
}

TokenStore::File TokenStore::map_file(const std::string& path, TokenDtype dtype,
                                      bool detect_header) {
  File f;
  f.path = path;
  f.width = dtype == TokenDtype::uint16 ? 2 : 4;
  const int fd = open_job_file(path, O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open token file " + path + ": " + job_file_error());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error("token file " + path + " is not a regular file");
  }
  const auto bytes = static_cast<std::uint64_t>(st.st_size);
  auto fail = [&](const std::string& why) {
    ::close(fd);
    throw std::runtime_error("token file " + path + ": " + why);
  };
  if (bytes > kMaxTokenFileBytes)
    fail(std::to_string(bytes) + " bytes, more than the limit of " +
         std::to_string(kMaxTokenFileBytes));
  if (detect_header && bytes >= kLlmcHeaderBytes) {
    std::int32_t h[3] = {};
    if (::pread(fd, h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) fail("cannot read");
    if (h[0] == kLlmcMagicGpt2 || h[0] == kLlmcMagicLlama3) {
      const bool gpt2 = h[0] == kLlmcMagicGpt2;
      if (h[1] != (gpt2 ? 1 : 7))
        fail("llm.c header (magic " + std::to_string(h[0]) + ") has version " +
             std::to_string(h[1]) + ", expected " + (gpt2 ? "1" : "7"));
      f.width = gpt2 ? 2 : 4;
      f.header = kLlmcHeaderBytes;
      if (h[2] < 0) fail("llm.c header gives a negative token count " + std::to_string(h[2]));
      const std::uint64_t want =
          kLlmcHeaderBytes + static_cast<std::uint64_t>(h[2]) * static_cast<std::uint64_t>(f.width);
      if (want != bytes)
        fail("llm.c header says " + std::to_string(h[2]) + " tokens of " + std::to_string(f.width) +
             " bytes (" + std::to_string(want) + " bytes with the header), but the file has " +
             std::to_string(bytes) + " bytes");
    }
  }
  const std::uint64_t body = bytes - f.header;
  if (body % static_cast<std::uint64_t>(f.width) != 0)
    fail(std::to_string(body) + " bytes of ids is not a whole number of " +
         std::to_string(f.width) +
         "-byte ids (data.dtype: " + (f.width == 2 ? "uint16" : "uint32") + ")");
  f.count = static_cast<std::size_t>(body / static_cast<std::uint64_t>(f.width));
  if (f.count == 0) fail("no tokens");
  f.map_len = static_cast<std::size_t>(bytes);
  void* p = ::mmap(nullptr, f.map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("cannot map token file " + path);
  // Reads are windows at random offsets: no read-ahead, so only the pages of the windows
  // read become resident.
  ::madvise(p, f.map_len, MADV_RANDOM);
  f.map = static_cast<const unsigned char*>(p);
  return f;
}

TokenStore TokenStore::open_files(const std::vector<std::string>& training,
                                  const std::vector<std::string>& validation, TokenDtype dtype,
                                  double val_fraction, int shards, int vocab, bool detect_header) {
  if (training.empty()) throw std::invalid_argument("TokenStore: no training files");
  if (shards < static_cast<int>(training.size()))
    throw std::invalid_argument("data.shards: " + std::to_string(shards) + " is fewer than the " +
                                std::to_string(training.size()) +
                                " training token files (a shard never crosses a file); set "
                                "data.shards to at least that");
  TokenStore s;
  s.vocab_ = static_cast<std::uint32_t>(std::max(vocab, 0));
  for (const auto* list : {&training, &validation})
    for (const auto& path : *list) {
      s.files_.push_back(map_file(path, dtype, detect_header));
      auto& f = s.files_.back();
      f.first = s.size_;
      s.size_ += f.count;
    }
  std::size_t train_tokens = 0;
  for (std::size_t i = 0; i < training.size(); ++i) train_tokens += s.files_[i].count;
  if (validation.empty()) {
    const auto tail = static_cast<std::size_t>(static_cast<double>(train_tokens) * val_fraction);
    const auto& last = s.files_[training.size() - 1];
    if (training.size() > 1 && tail >= last.count)
      throw std::invalid_argument(
          "data.val_fraction: the validation split (" + std::to_string(tail) +
          " tokens) would not fit in the last training file " + last.path + " (" +
          std::to_string(last.count) +
          " tokens); add a validation file (a name containing \"val\") or lower it");
    s.train_end_ = train_tokens - tail;
    s.val_ranges_.emplace_back(s.train_end_, s.size_);
  } else {
    s.train_end_ = train_tokens;
    for (std::size_t i = training.size(); i < s.files_.size(); ++i)
      s.val_ranges_.emplace_back(s.files_[i].first, s.files_[i].first + s.files_[i].count);
  }
  s.cut_shards_of(training.size(), shards);
  return s;
}

void TokenStore::cut_shards_of(std::size_t training_files, int shards) {
  // Training tokens of each file (the last may lose its tail to validation).
  std::vector<std::size_t> len(training_files);
  for (std::size_t i = 0; i < training_files; ++i)
    len[i] = std::min(files_[i].first + files_[i].count, train_end_) - files_[i].first;
  std::vector<int> k(training_files, 1);
  int given = static_cast<int>(training_files);
  // Largest tokens-per-shard first, one shard at a time: proportional, deterministic.
  while (given < shards) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < training_files; ++i)
      if (len[i] * static_cast<std::size_t>(k[best]) > len[best] * static_cast<std::size_t>(k[i]))
        best = i;
    ++k[best];
    ++given;
  }
  shards_.clear();
  for (std::size_t i = 0; i < training_files; ++i) {
    const std::size_t per = len[i] / static_cast<std::size_t>(k[i]);
    for (int j = 0; j < k[i]; ++j) {
      const std::size_t b = files_[i].first + per * static_cast<std::size_t>(j);
      shards_.emplace_back(b, j + 1 == k[i] ? files_[i].first + len[i] : b + per);
    }
  }
}

void TokenStore::unmap() {
  for (auto& f : files_)
    if (f.map) ::munmap(const_cast<unsigned char*>(f.map), f.map_len);
  files_.clear();
}

TokenStore::TokenStore(TokenStore&& o) noexcept { *this = std::move(o); }

TokenStore& TokenStore::operator=(TokenStore&& o) noexcept {
  if (this != &o) {
    unmap();
    files_ = std::move(o.files_);
    o.files_.clear();
    size_ = o.size_;
    train_end_ = o.train_end_;
    vocab_ = o.vocab_;
    shards_ = std::move(o.shards_);
    val_ranges_ = std::move(o.val_ranges_);
    read_since_release_.store(o.read_since_release_.load());
  }
  return *this;
}

TokenStore::~TokenStore() { unmap(); }

const std::string& TokenStore::path() const { return files_.at(0).path; }

const TokenStore::File& TokenStore::file_of(std::size_t i) const {
  if (i >= size_)
    throw std::out_of_range("token " + std::to_string(i) + " of " + std::to_string(size_));
  auto it = std::upper_bound(files_.begin(), files_.end(), i,
                             [](std::size_t v, const File& f) { return v < f.first; });
  return *(it - 1);
}

void TokenStore::read(std::size_t begin, std::size_t n, std::int64_t* out) const {
  if (n == 0) return;
  const File& f = file_of(begin);
  if (begin + n > f.first + f.count)
    throw std::out_of_range("TokenStore::read: tokens [" + std::to_string(begin) + ", " +
                            std::to_string(begin + n) + ") cross the end of " + f.path);
  const unsigned char* p = f.map + f.header + (begin - f.first) * static_cast<std::size_t>(f.width);
  std::uint32_t worst = 0;
  if (f.width == 2) {
    const auto* t = reinterpret_cast<const std::uint16_t*>(p);
    for (std::size_t j = 0; j < n; ++j) {
      out[j] = t[j];
      worst = std::max<std::uint32_t>(worst, t[j]);
    }
  } else {
    const auto* t = reinterpret_cast<const std::uint32_t*>(p);
    for (std::size_t j = 0; j < n; ++j) {
      out[j] = t[j];
      worst = std::max(worst, t[j]);
    }
  }
  // What a window can map: its bytes and, at each end, the kernel's fault-around (it maps
  // up to 64 KiB of cached pages around a faulting one, MADV_RANDOM or not).
  const std::size_t touched = n * static_cast<std::size_t>(f.width) + 2 * 65536;
  if (read_since_release_.fetch_add(touched, std::memory_order_relaxed) + touched >=
      kReleaseBytes) {
    read_since_release_.store(0, std::memory_order_relaxed);
    // Read-only file pages: another thread reading them meanwhile faults them back in.
    for (const auto& g : files_)
      ::madvise(const_cast<unsigned char*>(g.map), g.map_len, MADV_DONTNEED);
  }
  if (vocab_ != 0 && worst >= vocab_)
    for (std::size_t j = 0; j < n; ++j)
      if (static_cast<std::uint64_t>(out[j]) >= vocab_) {
        const std::size_t at = begin - f.first + j;
        // Where, not the id itself: no error message carries bytes of a file.
        throw std::runtime_error(
            "token file " + f.path + ": the id at token " + std::to_string(at) +
            " (byte offset " + std::to_string(f.header + at * static_cast<std::size_t>(f.width)) +
            ") is outside the vocabulary (model.vocab: " + std::to_string(vocab_) + ")");
      }
}

std::uint32_t TokenStore::at(std::size_t i) const {
  std::int64_t v = 0;
  read(i, 1, &v);
  return static_cast<std::uint32_t>(v);
}

std::pair<std::size_t, std::size_t> TokenStore::shard(int s) const {
  if (s < 0 || s >= shard_count())
    throw std::out_of_range("shard " + std::to_string(s) + " of " + std::to_string(shard_count()));
  return shards_[static_cast<std::size_t>(s)];
}

ShardSampler::ShardSampler(const TokenStore& store, std::vector<int> shards, int context,
                           std::uint64_t seed, std::uint64_t stream)
    : store_(&store), context_(context), seed_(seed), stream_(stream) {
  set_shards(std::move(shards));
}

void ShardSampler::set_shards(std::vector<int> shards) {
  if (shards.empty()) throw std::invalid_argument("ShardSampler: no shards");
  for (int s : shards) {
    const auto [b, e] = store_->shard(s);
    if (e - b < static_cast<std::size_t>(context_) + 2)
      throw std::invalid_argument("data.shards: shard " + std::to_string(s) + " has " +
                                  std::to_string(e - b) +
                                  " tokens, fewer than model.context + 2; use fewer shards");
  }
  shards_ = std::move(shards);
}

void ShardSampler::next(int batch, std::span<std::int64_t> out, int first) {
  const std::size_t w = static_cast<std::size_t>(context_) + 1;
  if (out.size() != static_cast<std::size_t>(batch) * w)
    throw std::invalid_argument("ShardSampler::next: bad out size");
  const std::uint64_t key = splitmix64(seed_ ^ splitmix64(stream_ + 0x5851f42d4c957f2dull));
  for (int b = 0; b < batch; ++b) {
    const std::uint64_t h =
        splitmix64(key ^ splitmix64(position_ * 65536ull + static_cast<std::uint64_t>(first + b)));
    const int s = shards_[static_cast<std::size_t>(h % shards_.size())];
    const auto [begin, end] = store_->shard(s);
    const std::size_t start = begin + static_cast<std::size_t>(splitmix64(h) % (end - begin - w));
    store_->read(start, w, out.data() + static_cast<std::size_t>(b) * w);
  }
  ++position_;
}

void validation_windows(const TokenStore& store, int context, int n, std::span<std::int64_t> out) {
  const std::size_t len = store.validation_size();
  const std::size_t w = static_cast<std::size_t>(context) + 1;
  if (len < w + 1)
    throw std::invalid_argument("data.val_fraction: the validation split has " +
                                std::to_string(len) + " tokens, fewer than model.context + 2");
  for (const auto& [b, e] : store.validation_ranges())
    if (e - b < w)
      throw std::invalid_argument("data.dir: a validation file has " + std::to_string(e - b) +
                                  " tokens, fewer than model.context + 1");
  if (out.size() != static_cast<std::size_t>(n) * w)
    throw std::invalid_argument("validation_windows: bad out size");
  const std::size_t span = len - w;
  const auto& ranges = store.validation_ranges();
  for (int j = 0; j < n; ++j) {
    std::size_t start =
        store.train_end() +
        (n == 1 ? 0 : span * static_cast<std::size_t>(j) / static_cast<std::size_t>(n - 1));
    // The range holding `start`; a window running past its end ends with it instead.
    auto it = std::upper_bound(ranges.begin(), ranges.end(), start,
                               [](std::size_t v, const auto& r) { return v < r.first; });
    const std::size_t end = (it - 1)->second;
    if (start + w > end) start = end - w;
    store.read(start, w, out.data() + static_cast<std::size_t>(j) * w);
  }
}

void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}

std::vector<int> round_robin_shards(int shards, int rank, int count) {
  std::vector<int> out;
  for (int s = rank; s < shards; s += count) out.push_back(s);
  return out;
}

}  // namespace loco::diloco
