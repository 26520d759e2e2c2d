// Compiled to PTX by the cuda.no_fma_contraction test (tests/cmake/check_no_fma.cmake), never
// linked: the logit transforms shared by the host and the device (cfg_mix_op, temperature_op)
// followed by the max subtraction of the softmax passes. Each operation must stay rounded on
// its own (mul.rn / add.rn / sub.rn): an fma here would give the device other logits than the
// host's, and other logits in one pass than in another (docs/cuda.md, "Determinism").

#include "specula/sample/transforms.hpp"

__global__ void specula_contraction_probe(const float* cond, const float* uncond, float scale,
                                          float inv_temperature, float max_logit, float* out) {
  const auto i = static_cast<int>(threadIdx.x);
  const specula::cfg_mix_op mix{scale};
  const specula::temperature_op temperature{inv_temperature};
  out[i] = temperature(mix(cond[i], uncond[i])) - max_logit;
}
