#pragma once

/// @file
/// Compiler annotations shared by host and device code.
///
/// `SPECULA_HOST_DEVICE` marks functions that are usable from both host and CUDA device code.
/// Without a CUDA compiler it expands to nothing, so every host header compiles with a plain
/// C++20 compiler; compiling them as an earlier standard stops with an error that says so.

#if defined(_MSVC_LANG) && !defined(__clang__)
#define SPECULA_CPLUSPLUS _MSVC_LANG
#else
#define SPECULA_CPLUSPLUS __cplusplus
#endif
// 201709L: the value of compilers whose C++20 mode predates the final standard (GCC 10).
#if SPECULA_CPLUSPLUS < 201709L
#error "specula requires C++20: compile with -std=c++20 (in CMake, link specula::specula)"
// Compilers go on after #error; a missing include is fatal, so the message above is the only
// error instead of the first of hundreds.
#include "specula: stop here, see the error above"
#endif

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

/// Before a loop of a constant trip count: unroll it fully (device code and Clang; GCC unrolls
/// such short loops at -O3 by itself and would warn about the pragma).
#if defined(__CUDA_ARCH__) || defined(__clang__)
#define SPECULA_UNROLL _Pragma("unroll")
#else
#define SPECULA_UNROLL
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SPECULA_RESTRICT __restrict__
#else
#define SPECULA_RESTRICT
#endif
