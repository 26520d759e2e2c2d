# Runs specula_demo twice (DEMO: the binary; ARGS_A, ARGS_B: ;-lists of arguments, each run
# with --json) and fails unless both runs produced the same image tokens for every sample
# (FIELD: the sample's JSON member to compare, default image_tokens; text for the text task).
# Used by examples.demo_image_lantern_exact: LANTERN++ with lambda = 0 accepts and resamples
# exactly as the exact rule, so `lantern --lambda 0` must reproduce `sd` token for token; and by
# examples.demo_text_jf_multiblock: multi-block decoding on text-target-jf reproduces its greedy
# decoding.
if(NOT DEFINED FIELD)
  set(FIELD image_tokens)
endif()
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
  string(JSON tokens_A GET "${out_A}" samples ${i} ${FIELD})
  string(JSON tokens_B GET "${out_B}" samples ${i} ${FIELD})
  if(NOT tokens_A STREQUAL tokens_B)
    message(FATAL_ERROR "sample ${i}: the ${FIELD} differs\n${tokens_A}\n${tokens_B}")
  endif()
endforeach()
message(STATUS "${n_A} samples, the same ${FIELD}")
