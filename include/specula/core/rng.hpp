#pragma once

/// @file
/// Per-request randomness built on Philox4x32-10.
///
/// A request's random numbers are a pure function of (seed, request id, step, position, slot):
///
///     key     = (low 32 bits of seed, high 32 bits of seed)
///     counter = (slot, position, step, request id)
///
/// so a request draws the same numbers whatever its position in a batch, whatever other requests
/// share the batch, and on either backend. The mapping is injective: two different draw points
/// never share a counter.
///
/// Slot allocation used by the library's verifiers (documented in docs/api.md):
///   - slots [0, 2^31): scalar draws at a position (chain verification uses slot 0 for the
///     acceptance test and slot 1 for the residual or bonus sample);
///   - slots [2^31, 2^32): per-category blocks for samplers that need one number per category
///     (exponential race / Gumbel keys): block b covers categories 4b .. 4b+3.

#include <cstdint>

#include "specula/core/config.hpp"
#include "specula/core/philox.hpp"

namespace specula {

/// The random stream of one request for one decoding step.
struct request_rng {
  std::uint64_t seed = 0;        ///< the request's seed (per-request seeds are supported)
  std::uint32_t request_id = 0;  ///< distinguishes requests that share a seed
  std::uint32_t step = 0;        ///< decoding step (iteration) number

  friend constexpr bool operator==(const request_rng&, const request_rng&) = default;
};

/// A point in a request's stream: the position within the step, and a slot at that position.
struct draw_id {
  std::uint32_t position = 0;
  std::uint32_t slot = 0;
};

/// First slot of the per-category blocks.
inline constexpr std::uint32_t category_slot_base = 0x80000000u;

/// Philox key of a 64-bit seed.
SPECULA_HOST_DEVICE constexpr u32x2 philox_key(std::uint64_t seed) noexcept {
  return u32x2{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
}

/// The four random words at `at` in the stream of `rng`.
SPECULA_HOST_DEVICE constexpr u32x4 random_bits(const request_rng& rng, draw_id at) noexcept {
  return philox4x32_10(u32x4{{at.slot, at.position, rng.step, rng.request_id}},
                       philox_key(rng.seed));
}

/// A uniform double in (0, 1) at `at` (52 random bits; never exactly 0 or 1).
SPECULA_HOST_DEVICE constexpr double uniform_at(const request_rng& rng, draw_id at) noexcept {
  const u32x4 w = random_bits(rng, at);
  return uniform_double_open(w.v[0], w.v[1]);
}

/// Derives an independent 64-bit seed from `seed` and `data` (e.g. a 64-bit request id or a
/// hash of a user string), by encrypting `data` under the key of `seed`.
SPECULA_HOST_DEVICE constexpr std::uint64_t fold_in(std::uint64_t seed,
                                                    std::uint64_t data) noexcept {
  const u32x4 w = philox4x32_10(u32x4{{static_cast<std::uint32_t>(data),
                                       static_cast<std::uint32_t>(data >> 32), 0u, 0x5EEDF01Du}},
                                philox_key(seed));
  return (static_cast<std::uint64_t>(w.v[1]) << 32) | w.v[0];
}

}  // namespace specula
