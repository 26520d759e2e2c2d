# Runs specula_demo twice (DEMO: the binary; ARGS_A, ARGS_B: ;-lists of arguments, each run
# with --json) and fails unless both runs produced the same image tokens for every sample.
# Used by examples.demo_image_lantern_exact: LANTERN++ with lambda = 0 accepts and resamples
# exactly as the exact rule, so `lantern --lambda 0` must reproduce `sd` token for token.
foreach(run A B)
  execute_process(COMMAND "${DEMO}" ${ARGS_${run}} --json --quiet OUTPUT_VARIABLE out_${run}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run ${run} (${ARGS_${run}}) exited with ${rc}")
  endif()
  string(JSON n_${run} LENGTH "${out_${run}}" samples)
endforeach()
if(NOT n_A EQUAL n_B OR n_A EQUAL 0)
  message(FATAL_ERROR "sample counts differ or are zero: ${n_A} vs ${n_B}")
endif()
math(EXPR last "${n_A} - 1")
foreach(i RANGE ${last})
  string(JSON tokens_A GET "${out_A}" samples ${i} image_tokens)
  string(JSON tokens_B GET "${out_B}" samples ${i} image_tokens)
  if(NOT tokens_A STREQUAL tokens_B)
    message(FATAL_ERROR "sample ${i}: the image tokens differ\n${tokens_A}\n${tokens_B}")
  endif()
endforeach()
message(STATUS "${n_A} samples, the same image tokens")
