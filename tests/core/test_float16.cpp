// bfloat16 / half storage types: exact widening, round-to-nearest-even narrowing, checked
// against values computed here from the definitions of the formats (ldexp in double).

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "specula/core/float16.hpp"
#include "specula/core/philox.hpp"

using namespace specula;

namespace {

/// The value of a 16-bit pattern of a binary format with `exponent_bits` and `mantissa_bits`
/// (1 + exponent_bits + mantissa_bits = 16) by its definition: bias 2^(exponent_bits-1) - 1,
/// subnormals at the lowest exponent, all-ones exponent for infinity and NaN.
double format_value(std::uint16_t h, int exponent_bits, int mantissa_bits) {
  const int sign = (h >> 15) != 0 ? -1 : 1;
  const int top = (1 << exponent_bits) - 1;
  const int e = (h >> mantissa_bits) & top;
  const int m = h & ((1 << mantissa_bits) - 1);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  if (e == top)
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - bias - mantissa_bits);
  return sign * std::ldexp(static_cast<double>((1 << mantissa_bits) + m), e - bias - mantissa_bits);
}

double half_value(std::uint16_t h) { return format_value(h, 5, 10); }
double bf16_value(std::uint16_t h) { return format_value(h, 8, 7); }

/// The nearest pattern among the finite non-negative patterns 0 .. max_finite (values
/// increasing with the pattern), ties to the even pattern; max_finite + 1 (infinity) when x is
/// at least the midpoint between the largest finite value and the next power of the spacing.
template <class ValueOf>
std::uint16_t nearest(double x, std::uint16_t max_finite, double overflow_at, ValueOf value_of) {
  if (x >= overflow_at) return static_cast<std::uint16_t>(max_finite + 1);
  std::uint16_t lo = 0;
  std::uint16_t hi = max_finite;
  while (lo < hi) {  // the last pattern whose value is <= x
    const auto mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (value_of(mid) <= x)
      lo = mid;
    else
      hi = static_cast<std::uint16_t>(mid - 1);
  }
  if (lo == max_finite || value_of(lo) == x) return lo;
  const double below = x - value_of(lo);
  const double above = value_of(static_cast<std::uint16_t>(lo + 1)) - x;
  if (below < above) return lo;
  if (above < below) return static_cast<std::uint16_t>(lo + 1);
  return (lo & 1) == 0 ? lo : static_cast<std::uint16_t>(lo + 1);
}

float random_float(std::uint32_t i) {
  // Random bits (every exponent equally likely), NaN excluded.
  for (std::uint32_t k = 0;; ++k) {
    const auto bits = philox4x32_10({i, k, 7, 0}, {11, 13})[0];
    const float f = std::bit_cast<float>(bits);
    if (f == f) return f;
  }
}

}  // namespace

TEST_CASE("half and bfloat16 widen exactly, every bit pattern", "[core][float16]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const double hv = half_value(h);
    const float hf = to_float(half{h});
    if (std::isnan(hv)) {
      CHECK(std::isnan(hf));
    } else {
      REQUIRE(static_cast<double>(hf) == hv);
      REQUIRE(std::signbit(hf) == ((h & 0x8000) != 0));
      REQUIRE(from_float<half>(hf).bits == h);  // round trip
    }
    const double bv = bf16_value(h);
    const float bf = to_float(bfloat16{h});
    if (std::isnan(bv)) {
      CHECK(std::isnan(bf));
    } else {
      REQUIRE(static_cast<double>(bf) == bv);
      REQUIRE(from_float<bfloat16>(bf).bits == h);
    }
  }
}

TEST_CASE("from_float rounds to nearest, ties to even", "[core][float16]") {
  const auto half_of = [](std::uint16_t h) { return half_value(h); };
  const auto bf16_of = [](std::uint16_t h) { return bf16_value(h); };
  // Overflow thresholds: the largest finite value plus half a spacing.
  const double half_overflow = 65504.0 + 16.0;
  const double bf16_overflow = bf16_value(0x7F7F) + std::ldexp(1.0, 127 - 8);
  std::vector<float> xs;
  for (std::uint32_t i = 0; i < 20000; ++i) xs.push_back(random_float(i));
  // Exact ties and their neighbours, small values and the overflow edge.
  for (const std::uint16_t h :
       {std::uint16_t{0x0001}, std::uint16_t{0x03FF}, std::uint16_t{0x0400}, std::uint16_t{0x3C00},
        std::uint16_t{0x3C01}, std::uint16_t{0x7BFE}}) {
    const double mid = (half_value(h) + half_value(static_cast<std::uint16_t>(h + 1))) / 2;
    xs.push_back(static_cast<float>(mid));
    xs.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
    xs.push_back(std::nextafter(static_cast<float>(mid), 1e30f));
  }
  for (const std::uint16_t h : {std::uint16_t{0x3F80}, std::uint16_t{0x3F81}, std::uint16_t{0x0001},
                                std::uint16_t{0x7F7E}}) {
    const double mid = (bf16_value(h) + bf16_value(static_cast<std::uint16_t>(h + 1))) / 2;
    xs.push_back(static_cast<float>(mid));
    xs.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
    xs.push_back(std::nextafter(static_cast<float>(mid), 3e38f));
  }
  for (const float x : {0.0f, -0.0f, 1e-8f, 2.9802322e-8f, 2.9802326e-8f, 65519.996f, 65520.0f,
                        std::numeric_limits<float>::infinity(), 1e-45f})
    xs.push_back(x);
  for (const float x : xs) {
    const double a = std::fabs(static_cast<double>(x));
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const auto want_half =
        static_cast<std::uint16_t>(sign | nearest(a, 0x7BFF, half_overflow, half_of));
    const auto want_bf16 =
        static_cast<std::uint16_t>(sign | nearest(a, 0x7F7F, bf16_overflow, bf16_of));
    INFO("x = " << x);
    REQUIRE(from_float<half>(x).bits == want_half);
    REQUIRE(from_float<bfloat16>(x).bits == want_bf16);
  }
  CHECK(std::isnan(to_float(from_float<half>(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(to_float(from_float<bfloat16>(std::numeric_limits<float>::quiet_NaN()))));
}
