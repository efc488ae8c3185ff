#include "diloco/model/device_info.hpp"

#include <dlfcn.h>

#include <functional>
#include <initializer_list>

namespace loco::diloco {

namespace {

// Calls `use` with the first of `symbols` that the CUDA driver LibTorch loaded exports; "" when
// there is no driver (without a GPU LibTorch loads none here either) or no such symbol.
std::string from_driver(std::initializer_list<const char*> symbols,
                        const std::function<std::string(void*)>& use) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) return "";
  void* sym = nullptr;
  for (const char* s : symbols)
    if ((sym = ::dlsym(driver, s))) break;
  std::string out = sym ? use(sym) : "";
  ::dlclose(driver);
  return out;
}

}  // namespace

std::string cuda_device_name(int index) {
  // CUresult cuDeviceGetName(char* name, int len, CUdevice dev), CUdevice an ordinal.
  return from_driver({"cuDeviceGetName"}, [&](void* sym) {
    char name[256] = {};
    const auto get_name = reinterpret_cast<int (*)(char*, int, int)>(sym);
    return get_name(name, int(sizeof name) - 1, index) == 0 ? std::string(name) : "";
  });
}

std::string cuda_device_uuid(int index) {
  // CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev), CUuuid 16 bytes; the _v2 entry point
  // (CUDA 11.4 on; MIG instances' own UUIDs) where the driver has it.
  return from_driver({"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}, [&](void* sym) {
    unsigned char uuid[16] = {};
    const auto get_uuid = reinterpret_cast<int (*)(unsigned char*, int)>(sym);
    if (get_uuid(uuid, index) != 0) return std::string();
    static const char* hex = "0123456789abcdef";
    std::string out = "GPU-";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
      out += hex[uuid[i] >> 4];
      out += hex[uuid[i] & 15];
    }
    return out;
  });
}

}  // namespace loco::diloco
