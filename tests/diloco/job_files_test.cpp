// The files a job names, opened in a node (diloco/data/bounded_file.hpp): the path was resolved
// under the node's root and held no link then; a link put on it afterwards (the race between
// that check and the open, issue "21 ·") is refused at the open, for reading and for writing,
// and the message names the path and carries no byte of what the link points at. Outside a
// node (loco-train) links are followed as any program follows them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/data.hpp"
#include "diloco/model/safetensors.hpp"

using namespace loco::diloco;
namespace fs = std::filesystem;

namespace {

std::string text_of(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A data root with corpus/a.txt in it, and a secret outside the root. `swap()` does what an
// attacker with write access to the root would do once the path was checked: the folder on the
// way becomes a link to the outside, where a file of the same name is the secret.
class JobFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("loco-job-files-" + std::to_string(::getpid()));
    fs::create_directories(root_ / "corpus");
    fs::create_directories(outside_);
    std::ofstream(root_ / "corpus" / "a.txt") << "the user's own text\n";
    std::ofstream(outside_ / "a.txt") << "SECRET of another user\n";
    path_ = fs::weakly_canonical(root_ / "corpus" / "a.txt").string();  // as resolve_under gives
  }
  void TearDown() override {
    open_job_files_without_links(false);
    fs::remove_all(base_);
  }
  void swap() {
    fs::rename(root_ / "corpus", root_ / "corpus.old");
    fs::create_directory_symlink(outside_, root_ / "corpus");
  }
  fs::path base_;
  fs::path root_ = fs::temp_directory_path() / ("loco-job-files-" + std::to_string(::getpid())) /
                   "root";
  fs::path outside_ =
      fs::temp_directory_path() / ("loco-job-files-" + std::to_string(::getpid())) / "outside";
  std::string path_;
};

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST_F(JobFiles, OutsideANodeLinksAreFollowed) {
  swap();
  EXPECT_EQ(read_bounded(path_, 1 << 20), "SECRET of another user\n");
}

TEST_F(JobFiles, InANodePlainFilesAreReadAndWritten) {
  open_job_files_without_links(true);
  EXPECT_EQ(read_bounded(path_, 1 << 20), "the user's own text\n");
  const std::string out = (root_ / "corpus" / "b.txt").string();
  *open_job_stream(out, std::ios::out) << "one\n";
  *open_job_stream(out, std::ios::out | std::ios::app) << "two\n";
  EXPECT_EQ(text_of(out), "one\ntwo\n");
  std::string line;
  std::getline(*open_job_stream(out, std::ios::in), line);
  EXPECT_EQ(line, "one");
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(JobFiles, InANodeALinkPutOnTheWayAfterTheCheckIsRefusedAtTheOpen) {
  open_job_files_without_links(true);
  swap();
  const std::string e = refusal([&] { (void)read_bounded(path_, 1 << 20, "data.tokenizer"); });
  EXPECT_TRUE(has(e, "data.tokenizer: cannot read (a symbolic link on its way")) << e;
  EXPECT_FALSE(has(e, "SECRET")) << e;
  // The same for a stream, a token file's map and a safetensors file.
  EXPECT_TRUE(has(refusal([&] { (void)open_job_stream(path_, std::ios::in); }),
                  path_ + ": cannot open (a symbolic link on its way"));
  EXPECT_TRUE(has(refusal([&] { (void)TokenStore::open_file(path_, 0.1, 1); }),
                  "cannot open token file " + path_ + ": a symbolic link on its way"));
  EXPECT_TRUE(has(refusal([&] { (void)read_safetensors(path_); }), "a symbolic link on its way"));
  // Written through the link: refused, and nothing lands outside.
  const std::string out = (root_ / "corpus" / "ckpt.pt").string();
  EXPECT_TRUE(has(refusal([&] { (void)open_job_stream(out, std::ios::out); }),
                  "a symbolic link on its way"));
  EXPECT_FALSE(fs::exists(outside_ / "ckpt.pt"));
}

TEST_F(JobFiles, InANodeALinkAsTheFileItselfIsRefusedAndNotWrittenThrough) {
  open_job_files_without_links(true);
  const fs::path planted = root_ / "corpus" / "tokens.bin";
  fs::create_symlink(outside_ / "a.txt", planted);
  EXPECT_TRUE(has(refusal([&] { (void)read_bounded(planted.string(), 1 << 20); }),
                  "a symbolic link on its way"));
  EXPECT_TRUE(has(refusal([&] { (void)open_job_stream(planted.string(), std::ios::out); }),
                  "a symbolic link on its way"));
  EXPECT_EQ(text_of(outside_ / "a.txt"), "SECRET of another user\n");
  // A ".." left in a path means it was never resolved: refused too.
  EXPECT_TRUE(has(refusal([&] {
                    (void)read_bounded((root_ / "corpus" / ".." / "corpus" / "a.txt").string(),
                                       1 << 20);
                  }),
                  "a '..' in it"));
}

}  // namespace
