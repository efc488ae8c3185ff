// Statistics the benchmarks report.
#pragma once

#include <algorithm>
#include <vector>

namespace loco::bench {

// The median of `v` (the mean of the two middle values for an even count); v is not empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace loco::bench
