// Philox4x32-10 against the Random123 known-answer vectors; uniform conversions; streams.

#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <vector>

#include "specula/core/philox.hpp"
#include "specula/core/rng.hpp"

using namespace specula;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[core][rng]") {
  // From Random123's kat_vectors (format: counter[4] key[2] -> output[4]).
  struct kat {
    u32x4 ctr;
    u32x2 key;
    u32x4 expected;
  };
  const kat vectors[] = {
      {{{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
       {{0x00000000u, 0x00000000u}},
       {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {{0xffffffffu, 0xffffffffu}},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {{0xa4093822u, 0x299f31d0u}},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& v : vectors) CHECK(philox4x32_10(v.ctr, v.key) == v.expected);
  // The generator is constexpr: the first vector checked at compile time.
  static_assert(philox4x32_10(u32x4{{0, 0, 0, 0}}, u32x2{{0, 0}}) ==
                u32x4{{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
}

TEST_CASE("uniform conversions never return 0 or 1", "[core][rng]") {
  CHECK(uniform_float_open(0u) > 0.0f);
  CHECK(uniform_float_open(0xffffffffu) < 1.0f);
  CHECK(uniform_float_open(0u) == 0x1p-24f);
  CHECK(uniform_float_open(0xffffffffu) == 1.0f - 0x1p-24f);
  CHECK(uniform_double_open(0u, 0u) > 0.0);
  CHECK(uniform_double_open(0xffffffffu, 0xffffffffu) < 1.0);
  CHECK(uniform_double_open(0u, 0u) == 0x1p-53);
  CHECK(uniform_double_open(0xffffffffu, 0xffffffffu) == 1.0 - 0x1p-53);
  // log and division are finite at both ends.
  CHECK(std::isfinite(std::log(uniform_double_open(0u, 0u))));
  CHECK(std::isfinite(1.0 / (1.0 - uniform_double_open(0xffffffffu, 0xffffffffu))));
}

TEST_CASE("uniforms from a stream are uniform (chi-square on 64 bins)", "[core][rng]") {
  const request_rng rng{12345, 7, 3};
  std::vector<double> counts(64, 0.0);
  const int n = 200000;
  for (int i = 0; i < n; ++i)
    counts[static_cast<std::size_t>(uniform_at(rng, draw_id{static_cast<std::uint32_t>(i), 0}) *
                                    64)] += 1;
  double x2 = 0;
  const double e = n / 64.0;
  for (double c : counts) x2 += (c - e) * (c - e) / e;
  // 63 degrees of freedom: mean 63, sd ~11.2; 150 is > 7 sd above the mean.
  CHECK(x2 < 150.0);
}

TEST_CASE("draw points map to distinct counters and streams to distinct numbers", "[core][rng]") {
  std::set<std::uint32_t> seen;
  int draws = 0;
  for (std::uint32_t req = 0; req < 4; ++req)
    for (std::uint32_t step = 0; step < 4; ++step)
      for (std::uint32_t pos = 0; pos < 8; ++pos)
        for (std::uint32_t slot : {0u, 1u, category_slot_base}) {
          seen.insert(random_bits(request_rng{99, req, step}, draw_id{pos, slot}).v[0]);
          ++draws;
        }
  CHECK(seen.size() == static_cast<std::size_t>(draws));  // no collision among 384 words
  CHECK(uniform_at({1, 0, 0}, {0, 0}) != uniform_at({2, 0, 0}, {0, 0}));
  CHECK(fold_in(1, 2) != fold_in(1, 3));
  CHECK(fold_in(1, 2) != fold_in(2, 2));
  CHECK(fold_in(1, 2) == fold_in(1, 2));
}
