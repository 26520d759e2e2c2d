# specula_skip(<why>): report a script-mode test (cmake -P) as skipped: prints
# "SPECULA_TEST_SKIPPED: <why>", which the test's SKIP_REGULAR_EXPRESSION matches, and exits 77
# (its SKIP_RETURN_CODE) where CMake can. The caller returns after it.
function(specula_skip why)
  message("SPECULA_TEST_SKIPPED: ${why}")
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.29)
    cmake_language(EXIT 77)  # SKIP_RETURN_CODE; older CMake: SKIP_REGULAR_EXPRESSION
  endif()
endfunction()
