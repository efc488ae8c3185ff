#pragma once
// A DiLoCo job's configuration: loco::diloco::JobConfig, read from a job file and checked
// field by field (a refused field is named in the ConfigError), as `loco submit` checks it.
#include "diloco/job/config.hpp"
#include "version.hpp"
