# Fails unless every header under include/specula is reachable from the umbrella header
# <specula/specula.hpp> through its "specula/..." includes, or is listed as deliberately separate.
#   cmake -DINCLUDE_DIR=<repo>/include -P umbrella_reach.cmake
#
# Deliberately separate: the testing kit (specula/testing/*: needs Boost.Math, and catch2.hpp
# needs Catch2; CMake target specula::testing). Everything else is part of the umbrella.
cmake_minimum_required(VERSION 3.20)
set(_separate_regex "^specula/testing/")

file(GLOB_RECURSE _all RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/specula/*.hpp")
set(_reached "")
set(_queue "specula/specula.hpp")
while(_queue)
  list(POP_FRONT _queue _h)
  if(_h IN_LIST _reached)
    continue()
  endif()
  list(APPEND _reached "${_h}")
  if(NOT EXISTS "${INCLUDE_DIR}/${_h}")
    message(FATAL_ERROR "${_h} is included but does not exist")
  endif()
  file(STRINGS "${INCLUDE_DIR}/${_h}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]specula/")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*$" "\\1" _inc "${_line}")
    list(APPEND _queue "${_inc}")
  endforeach()
endwhile()

set(_missing "")
list(LENGTH _all _count)
foreach(_h IN LISTS _all)
  if(_h MATCHES "${_separate_regex}")
    if(_h IN_LIST _reached)
      message(FATAL_ERROR "${_h} is listed as separate but the umbrella includes it")
    endif()
  elseif(NOT _h IN_LIST _reached)
    list(APPEND _missing "${_h}")
  endif()
endforeach()
if(_missing)
  list(JOIN _missing "\n  " _text)
  message(FATAL_ERROR "not reachable from specula/specula.hpp (include them there, or list "
                      "them as separate in tests/cmake/umbrella_reach.cmake):\n  ${_text}")
endif()
message(STATUS "${_count} headers: all reachable from specula/specula.hpp or listed as separate")
