// The aggregator's calls to its workers, waited for together. Private to actors/.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/runtime.hpp"

namespace loco::actors {

// Why a call to a worker failed, and whether the worker itself is gone.
struct Failure {
  std::string message;
  bool gone = false;  // its actor died or no longer exists; else it answered with an error
};

// Waits for all futures; returns, per index, the value, or sets the failure.
template <class T>
std::vector<std::optional<T>> gather(std::vector<Future<T>>& fs, std::vector<Failure>& errors,
                                     Millis timeout) {
  std::vector<std::optional<T>> out(fs.size());
  errors.assign(fs.size(), Failure{});
  for (size_t i = 0; i < fs.size(); ++i) {
    try {
      out[i] = fs[i].get(timeout);
    } catch (const ActorDiedError& e) {
      errors[i] = {e.what(), true};
    } catch (const ActorNotFoundError& e) {
      errors[i] = {e.what(), true};
    } catch (const std::exception& e) {
      errors[i] = {e.what(), false};
    }
  }
  return out;
}

}  // namespace loco::actors
