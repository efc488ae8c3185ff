#include "runtime/core/paths.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <algorithm>
#include <cctype>
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

namespace {

// A path of `r`'s user refused under `user_root`: when it lies in another user's folder of the
// same root, the refusal says whose.
std::string resolve_for(const PathRoots& r, const std::string& user_root, const std::string& path,
                        const std::string& field, const std::string& root_option) {
  try {
    return resolve_under(user_root, path, field, root_option);
  } catch (const PathError& e) {
    if (r.user.empty()) throw;
    const fs::path mine = landing(fs::absolute(user_root));
    const fs::path root = mine.parent_path();
    const fs::path p(path);
    const fs::path full = landing(p.is_absolute() ? p : mine / p);
    if (inside(root, full) && full != root) {
      const std::string owner = full.lexically_relative(root).begin()->string();
      throw PathError(field + ": '" + shown(path) + "' is in the folder of user '" + shown(owner) +
                      "' (" + (root / owner).string() + "); a client's job reads and writes " +
                      "only under its own, " + mine.string() +
                      " (docs/security.md, \"Users' files apart\")");
    }
    throw;
  }
}

}  // namespace

std::string user_folder(const std::string& key, const std::string& name) {
  const bool plain = !name.empty() && name.size() <= 64 && name[0] != '-' &&
                     std::all_of(name.begin(), name.end(), [](unsigned char c) {
                       return std::isalnum(c) || c == '_' || c == '-';
                     });
  if (plain) return name;
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a stable folder name, not a secret
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("key-") + hex;
}

PathRoots PathRoots::for_user(const std::string& key, const std::string& name) const {
  PathRoots r;
  r.user = user_folder(key, name);
  r.data = (fs::path(data) / r.user).string();
  r.checkpoints = (fs::path(checkpoints) / r.user).string();
  for (const std::string& dir : {r.data, r.checkpoints}) {
    std::error_code ec;
    if (fs::create_directory(dir, ec)) ::chmod(dir.c_str(), 0700);
  }
  return r;
}

std::string resolve_data_path(const PathRoots& r, const std::string& path,
                              const std::string& field) {
  return resolve_for(r, r.data, path, field, "--data-root");
}

std::string resolve_checkpoint_path(const PathRoots& r, const std::string& path,
                                    const std::string& field) {
  return resolve_for(r, r.checkpoints, path, field, "--checkpoint-root");
}

}  // namespace loco
