# Runs at ctest time: compiles SRC to PTX with NVCC (include directory INCLUDE, architecture
# ARCH) and fails when the PTX holds a fused multiply-add (fma.*.f32) or a product the
# assembler may still fuse (mul.f32 without a rounding mode). See tests/cuda/ptx/.
execute_process(
  COMMAND "${NVCC}" -std=c++20 -arch=${ARCH} -O3 --expt-relaxed-constexpr -ptx
          -I${INCLUDE} "${SRC}" -o "${OUT}"
  RESULT_VARIABLE rc
  ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvcc -ptx failed (${rc}):\n${err}")
endif()
file(READ "${OUT}" ptx)
if(ptx MATCHES "fma\\.[a-z]+\\.f32")
  message(FATAL_ERROR "the logit transforms were contracted into an FMA (${OUT})")
endif()
if(ptx MATCHES "mul\\.f32")
  message(FATAL_ERROR "a product without a rounding mode remains; ptxas may fuse it (${OUT})")
endif()
if(NOT ptx MATCHES "mul\\.rn\\.f32")
  message(FATAL_ERROR "no rounded product found: the probe did not compile as expected (${OUT})")
endif()
message(STATUS "no FMA contraction in the logit transforms")
