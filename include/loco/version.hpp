#pragma once
// loco's version: the one place it is written (the top CMakeLists.txt reads it from here).
// 0.x: a minor version may change the API; find_package(loco 0.N) takes 0.N.* only.
#define LOCO_VERSION_MAJOR 0
#define LOCO_VERSION_MINOR 23
#define LOCO_VERSION_PATCH 0
#define LOCO_VERSION_STRING "0.23.0"

namespace loco {
inline constexpr int kVersionMajor = LOCO_VERSION_MAJOR;
inline constexpr int kVersionMinor = LOCO_VERSION_MINOR;
inline constexpr int kVersionPatch = LOCO_VERSION_PATCH;
inline constexpr const char* kVersion = LOCO_VERSION_STRING;
}  // namespace loco
