// loco-plugin-classes LIBRARY MANIFEST: loads a plugin and writes the actor classes it
// registers, one a line, to MANIFEST. The build runs it after linking every plugin, so that
// a node knows which plugin to load for a class without loading them all (plugins.hpp).
#include <dlfcn.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "runtime/core/registry.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: loco-plugin-classes LIBRARY MANIFEST\n");
    return 2;
  }
  auto& registry = loco::detail::Registry::instance();
  auto before = registry.class_names();
  std::set<std::string> had(before.begin(), before.end());
  if (!::dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "loco-plugin-classes: cannot load %s: %s\n", argv[1], ::dlerror());
    return 1;
  }
  const std::string tmp = std::string(argv[2]) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& name : registry.class_names())
      if (!had.count(name)) out << name << "\n";
    if (!out) {
      std::fprintf(stderr, "loco-plugin-classes: cannot write %s\n", tmp.c_str());
      return 1;
    }
  }
  std::filesystem::rename(tmp, argv[2]);
  return 0;
}
