#pragma once
// The actor class registry: which classes a process can host, how to construct
// them, and their methods by name. Filled by loco::ActorClass at static
// initialisation (of the program, or of a plugin that a node loads).
#include <any>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <typeindex>
#include <vector>

#include "codec.hpp"

namespace loco::detail {

struct MethodEntry {
  std::string name;
  std::any pointer;  // the member function pointer, to map a typed call to its name
  // Decodes the arguments from `args`, calls the method on `self`, encodes the result.
  std::function<Payload(void* self, Payload& args)> invoke;
  // Callable only by members of the cluster (its head, nodes and actors), not by clients.
  bool internal = false;
  // Runs beside the actor's mailbox, on a thread of its own, while other methods run
  // (ActorClass::concurrent_method).
  bool concurrent = false;
};

struct ClassEntry {
  std::string name;
  std::type_index type = typeid(void);
  std::function<std::shared_ptr<void>(Payload& args)> factory;
  std::vector<MethodEntry> methods;
  // Asks an instance to stop (ActorClass::on_stop); empty when the class has no such hook.
  std::function<void(void* self)> stop;

  const MethodEntry* find(const std::string& method) const;
  std::string method_list() const;  // "add, get" for error messages
};

class Registry {
 public:
  static Registry& instance();
  ClassEntry& entry_for(const std::string& name, std::type_index type);
  const ClassEntry* find(const std::string& name) const;
  std::vector<std::string> class_names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<ClassEntry>> classes_;
};

// The class entry of C++ type T, set when T is registered.
template <class T>
struct TypeSlot {
  static inline ClassEntry* entry = nullptr;
};

template <class T>
const ClassEntry& class_entry() {
  if (!TypeSlot<T>::entry)
    throw std::logic_error(std::string("actor class ") + typeid(T).name() +
                           " is not registered: declare a loco::ActorClass<T> for it");
  return *TypeSlot<T>::entry;
}

// The registered name of method `m` of T.
template <class T, class M>
const std::string& method_name(M m) {
  for (const MethodEntry& e : class_entry<T>().methods) {
    if (const M* p = std::any_cast<M>(&e.pointer); p && *p == m) return e.name;
  }
  throw std::logic_error("method of actor class " + class_entry<T>().name +
                         " called through a handle but not registered with .method()");
}

}  // namespace loco::detail
