#pragma once
// Errors that cross the wire. Each has a stable type name; a reply that carries
// an error is rethrown on the caller's side as the same C++ type.
#include <stdexcept>
#include <string>

namespace loco {

class Error : public std::runtime_error {
 public:
  Error(std::string type, const std::string& message)
      : std::runtime_error(message), type_(std::move(type)) {}
  const std::string& type() const { return type_; }

 private:
  std::string type_;
};

#define LOCO_DEFINE_ERROR(Name)                                          \
  class Name : public Error {                                            \
   public:                                                               \
    explicit Name(const std::string& message) : Error(#Name, message) {} \
  };

// The actor's process or node is gone (or unreachable past the detection time),
// or the actor was killed and has no restarts left.
LOCO_DEFINE_ERROR(ActorDiedError)
// No actor with that id or name exists where the call was sent.
LOCO_DEFINE_ERROR(ActorNotFoundError)
// The actor's class has no method of that name.
LOCO_DEFINE_ERROR(MethodNotFoundError)
// The user's method threw; the message carries its what().
LOCO_DEFINE_ERROR(RemoteError)
// A call was not answered in the time the caller allowed.
LOCO_DEFINE_ERROR(TimeoutError)
// A malformed, truncated, oversized or wrong-version message.
LOCO_DEFINE_ERROR(ProtocolError)
// No node can host an actor: the message says which resource is short.
LOCO_DEFINE_ERROR(SchedulingError)
// The head or the membership store cannot be reached, or refused a request.
LOCO_DEFINE_ERROR(ClusterError)
// The caller's key does not let it do this: a client calling an internal method, or acting
// for a job it is not part of.
LOCO_DEFINE_ERROR(PermissionError)

#undef LOCO_DEFINE_ERROR

// Rethrows an error received from the wire as its C++ type.
[[noreturn]] void throw_error(const std::string& type, const std::string& message);

}  // namespace loco
