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

# specula_cuda_compile_only(<target>...): with SPECULA_CUDA_COMPILE_ONLY, the C++ files of
# CUDA-only targets (host code that launches device code, which a machine without a GPU never
# runs) are built at -O1 like the host side of their .cu files (appended after the
# configuration's flags, so it overrides their level). Nothing otherwise.
function(specula_cuda_compile_only)
  if(NOT SPECULA_CUDA_COMPILE_ONLY)
    return()
  endif()
  foreach(_target IN LISTS ARGN)
    target_compile_options(${_target} PRIVATE
      $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>>:-O1>)
  endforeach()
endfunction()
