// What a worker reports of its device without CUDA headers or a CUDA link: the GPU's name
// from the CUDA driver that LibTorch has loaded. No LibTorch here.
#pragma once

#include <string>

namespace loco::diloco {

// The name CUDA gives device `index` of this process ("NVIDIA H100 80GB HBM3"), read through
// the driver API (cuDeviceGetName of libcuda.so.1, looked up at run time); "" when there is no
// driver or no such device.
std::string cuda_device_name(int index);

// Device `index`'s UUID, the same in every process on the host whatever CUDA_VISIBLE_DEVICES
// says (cuDeviceGetUuid, as hex, "GPU-" first, as nvidia-smi shows it); "" without a driver.
std::string cuda_device_uuid(int index);

}  // namespace loco::diloco
