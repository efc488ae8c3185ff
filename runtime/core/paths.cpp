#include "runtime/core/paths.hpp"

#include <filesystem>
#include <system_error>

namespace fs = std::filesystem;

namespace loco {

namespace {

// `p` with "." and ".." folded and the symbolic links of its longest existing prefix
// followed: where a write to it would land.
fs::path landing(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : out;
}

// A path from a job file or a request, shown in an error: at most 256 bytes, control bytes as '?'.
std::string shown(const std::string& path) {
  std::string s = path.substr(0, 256);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return path.size() > 256 ? s + "..." : s;
}

bool inside(const fs::path& root, const fs::path& p) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (r->empty()) continue;  // the trailing "" of "/a/b/"
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

}  // namespace

PathRoots PathRoots::at(const std::string& dir) {
  const std::string d = landing(fs::absolute(dir)).string();
  return {d, d};
}

std::string resolve_under(const std::string& root, const std::string& path,
                          const std::string& field, const std::string& root_option) {
  const std::string root_name =
      root_option == "--data-root" ? "data root" : root_option == "--checkpoint-root"
                                                       ? "checkpoint root"
                                                       : "root";
  if (path.empty()) throw PathError(field + ": an empty path");
  if (path.find('\0') != std::string::npos) throw PathError(field + ": a path with a NUL byte");
  const fs::path base = landing(fs::absolute(root));
  const fs::path p(path);
  const fs::path full = landing(p.is_absolute() ? p : base / p);
  if (!inside(base, full))
    throw PathError(field + ": '" + shown(path) + "' is outside this node's " + root_name + " '" +
                    base.string() + "' (loco start " + root_option + ")");
  return full.string();
}

}  // namespace loco
