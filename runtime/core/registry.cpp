#include "runtime/core/registry.hpp"

namespace loco::detail {

const MethodEntry* ClassEntry::find(const std::string& method) const {
  for (const MethodEntry& m : methods)
    if (m.name == method) return &m;
  return nullptr;
}

std::string ClassEntry::method_list() const {
  std::string out;
  for (const MethodEntry& m : methods) out += (out.empty() ? "" : ", ") + m.name;
  return out.empty() ? "none" : out;
}

Registry& Registry::instance() {
  static Registry r;
  return r;
}

ClassEntry& Registry::entry_for(const std::string& name, std::type_index type) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = classes_[name];
  if (!slot) {
    slot = std::make_unique<ClassEntry>();
    slot->name = name;
    slot->type = type;
  } else if (slot->type != type) {
    throw std::logic_error("actor class name '" + name + "' registered twice for different types");
  }
  return *slot;
}

const ClassEntry* Registry::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(name);
  return it == classes_.end() ? nullptr : it->second.get();
}

std::vector<std::string> Registry::class_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (auto& [name, _] : classes_) out.push_back(name);
  return out;
}

}  // namespace loco::detail
