# specula_cuda_toolchain_defaults(): before check_language(CUDA) / enable_language(CUDA), point
# CMake at the toolkit's default location when nvcc is not otherwise configured, use the C++
# build's host compiler (unless told otherwise). Through the
# environment (rather than CMAKE_CUDA_COMPILER) so that check_language() still makes a real
# trial configuration and a broken toolchain degrades to "no CUDA".
include_guard(GLOBAL)

macro(specula_cuda_toolchain_defaults)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS "/usr/local/cuda/bin/nvcc")
    set(ENV{CUDACXX} "/usr/local/cuda/bin/nvcc")
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX}
     AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(ENV{CUDAHOSTCXX} "${CMAKE_CXX_COMPILER}")
  endif()
endmacro()
