// The JSON that comes from outside (diloco/data/bounded_json.hpp) through each of its readers: a
// model folder's config.json, a safetensors header, a tokenizer.json. A file nested too deep or
// too costly to hold is refused with a message that says which limit it passed, before anything
// recurses over it or the memory grows past the bound (issue "21 ·", finding 1: a 1 MB
// config.json nested 500,000 deep crashed every node that read it).
#include "diloco/data/bounded_json.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "diloco/data/tokenizer_json.hpp"
#include "diloco/model/hf_config.hpp"
#include "diloco/model/safetensors.hpp"

using namespace loco::diloco;

namespace {

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

class BoundedJson : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("loco-bounded-json-" + std::to_string(::getpid())))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

long max_rss_kib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

TEST_F(BoundedJson, NestingPastTheLimitIsRefusedByEveryReader) {
  // The file: one field nested 500,000 deep, under config.json's size bound.
  const std::string deep = "{\"model_type\": \"gpt2\", \"x\": " + nested(500000) + "}";
  const std::string config = write("config.json", deep);
  std::string e = error_of([&] { hf::read_json_object(config, 1 << 21); });
  EXPECT_TRUE(contains(e, config + ": nested more than 64 deep")) << e;

  e = error_of([&] { parse_tokenizer_json(deep, "tokenizer.json"); });
  EXPECT_TRUE(contains(e, "tokenizer.json: nested more than 64 deep")) << e;

  // A safetensors file whose header is the same.
  std::string st(8, '\0');
  const std::uint64_t n = deep.size();
  for (int i = 0; i < 8; ++i) st[size_t(i)] = char((n >> (8 * i)) & 0xff);
  const std::string file = write("model.safetensors", st + deep);
  e = error_of([&] { read_safetensors(file); });
  EXPECT_TRUE(contains(e, "header: nested more than 64 deep")) << e;

  // 64 deep is read.
  EXPECT_NO_THROW(parse_bounded_json(nested(64), "x"));
  EXPECT_THROW(parse_bounded_json(nested(65), "x"), std::runtime_error);
}

// The costliest JSON per byte, empty arrays (about 37 bytes of memory a byte unbounded): refused
// once the estimate passes 16 bytes a byte and 16 MiB, the process's memory grown by less than
// twice that.
TEST_F(BoundedJson, ADocumentCostlierThanTheBoundIsRefusedBeforeItsMemoryGrowsPastIt) {
  const std::size_t n = std::size_t(8) << 20;
  std::string spam = "[";
  spam.reserve(n + 8);
  while (spam.size() < n) spam += "[],";
  spam += "[]]";
  const long before = max_rss_kib();
  const std::string e = error_of([&] { parse_tokenizer_json(spam, "tokenizer.json"); });
  const double grown = double(max_rss_kib() - before) * 1024;
  EXPECT_TRUE(contains(e, "tokenizer.json: would take more than")) << e;
  EXPECT_LT(grown, 2 * (16.0 * double(spam.size()) + double(16 << 20)))
      << "grew " << grown / (1 << 20) << " MiB for " << spam.size() / (1 << 20) << " MiB";
  // Numbers cost less (16 bytes for 2): the same size of them is read.
  std::string numbers = "[";
  while (numbers.size() < n) numbers += "1,";
  numbers += "1]";
  EXPECT_NO_THROW(parse_bounded_json(numbers, "numbers"));
}

TEST_F(BoundedJson, ASyntaxErrorSaysWhereNotWhatTheBytesWere) {
  const std::string e = error_of([] { parse_bounded_json("{\"a\": secret-bytes}", "f.json"); });
  EXPECT_TRUE(contains(e, "f.json: not JSON (a syntax error at byte")) << e;
  EXPECT_FALSE(contains(e, "secret")) << e;
}
