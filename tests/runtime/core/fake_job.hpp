#pragma once
// A job run by the test plugin's test.FakeJob (tests/runtime/core/test_actors.hpp) instead of
// DiLoCo's aggregator: `text` is its script ("rounds 5", "rounds 3 bad-report", ...).
#include <string>

#include "client/client.hpp"

namespace loco::testing {

inline JobSpec fake_job(const std::string& text) {
  JobSpec s;
  s.text = text;
  s.name = "fake";
  s.entry_class = "test.FakeJob";
  return s;
}

}  // namespace loco::testing
