#include "diloco/device_info.hpp"

#include <dlfcn.h>

namespace loco::diloco {

std::string cuda_device_name(int index) {
  // The driver LibTorch loaded when it found a GPU; without one, none is loaded here either.
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) return "";
  // CUresult cuDeviceGetName(char* name, int len, CUdevice dev), CUdevice an ordinal.
  using GetName = int (*)(char*, int, int);
  auto get_name = reinterpret_cast<GetName>(::dlsym(driver, "cuDeviceGetName"));
  std::string out;
  char name[256] = {};
  if (get_name && get_name(name, int(sizeof name) - 1, index) == 0) out = name;
  ::dlclose(driver);
  return out;
}

}  // namespace loco::diloco
