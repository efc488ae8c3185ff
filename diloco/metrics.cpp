#include "diloco/metrics.hpp"

#include <iomanip>
#include <sstream>

namespace loco::diloco {

std::string RoundMetrics::to_json() const {
  std::ostringstream s;
  s << std::setprecision(8) << "{\"round\":" << round << ",\"inner_steps\":" << inner_steps
    << ",\"tokens\":" << tokens_per_worker << ",\"tokens_total\":" << tokens_total
    << ",\"train_loss\":" << train_loss << ",\"val_loss\":";
  if (val_loss)
    s << *val_loss;
  else
    s << "null";
  s << ",\"bytes\":" << bytes_per_worker << ",\"time\":" << seconds << ",\"theta_hash\":\""
    << std::hex << theta_hash << "\"}";
  return s.str();
}

}  // namespace loco::diloco
