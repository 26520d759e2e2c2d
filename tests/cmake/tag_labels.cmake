# Runs at ctest time (a TEST_INCLUDE_FILES script): gives every discovered Catch2 test the
# ctest labels of its area and of its Catch2 tags, so that e.g. `ctest -L stats` runs every
# statistical test and `ctest -L tree` every tree test, whichever executable holds them.
#
# Inputs: exe (test executable), prefix (ctest name prefix), area_label.
# Catch2 v2 prints `--list-tests` as "  <name>" lines followed by "      [tag][tag]" lines; the
# test main is built with a console width wide enough that names are not wrapped.
if(NOT EXISTS "${exe}")
  return()
endif()
execute_process(COMMAND "${exe}" --list-tests OUTPUT_VARIABLE out ERROR_QUIET)
string(REPLACE ";" "\\;" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
set(name "")
foreach(line IN LISTS lines)
  if(line MATCHES "^      (\\[.*\\])$" AND NOT name STREQUAL "")
    string(REGEX MATCHALL "\\[[^]]+\\]" tags "${CMAKE_MATCH_1}")
    set(labels "${area_label}")
    foreach(tag IN LISTS tags)
      string(REGEX REPLACE "^\\[(.*)\\]$" "\\1" tag "${tag}")
      if(NOT tag MATCHES "^[.!#]")
        list(APPEND labels "${tag}")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES labels)
    set_tests_properties("${prefix}${name}" PROPERTIES LABELS "${labels}")
    set(name "")
  elseif(line MATCHES "^  ([^ ].*)$")
    set(name "${CMAKE_MATCH_1}")
  endif()
endforeach()
