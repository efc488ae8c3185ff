// Corpus, tokenizer, token files and shards. No LibTorch here.
//
// Layout of a data folder with data.format: text (made by scripts/fetch-corpus; the token
// file is written on first use):
//   DIR/corpus/*.txt            the text, concatenated in name order
//   DIR/bpe-V.model             sentencepiece BPE model (tokenizer: bpe, vocabulary V)
//   DIR/tokens-byte.bin         uint16 tokens, written once, memory-mapped
//   DIR/tokens-bpe-V.bin
//   DIR/tokens-json-H.bin       with a tokenizer.json (H: hash of its bytes; -u32 when the
//                               vocabulary passes 65,536)
// With data.format: tokens (scripts/prepare-data, nanoGPT, llm.c):
//   DIR/*.bin                   token files, in name order; those whose name contains
//                               "val" are the validation split, the others training.
//                               llm.c header (256 int32: magic 20240520 version 1 -> uint16
//                               ids, magic 20240801 version 7 -> uint32) or none (raw ids of
//                               data.dtype).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "diloco/job/config.hpp"

namespace loco::diloco {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int vocab_size() const = 0;
  virtual std::vector<std::uint32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(std::span<const std::uint32_t> tokens) const = 0;
};

// Byte-level: token = byte, vocabulary 256.
std::unique_ptr<Tokenizer> make_byte_tokenizer();
// byte: the byte tokenizer; bpe: loads DIR/bpe-V.model, training it on DIR/corpus first when
// it is missing; json: the tokenizer.json at data.tokenizer_json (tokenizer_json.hpp).
std::unique_ptr<Tokenizer> make_tokenizer(const DataConfig& data);

// Limits on token files, which are treated as hostile input.
inline constexpr std::size_t kMaxTokenFiles = 1 << 16;
inline constexpr std::uint64_t kMaxTokenFileBytes = std::uint64_t(1) << 42;  // 4 TiB
inline constexpr std::size_t kReleaseBytes = std::size_t(32) << 20;

// The tokens of the data, memory-mapped read-only (never read whole), in one index space:
// the training files in name order, then the validation files. Tokens [0, train_end) are
// the training split, [train_end, size) validation. Without validation files the split is
// the last val_fraction of the tokens, all in the last training file.
// The training split is cut into `shards` contiguous shards, each inside one file: a file
// gets a number of shards in proportion to its tokens (at least one), and its shards are
// equal (its last takes the remainder). With one file that is the old cut: train_end /
// shards each. Any worker can be handed any shard, and reads only the pages of its shards.
class TokenStore {
 public:
  // format text: tokenizes DIR/corpus/*.txt into the token file when it is missing (the
  // file is written to a temporary name and renamed: concurrent preparers are safe), then
  // maps it. Throws naming the folder when there is no corpus. format tokens: maps
  // DIR/*.bin, checking each header against the file's size. `vocab` > 0: every id read
  // is checked against it (read() throws naming the file and offset of the first one out of
  // range), so a hostile file never indexes past the embedding.
  static TokenStore open(const DataConfig& data, int vocab = 0);
  // Maps one raw uint16 token file (tests, benches).
  static TokenStore open_file(const std::string& path, double val_fraction, int shards);
  // Maps token files (format tokens); `validation` may be empty. `dtype`: the width of the
  // files without an llm.c header.
  static TokenStore open_files(const std::vector<std::string>& training,
                               const std::vector<std::string>& validation, TokenDtype dtype,
                               double val_fraction, int shards, int vocab,
                               bool detect_header = true);

  TokenStore(TokenStore&&) noexcept;
  TokenStore& operator=(TokenStore&&) noexcept;
  ~TokenStore();

  std::size_t size() const { return size_; }
  std::size_t train_end() const { return train_end_; }
  int shard_count() const { return static_cast<int>(shards_.size()); }
  // [begin, end) of shard s inside the training split; never crosses a file.
  std::pair<std::size_t, std::size_t> shard(int s) const;
  // Copies tokens [begin, begin + n) to out; the range must lie in one file (a shard's
  // window does). Throws on an id >= vocab, naming the file and the token's byte offset.
  // Thread-safe. Every kReleaseBytes read, the mappings' pages are dropped from the process
  // (MADV_DONTNEED: the page cache keeps them), so its resident set stays flat however long
  // it trains on however much data.
  void read(std::size_t begin, std::size_t n, std::int64_t* out) const;
  std::uint32_t at(std::size_t i) const;
  // [begin, end) of each validation file (or of the validation tail), in order.
  const std::vector<std::pair<std::size_t, std::size_t>>& validation_ranges() const {
    return val_ranges_;
  }
  std::size_t validation_size() const { return size_ - train_end_; }
  // The first file's path (the only one with format text).
  const std::string& path() const;
  std::size_t file_count() const { return files_.size(); }
  // Bytes per id of file f (2 or 4), and its path.
  int token_bytes(std::size_t f) const { return files_.at(f).width; }
  const std::string& file_path(std::size_t f) const { return files_.at(f).path; }

 private:
  struct File {
    std::string path;
    const unsigned char* map = nullptr;  // the whole file
    std::size_t map_len = 0;
    std::size_t header = 0;  // bytes before the first id
    int width = 2;
    std::size_t first = 0;  // index of its first token
    std::size_t count = 0;
  };
  TokenStore() = default;
  void unmap();
  static File map_file(const std::string& path, TokenDtype dtype, bool detect_header);
  const File& file_of(std::size_t i) const;
  void cut_shards_of(std::size_t training_files, int shards);

  std::vector<File> files_;
  std::size_t size_ = 0;
  std::size_t train_end_ = 0;
  std::uint32_t vocab_ = 0;  // 0: unchecked
  std::vector<std::pair<std::size_t, std::size_t>> shards_;
  std::vector<std::pair<std::size_t, std::size_t>> val_ranges_;
  mutable std::atomic<std::size_t> read_since_release_{0};
};

// Writes tokens to path atomically (temporary file, then rename), raw, 2 bytes each.
void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens);
// The same with `width` (2 or 4) bytes per id.
void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, int width);

// Deterministic batches from a set of shards. Batch i depends only on (seed,
// stream, shards, i): the sampler's whole state is the counter `position()`,
// so a checkpoint stores one integer and a worker that is handed other shards
// keeps going from the same counter.
class ShardSampler {
 public:
  ShardSampler(const TokenStore& store, std::vector<int> shards, int context, std::uint64_t seed,
               std::uint64_t stream);
  // Fills `out` (batch * (context + 1) tokens, as int64) with `batch` windows of
  // context + 1 tokens: inputs are [0, context), targets [1, context + 1). Window b of
  // a position is a function of (position, b): with `first`, the windows are
  // first .. first + batch − 1 of the position, so G local ranks taking batch B from
  // first = rank · B read together the G · B windows of one rank's next(G · B).
  void next(int batch, std::span<std::int64_t> out, int first = 0);
  std::uint64_t position() const { return position_; }
  void set_position(std::uint64_t p) { position_ = p; }
  void set_shards(std::vector<int> shards);
  const std::vector<int>& shards() const { return shards_; }

 private:
  const TokenStore* store_;
  std::vector<int> shards_;
  int context_;
  std::uint64_t seed_;
  std::uint64_t stream_;
  std::uint64_t position_ = 0;
};

// Evenly spaced validation windows: window j of n starts at j * (len - context - 1) / (n - 1)
// of the validation split; a window that would cross from one validation file into the next
// is moved back to end with its file.
void validation_windows(const TokenStore& store, int context, int n, std::span<std::int64_t> out);

// Shards of worker `rank` among `count`: {s : s % count == rank}.
std::vector<int> round_robin_shards(int shards, int rank, int count);

std::uint64_t splitmix64(std::uint64_t x);

// A 64-bit hash as the file names and job fields that carry one write it: 16 hex digits.
std::string hex64(std::uint64_t h);

// rm -rf. Not std::filesystem::remove_all: libtorch.so exports its own copy of
// that symbol, which crashes when a program linking LibTorch binds to it.
void remove_tree(const std::string& path);

}  // namespace loco::diloco
