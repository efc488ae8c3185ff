#pragma once
// loco's job client: Client(address).submit(JobSpec) -> JobHandle (info, watch, wait, logs, metrics, scale,
// cancel), jobs(); what the `loco` command line does, as a library.
#include "client/client.hpp"
#include "version.hpp"
