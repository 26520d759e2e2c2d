# Runs two programs and fails unless both exit 0 and print the same standard output.
#   cmake -DFIRST=<program> -DSECOND=<program> -P compare_outputs.cmake
foreach(_which FIRST SECOND)
  execute_process(COMMAND "${${_which}}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out_${_which} ERROR_VARIABLE _err)
  message(STATUS "${${_which}}: exit ${_rc}\n${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${${_which}} failed (exit ${_rc}):\n${_out_${_which}}${_err}")
  endif()
endforeach()
if(NOT _out_FIRST STREQUAL _out_SECOND)
  message(FATAL_ERROR "outputs differ\n--- ${FIRST}\n${_out_FIRST}--- ${SECOND}\n${_out_SECOND}")
endif()
string(REGEX MATCHALL "\n" _lines "${_out_FIRST}")
list(LENGTH _lines _count)
message(STATUS "${_count} digest lines identical")
