# cmake -DCLANG_FORMAT=<exe> -DROOT=<repo> -P check_format.cmake
# Fails (listing the files) if any C++ source under include/, cuda/, tests/, bench/, examples/,
# python/src/ differs from clang-format's output.
file(GLOB_RECURSE sources
     "${ROOT}/include/*.hpp" "${ROOT}/cuda/*.cuh" "${ROOT}/cuda/*.hpp"
     "${ROOT}/tests/*.cpp" "${ROOT}/tests/*.hpp" "${ROOT}/tests/*.cu"
     "${ROOT}/bench/*.cpp" "${ROOT}/bench/*.hpp" "${ROOT}/bench/*.cu" "${ROOT}/bench/*.cuh"
     "${ROOT}/examples/*.cpp" "${ROOT}/examples/*.hpp"
     "${ROOT}/python/src/*.cpp" "${ROOT}/python/src/*.hpp")
list(FILTER sources EXCLUDE REGEX "/tests/package/")
set(bad "")
foreach(f IN LISTS sources)
  execute_process(COMMAND "${CLANG_FORMAT}" --dry-run --Werror "${f}"
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND bad "${f}")
  endif()
endforeach()
if(bad)
  list(JOIN bad "\n  " listing)
  message(FATAL_ERROR "not clang-formatted (run scripts/lint.sh --fix):\n  ${listing}")
endif()
list(LENGTH sources n)
message(STATUS "${n} files formatted")
