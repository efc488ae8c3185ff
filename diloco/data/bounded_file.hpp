// Reading a file that came from outside (a job's folder, a user's module): its size bounded
// before anything is allocated. Torch-free and dependency-free, so that the fuzz targets of
// the parsers that read such files link it alone.
//
// And opening the files a job names. In a node every such path was resolved under one of the
// node's roots first (runtime/core/paths.hpp: absolute, ".." folded, the links of its existing
// part followed), so the path the readers get has no link in it; a link met when the file is
// opened was put there after that check, and could lead out of the root. A node's actors turn
// `open_job_files_without_links` on, and from then on every reader here opens its file one
// component at a time, each with O_NOFOLLOW, refusing a link anywhere on the way (issue
// "21 ·"). `loco-train` and `loco submit`, a user's own processes on the user's own paths,
// follow links as any program does.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

namespace loco::diloco {

// The bytes of the file at `path`, its size checked against `max_bytes` before they are
// allocated. Throws std::runtime_error, "WHAT: ..." (`what`: the path unless given): cannot be
// read, or more than max_bytes.
std::string read_bounded(const std::string& path, std::uintmax_t max_bytes,
                         const std::string& what = "");

// For the whole process: whether job files are opened without following links (see above).
void open_job_files_without_links(bool on);
bool job_files_without_links();

// ::open(path, flags | O_CLOEXEC, mode), or, with links refused, the same file reached one
// component at a time from "/" (or the working directory) with O_NOFOLLOW: -1 and errno ELOOP
// when any component is a symbolic link, EXDEV for a "..". -1 and errno as ::open otherwise.
int open_job_file(const std::string& path, int flags, mode_t mode = 0600);

// Why open_job_file failed, for a message: "a symbolic link on its way (…)" for ELOOP, else
// strerror. Call right after the failure (it reads errno).
std::string job_file_error();

// A stream on a job file: read (std::ios::in) or written (std::ios::out: created 0600 or
// truncated; with std::ios::app, appended). Throws std::runtime_error "WHAT: cannot open
// (WHY)" (`what`: the path unless given).
std::unique_ptr<std::iostream> open_job_stream(const std::string& path, std::ios::openmode mode,
                                               const std::string& what = "");

}  // namespace loco::diloco
