# Drives a packaging test. Usage (see tests/package/CMakeLists.txt):
#
#   cmake -DMODE=find_package|add_subdirectory -DWORK_DIR=... -DSPECULA_SOURCE_DIR=...
#         -DSPECULA_BUILD_DIR=... -DSPECULA_VERSION=... -DCONSUMER_SOURCE_ROOT=...
#         [-DCONFIG=...] [-DGENERATOR=...] [-DMAKE_PROGRAM=...] [-DCXX_COMPILER=...]
#         [-DEXPECT_TESTING=0|1] [-DHAS_CUDA=ON|OFF] [-DCUDA_*=...]
#         -P run_consumer.cmake
#
# MODE=find_package:
#   1. cmake --install <SPECULA_BUILD_DIR> --prefix <WORK_DIR>/prefix
#   2. configure + build tests/package/find_package against that prefix, run it
#   3. configure again asking for specula 99: must fail (version file check)
# MODE=add_subdirectory:
#   configure + build tests/package/add_subdirectory with -DSPECULA_SOURCE_DIR, run it;
#   install it (specula must install nothing), then again with -DSPECULA_INSTALL=ON
cmake_minimum_required(VERSION 3.25)

foreach(_v MODE WORK_DIR SPECULA_SOURCE_DIR SPECULA_BUILD_DIR SPECULA_VERSION
           CONSUMER_SOURCE_ROOT)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: ${_v} is required")
  endif()
endforeach()
if(NOT DEFINED CONFIG OR CONFIG STREQUAL "")
  set(CONFIG Release)
endif()

# _run(<description> <expect: PASS|FAIL> <out-var> COMMAND ...)
function(_run desc expect out)
  message(STATUS "[${MODE}] ${desc}")
  execute_process(${ARGN}
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _out)
  if(expect STREQUAL "PASS" AND NOT _rc EQUAL 0)
    message(FATAL_ERROR "[${MODE}] ${desc}: FAILED (exit ${_rc})\n${_out}")
  elseif(expect STREQUAL "FAIL" AND _rc EQUAL 0)
    message(FATAL_ERROR "[${MODE}] ${desc}: expected failure but it succeeded\n${_out}")
  endif()
  set(${out} "${_out}" PARENT_SCOPE)
endfunction()

# Common configure arguments: same generator / compilers as the parent build.
set(_gen_args)
if(GENERATOR)
  list(APPEND _gen_args -G "${GENERATOR}")
endif()
if(GENERATOR_PLATFORM)
  list(APPEND _gen_args -A "${GENERATOR_PLATFORM}")
endif()
if(GENERATOR_TOOLSET)
  list(APPEND _gen_args -T "${GENERATOR_TOOLSET}")
endif()
if(MAKE_PROGRAM)
  list(APPEND _gen_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND _gen_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(TOOLCHAIN_FILE)
  list(APPEND _gen_args "-DCMAKE_TOOLCHAIN_FILE=${TOOLCHAIN_FILE}")
endif()
list(APPEND _gen_args
  "-DCMAKE_BUILD_TYPE=${CONFIG}"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(HAS_CUDA)
  list(APPEND _gen_args
    "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}"
    "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"
    "-DCUDAToolkit_ROOT=${CUDA_TOOLKIT_ROOT}")
  if(CUDA_HOST_COMPILER)
    list(APPEND _gen_args "-DCMAKE_CUDA_HOST_COMPILER=${CUDA_HOST_COMPILER}")
  endif()
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if(MODE STREQUAL "find_package")
  set(_prefix "${WORK_DIR}/prefix")
  set(_src "${CONSUMER_SOURCE_ROOT}/find_package")
  set(_bld "${WORK_DIR}/build")

  _run("install specula into ${_prefix}" PASS _o
    COMMAND "${CMAKE_COMMAND}" --install "${SPECULA_BUILD_DIR}"
            --prefix "${_prefix}" --config "${CONFIG}")

  # The installed tree must contain headers and CMake files only.
  file(GLOB_RECURSE _installed RELATIVE "${_prefix}" "${_prefix}/*")
  foreach(_f IN LISTS _installed)
    if(NOT _f MATCHES "\\.(hpp|h|cuh|cmake)$")
      message(FATAL_ERROR "[${MODE}] unexpected installed file: ${_f}")
    endif()
  endforeach()
  if(NOT EXISTS "${_prefix}/include/specula/specula.hpp")
    message(FATAL_ERROR "[${MODE}] include/specula/specula.hpp was not installed")
  endif()

  _run("configure consumer" PASS _o
    COMMAND "${CMAKE_COMMAND}" -S "${_src}" -B "${_bld}" ${_gen_args}
            "-DCMAKE_PREFIX_PATH=${_prefix}"
            "-DSPECULA_EXPECTED_PREFIX=${_prefix}"
            "-DSPECULA_EXPECT_TESTING=${EXPECT_TESTING}"
            "-DSPECULA_EXPECT_CUDA=${HAS_CUDA}")
  message("${_o}")
  _run("build consumer" PASS _o
    COMMAND "${CMAKE_COMMAND}" --build "${_bld}" --config "${CONFIG}")

  find_program(_exe specula_consumer
    PATHS "${_bld}" "${_bld}/${CONFIG}" NO_DEFAULT_PATH REQUIRED)
  _run("run consumer" PASS _o COMMAND "${_exe}")
  message("${_o}")
  if(NOT _o MATCHES "specula ${SPECULA_VERSION}")
    message(FATAL_ERROR "[${MODE}] consumer printed '${_o}', expected the version "
                        "string to be ${SPECULA_VERSION} (SPECULA_VERSION_STRING in "
                        "include/specula/version.hpp must match project(VERSION))")
  endif()

  _run("configure consumer requiring specula 99 (must fail)" FAIL _o
    COMMAND "${CMAKE_COMMAND}" -S "${_src}" -B "${WORK_DIR}/build-v99" ${_gen_args}
            "-DCMAKE_PREFIX_PATH=${_prefix}"
            -DSPECULA_REQUIRED_VERSION=99)
  if(NOT _o MATCHES "specula")
    message(FATAL_ERROR "[${MODE}] version-mismatch failure did not mention specula:\n${_o}")
  endif()
  message(STATUS "[${MODE}] find_package(specula 99) correctly rejected")

elseif(MODE STREQUAL "add_subdirectory")
  set(_src "${CONSUMER_SOURCE_ROOT}/add_subdirectory")
  set(_bld "${WORK_DIR}/build")

  # SPECULA_ENABLE_CUDA is left to its default: on only because the consumer enables CUDA
  # itself when HAS_CUDA (the consumer checks that specula never enables it otherwise).
  _run("configure consumer" PASS _o
    COMMAND "${CMAKE_COMMAND}" -S "${_src}" -B "${_bld}" ${_gen_args}
            "-DSPECULA_SOURCE_DIR=${SPECULA_SOURCE_DIR}"
            "-DSPECULA_EXPECT_CUDA=${HAS_CUDA}")
  message("${_o}")
  _run("build consumer" PASS _o
    COMMAND "${CMAKE_COMMAND}" --build "${_bld}" --config "${CONFIG}")

  find_program(_exe specula_subdir_consumer
    PATHS "${_bld}" "${_bld}/${CONFIG}" NO_DEFAULT_PATH REQUIRED)
  _run("run consumer" PASS _o COMMAND "${_exe}")
  message("${_o}")
  if(NOT _o MATCHES "specula ${SPECULA_VERSION}")
    message(FATAL_ERROR "[${MODE}] consumer printed '${_o}', expected version ${SPECULA_VERSION}")
  endif()

  # The parent's install does not install specula unless asked (SPECULA_INSTALL=ON).
  _run("install the consumer (specula's install rules off by default)" PASS _o
    COMMAND "${CMAKE_COMMAND}" --install "${_bld}" --prefix "${WORK_DIR}/prefix-default"
            --config "${CONFIG}")
  file(GLOB_RECURSE _installed "${WORK_DIR}/prefix-default/*")
  if(_installed)
    message(FATAL_ERROR "[${MODE}] a subproject specula installed files by default: ${_installed}")
  endif()
  _run("configure consumer with SPECULA_INSTALL=ON" PASS _o
    COMMAND "${CMAKE_COMMAND}" -S "${_src}" -B "${_bld}" -DSPECULA_INSTALL=ON)
  _run("install the consumer with SPECULA_INSTALL=ON" PASS _o
    COMMAND "${CMAKE_COMMAND}" --install "${_bld}" --prefix "${WORK_DIR}/prefix-on"
            --config "${CONFIG}")
  foreach(_f IN ITEMS include/specula/verify.hpp share/cmake/specula/specula-config.cmake)
    if(NOT EXISTS "${WORK_DIR}/prefix-on/${_f}")
      message(FATAL_ERROR "[${MODE}] SPECULA_INSTALL=ON did not install ${_f}")
    endif()
  endforeach()

else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

message(STATUS "[${MODE}] OK")
