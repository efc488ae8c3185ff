// data.format: tokens (llm.c / nanoGPT token files) and tokenizer.json, torch-free.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "diloco/data/data.hpp"
#include "diloco/data/tokenizer_json.hpp"
#include "diloco/job/config.hpp"
#include "tests/diloco/test_corpus.hpp"
#include "tests/diloco/tokenizer_test_util.hpp"

using namespace loco::diloco;
using namespace loco::diloco::testing;
namespace fs = std::filesystem;

namespace {

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loco-token-files-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    remove_tree(dir_.string());
    fs::create_directories(dir_);
  }
  void TearDown() override { remove_tree(dir_.string()); }

  // An llm.c file: header (magic, version, count, or `count_override`) then the ids.
  std::string llmc(const std::string& name, const std::vector<std::uint32_t>& ids, bool wide,
                   std::optional<std::int64_t> count_override = {}, std::int32_t version = -1) {
    std::int32_t h[256] = {};
    h[0] = wide ? 20240801 : 20240520;
    h[1] = version >= 0 ? version : (wide ? 7 : 1);
    h[2] =
        static_cast<std::int32_t>(count_override.value_or(static_cast<std::int64_t>(ids.size())));
    std::ofstream out(dir_ / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(h), sizeof h);
    write_ids(out, ids, wide ? 4 : 2);
    return (dir_ / name).string();
  }
  std::string raw(const std::string& name, const std::vector<std::uint32_t>& ids, int width) {
    std::ofstream out(dir_ / name, std::ios::binary);
    write_ids(out, ids, width);
    return (dir_ / name).string();
  }
  static void write_ids(std::ofstream& out, const std::vector<std::uint32_t>& ids, int width) {
    for (auto id : ids) {
      if (width == 2) {
        const auto v = static_cast<std::uint16_t>(id);
        out.write(reinterpret_cast<const char*>(&v), 2);
      } else {
        out.write(reinterpret_cast<const char*>(&id), 4);
      }
    }
  }
  static std::vector<std::uint32_t> iota(std::size_t n, std::uint32_t from, std::uint32_t mod) {
    std::vector<std::uint32_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint32_t>((from + i) % mod);
    return v;
  }
  DataConfig tokens_config(int shards = 4) const {
    DataConfig d;
    d.dir = dir_.string();
    d.format = DataFormat::tokens;
    d.shards = shards;
    d.val_fraction = 0.1;
    return d;
  }
  std::string open_error(const DataConfig& d, int vocab = 0) {
    try {
      TokenStore::open(d, vocab);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  std::vector<std::int64_t> all(const TokenStore& s, std::size_t b, std::size_t n) {
    std::vector<std::int64_t> v(n);
    s.read(b, n, v.data());
    return v;
  }
  fs::path dir_;
};

TEST_F(TokenFiles, HeadersGiveTheWidthAndRawFilesTheDtype) {
  const auto ids16 = iota(5000, 3, 60000);
  const auto ids32 = iota(5000, 70000, 128256);
  {
    llmc("a_train_000000.bin", ids16, false);
    const auto s = TokenStore::open(tokens_config(), 60000);
    ASSERT_EQ(s.size(), ids16.size());
    EXPECT_EQ(s.token_bytes(0), 2);
    for (std::size_t i = 0; i < ids16.size(); i += 97) EXPECT_EQ(s.at(i), ids16[i]);
  }
  remove_tree(dir_.string());
  fs::create_directories(dir_);
  {
    llmc("a_train_000000.bin", ids32, true);
    const auto s = TokenStore::open(tokens_config(), 128256);
    ASSERT_EQ(s.size(), ids32.size());
    EXPECT_EQ(s.token_bytes(0), 4);
    for (std::size_t i = 0; i < ids32.size(); i += 97) EXPECT_EQ(s.at(i), ids32[i]);
  }
  remove_tree(dir_.string());
  fs::create_directories(dir_);
  {
    raw("train.bin", ids32, 4);
    auto d = tokens_config();
    d.dtype = TokenDtype::uint32;
    const auto s = TokenStore::open(d, 128256);
    ASSERT_EQ(s.size(), ids32.size());
    EXPECT_EQ(s.at(4999), ids32[4999]);
    // The same bytes read as uint16 are twice as many ids.
    d.dtype = TokenDtype::uint16;
    EXPECT_EQ(TokenStore::open(d).size(), 2 * ids32.size());
  }
}

TEST_F(TokenFiles, BadHeadersSizesAndFilesAreRefusedNamingTheFile) {
  const auto ids = iota(3000, 0, 1000);
  const auto bad = llmc("a_train.bin", ids, false, 2999);
  auto e = open_error(tokens_config());
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  EXPECT_NE(e.find("header says 2999 tokens"), std::string::npos) << e;
  fs::remove(bad);

  llmc("a_train.bin", ids, false, std::nullopt, 3);
  e = open_error(tokens_config());
  EXPECT_NE(e.find("version 3"), std::string::npos) << e;
  fs::remove(dir_ / "a_train.bin");

  llmc("a_train.bin", ids, false, -2);  // negative count
  e = open_error(tokens_config());
  EXPECT_NE(e.find("negative token count"), std::string::npos) << e;
  fs::remove(dir_ / "a_train.bin");

  // A raw file of an odd number of bytes is not uint16 ids.
  {
    std::ofstream out(dir_ / "odd.bin", std::ios::binary);
    out << "abcde";
  }
  e = open_error(tokens_config());
  EXPECT_NE(e.find("odd.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("not a whole number"), std::string::npos) << e;
  fs::remove(dir_ / "odd.bin");

  { std::ofstream out(dir_ / "empty.bin", std::ios::binary); }
  e = open_error(tokens_config());
  EXPECT_NE(e.find("no tokens"), std::string::npos) << e;
  fs::remove(dir_ / "empty.bin");

  // No training file, only validation.
  llmc("x_val_000000.bin", ids, false);
  e = open_error(tokens_config());
  EXPECT_NE(e.find("no training token files"), std::string::npos) << e;

  // A link could lead outside the data root: refused.
  llmc("../outside.bin", ids, false);
  fs::create_symlink(dir_.parent_path() / "outside.bin", dir_ / "link_train.bin");
  e = open_error(tokens_config());
  EXPECT_NE(e.find("symbolic link"), std::string::npos) << e;
  fs::remove(dir_.parent_path() / "outside.bin");

  // Not a folder.
  auto d = tokens_config();
  d.dir = (dir_ / "missing").string();
  e = open_error(d);
  EXPECT_NE(e.find("not a folder"), std::string::npos) << e;
}

TEST_F(TokenFiles, IdsOutsideTheVocabularyAreRefusedAtTheirOffset) {
  auto ids = iota(4000, 0, 500);
  ids[1234] = 777;
  const auto path = llmc("a_train.bin", ids, false);
  const auto s = TokenStore::open(tokens_config(1), 500);
  EXPECT_EQ(all(s, 0, 1000).size(), 1000u);  // the pages before are fine
  try {
    all(s, 1200, 100);
    FAIL() << "read an id past the vocabulary";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("the id at token 1234"), std::string::npos) << m;
    EXPECT_EQ(m.find("777"), std::string::npos) << m;  // no bytes of the file
    EXPECT_NE(m.find("byte offset " + std::to_string(1024 + 2 * 1234)), std::string::npos) << m;
    EXPECT_NE(m.find("model.vocab: 500"), std::string::npos) << m;
  }
  // The sampler reads through the same check: some window covers token 1234.
  ShardSampler sampler(s, {0}, 64, 1, 1);
  std::vector<std::int64_t> out(32 * 65);
  EXPECT_THROW(
      {
        for (int i = 0; i < 50; ++i) sampler.next(32, out);
      },
      std::runtime_error);
}

TEST_F(TokenFiles, ShardsAreDealtOverFilesAndNeverCrossOne) {
  // Three training files of different sizes, one validation file.
  const std::vector<std::size_t> sizes = {10000, 3000, 6500};
  std::uint32_t next = 0;
  for (std::size_t f = 0; f < sizes.size(); ++f) {
    llmc("d_train_00000" + std::to_string(f) + ".bin", iota(sizes[f], next, 1u << 16), false);
    next += static_cast<std::uint32_t>(sizes[f]);
  }
  llmc("d_val_000000.bin", iota(800, 5, 1u << 16), false);
  const auto s = TokenStore::open(tokens_config(7), 1 << 16);
  ASSERT_EQ(s.file_count(), 4u);
  EXPECT_EQ(s.train_end(), 19500u);  // validation from its own file, not the tail
  EXPECT_EQ(s.validation_size(), 800u);
  EXPECT_EQ(s.validation_ranges().size(), 1u);
  ASSERT_EQ(s.shard_count(), 7);
  // Shards tile the training split in order; a file boundary is always a shard boundary.
  std::set<std::size_t> boundaries = {0, 10000, 13000, 19500};
  std::size_t covered = 0;
  std::vector<std::size_t> per_file(3, 0);
  for (int i = 0; i < 7; ++i) {
    const auto [b, e] = s.shard(i);
    EXPECT_EQ(b, covered);
    covered = e;
    const std::size_t file = b < 10000 ? 0 : b < 13000 ? 1 : 2;
    const std::size_t file_end = file == 0 ? 10000 : file == 1 ? 13000 : 19500;
    EXPECT_LE(e, file_end) << "shard " << i << " crosses a file";
    ++per_file[file];
  }
  EXPECT_EQ(covered, 19500u);
  // In proportion to the files' tokens: 10000 : 3000 : 6500 over 7 shards.
  EXPECT_EQ(per_file, (std::vector<std::size_t>{4, 1, 2}));
  // Fewer shards than files cannot keep shards inside files.
  const auto e = open_error(tokens_config(2), 1 << 16);
  EXPECT_NE(e.find("data.shards: 2 is fewer than the 3 training token files"), std::string::npos)
      << e;
}

TEST_F(TokenFiles, WithoutAValidationFileTheTailOfTheLastFileIsIt) {
  llmc("d_train_000000.bin", iota(5000, 0, 1000), false);
  llmc("d_train_000001.bin", iota(5000, 1, 1000), false);
  const auto s = TokenStore::open(tokens_config(2), 1000);
  EXPECT_EQ(s.validation_size(), 1000u);  // 10 % of 10,000
  EXPECT_EQ(s.train_end(), 9000u);
  EXPECT_EQ(s.shard(1), (std::pair<std::size_t, std::size_t>{5000, 9000}));
  // Too large a tail for the last file: refused rather than crossing files.
  auto d = tokens_config(3);
  d.val_fraction = 0.49;
  raw("zz_train.bin", iota(100, 0, 1000), 2);  // a small last file
  const auto e = open_error(d, 1000);
  EXPECT_NE(e.find("data.val_fraction"), std::string::npos) << e;
}

TEST_F(TokenFiles, SamplerIsDeterministicAndWindowsStayInTheirShardsFile) {
  std::uint32_t next = 0;
  for (int f = 0; f < 3; ++f) {
    llmc("d_train_00000" + std::to_string(f) + ".bin", iota(4000, next, 1u << 16), false);
    next += 4000;
  }
  llmc("d_val_000000.bin", iota(300, 50000, 1u << 16), false);
  llmc("d_val_000001.bin", iota(300, 60000, 1u << 16), false);
  const auto s = TokenStore::open(tokens_config(6), 1 << 16);
  const int ctx = 32, batch = 16;
  ShardSampler a(s, {1, 4}, ctx, 9, 2), b(s, {1, 4}, ctx, 9, 2);
  std::vector<std::int64_t> xa(batch * (ctx + 1)), xb(xa.size());
  for (int i = 0; i < 30; ++i) {
    a.next(batch, xa);
    b.next(batch, xb);
    ASSERT_EQ(xa, xb);
    // The ids are their global index (iota): each window is consecutive, and inside shard 1
    // or 4.
    for (int w = 0; w < batch; ++w) {
      const auto* x = &xa[static_cast<std::size_t>(w * (ctx + 1))];
      for (int j = 1; j <= ctx; ++j) ASSERT_EQ(x[j], x[0] + j);
      bool inside = false;
      for (int sh : {1, 4}) {
        const auto [sb, se] = s.shard(sh);
        inside |=
            static_cast<std::size_t>(x[0]) >= sb && static_cast<std::size_t>(x[0]) + ctx + 1 <= se;
      }
      ASSERT_TRUE(inside) << x[0];
    }
  }
  // Validation windows: from the validation files only, never across their boundary.
  std::vector<std::int64_t> v(8 * (ctx + 1));
  validation_windows(s, ctx, 8, v);
  for (int w = 0; w < 8; ++w) {
    const auto* x = &v[static_cast<std::size_t>(w * (ctx + 1))];
    const bool first = x[0] >= 50000 && x[ctx] < 50300;
    const bool second = x[0] >= 60000 && x[ctx] < 60300;
    EXPECT_TRUE(first || second) << w << ": " << x[0] << ".." << x[ctx];
    for (int j = 1; j <= ctx; ++j) ASSERT_EQ(x[j], x[0] + j);
  }
}

TEST(TokenConfig, FormatDtypeAndTokenizerParseValidateAndRoundTrip) {
  const std::string job = R"(
name: t
model: {layers: 1, width: 16, heads: 2, context: 8, vocab: 1000}
data: {dir: d, format: tokens, dtype: uint32, tokenizer: tok/tokenizer.json, shards: 4}
workers: {count: 1}
rounds: 1
)";
  auto c = JobConfig::from_yaml(job);
  EXPECT_EQ(c.data.format, DataFormat::tokens);
  EXPECT_EQ(c.data.dtype, TokenDtype::uint32);
  EXPECT_EQ(c.data.tokenizer, TokenizerKind::json);
  EXPECT_EQ(c.data.tokenizer_json, "tok/tokenizer.json");
  EXPECT_NO_THROW(c.validate());
  const auto back = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(back.data.format, DataFormat::tokens);
  EXPECT_EQ(back.data.dtype, TokenDtype::uint32);
  EXPECT_EQ(back.data.tokenizer_json, "tok/tokenizer.json");
  EXPECT_EQ(back.to_yaml(), c.to_yaml());

  auto error = [](const std::string& yaml) -> std::string {
    try {
      JobConfig::from_yaml(yaml).validate();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  auto with = [&](const std::string& from, const std::string& to) {
    std::string y = job;
    y.replace(y.find(from), from.size(), to);
    return y;
  };
  EXPECT_NE(error(with("format: tokens", "format: parquet")).find("data.format"),
            std::string::npos);
  EXPECT_NE(error(with("dtype: uint32", "dtype: int8")).find("data.dtype"), std::string::npos);
  EXPECT_NE(error(with("tok/tokenizer.json", "gpt2")).find("data.tokenizer"), std::string::npos);
  EXPECT_NE(error(with(", vocab: 1000", "")).find("model.vocab: required"), std::string::npos);
  EXPECT_NE(error(with("tok/tokenizer.json", "bpe")).find("data.tokenizer: bpe"),
            std::string::npos);
  EXPECT_NE(error(with("vocab: 1000", "vocab: 4000000")).find("model.vocab"), std::string::npos);
  // Text format with a tokenizer.json needs the vocabulary too.
  std::string text_json = with("format: tokens", "format: text");
  text_json.replace(text_json.find(", vocab: 1000"), 13, "");
  EXPECT_NE(error(text_json).find("model.vocab: required with data.tokenizer"), std::string::npos);
}

// ---- tokenizer.json ------------------------------------------------------------------

// scripts/prepare-data trains a byte-level BPE with `tokenizers` on the KJV (or, without the
// bible tool, the tests' corpus); the C++ encoder must give exactly its ids.
class TokenizerJson : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("loco-tokenizer-json-" + std::to_string(::getpid())));
    remove_tree(dir_->string());
    fs::create_directories(*dir_);
    const fs::path corpus = *dir_ / "kjv.txt";
    write_kjv(corpus);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(run(std::string(LOCO_SOURCE_DIR) + "/scripts/prepare-data --input " +
                  corpus.string() + " --out " + (*dir_ / "out").string() +
                  " --train-tokenizer --vocab 1000 --shard-tokens 400000 > " +
                  (*dir_ / "prepare.log").string()),
              0);
  }
  static void TearDownTestSuite() {
    remove_tree(dir_->string());
    delete dir_;
  }
  // `tokenizers`' ids of the file `text`, through the project's venv.
  static std::vector<std::uint32_t> python_ids(const fs::path& text, const fs::path& tokenizer) {
    const fs::path script = *dir_ / "encode.py";
    write_file(script,
               "import sys, numpy as np\n"
               "from tokenizers import Tokenizer\n"
               "t = Tokenizer.from_file(sys.argv[1])\n"
               "s = open(sys.argv[2], encoding='utf-8', newline='').read()\n"
               "np.array(t.encode(s, add_special_tokens=False).ids, dtype=np.uint32)"
               ".tofile(sys.argv[3])\n");
    const fs::path out = *dir_ / "ids.bin";
    fs::remove(out);
    EXPECT_EQ(venv_python(script.string() + " " + tokenizer.string() + " " + text.string() + " " +
                          out.string()),
              0);
    return read_ids(out);
  }
  static fs::path* dir_;
};
fs::path* TokenizerJson::dir_ = nullptr;

const std::string kTestText = test_text("<|endoftext|>");

TEST_F(TokenizerJson, EncoderGivesTheIdsOfTokenizersAndRoundTrips) {
  const fs::path tj = *dir_ / "out" / "tokenizer.json";
  ASSERT_TRUE(fs::exists(tj)) << read_file(*dir_ / "prepare.log");
  const auto tok = load_tokenizer_json(tj.string());
  EXPECT_EQ(tok->vocab_size(), 1000);
  write_file(*dir_ / "test.txt", kTestText);
  const auto want = python_ids(*dir_ / "test.txt", tj);
  ASSERT_FALSE(want.empty());
  const auto got = tok->encode(kTestText);
  EXPECT_EQ(got, want);
  EXPECT_EQ(tok->decode(got), kTestText);
  // The special token is one id, the one `tokenizers` gives it.
  const auto eot = tok->encode("<|endoftext|>");
  ASSERT_EQ(eot.size(), 1u);
  EXPECT_EQ(std::count(got.begin(), got.end(), eot[0]), 3);
}

// GPT-2's split regex reads \s as Oniguruma does (U+0085 is whitespace there, not in PCRE2).
TEST_F(TokenizerJson, UnicodeWhitespaceAndDigitsSplitAsTokenizersDoes) {
  const fs::path tj = *dir_ / "out" / "tokenizer.json";
  write_file(*dir_ / "unicode.txt", unicode_text());
  const auto want = python_ids(*dir_ / "unicode.txt", tj);
  const auto tok = load_tokenizer_json(tj.string());
  EXPECT_EQ(tok->encode(unicode_text()), want);
  EXPECT_EQ(tok->decode(want), unicode_text());
}

// Pieces far longer than words (the split regex must match them whole).
TEST_F(TokenizerJson, LongRunsEncodeAsTokenizersDoes) {
  const fs::path tj = *dir_ / "out" / "tokenizer.json";
  const std::string text = long_runs_text();
  write_file(*dir_ / "long.txt", text);
  const auto want = python_ids(*dir_ / "long.txt", tj);
  const auto tok = load_tokenizer_json(tj.string());
  const auto got = tok->encode(text);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  EXPECT_EQ(tok->decode(got), text);
}

// Few repeats for the word cache: 2 MB of pseudo-random words (and numbers) still encode
// in seconds, with the ids of `tokenizers`.
TEST_F(TokenizerJson, DistinctWordsEncodeAsTokenizersDoesInSeconds) {
  const std::string text = distinct_words_text();
  const fs::path tj = *dir_ / "out" / "tokenizer.json";
  write_file(*dir_ / "distinct.txt", text);
  const auto want = python_ids(*dir_ / "distinct.txt", tj);
  const auto tok = load_tokenizer_json(tj.string());
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = tok->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  std::cout << "encoded " << text.size() << " bytes of distinct words into " << got.size()
            << " ids in " << s << " s\n";
  EXPECT_LT(s, 30.0);
}

TEST_F(TokenizerJson, TheWholeCorpusEncodesAsTokenizersDoesInSeconds) {
  const fs::path tj = *dir_ / "out" / "tokenizer.json";
  const fs::path corpus = *dir_ / "kjv.txt";
  const auto want = python_ids(corpus, tj);
  const auto tok = load_tokenizer_json(tj.string());
  const auto text = read_file(corpus);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = tok->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  EXPECT_EQ(tok->decode(got), text);
  std::cout << "encoded " << text.size() << " bytes into " << got.size() << " ids in " << s
            << " s\n";
  EXPECT_LT(s, 30.0);
}

TEST_F(TokenizerJson, PrepareDataWritesLlmcShardsTheStoreReads) {
  const fs::path out = *dir_ / "out";
  DataConfig d;
  d.dir = out.string();
  d.format = DataFormat::tokens;
  d.shards = 8;
  const auto s = TokenStore::open(d, 1000);
  ASSERT_GE(s.file_count(), 2u);
  EXPECT_GT(s.validation_size(), 0u);
  for (std::size_t f = 0; f < s.file_count(); ++f) EXPECT_EQ(s.token_bytes(f), 2);
  // Every id is in the vocabulary (read() checks each), and the training split starts with
  // the document separator then the corpus' first words, as the C++ encoder gives them.
  std::vector<std::int64_t> ids(s.train_end());
  s.read(0, s.shard(0).second, ids.data());
  const auto tok = load_tokenizer_json((out / "tokenizer.json").string());
  const auto eot = tok->encode("<|endoftext|>");
  EXPECT_EQ(static_cast<std::uint32_t>(ids[0]), eot.at(0));
  std::vector<std::int64_t> val(s.validation_size());
  s.read(s.train_end(), val.size(), val.data());
  EXPECT_EQ(static_cast<std::uint32_t>(val[0]), eot.at(0));
  const auto kjv = read_file(*dir_ / "kjv.txt");
  const auto head = tok->encode(kjv.substr(0, kjv.find('\n') + 1));
  for (std::size_t i = 0; i + 1 < head.size(); ++i)  // the last may merge with what follows
    EXPECT_EQ(static_cast<std::uint32_t>(val[1 + i]), head[i]) << i;
}

// A vocabulary over 65,536: prepare-data's writer makes llm.c's llama-3 files (uint32), which
// the store reads back id for id, and shards of at most --shard-tokens.
TEST_F(TokenizerJson, PrepareDataWritesUint32FilesForLargeVocabularies) {
  const fs::path out = *dir_ / "wide";
  fs::create_directories(out);
  const fs::path script = *dir_ / "wide.py";
  write_file(script,
             "import sys, numpy as np\n"
             "sys.path.insert(0, sys.argv[1])\n"
             "import prepare_data\n"
             "w = prepare_data.ShardWriter(sys.argv[2], 'big', 'train', 3000, True)\n"
             "w.add(np.arange(70000, 80000))\n"
             "w.flush()\n");
  ASSERT_EQ(run("bash -c 'source " + std::string(LOCO_SOURCE_DIR) +
                "/scripts/env.sh && \"$LOCO_VENV/bin/python\" " + script.string() + " " +
                LOCO_SOURCE_DIR + "/scripts " + out.string() + "'"),
            0);
  DataConfig d;
  d.dir = out.string();
  d.format = DataFormat::tokens;
  d.shards = 4;
  const auto s = TokenStore::open(d, 80000);
  ASSERT_EQ(s.file_count(), 4u);  // 3000 + 3000 + 3000 + 1000
  for (std::size_t f = 0; f < 4; ++f) EXPECT_EQ(s.token_bytes(f), 4);
  ASSERT_EQ(s.size(), 10000u);
  for (std::size_t i = 0; i < s.size(); i += 7) ASSERT_EQ(s.at(i), 70000 + i);
}

TEST_F(TokenizerJson, MergesAsStringsReadTheSameAndUnsupportedFieldsAreRefused) {
  const fs::path tj = *dir_ / "out" / "tokenizer.json";
  auto j = nlohmann::json::parse(read_file(tj));
  ASSERT_TRUE(j["model"]["merges"][0].is_array());  // tokenizers 0.23 writes [a, b]
  auto strings = j;
  for (auto& m : strings["model"]["merges"])
    m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const auto a = parse_tokenizer_json(j.dump(), "pairs");
  const auto b = parse_tokenizer_json(strings.dump(), "strings");
  EXPECT_EQ(a->encode(kTestText), b->encode(kTestText));
  // merges.txt's "#version" line, which `tokenizers` skips, takes no rank.
  strings["model"]["merges"].insert(strings["model"]["merges"].begin(), "#version: 0.2");
  EXPECT_EQ(parse_tokenizer_json(strings.dump(), "strings")->encode(kTestText),
            a->encode(kTestText));

  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) -> std::string {
    auto k = j;
    edit(k);
    try {
      parse_tokenizer_json(k.dump(), "tok.json");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(refused([](auto& k) {
                    k["normalizer"] = {{"type", "NFC"}};
                  }),
                  "tok.json: normalizer"));
  EXPECT_TRUE(has(refused([](auto& k) {
                    k["pre_tokenizer"] = {{"type", "Whitespace"}};
                  }),
                  "tok.json: pre_tokenizer"));
  EXPECT_TRUE(has(refused([](auto& k) { k["model"]["dropout"] = 0.1; }), "model.dropout"));
  EXPECT_EQ(refused([](auto& k) { k["model"]["dropout"] = 0.0; }), "");  // none, to `tokenizers`
  EXPECT_TRUE(has(refused([](auto& k) { k["model"]["unk_token"] = 5; }), "model.unk_token"));
  EXPECT_TRUE(has(refused([](auto& k) { k["model"]["type"] = "WordPiece"; }), "model.type"));
  EXPECT_TRUE(has(refused([](auto& k) { k["decoder"] = {{"type", "WordPiece"}}; }), "decoder"));
  EXPECT_TRUE(
      has(refused([](auto& k) { k["model"]["merges"][3] = "nosuch pair"; }), "model.merges[3]"));
  EXPECT_TRUE(has(refused([](auto& k) { k["model"]["vocab"].erase("a"); }), "byte 97"));
  EXPECT_TRUE(has(refused([](auto& k) { k["added_tokens"][0]["lstrip"] = true; }),
                  "added_tokens[0].lstrip"));
  EXPECT_TRUE(has(refused([](auto& k) {
                    k["post_processor"] = {{"type", "BertProcessing"}};
                  }),
                  "post_processor"));
  try {
    parse_tokenizer_json("{not json", "x.json");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(has(e.what(), "x.json: not JSON"));
  }
}

// A corpus file, the corpus folder or the token cache that is a link is refused naming it: it
// could lead out of the node's data root (issue "21 ·": a corpus file linked to a root-only
// file outside the roots was tokenized, and its cache decoded to the file's text).
TEST_F(TokenFiles, LinksInACorpusAreRefusedNamingThem) {
  const fs::path secret = dir_ / "outside.txt";
  std::ofstream(secret) << "a secret outside the data root\n";
  const fs::path d = dir_ / "data";
  fs::create_directories(d / "corpus");
  {
    std::ofstream a(d / "corpus" / "a.txt");
    for (int i = 0; i < 200; ++i) a << "in the beginning was the word\n";
  }
  DataConfig c;
  c.dir = d.string();
  c.shards = 1;
  auto refusal = [&] {
    try {
      (void)TokenStore::open(c, 256);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  fs::create_symlink(secret, d / "corpus" / "b.txt");
  std::string e = refusal();
  EXPECT_NE(e.find("corpus file " + (d / "corpus" / "b.txt").string() + " is a symbolic link"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(d / "tokens-byte.bin")) << "nothing was tokenized";
  fs::remove(d / "corpus" / "b.txt");
  // A cache planted as a link to another file.
  fs::create_symlink(secret, d / "tokens-byte.bin");
  e = refusal();
  EXPECT_NE(e.find("token cache " + (d / "tokens-byte.bin").string() + " is a symbolic link"),
            std::string::npos)
      << e;
  fs::remove(d / "tokens-byte.bin");
  EXPECT_NO_THROW((void)TokenStore::open(c, 256));  // the plain corpus is read
}

TEST_F(TokenizerJson, TextFormatTokenizesTheCorpusWithIt) {
  // data.format text with data.tokenizer a tokenizer.json: the corpus through the C++ encoder.
  const fs::path d = *dir_ / "textfmt";
  fs::create_directories(d / "corpus");
  const auto kjv = read_file(*dir_ / "kjv.txt");
  write_file(d / "corpus" / "a.txt", kjv.substr(0, 200000));
  DataConfig c;
  c.dir = d.string();
  c.tokenizer = TokenizerKind::json;
  c.tokenizer_json = (*dir_ / "out" / "tokenizer.json").string();
  c.shards = 4;
  const auto s = TokenStore::open(c, 1000);
  const auto tok = load_tokenizer_json(c.tokenizer_json);
  const auto want = tok->encode(kjv.substr(0, 200000));
  ASSERT_EQ(s.size(), want.size());
  for (std::size_t i = 0; i < want.size(); i += 101) ASSERT_EQ(s.at(i), want[i]) << i;
  EXPECT_NE(s.path().find("tokens-json-"), std::string::npos);
}

}  // namespace
