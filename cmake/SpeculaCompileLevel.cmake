# Optimisation levels of the project's own executables (not installed: consumers choose theirs).
include_guard(GLOBAL)

# specula_compile_level(<target> <level>): <target>'s C++ files are compiled at -O<level>
# instead of the configuration's level, in Release builds with GCC or Clang (appended after
# CMAKE_CXX_FLAGS_RELEASE, so it overrides its -O3). For the test executables, whose build
# time counts more than their run time (tests/CMakeLists.txt). One level per executable: the
# library is header-only, so an inline function is compiled into every object that uses it
# and the linker keeps one copy, which may come from the least optimised object.
function(specula_compile_level target level)
  target_compile_options(${target} PRIVATE
    $<$<AND:$<CONFIG:Release>,$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>>:-O${level}>)
endfunction()

# specula_cuda_compile_only(<target>...): with SPECULA_CUDA_COMPILE_ONLY, the C++ files of
# CUDA-only targets (host code that launches device code, which a machine without a GPU never
# runs) are built at -O0 like the host side of their .cu files. Nothing otherwise.
function(specula_cuda_compile_only)
  if(NOT SPECULA_CUDA_COMPILE_ONLY)
    return()
  endif()
  foreach(_target IN LISTS ARGN)
    specula_compile_level(${_target} 0)
  endforeach()
endfunction()
