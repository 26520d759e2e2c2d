#pragma once

/// @file
/// Library version.

#define SPECULA_VERSION_MAJOR 0
#define SPECULA_VERSION_MINOR 1
#define SPECULA_VERSION_PATCH 0
#define SPECULA_VERSION_STRING "0.1.0"

namespace specula {

/// Library version as (major, minor, patch).
struct version_info {
  int major;
  int minor;
  int patch;
};

inline constexpr version_info version{SPECULA_VERSION_MAJOR, SPECULA_VERSION_MINOR,
                                      SPECULA_VERSION_PATCH};

}  // namespace specula
