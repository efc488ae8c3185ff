// A checkpoint's archive on disk, read and written through open_job_stream
// (bounded_file.hpp): in a node, no link on the path is followed.
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <string>

namespace loco::diloco {

// The archive at `path`, its tensors on the CPU. Throws std::runtime_error naming the path.
void read_archive(torch::serialize::InputArchive& ar, const std::string& path);

// `ar` to `path` atomically: written to PATH.tmp (its folder made when missing), then renamed
// over it, so that a reader sees the old file or the new one.
void write_archive(torch::serialize::OutputArchive& ar, const std::string& path);

}  // namespace loco::diloco
