#pragma once

/// @file
/// Philox4x32-10 counter-based random number generator (Salmon et al., "Parallel random numbers:
/// as easy as 1, 2, 3", SC 2011), and conversions of its output to uniforms in the open
/// interval (0, 1).
///
/// The generator is a pure function (key, counter) -> 4 x u32, so the same inputs give the same
/// numbers on the host and on a GPU, in any order and on any thread.

#include <cstdint>

#include "specula/core/config.hpp"

namespace specula {

/// Four 32-bit words: a Philox counter or output block.
struct u32x4 {
  std::uint32_t v[4];
  SPECULA_HOST_DEVICE constexpr std::uint32_t operator[](int i) const noexcept { return v[i]; }
  friend constexpr bool operator==(const u32x4&, const u32x4&) = default;
};

/// Two 32-bit words: a Philox key.
struct u32x2 {
  std::uint32_t v[2];
  SPECULA_HOST_DEVICE constexpr std::uint32_t operator[](int i) const noexcept { return v[i]; }
  friend constexpr bool operator==(const u32x2&, const u32x2&) = default;
};

namespace detail {

inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;  // sqrt(3) - 1

SPECULA_HOST_DEVICE constexpr u32x4 philox_round(u32x4 c, u32x2 k) noexcept {
  const std::uint64_t p0 = static_cast<std::uint64_t>(philox_m0) * c.v[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c.v[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32);
  const auto lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32);
  const auto lo1 = static_cast<std::uint32_t>(p1);
  return u32x4{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}

}  // namespace detail

/// Philox4x32 with `Rounds` rounds (10 is the standard, crush-resistant choice).
template <int Rounds = 10>
SPECULA_HOST_DEVICE constexpr u32x4 philox4x32(u32x4 counter, u32x2 key) noexcept {
  for (int r = 0; r < Rounds; ++r) {
    if (r > 0) {
      key.v[0] += detail::philox_w0;
      key.v[1] += detail::philox_w1;
    }
    counter = detail::philox_round(counter, key);
  }
  return counter;
}

/// Philox4x32-10.
SPECULA_HOST_DEVICE constexpr u32x4 philox4x32_10(u32x4 counter, u32x2 key) noexcept {
  return philox4x32<10>(counter, key);
}

/// Uniform float in the open interval (0, 1) from 23 random bits:
/// (k + 0.5) * 2^-23 for k in [0, 2^23), so the result lies in [2^-24, 1 - 2^-24] and is never
/// exactly 0 or 1 (safe before a division or a log).
SPECULA_HOST_DEVICE constexpr float uniform_float_open(std::uint32_t bits) noexcept {
  return (static_cast<float>(bits >> 9) + 0.5f) * 0x1p-23f;
}

/// Uniform double in the open interval (0, 1) from 52 random bits of two words:
/// (k + 0.5) * 2^-52, so the result lies in [2^-53, 1 - 2^-53], never exactly 0 or 1.
SPECULA_HOST_DEVICE constexpr double uniform_double_open(std::uint32_t hi,
                                                         std::uint32_t lo) noexcept {
  const std::uint64_t k = (static_cast<std::uint64_t>(hi) << 20) | (lo >> 12);
  return (static_cast<double>(k) + 0.5) * 0x1p-52;
}

}  // namespace specula
