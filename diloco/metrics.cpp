#include "diloco/metrics.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

#include "diloco/job_schema.hpp"

namespace loco::diloco {

std::string RoundMetrics::to_json() const {
  std::ostringstream hash;
  hash << std::hex << theta_hash;
  // nlohmann::ordered_json keeps the fields in the order people read them.
  namespace key = schema::metrics_line;
  nlohmann::ordered_json j = {{key::kRound, round},          {key::kInnerSteps, inner_steps},
                              {"tokens", tokens_per_worker}, {key::kTokensTotal, tokens_total},
                              {key::kTrainLoss, train_loss}, {key::kValLoss, nullptr},
                              {"bytes", bytes_per_worker},   {"time", seconds},
                              {"theta_hash", hash.str()}};
  if (val_loss) j[key::kValLoss] = *val_loss;
  return j.dump();
}

}  // namespace loco::diloco
