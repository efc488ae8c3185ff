#pragma once
// The shared libraries of actor classes a node may host (`--plugin`, $LOCO_PLUGIN_PATH,
// build/plugins), loaded when an actor needs them: an idle node maps none of them (not
// LibTorch, which the DiLoCo plugin pulls in). A library named on its own is loaded at
// once; those found in a folder wait until a class they offer is asked for. What a
// library offers is read from its manifest, `libX.classes` beside `libX.so` (one class a
// line, written at build time by loco-plugin-classes); a library without one is tried,
// in name order, only for a class that no manifest names.
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace loco {

class Plugins {
 public:
  // Throws naming the path when one does not exist or a library named on its own fails
  // to load.
  explicit Plugins(const std::vector<std::string>& paths);

  // Makes `class_name` registered if a plugin offers it, loading what is needed; true
  // when it is registered afterwards. Throws naming the library when one fails to load.
  bool provide(const std::string& class_name);

  // The libraries loaded so far, and every one known.
  std::vector<std::string> loaded() const;
  size_t known() const { return libs_.size(); }
  // Classes that could be hosted: those registered and those the manifests offer.
  std::vector<std::string> offered() const;

 private:
  struct Lib {
    std::string path;
    bool has_manifest = false;
    std::set<std::string> classes;  // from the manifest
    bool loaded = false;
  };
  void load(Lib& lib);

  mutable std::mutex mu_;
  std::vector<Lib> libs_;
};

// `dir/libX.classes` for `dir/libX.so`.
std::string plugin_manifest_path(const std::string& library);

}  // namespace loco
