#include "bench/actor_calls/bench_actors.hpp"

namespace bench {

LOCO_REGISTER(Echo, loco::ActorClass<Echo>("bench.Echo")
                        .method("ping", &Echo::ping)
                        .method("poke", &Echo::poke)
                        .method("pokes", &Echo::pokes)
                        .method("bounce", &Echo::bounce));
LOCO_REGISTER(Pinger, loco::ActorClass<Pinger>("bench.Pinger")
                          .method("latency", &Pinger::latency)
                          .method("throughput", &Pinger::throughput)
                          .method("tells", &Pinger::tells)
                          .method("blobs", &Pinger::blobs));

}  // namespace bench
