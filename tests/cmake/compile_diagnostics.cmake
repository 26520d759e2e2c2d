# Compiles one translation unit as a consumer would (plain -I, no specula target) and checks
# the compiler's diagnostics.
#   cmake -DCXX=<compiler> -DINCLUDE_DIR=<dir> -DSOURCE=<file> -DFLAGS=<;-list>
#         -DEXPECT=FAIL|PASS [-DMATCH=<regex>] [-DMAX_ERRORS=<n>] [-DNO_WARNINGS=ON]
#         -P compile_diagnostics.cmake
# EXPECT=FAIL: the compile must fail, its output must match MATCH, and it must report at most
# MAX_ERRORS diagnostics "error:" (so a required-standard check stops at its own message).
# EXPECT=PASS with NO_WARNINGS: the compile must succeed with no "warning:" line.
execute_process(COMMAND "${CXX}" ${FLAGS} -fsyntax-only "-I${INCLUDE_DIR}" "${SOURCE}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message(STATUS "exit ${_rc}\n${_out}")
if(EXPECT STREQUAL "FAIL")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "the compile succeeded, expected it to fail")
  endif()
  if(DEFINED MATCH AND NOT _out MATCHES "${MATCH}")
    message(FATAL_ERROR "the output does not match '${MATCH}'")
  endif()
  if(DEFINED MAX_ERRORS)
    string(REGEX MATCHALL "error:" _errors "${_out}")
    list(LENGTH _errors _n)
    if(_n GREATER MAX_ERRORS)
      message(FATAL_ERROR "${_n} errors, expected at most ${MAX_ERRORS}")
    endif()
  endif()
else()
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "the compile failed (exit ${_rc})")
  endif()
  if(NO_WARNINGS AND _out MATCHES "warning:")
    message(FATAL_ERROR "the compile printed warnings")
  endif()
endif()
