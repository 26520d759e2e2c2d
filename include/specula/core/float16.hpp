#pragma once

/// @file
/// Host storage types for 16-bit floating-point logits: `bfloat16` (8-bit exponent, 7-bit
/// mantissa) and `half` (IEEE binary16: 5-bit exponent, 10-bit mantissa).
///
/// Both are a single `std::uint16_t` of bits, so a buffer of an engine's bf16/fp16 tensors
/// (PyTorch, __nv_bfloat16, __half, _Float16) can be viewed as an array of them without a copy.
/// They do no arithmetic: `to_float` widens exactly (every bf16 and fp16 value is a float), and
/// `from_float` narrows with round-to-nearest-even (for building test data and for callers that
/// need it). Both are pure integer code, so the result does not depend on the floating-point
/// environment (rounding mode, flush-to-zero) or on the compiler's flags.

#include <bit>
#include <cstdint>
#include <type_traits>

namespace specula {

/// bfloat16 storage: the upper 16 bits of a float.
struct bfloat16 {
  std::uint16_t bits = 0;
};

/// IEEE 754 binary16 storage.
struct half {
  std::uint16_t bits = 0;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);

/// Identity, so code templated on the logit type can widen every type the same way.
[[nodiscard]] constexpr float to_float(float x) noexcept { return x; }

/// The exact float value of a bfloat16 (NaN payloads are kept).
[[nodiscard]] constexpr float to_float(bfloat16 x) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

/// The exact float value of a binary16 (subnormals, infinities and NaN included).
[[nodiscard]] constexpr float to_float(half x) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t magnitude = x.bits & 0x7FFFu;
  std::uint32_t out = 0;
  if (magnitude >= 0x7C00u) {  // infinity or NaN
    out = sign | 0x7F800000u | ((magnitude & 0x03FFu) << 13);
  } else if (magnitude >= 0x0400u) {  // normal: rebias the exponent by 127 - 15
    out = sign | ((magnitude << 13) + (112u << 23));
  } else if (magnitude != 0u) {                         // subnormal: magnitude * 2^-24, normalised
    const int lead = std::countl_zero(magnitude) - 21;  // shift that puts the top bit at bit 10
    const std::uint32_t mantissa = (magnitude << lead) & 0x03FFu;
    const auto exponent = static_cast<std::uint32_t>(113 - lead);  // 2^(1 - 15 - lead) biased
    out = sign | (exponent << 23) | (mantissa << 13);
  } else {
    out = sign;
  }
  return std::bit_cast<float>(out);
}

namespace detail {

/// `value >> shift` rounded to nearest, ties to even (shift in [1, 31]).
[[nodiscard]] constexpr std::uint32_t shift_round_even(std::uint32_t value, int shift) noexcept {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  return kept + ((rest > halfway || (rest == halfway && (kept & 1u) != 0u)) ? 1u : 0u);
}

}  // namespace detail

/// Identity, so code templated on the logit type can narrow every type the same way.
template <class T>
requires std::is_same_v<T, float>
[[nodiscard]] constexpr T from_float(float x) noexcept { return x; }

/// The bfloat16 nearest to `x` (ties to even); NaN stays NaN (quiet), overflow gives infinity.
template <class T>
requires std::is_same_v<T, bfloat16>
[[nodiscard]] constexpr T from_float(float x) noexcept {
  const auto b = std::bit_cast<std::uint32_t>(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return T{static_cast<std::uint16_t>((b >> 16) | 0x0040u)};
  // Rounding may carry into the exponent; past the largest finite value that gives infinity.
  return T{static_cast<std::uint16_t>(detail::shift_round_even(b & 0x7FFFFFFFu, 16) |
                                      ((b >> 16) & 0x8000u))};
}

/// The binary16 nearest to `x` (ties to even); NaN stays NaN (quiet), |x| >= 65520 gives
/// infinity, tiny values become subnormal or signed zero.
template <class T>
requires std::is_same_v<T, half>
[[nodiscard]] constexpr T from_float(float x) noexcept {
  const auto b = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  const std::uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return T{static_cast<std::uint16_t>(sign | 0x7E00u)};
  if (a >= 0x477FF000u) return T{static_cast<std::uint16_t>(sign | 0x7C00u)};  // >= 65520
  if (a >= 0x38800000u)  // >= 2^-14: normal; rebias, round 23 -> 10 mantissa bits
    return T{static_cast<std::uint16_t>(sign | detail::shift_round_even(a - (112u << 23), 13))};
  // Below 2^-14: a multiple of 2^-24 (possibly 2^-14 itself after rounding), i.e. the value
  // (1.m * 2^(e - 127)) * 2^24 rounded to an integer. Float subnormals round to zero.
  const int e = static_cast<int>(a >> 23);
  const int shift = 126 - e;  // value * 2^24 = (mantissa | 2^23) >> shift
  if (e == 0 || shift > 24) return T{sign};
  return T{static_cast<std::uint16_t>(
      sign | detail::shift_round_even((a & 0x007FFFFFu) | 0x00800000u, shift))};
}

}  // namespace specula
