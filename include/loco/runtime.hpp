#pragma once
// loco's actor runtime, as a program that embeds it includes it:
//   loco::Runtime::connect(address), spawn<T>(options), get_actor<T>(name), status();
//   loco::ActorClass<T> and LOCO_REGISTER for a plugin's classes; handles with call() (a
//   loco::Future), tell(), and loco::Error and its kinds.
// Installed as <loco/runtime.hpp>; the files it includes sit under loco/runtime/.
#include "runtime/core/runtime.hpp"
#include "version.hpp"
