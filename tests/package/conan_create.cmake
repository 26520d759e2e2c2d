# `conan create` of the recipe in the source tree, fully offline (see tests/package/CMakeLists.txt):
#
#   cmake -DSPECULA_SOURCE_DIR=... -DWORK_DIR=... -DSPECULA_VERSION=...
#         [-DCXX_COMPILER=...] [-DHAS_CUDA=ON|OFF] [-DCUDA_COMPILER=...] [-DCUDA_HOST_COMPILER=...]
#         -P conan_create.cmake
#
# Skips (prints "SPECULA_TEST_SKIPPED", which the test's SKIP_REGULAR_EXPRESSION
# matches) when no `conan` (Conan 2) is on PATH at test time; set SPECULA_CONAN to a
# conan executable to use that one instead.
#
# Everything happens under WORK_DIR: a fresh CONAN_HOME with no remotes (so nothing
# is downloaded: the default options need no dependencies), and a copy of
# test_package (conan writes its build folder next to the test package's conanfile).
#   1. conan profile detect (with the parent build's C++ compiler)
#   2. conan create <source> -tf <copy of test_package>: builds + packages specula,
#      builds the test package against it and runs it
#   3. with CUDA: conan test <copy> specula/<version> -o specula/*:with_cuda=True
cmake_minimum_required(VERSION 3.25)

foreach(_v SPECULA_SOURCE_DIR WORK_DIR SPECULA_VERSION)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "conan_create.cmake: ${_v} is required")
  endif()
endforeach()

include("${CMAKE_CURRENT_LIST_DIR}/../cmake/skip.cmake")

# --- find conan (at test time, so PATH decides) ----------------------------------
if(DEFINED ENV{SPECULA_CONAN} AND NOT "$ENV{SPECULA_CONAN}" STREQUAL "")
  set(_conan "$ENV{SPECULA_CONAN}")
else()
  find_program(_conan NAMES conan NO_CACHE)
endif()
if(NOT _conan)
  specula_skip("conan not found on PATH")
  return()
endif()
execute_process(COMMAND "${_conan}" --version
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _conan_version ERROR_VARIABLE _conan_version)
string(STRIP "${_conan_version}" _conan_version)
if(NOT _rc EQUAL 0 OR NOT _conan_version MATCHES "Conan version 2\\.")
  specula_skip("'${_conan}' is not a working Conan 2 (${_conan_version})")
  return()
endif()
message(STATUS "[conan] using ${_conan} (${_conan_version})")

# _run(<description> <out-var> <args>...): run conan, fail the test on error.
function(_run desc out)
  message(STATUS "[conan] ${desc}")
  execute_process(COMMAND "${_conan}" ${ARGN}
    WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "[conan] ${desc}: FAILED (exit ${_rc})\n${_out}")
  endif()
  set(${out} "${_out}" PARENT_SCOPE)
endfunction()

# --- isolated, offline Conan home -------------------------------------------------
file(REMOVE_RECURSE "${WORK_DIR}")
set(_home "${WORK_DIR}/conan_home")
file(MAKE_DIRECTORY "${_home}")
# No remotes at all: conan never goes to the network (a missing requirement fails).
file(WRITE "${_home}/remotes.json" "{\"remotes\": []}\n")
file(WRITE "${_home}/global.conf" "core:non_interactive=True\n")
set(ENV{CONAN_HOME} "${_home}")
unset(ENV{CONAN_DEFAULT_PROFILE})
unset(ENV{CONAN_DEFAULT_BUILD_PROFILE})

# Same cmake as the parent build (specula needs >= 3.25), same C++ compiler.
get_filename_component(_cmake_dir "${CMAKE_COMMAND}" DIRECTORY)
if(WIN32)
  set(ENV{PATH} "${_cmake_dir};$ENV{PATH}")
else()
  set(ENV{PATH} "${_cmake_dir}:$ENV{PATH}")
endif()
if(CXX_COMPILER)
  set(ENV{CXX} "${CXX_COMPILER}")
endif()

_run("conan remote list" _o remote list)
if(NOT _o STREQUAL "" AND _o MATCHES "http")
  message(FATAL_ERROR "[conan] remotes still configured in ${_home}:\n${_o}")
endif()
_run("conan profile detect" _o profile detect --force)

# --- create (default options: no requirements, works offline) ---------------------
set(_tp "${WORK_DIR}/test_package")
file(COPY "${SPECULA_SOURCE_DIR}/test_package/" DESTINATION "${_tp}"
     PATTERN "build" EXCLUDE PATTERN "CMakeUserPresets.json" EXCLUDE)

_run("conan create ${SPECULA_SOURCE_DIR}" _o
     create "${SPECULA_SOURCE_DIR}" --build=missing -tf "${_tp}")
message("${_o}")
if(NOT _o MATCHES "specula/${SPECULA_VERSION}")
  message(FATAL_ERROR "[conan] conan create did not create specula/${SPECULA_VERSION}")
endif()
if(NOT _o MATCHES "specula ${SPECULA_VERSION}: philox4x32_10 ok")
  message(FATAL_ERROR "[conan] test_package did not print 'specula ${SPECULA_VERSION}: "
                      "philox4x32_10 ok' (did the version or the test package change?)")
endif()

# --- CUDA component (needs no remote either) ---------------------------------------
if(HAS_CUDA)
  if(CUDA_COMPILER)
    set(ENV{CUDACXX} "${CUDA_COMPILER}")
  endif()
  if(CUDA_HOST_COMPILER)
    set(ENV{CUDAHOSTCXX} "${CUDA_HOST_COMPILER}")
  endif()
  file(REMOVE_RECURSE "${_tp}/build")
  _run("conan test (with_cuda=True)" _o
       test "${_tp}" "specula/${SPECULA_VERSION}" -o "specula/*:with_cuda=True")
  message("${_o}")
  if(NOT _o MATCHES "specula ${SPECULA_VERSION}: [0-9]+ CUDA device")
    message(FATAL_ERROR "[conan] the CUDA test package did not run")
  endif()
endif()

message(STATUS "[conan] OK")
