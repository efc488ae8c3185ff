#include "runtime/core/errors.hpp"

namespace loco {

void throw_error(const std::string& type, const std::string& message) {
  if (type == "ActorDiedError") throw ActorDiedError(message);
  if (type == "ActorNotFoundError") throw ActorNotFoundError(message);
  if (type == "MethodNotFoundError") throw MethodNotFoundError(message);
  if (type == "TimeoutError") throw TimeoutError(message);
  if (type == "ProtocolError") throw ProtocolError(message);
  if (type == "SchedulingError") throw SchedulingError(message);
  if (type == "ClusterError") throw ClusterError(message);
  if (type == "RemoteError") throw RemoteError(message);
  if (type == "PermissionError") throw PermissionError(message);
  throw RemoteError(type + ": " + message);
}

}  // namespace loco
