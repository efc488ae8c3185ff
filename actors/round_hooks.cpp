#include "actors/round_hooks.hpp"

namespace loco::actors {
namespace {

std::atomic<RoundHooks*> installed{nullptr};

}  // namespace

void install_round_hooks(RoundHooks* hooks) { installed.store(hooks); }

RoundHooks* round_hooks() { return installed.load(std::memory_order_acquire); }

}  // namespace loco::actors
