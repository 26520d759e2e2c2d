# Runs the Python package's tests (see tests/python/CMakeLists.txt):
#
#   cmake -DPACKAGE_DIR=<build>/python-package -DTESTS=<src>/python/tests
#         [-DREFERENCE=<specula_py_reference>] -P run_pytest.cmake
#
# PACKAGE_DIR/venv is made by scripts/test.sh (ensure_python_package); without it the test is
# skipped with the reason the script recorded in PACKAGE_DIR/skipped.
cmake_minimum_required(VERSION 3.25)

include("${CMAKE_CURRENT_LIST_DIR}/../cmake/skip.cmake")

set(_python "${PACKAGE_DIR}/venv/bin/python")
if(NOT EXISTS "${_python}")
  set(_why "no Python package environment at ${PACKAGE_DIR}/venv (scripts/test.sh makes it)")
  if(EXISTS "${PACKAGE_DIR}/skipped")
    file(READ "${PACKAGE_DIR}/skipped" _why)
    string(STRIP "${_why}" _why)
  endif()
  specula_skip("${_why}")
  return()
endif()

set(ENV{SPECULA_PY_REFERENCE} "${REFERENCE}")
execute_process(
  COMMAND "${_python}" -m pytest -q -p no:cacheprovider "${TESTS}"
  WORKING_DIRECTORY "${TESTS}"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pytest failed (exit ${_rc}); the package build log is "
                      "${PACKAGE_DIR}/build.log")
endif()
