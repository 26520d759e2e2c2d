#pragma once

/// @file
/// Sampling k distinct categories from an unnormalised weight row (sampling without
/// replacement).
///
/// Two methods with the same law (the law of drawing one category at a time from the weights
/// renormalised over the categories not yet drawn):
///   - `sample_without_replacement_keys`: exponential keys E_i / w(i) with E_i ~ Exp(1) from the
///     per-category slots of a request's Philox stream, keeping the k smallest (a one-pass top-k
///     selection; Efraimidis–Spirakis / the Gumbel-top-k trick). Sorting the kept keys gives the
///     categories in the order a sequential draw would produce them.
///   - `sample_without_replacement_sequential`: k rounds of inverse-CDF sampling through a
///     random source, each excluding the categories already drawn. It makes k + 1 passes over
///     the row but draws through the random_source interface, so its law can be enumerated
///     exactly (specula/testing/enumerate.hpp).

#include <cmath>
#include <cstdint>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/sample/random_source.hpp"

namespace specula {

/// The Philox block holding the 32-bit words of categories 4·(i / 4) .. 4·(i / 4) + 3 (word
/// i % 4 is category i's).
SPECULA_HOST_DEVICE inline u32x4 exponential_key_bits(const request_rng& rng,
                                                      std::uint32_t position, index_t i) noexcept {
  return random_bits(rng,
                     draw_id{position, category_slot_base + static_cast<std::uint32_t>(i / 4)});
}

/// E / w with E = -log(u), u = (bits + 0.5) / 2^32 in (0, 1): the key of a category with weight
/// w > 0 and random word `bits`.
SPECULA_HOST_DEVICE inline double exponential_key_from_bits(std::uint32_t bits, double w) noexcept {
  const double u = (static_cast<double>(bits) + 0.5) * 0x1p-32;
  return -std::log(u) / w;
}

/// Exponential key of category i for the without-replacement sampler: E_i / w with
/// E_i = -log(u_i), u_i the 32-bit uniform of category i in the per-category slots of
/// (rng, position). Smaller keys win.
SPECULA_HOST_DEVICE inline double exponential_key(const request_rng& rng, std::uint32_t position,
                                                  index_t i, double w) noexcept {
  const u32x4 bits = exponential_key_bits(rng, position, i);
  return exponential_key_from_bits(bits.v[i % 4], w);
}

/// Draws min(k, number of positive weights) distinct categories with the exponential-key
/// method, in one pass over the row. Writes them to out[0..] in draw order (ascending key) and
/// their keys to keys[0..] (both caller-provided, k elements each); returns how many were drawn.
/// Categories with w(i) <= 0 are never drawn. The same (rng, position) selects the same
/// categories on every call, and the first category equals sample_exponential_race's choice.
template <class WeightFn>
SPECULA_HOST_DEVICE index_t sample_without_replacement_keys(index_t n, WeightFn&& w, index_t k,
                                                            const request_rng& rng,
                                                            std::uint32_t position, token_t* out,
                                                            double* keys) noexcept {
  index_t count = 0;
  if (k <= 0) return 0;
  for (index_t i = 0; i < n; ++i) {
    const double wi = w(i);
    if (!(wi > 0.0)) continue;
    const double key = exponential_key(rng, position, i, wi);
    if (count == k && !(key < keys[k - 1])) continue;
    // Insertion into the sorted list of the best `count` keys (k is small).
    index_t j = count < k ? count++ : k - 1;
    while (j > 0 && key < keys[j - 1]) {
      keys[j] = keys[j - 1];
      out[j] = out[j - 1];
      --j;
    }
    keys[j] = key;
    out[j] = static_cast<token_t>(i);
  }
  return count;
}

/// Draws min(k, number of positive weights) distinct categories one at a time: round r samples
/// from the weights with the r categories already drawn removed (inverse CDF through `src`, at
/// draw_id{position, slot_base + r}). Writes them to out[0..] in draw order; returns the count.
template <random_source Source, class WeightFn>
SPECULA_HOST_DEVICE index_t sample_without_replacement_sequential(Source& src, index_t n,
                                                                  WeightFn&& w, index_t k,
                                                                  std::uint32_t position,
                                                                  std::uint32_t slot_base,
                                                                  token_t* out) {
  index_t count = 0;
  for (; count < k; ++count) {
    auto remaining = [&](index_t i) {
      for (index_t j = 0; j < count; ++j)
        if (static_cast<index_t>(out[j]) == i) return 0.0;
      return w(i);
    };
    const double total = positive_mass(n, remaining);
    if (!(total > 0.0)) break;
    const index_t c = src.categorical(
        n, remaining, total, draw_id{position, slot_base + static_cast<std::uint32_t>(count)});
    if (c < 0) break;
    out[count] = static_cast<token_t>(c);
  }
  return count;
}

}  // namespace specula
