# CMake < 3.26-ish does not know that nvcc >= 12 supports C++20, so
# CUDA_STANDARD 20 / cuda_std_20 are rejected ("The compiler feature
# cuda_std_20 is not known to CUDA compiler"). specula_cuda_std20_shim()
# teaches the *current directory scope* (and its subdirectories) about it.
#
# Sets SPECULA_CUDA_STD20_NATIVE to TRUE when CMake supports it on its own.
include_guard(GLOBAL)

macro(specula_cuda_std20_shim)
  if("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    set(SPECULA_CUDA_STD20_NATIVE TRUE)
  else()
    set(SPECULA_CUDA_STD20_NATIVE FALSE)
    if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
       AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
       AND NOT CMAKE_CUDA_SIMULATE_ID STREQUAL "MSVC")
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
      message(STATUS "specula: enabling C++20 for nvcc ${CMAKE_CUDA_COMPILER_VERSION} "
                     "(not known to CMake ${CMAKE_VERSION})")
    endif()
  endif()
endmacro()
