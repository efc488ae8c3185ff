#include "greeter.hpp"

#include <unistd.h>

#include <loco/runtime.hpp>

namespace embed {

std::string Greeter::hello(std::string who) {
  ++calls_;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return "hello " + who + " from " + host + " pid " + std::to_string(getpid());
}

LOCO_REGISTER(Greeter, loco::ActorClass<Greeter>("embed.Greeter")
                           .method("hello", &Greeter::hello)
                           .method("calls", &Greeter::calls));

}  // namespace embed
