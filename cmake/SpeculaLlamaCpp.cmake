# The optional llama.cpp integration (-DSPECULA_WITH_LLAMA_CPP=ON): specula's decoding loops over
# a real engine (examples/llama_cpp/, tests/llama/, ctest label `llama`).
#
# specula_find_llama_cpp() sets SPECULA_HAS_LLAMA_CPP (and SPECULA_GGUF_PYTHON, a Python with the
# `gguf` package for tools/to_gguf.py) in the caller's scope:
#   - a llama.cpp the user points at (llama_DIR or CMAKE_PREFIX_PATH with a llama-config.cmake)
#     is used as it is;
#   - otherwise scripts/llama_cpp.sh fetches the pinned llama-cpp-python sdist from PyPI (by
#     version and sha256) and builds libllama + ggml from its vendored llama.cpp into a cache
#     folder outside the build tree (~/.cache/specula/llama-cpp-python-<version>-<flavour>),
#     once; later configures only find it there;
#   - without access to PyPI the integration is skipped with a message (the `llama` tests then
#     report skipped), as the Python package and Conan tests are.
include_guard(GLOBAL)

function(specula_find_llama_cpp)
  set(SPECULA_HAS_LLAMA_CPP OFF PARENT_SCOPE)
  set(_script "${PROJECT_SOURCE_DIR}/scripts/llama_cpp.sh")
  find_package(llama CONFIG QUIET)
  if(NOT llama_FOUND)
    message(STATUS "specula: llama.cpp: scripts/llama_cpp.sh (fetch + build once into the cache)")
    execute_process(COMMAND bash "${_script}" RESULT_VARIABLE _rc
                    OUTPUT_VARIABLE _prefix OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 2)
      set(SPECULA_LLAMA_CPP_SKIPPED "the pinned llama.cpp could not be fetched from PyPI"
          PARENT_SCOPE)
      message(STATUS "specula: llama.cpp integration skipped: the pinned llama-cpp-python sdist "
                     "could not be fetched from PyPI")
      return()
    elseif(NOT _rc EQUAL 0)
      message(FATAL_ERROR "specula: scripts/llama_cpp.sh failed (exit ${_rc}); see its log above")
    endif()
    find_package(llama CONFIG REQUIRED PATHS "${_prefix}" NO_DEFAULT_PATH)
  endif()
  execute_process(COMMAND bash "${_script}" --python RESULT_VARIABLE _rc
                  OUTPUT_VARIABLE _python OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    set(SPECULA_LLAMA_CPP_SKIPPED "no Python with the gguf package (PyPI)" PARENT_SCOPE)
    message(STATUS "specula: llama.cpp integration skipped: no Python with the gguf package")
    return()
  endif()
  message(STATUS "specula: llama.cpp ${llama_VERSION} (${llama_DIR}); gguf: ${_python}")
  set(SPECULA_GGUF_PYTHON "${_python}" PARENT_SCOPE)
  set(SPECULA_HAS_LLAMA_CPP ON PARENT_SCOPE)
endfunction()
