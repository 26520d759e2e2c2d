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

/// a * b rounded to double and never fused with a following addition. nvcc contracts a product
/// feeding an addition into one FMA by default (one rounding instead of two), which would make
/// device results differ from the host's in the last bit; products whose result is later added
/// or subtracted in the verifiers' shared maths go through this function so both backends round
/// the same way. (Host builds must not enable FMA contraction either: no -ffp-contract=fast
/// together with -mfma / -march=native for translation units that need host/device parity.)
SPECULA_HOST_DEVICE constexpr double mul_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/// Float a * b, rounded and never fused (see mul_rn): __fmul_rn on the device.
SPECULA_HOST_DEVICE constexpr float fmul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// Float a + b, rounded and never fused with a product that feeds it: __fadd_rn on the device.
SPECULA_HOST_DEVICE constexpr float fadd_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// Float a - b, rounded and never fused: __fsub_rn on the device.
SPECULA_HOST_DEVICE constexpr float fsub_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

}  // namespace specula::detail
