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

std::string cuda_device_uuid(int index) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) return "";
  // CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev), CUuuid 16 bytes.
  using GetUuid = int (*)(unsigned char*, int);
  // The _v2 entry point (CUDA 11.4 on; MIG instances' own UUIDs) where the driver has it.
  void* sym = ::dlsym(driver, "cuDeviceGetUuid_v2");
  if (!sym) sym = ::dlsym(driver, "cuDeviceGetUuid");
  auto get_uuid = reinterpret_cast<GetUuid>(sym);
  std::string out;
  unsigned char uuid[16] = {};
  if (get_uuid && get_uuid(uuid, index) == 0) {
    static const char* hex = "0123456789abcdef";
    out = "GPU-";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
      out += hex[uuid[i] >> 4];
      out += hex[uuid[i] & 15];
    }
  }
  ::dlclose(driver);
  return out;
}

}  // namespace loco::diloco
