#pragma once

/// @file
/// Small numeric helpers usable in host and device code (IEEE semantics; do not compile specula
/// code with -ffast-math, which removes NaN/Inf checks).

#include "specula/core/config.hpp"

namespace specula::detail {

SPECULA_HOST_DEVICE constexpr bool is_nan(double x) noexcept { return x != x; }

/// True for finite values; false for NaN and +-Inf.
SPECULA_HOST_DEVICE constexpr bool is_finite(double x) noexcept { return x - x == 0.0; }

template <class T>
SPECULA_HOST_DEVICE constexpr double to_double(T x) noexcept {
  return static_cast<double>(x);
}

SPECULA_HOST_DEVICE constexpr double abs_value(double x) noexcept { return x < 0 ? -x : x; }

}  // namespace specula::detail
