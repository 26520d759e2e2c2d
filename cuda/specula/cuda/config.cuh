#pragma once

/// @file
/// Namespace and kernel annotations of the CUDA backend.
///
/// Everything device-side lives in `specula::cuda` inside a versioned inline namespace
/// tagged with the library version and the GPU architectures of the translation unit (from
/// nvcc's __CUDA_ARCH_LIST__, e.g. `v0_1_0_sm_900` or `v0_1_0_sm_800_900`), and kernels are
/// declared with hidden visibility: two libraries built against different specula versions or
/// for different architectures never share (and so never mix up) kernel instances — the guard
/// CUB uses against ODR clashes between independently built libraries.

#include <cuda_runtime_api.h>

#define SPECULA_PP_CAT_IMPL(a, b) a##b
#define SPECULA_PP_CAT(a, b) SPECULA_PP_CAT_IMPL(a, b)
#define SPECULA_PP_COUNT_IMPL(a1, a2, a3, a4, a5, a6, a7, a8, n, ...) n
#define SPECULA_PP_COUNT(...) SPECULA_PP_COUNT_IMPL(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define SPECULA_PP_JOIN_1(a1) _##a1
#define SPECULA_PP_JOIN_2(a1, a2) _##a1##_##a2
#define SPECULA_PP_JOIN_3(a1, a2, a3) _##a1##_##a2##_##a3
#define SPECULA_PP_JOIN_4(a1, a2, a3, a4) _##a1##_##a2##_##a3##_##a4
#define SPECULA_PP_JOIN_5(a1, a2, a3, a4, a5) _##a1##_##a2##_##a3##_##a4##_##a5
#define SPECULA_PP_JOIN_6(a1, a2, a3, a4, a5, a6) _##a1##_##a2##_##a3##_##a4##_##a5##_##a6
#define SPECULA_PP_JOIN_7(a1, a2, a3, a4, a5, a6, a7) \
  _##a1##_##a2##_##a3##_##a4##_##a5##_##a6##_##a7
#define SPECULA_PP_JOIN_8(a1, a2, a3, a4, a5, a6, a7, a8) \
  _##a1##_##a2##_##a3##_##a4##_##a5##_##a6##_##a7##_##a8
#define SPECULA_PP_JOIN(...) \
  SPECULA_PP_CAT(SPECULA_PP_JOIN_, SPECULA_PP_COUNT(__VA_ARGS__))(__VA_ARGS__)

#if defined(__CUDA_ARCH_LIST__)
#define SPECULA_CUDA_ARCH_TAG SPECULA_PP_CAT(sm, SPECULA_PP_JOIN(__CUDA_ARCH_LIST__))
#else
#define SPECULA_CUDA_ARCH_TAG sm_any
#endif

/// The versioned, architecture-tagged inline namespace, e.g. v0_1_0_sm_900.
#define SPECULA_CUDA_ABI_NAME SPECULA_PP_CAT(v0_1_0_, SPECULA_CUDA_ARCH_TAG)

/// Opens specula's versioned CUDA namespace.
#define SPECULA_CUDA_NAMESPACE_BEGIN \
  namespace specula::cuda {          \
  inline namespace SPECULA_CUDA_ABI_NAME {
/// Closes it.
#define SPECULA_CUDA_NAMESPACE_END \
  }                                \
  }

#if defined(__GNUC__) || defined(__clang__)
#define SPECULA_CUDA_HIDDEN __attribute__((visibility("hidden")))
#else
#define SPECULA_CUDA_HIDDEN
#endif

/// Resident CTAs per SM the verifier kernels (chain, tree, K candidates) are compiled for: the
/// second argument of their __launch_bounds__. Without it ptxas picks a register budget by its
/// own occupancy heuristic and chose 64 registers with spills to local memory for several of them
/// (docs/cuda.md lists the numbers); 2 caps them at 128 registers (two 256-thread CTAs per SM).
#ifndef SPECULA_CUDA_VERIFIER_MIN_CTAS
#define SPECULA_CUDA_VERIFIER_MIN_CTAS 2
#endif

/// Declares a kernel with hidden visibility.
#define SPECULA_KERNEL __global__ SPECULA_CUDA_HIDDEN
