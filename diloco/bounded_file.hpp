// Reading a file that came from outside (a job's folder, a user's module): its size bounded
// before anything is allocated. Torch-free and dependency-free, so that the fuzz targets of
// the parsers that read such files link it alone.
#pragma once

#include <cstdint>
#include <string>

namespace loco::diloco {

// The bytes of the file at `path`, its size checked against `max_bytes` before they are
// allocated. Throws std::runtime_error, "WHAT: ..." (`what`: the path unless given): cannot be
// read, or more than max_bytes.
std::string read_bounded(const std::string& path, std::uintmax_t max_bytes,
                         const std::string& what = "");

}  // namespace loco::diloco
