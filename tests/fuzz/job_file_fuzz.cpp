// The job file parser: any text either parses into a JobConfig that validates, or is refused
// with a ConfigError; and a parsed config's YAML parses to the same config.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "diloco/job/config.hpp"

using loco::diloco::ConfigError;
using loco::diloco::JobConfig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const JobConfig c = JobConfig::from_yaml(text);
    (void)c.total_rounds();
    const std::string again = c.to_yaml();
    if (JobConfig::from_yaml(again).to_yaml() != again) std::abort();
  } catch (const ConfigError&) {
  }
  return 0;
}
