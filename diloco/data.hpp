// Corpus, tokenizer, token file and shards. No LibTorch here.
//
// Layout of a data folder (made by scripts/fetch-corpus, then by prepare()):
//   DIR/corpus/*.txt            the text, concatenated in name order
//   DIR/bpe-V.model             sentencepiece BPE model (tokenizer: bpe, vocabulary V)
//   DIR/tokens-byte.bin         uint16 tokens, written once, memory-mapped
//   DIR/tokens-bpe-V.bin
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "diloco/config.hpp"

namespace loco::diloco {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int vocab_size() const = 0;
  virtual std::vector<std::uint16_t> encode(const std::string& text) const = 0;
  virtual std::string decode(std::span<const std::uint16_t> tokens) const = 0;
};

// Byte-level: token = byte, vocabulary 256.
std::unique_ptr<Tokenizer> make_byte_tokenizer();
// Loads DIR/bpe-V.model, training it on DIR/corpus first when it is missing.
std::unique_ptr<Tokenizer> make_tokenizer(const DataConfig& data);

// The tokens of the corpus, memory-mapped read-only, with the split:
// tokens [0, train_end) are the training split, [train_end, size) validation.
// The training split is cut into `shards` contiguous, equal shards (the last
// takes the remainder); any worker can be handed any shard.
class TokenStore {
 public:
  // Tokenizes DIR/corpus/*.txt into the token file when it is missing (the
  // file is written to a temporary name and renamed: concurrent preparers are
  // safe), then maps it. Throws naming the folder when there is no corpus.
  static TokenStore open(const DataConfig& data);
  // Maps an existing token file (used by tests).
  static TokenStore open_file(const std::string& path, double val_fraction, int shards);

  TokenStore(TokenStore&&) noexcept;
  TokenStore& operator=(TokenStore&&) noexcept;
  ~TokenStore();

  std::span<const std::uint16_t> tokens() const { return {data_, size_}; }
  std::size_t train_end() const { return train_end_; }
  int shard_count() const { return shards_; }
  // [begin, end) of shard s inside the training split.
  std::pair<std::size_t, std::size_t> shard(int s) const;
  std::span<const std::uint16_t> validation() const { return tokens().subspan(train_end_); }
  const std::string& path() const { return path_; }

 private:
  TokenStore() = default;
  std::string path_;
  const std::uint16_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t train_end_ = 0;
  int shards_ = 1;
  std::size_t map_len_ = 0;
};

// Writes tokens to path atomically (temporary file, then rename).
void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens);

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

// Evenly spaced validation windows: window j of n starts at j * (len - context - 1) / (n - 1).
void validation_windows(const TokenStore& store, int context, int n, std::span<std::int64_t> out);

// Shards of worker `rank` among `count`: {s : s % count == rank}.
std::vector<int> round_robin_shards(int shards, int rank, int count);

std::uint64_t splitmix64(std::uint64_t x);

// rm -rf. Not std::filesystem::remove_all: libtorch.so exports its own copy of
// that symbol, which crashes when a program linking LibTorch binds to it.
void remove_tree(const std::string& path);

}  // namespace loco::diloco
