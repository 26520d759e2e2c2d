#pragma once

/// @file
/// Compiler annotations shared by host and device code.
///
/// `SPECULA_HOST_DEVICE` marks functions that are usable from both host and CUDA device code.
/// Without a CUDA compiler it expands to nothing, so every host header compiles with a plain
/// C++20 compiler.

#if defined(__CUDACC__)
#define SPECULA_HOST_DEVICE __host__ __device__
#define SPECULA_DEVICE __device__
#else
#define SPECULA_HOST_DEVICE
#define SPECULA_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define SPECULA_IS_DEVICE_CODE 1
#else
#define SPECULA_IS_DEVICE_CODE 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SPECULA_RESTRICT __restrict__
#else
#define SPECULA_RESTRICT
#endif
