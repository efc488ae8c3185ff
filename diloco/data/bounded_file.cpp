#include "diloco/data/bounded_file.hpp"

#include <ext/stdio_filebuf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <istream>
#include <stdexcept>

namespace loco::diloco {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_without_links{false};

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// `path` reached one component at a time, each opened relative to the one before with
// O_NOFOLLOW: a symbolic link anywhere fails with ELOOP. "." is skipped; ".." fails with EXDEV
// (a path resolved under a root has none, so one here was not resolved).
int open_without_links(const std::string& path, int flags, mode_t mode) {
  const fs::path p(path);
  Fd dir(::open(p.is_absolute() ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd < 0) return -1;
  std::string last;
  const fs::path rel = p.relative_path();
  for (const fs::path& component : rel) {
    const std::string part = component.string();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      errno = EXDEV;
      return -1;
    }
    if (!last.empty()) {
      // O_PATH with O_NOFOLLOW opens a link itself, so what was opened is checked.
      Fd next(::openat(dir.fd, last.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (next.fd < 0) return -1;
      struct stat st {};
      if (::fstat(next.fd, &st) != 0) return -1;
      if (!S_ISDIR(st.st_mode)) {
        errno = S_ISLNK(st.st_mode) ? ELOOP : ENOTDIR;
        return -1;
      }
      std::swap(dir.fd, next.fd);
    }
    last = part;
  }
  if (last.empty()) {
    errno = EISDIR;
    return -1;
  }
  return ::openat(dir.fd, last.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

struct FdStream : std::iostream {
  __gnu_cxx::stdio_filebuf<char> buf;
  FdStream(int fd, std::ios::openmode mode) : std::iostream(nullptr), buf(fd, mode) {
    rdbuf(&buf);
  }
};

}  // namespace

void open_job_files_without_links(bool on) { g_without_links.store(on); }

bool job_files_without_links() { return g_without_links.load(); }

int open_job_file(const std::string& path, int flags, mode_t mode) {
  if (path.find('\0') != std::string::npos) {
    errno = EINVAL;
    return -1;
  }
  if (!job_files_without_links()) return ::open(path.c_str(), flags | O_CLOEXEC, mode);
  return open_without_links(path, flags, mode);
}

std::string job_file_error() {
  const int e = errno;
  if (e == ELOOP)
    return "a symbolic link on its way: a node opens the files a job names without following "
           "links (docs/security.md, \"Users' files apart\")";
  if (e == EXDEV && job_files_without_links())
    return "a '..' in it: a node opens only paths resolved under its roots";
  return std::strerror(e);
}

std::unique_ptr<std::iostream> open_job_stream(const std::string& path, std::ios::openmode mode,
                                               const std::string& what) {
  int flags = O_RDONLY;
  if (mode & std::ios::out)
    flags = O_WRONLY | O_CREAT | ((mode & std::ios::app) ? O_APPEND : O_TRUNC);
  const int fd = open_job_file(path, flags);
  if (fd < 0)
    throw std::runtime_error((what.empty() ? path : what) + ": cannot open (" + job_file_error() +
                             ")");
  return std::make_unique<FdStream>(fd, mode | std::ios::binary);
}

std::string read_bounded(const std::string& path, std::uintmax_t max_bytes,
                         const std::string& what) {
  const std::string& name = what.empty() ? path : what;
  Fd f(open_job_file(path, O_RDONLY));
  if (f.fd < 0) throw std::runtime_error(name + ": cannot read (" + job_file_error() + ")");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    throw std::runtime_error(name + ": cannot read (" + job_file_error() + ")");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(name + ": not a regular file");
  const auto size = static_cast<std::uintmax_t>(st.st_size);
  if (size > max_bytes)
    throw std::runtime_error(name + ": " + std::to_string(size) + " bytes, more than the " +
                             std::to_string(max_bytes) + " allowed");
  std::string bytes(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(f.fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw std::runtime_error(name + ": cannot read its " + std::to_string(size) + " bytes");
    got += static_cast<std::size_t>(n);
  }
  return bytes;
}

}  // namespace loco::diloco
