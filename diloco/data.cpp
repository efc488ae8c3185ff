#include "diloco/data.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace loco::diloco {

namespace fs = std::filesystem;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

std::vector<fs::path> corpus_files(const std::string& dir) {
  std::vector<fs::path> files;
  const fs::path c = fs::path(dir) / "corpus";
  if (fs::is_directory(c))
    for (const auto& e : fs::directory_iterator(c))
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw std::runtime_error("data.dir: no corpus in " + c.string() +
                             "/*.txt; run scripts/fetch-corpus " + dir);
  return files;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ByteTokenizer final : public Tokenizer {
 public:
  int vocab_size() const override { return 256; }
  std::vector<std::uint16_t> encode(const std::string& text) const override {
    std::vector<std::uint16_t> out(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(std::span<const std::uint16_t> tokens) const override {
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
  std::vector<std::uint16_t> encode(const std::string& text) const override {
    std::vector<std::uint16_t> out;
    std::istringstream in(text);
    std::string line;
    std::vector<int> ids;
    bool first = true;
    while (std::getline(in, line)) {
      if (!first) out.push_back(static_cast<std::uint16_t>(nl_));
      first = false;
      sp_.Encode(line, &ids).IgnoreError();
      for (int id : ids) out.push_back(static_cast<std::uint16_t>(id));
    }
    if (!text.empty() && text.back() == '\n') out.push_back(static_cast<std::uint16_t>(nl_));
    return out;
  }
  std::string decode(std::span<const std::uint16_t> tokens) const override {
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
        run.push_back(t);
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
  const auto model = bpe_model_path(d);
  if (!fs::exists(model)) train_bpe(d);
  return std::make_unique<BpeTokenizer>(model);
}

void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + tmp);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size_bytes()));
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  fs::rename(tmp, path);
}

TokenStore TokenStore::open(const DataConfig& d) {
  const std::string name = d.tokenizer == TokenizerKind::byte
                               ? "tokens-byte.bin"
                               : "tokens-bpe-" + std::to_string(d.bpe_vocab) + ".bin";
  const std::string path = (fs::path(d.dir) / name).string();
  if (!fs::exists(path)) {
    const auto tok = make_tokenizer(d);
    std::vector<std::uint16_t> all;
    for (const auto& f : corpus_files(d.dir)) {
      auto t = tok->encode(read_all(f));
      all.insert(all.end(), t.begin(), t.end());
    }
    write_token_file(path, all);
  }
  return open_file(path, d.val_fraction, d.shards);
}

TokenStore TokenStore::open_file(const std::string& path, double val_fraction, int shards) {
  TokenStore s;
  s.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open token file " + path);
  struct stat st {};
  ::fstat(fd, &st);
  s.map_len_ = static_cast<std::size_t>(st.st_size);
  s.size_ = s.map_len_ / sizeof(std::uint16_t);
  if (s.size_ == 0) {
    ::close(fd);
    throw std::runtime_error("token file " + path + " is empty");
  }
  void* p = ::mmap(nullptr, s.map_len_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("cannot map token file " + path);
  s.data_ = static_cast<const std::uint16_t*>(p);
  s.train_end_ = s.size_ - static_cast<std::size_t>(static_cast<double>(s.size_) * val_fraction);
  s.shards_ = shards;
  return s;
}

TokenStore::TokenStore(TokenStore&& o) noexcept { *this = std::move(o); }

TokenStore& TokenStore::operator=(TokenStore&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::uint16_t*>(data_), map_len_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = o.size_;
    train_end_ = o.train_end_;
    shards_ = o.shards_;
    map_len_ = o.map_len_;
  }
  return *this;
}

TokenStore::~TokenStore() {
  if (data_) ::munmap(const_cast<std::uint16_t*>(data_), map_len_);
}

std::pair<std::size_t, std::size_t> TokenStore::shard(int s) const {
  if (s < 0 || s >= shards_)
    throw std::out_of_range("shard " + std::to_string(s) + " of " + std::to_string(shards_));
  const std::size_t per = train_end_ / static_cast<std::size_t>(shards_);
  const std::size_t begin = per * static_cast<std::size_t>(s);
  const std::size_t end = s + 1 == shards_ ? train_end_ : begin + per;
  return {begin, end};
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
  const auto tokens = store_->tokens();
  const std::uint64_t key = splitmix64(seed_ ^ splitmix64(stream_ + 0x5851f42d4c957f2dull));
  for (int b = 0; b < batch; ++b) {
    const std::uint64_t h =
        splitmix64(key ^ splitmix64(position_ * 65536ull + static_cast<std::uint64_t>(first + b)));
    const int s = shards_[static_cast<std::size_t>(h % shards_.size())];
    const auto [begin, end] = store_->shard(s);
    const std::size_t start = begin + static_cast<std::size_t>(splitmix64(h) % (end - begin - w));
    for (std::size_t j = 0; j < w; ++j)
      out[static_cast<std::size_t>(b) * w + j] = tokens[start + j];
  }
  ++position_;
}

void validation_windows(const TokenStore& store, int context, int n, std::span<std::int64_t> out) {
  const auto val = store.validation();
  const std::size_t w = static_cast<std::size_t>(context) + 1;
  if (val.size() < w + 1)
    throw std::invalid_argument("data.val_fraction: the validation split has " +
                                std::to_string(val.size()) +
                                " tokens, fewer than model.context + 2");
  if (out.size() != static_cast<std::size_t>(n) * w)
    throw std::invalid_argument("validation_windows: bad out size");
  const std::size_t span = val.size() - w;
  for (int j = 0; j < n; ++j) {
    const std::size_t start =
        n == 1 ? 0 : span * static_cast<std::size_t>(j) / static_cast<std::size_t>(n - 1);
    for (std::size_t i = 0; i < w; ++i) out[static_cast<std::size_t>(j) * w + i] = val[start + i];
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
