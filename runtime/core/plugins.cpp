#include "runtime/core/plugins.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "runtime/core/registry.hpp"

namespace loco {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool registered(const std::string& class_name) {
  const detail::ClassEntry* cls = detail::Registry::instance().find(class_name);
  return cls && cls->factory;
}

}  // namespace

std::string plugin_manifest_path(const std::string& library) {
  std::string base = ends_with(library, ".so") ? library.substr(0, library.size() - 3) : library;
  return base + ".classes";
}

Plugins::Plugins(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0)
      throw std::runtime_error("plugin path " + p + " does not exist");
    if (!S_ISDIR(st.st_mode)) {
      // Named on its own: the operator asked for it, so it is loaded now.
      libs_.push_back(Lib{p, false, {}, false});
      load(libs_.back());
      continue;
    }
    DIR* d = ::opendir(p.c_str());
    if (!d) continue;
    std::vector<std::string> found;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("lib", 0) == 0 && ends_with(n, ".so")) found.push_back(p + "/" + n);
    }
    ::closedir(d);
    std::sort(found.begin(), found.end());
    for (const std::string& f : found) {
      Lib lib{f, false, {}, false};
      std::ifstream manifest(plugin_manifest_path(f));
      if (manifest) {
        lib.has_manifest = true;
        for (std::string line; std::getline(manifest, line);)
          if (!line.empty()) lib.classes.insert(line);
      }
      libs_.push_back(std::move(lib));
    }
  }
}

void Plugins::load(Lib& lib) {
  if (!::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_GLOBAL))
    throw std::runtime_error("cannot load plugin " + lib.path + ": " + ::dlerror());
  lib.loaded = true;
  spdlog::info("loaded plugin {}", lib.path);
}

bool Plugins::provide(const std::string& class_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (registered(class_name)) return true;
  for (Lib& lib : libs_)
    if (!lib.loaded && lib.classes.count(class_name)) {
      load(lib);
      if (registered(class_name)) return true;
      spdlog::warn("plugin {} lists {} in {} but does not register it", lib.path, class_name,
                   plugin_manifest_path(lib.path));
    }
  for (Lib& lib : libs_)
    if (!lib.loaded && !lib.has_manifest) {
      load(lib);
      if (registered(class_name)) return true;
    }
  return false;
}

std::vector<std::string> Plugins::loaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const Lib& lib : libs_)
    if (lib.loaded) out.push_back(lib.path);
  return out;
}

std::vector<std::string> Plugins::offered() const {
  std::set<std::string> out;
  for (const std::string& n : detail::Registry::instance().class_names())
    if (n.rfind("loco.", 0) != 0 && registered(n)) out.insert(n);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Lib& lib : libs_)
    if (!lib.loaded) out.insert(lib.classes.begin(), lib.classes.end());
  return {out.begin(), out.end()};
}

}  // namespace loco
