// A test suite over the small corpus (test_corpus.hpp): its folder is made once before the
// suite's first test and removed after its last, and torch runs on one thread. A suite derives
// from CorpusSuite<Itself> and names its folder's tag:
//
//   class ArchTest : public loco::diloco::testing::CorpusSuite<ArchTest> {
//    public:
//     static constexpr const char* kCorpus = "arch";
//   };
//
// and its tests read the folder as *dir_. A suite with more to set up defines its own
// SetUpTestSuite, calling CorpusSuite's first.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "tests/diloco/test_corpus.hpp"

namespace loco::diloco::testing {

template <typename Suite>
class CorpusSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    dir_ = new std::string(make_corpus_dir(Suite::kCorpus));
  }
  static void TearDownTestSuite() {
    remove_tree(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string* dir_;
};

template <typename Suite>
std::string* CorpusSuite<Suite>::dir_ = nullptr;

}  // namespace loco::diloco::testing
