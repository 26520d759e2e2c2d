#pragma once

/// @file
/// A logit row's argmax and its softmax probability (the confidence), host and device
/// (SPECULA_HOST_DEVICE): the summary of a row that the diffusion loops (decode/ssd.hpp) read.
/// The example transformer's resident SSD computes it on the GPU with this function, one thread
/// per row, so only the summaries cross to the host.

#include <cmath>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"

namespace specula::detail {

/// Argmax (lowest id on ties) and its softmax probability for one logit row.
struct row_top {
  index_t token = -1;
  double confidence = 0.0;
};

/// row_top of row[0 .. V).
SPECULA_HOST_DEVICE inline row_top top_of(const float* row, index_t V) {
  row_top t;
  float best = -INFINITY;
  for (index_t y = 0; y < V; ++y)
    if (row[y] > best || t.token < 0) {
      best = row[y];
      t.token = y;
    }
  double sum = 0.0;
  for (index_t y = 0; y < V; ++y)
    sum += std::exp(static_cast<double>(row[y]) - static_cast<double>(best));
  t.confidence = sum > 0.0 ? 1.0 / sum : 0.0;
  return t;
}

}  // namespace specula::detail
