# Warning flags for specula's own targets (tests, benchmarks, examples,
# header checks). Never applied to the INTERFACE targets users consume.
include_guard(GLOBAL)

set(_specula_werror_default OFF)
if(DEFINED ENV{SPECULA_WERROR} AND "$ENV{SPECULA_WERROR}")
  set(_specula_werror_default ON)
endif()
option(SPECULA_WERROR "Treat warnings as errors in specula's own targets"
       ${_specula_werror_default})

# specula_set_warnings(<target>)
function(specula_set_warnings target)
  if(MSVC)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CXX>:/W4;/permissive->")
    if(SPECULA_WERROR)
      target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:/WX>")
    endif()
    return()
  endif()

  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic;-Wshadow>"
    # nvcc: forward to the host compiler. -Wpedantic is left out because the
    # host code nvcc generates is not pedantic-clean.
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow>")
  if(SPECULA_WERROR)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CXX>:-Werror>"
      "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>")
  endif()
endfunction()
