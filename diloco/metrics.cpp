#include "diloco/metrics.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

namespace loco::diloco {

std::string RoundMetrics::to_json() const {
  std::ostringstream hash;
  hash << std::hex << theta_hash;
  // nlohmann::ordered_json keeps the fields in the order people read them.
  nlohmann::ordered_json j = {{"round", round},
                              {"inner_steps", inner_steps},
                              {"tokens", tokens_per_worker},
                              {"tokens_total", tokens_total},
                              {"train_loss", train_loss},
                              {"val_loss", nullptr},
                              {"bytes", bytes_per_worker},
                              {"time", seconds},
                              {"theta_hash", hash.str()}};
  if (val_loss) j["val_loss"] = *val_loss;
  return j.dump();
}

}  // namespace loco::diloco
