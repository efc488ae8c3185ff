// Job-file helpers of the config tests (core_test, hf_format_test). No LibTorch, no gtest
// beyond EXPECT.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "diloco/job/config.hpp"

namespace loco::diloco::testing {

// The ConfigError a job file gives, or "" when it parses and validates.
inline std::string error_of(const std::string& yaml) {
  try {
    JobConfig::from_yaml(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// `s` with its first `from` (which must be there) replaced by `to`.
inline std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace loco::diloco::testing
