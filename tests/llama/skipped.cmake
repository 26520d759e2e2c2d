# llama.skipped: stands for the llama tests when -DSPECULA_WITH_LLAMA_CPP=ON could not provide
# llama.cpp (WHY: the reason cmake/SpeculaLlamaCpp.cmake gave); reported as skipped.
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/skip.cmake")
specula_skip("llama.cpp integration: ${WHY}")
