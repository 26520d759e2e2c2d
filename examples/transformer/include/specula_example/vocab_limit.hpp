#pragma once

/// @file
/// A vocabulary limit on a model's logit rows, host and device (SPECULA_HOST_DEVICE): the
/// logits of tokens at or past the limit are -inf, so no sampling rule, verifier or argmax ever
/// returns them (the class-conditional image model's label tokens, which are never image
/// tokens). `transformer::set_vocab_limit` applies it to every row of the host forward pass and
/// `device_transformer::set_vocab_limit` to every row on the GPU (one small kernel after the
/// vocabulary GEMM, so the resident loops see restricted rows without any row crossing).

#include <cmath>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"

namespace specula::example::detail {

/// Sets row[limit + first], row[limit + first + step], ... below V to -inf (first = 0, step = 1:
/// the whole tail [limit, V); a CTA's threads split it with first = thread, step = threads).
struct vocab_limit_op {
  index_t limit;
  SPECULA_HOST_DEVICE void operator()(float* row, index_t V, index_t first = 0,
                                      index_t step = 1) const {
    for (index_t y = limit + first; y < V; y += step) row[y] = -INFINITY;
  }
};

}  // namespace specula::example::detail
