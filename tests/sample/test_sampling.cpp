// Batched sampling (sample/sampling.hpp): exact law of one draw, G-tests of the batched calls
// against laws computed independently (hand-normalised weights; the sort-based reference
// pipeline), greedy rows mixed with sampled ones, and bad input.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "specula/sample/sampling.hpp"
#include "specula/testing/catch2.hpp"
#include "specula/testing/reference_transforms.hpp"

using namespace specula;

namespace {

using testing::reference_law;
std::vector<double> normalised(const std::vector<float>& w) { return testing::normalised_law(w); }

std::vector<request_rng> streams(index_t n, std::uint64_t seed) {
  std::vector<request_rng> r;
  for (index_t i = 0; i < n; ++i) r.push_back({seed, static_cast<std::uint32_t>(i), 3});
  return r;
}

}  // namespace

TEST_CASE("one draw from weights has law w / sum(w)", "[sample][stats]") {
  const std::vector<float> w = {0.5f, 0.0f, 2.0f, 1.0f, 0.25f};  // not normalised
  const std::vector<double> p = normalised(w);
  const auto draw = [&](auto& src) {
    const row_view<const float> row{w.data(), 5};
    return detail::sample_weights(src, 5, detail::row_weights<float>{row});
  };
  SPECULA_REQUIRE_LOSSLESS(p, draw);
}

TEST_CASE("sample_from_probs fits each row's law (G-test)", "[sample][stats]") {
  const index_t V = 5, per_row = 20000;
  const std::vector<std::vector<float>> rows = {{0.1f, 0.2f, 0.3f, 0.4f, 0.0f},
                                                {3.0f, 0.0f, 0.0f, 1.0f, 1.0f}};
  // Rows alternate between the two laws.
  const index_t B = 2 * per_row;
  std::vector<float> probs;
  for (index_t r = 0; r < B; ++r) {
    const auto& row = rows[static_cast<std::size_t>(r % 2)];
    probs.insert(probs.end(), row.begin(), row.end());
  }
  const auto rng = streams(B, 11);
  std::vector<token_t> out(static_cast<std::size_t>(B), -7);
  sample_from_probs(host::par, batch_view<const float>{probs.data(), B, V}, rng, out);
  for (std::size_t k = 0; k < 2; ++k) {
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(V), 0);
    for (index_t r = static_cast<index_t>(k); r < B; r += 2)
      ++counts[static_cast<std::size_t>(out[static_cast<std::size_t>(r)])];
    SPECULA_REQUIRE_FITS(counts, normalised(rows[k]), 1e-4);
    SPECULA_REQUIRE_MISFITS(counts, normalised(rows[1 - k]), 1e-9);  // negative control
  }
  // The same streams give the same tokens sequentially, and in double.
  std::vector<token_t> seq_out(out.size());
  sample_from_probs(batch_view<const float>{probs.data(), B, V}, rng, seq_out);
  CHECK(seq_out == out);
  std::vector<double> probs_d(probs.begin(), probs.end());
  std::vector<token_t> d_out(out.size());
  sample_from_probs(batch_view<const double>{probs_d.data(), B, V}, rng, d_out);
  CHECK(d_out == out);
}

TEST_CASE("sample_from_logits fits the reference pipeline's law per row (G-test)",
          "[sample][stats]") {
  const testing::filtered_rows_case c(15000);
  const auto& logits = c.logits;
  const auto& params = c.params;
  const index_t V = c.vocab(), B = c.rows;
  const auto rng = streams(B, 5);
  std::vector<token_t> out(static_cast<std::size_t>(B));
  sample_from_logits<float>(host::par, batch_view<const float>{c.data.data(), B, V}, c.per_row, rng,
                            out);
  const auto plain = reference_law(params[0], logits);
  for (std::size_t k = 0; k < 4; ++k) {
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(V), 0);
    for (index_t r = static_cast<index_t>(k); r < B; r += 4)
      ++counts[static_cast<std::size_t>(out[static_cast<std::size_t>(r)])];
    INFO("params " << k);
    SPECULA_REQUIRE_FITS(counts, reference_law(params[k], logits), 1e-4);
    if (k > 0) SPECULA_REQUIRE_MISFITS(counts, plain, 1e-9);  // the filters are applied
  }
}

TEST_CASE("greedy and sampled rows in one sample_from_logits call", "[sample]") {
  const index_t V = 6, B = 8;
  std::vector<float> rows;
  for (index_t r = 0; r < B; ++r)
    for (index_t i = 0; i < V; ++i)
      rows.push_back(std::sin(static_cast<float>(3 * r + 7 * i)) * 2.0f);
  rows[static_cast<std::size_t>(2 * V + 4)] = rows[static_cast<std::size_t>(2 * V + 1)] =
      9.0f;  // tie
  const std::vector<std::uint8_t> greedy = {1, 0, 1, 0, 0, 1, 0, 1};
  const auto rng = streams(B, 9);
  sampling_params sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  const std::vector<sampling_params> one{sp};
  std::vector<token_t> mixed(static_cast<std::size_t>(B)), sampled(static_cast<std::size_t>(B));
  const batch_view<const float> in{rows.data(), B, V};
  sample_from_logits<float>(host::par, in, one, rng, mixed, greedy);
  sample_from_logits<float>(in, one, rng, sampled);
  for (index_t r = 0; r < B; ++r) {
    const auto row = rows.begin() + r * V;
    const auto argmax = static_cast<token_t>(std::max_element(row, row + V) - row);  // first max
    if (greedy[static_cast<std::size_t>(r)] != 0)
      CHECK(mixed[static_cast<std::size_t>(r)] == argmax);
    else
      CHECK(mixed[static_cast<std::size_t>(r)] == sampled[static_cast<std::size_t>(r)]);
  }
  CHECK(mixed[2] == 1);  // ties: the lowest id
}

TEST_CASE("the samplers reject bad input", "[sample][bad_input]") {
  const index_t V = 4, B = 3;
  std::vector<float> probs(static_cast<std::size_t>(V * B), 0.25f);
  const auto rng = streams(B, 1);
  std::vector<token_t> out(static_cast<std::size_t>(B));
  const auto run = [&] {
    sample_from_probs(batch_view<const float>{probs.data(), B, V}, rng, out);
  };
  REQUIRE_NOTHROW(run());
  probs[6] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(run(), Catch::Contains("probs[row 1][column 2]: NaN entry"));
  probs[6] = -0.5f;
  CHECK_THROWS_WITH(run(), Catch::Contains("probs[row 1][column 2]: negative"));
  probs[6] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(run(), Catch::Contains("probs[row 1][column 2]: infinite"));
  probs[6] = 0.25f;
  std::fill(probs.begin() + 8, probs.end(), 0.0f);
  CHECK_THROWS_WITH(run(), Catch::Contains("probs[row 2]: row has no positive mass"));
  std::fill(probs.begin(), probs.end(), 0.25f);
  CHECK_THROWS_WITH(sample_from_probs(batch_view<const float>{probs.data(), B, V},
                                      row_view<const request_rng>{rng.data(), 2}, out),
                    Catch::Contains("rng"));
  CHECK_THROWS_WITH(sample_from_probs(batch_view<const float>{probs.data(), B, V}, rng,
                                      row_view<token_t>{out.data(), 1}),
                    Catch::Contains("out"));
  CHECK_THROWS_WITH(sample_from_probs(batch_view<const float>{probs.data(), B, V, 2}, rng, out),
                    Catch::Contains("probs") && Catch::Contains("row_stride"));
  // B = 0 is a no-op.
  REQUIRE_NOTHROW(sample_from_probs(batch_view<const float>{nullptr, 0, V}, {}, {}));

  std::vector<float> logits(static_cast<std::size_t>(V * B), 0.5f);
  sampling_params bad;
  bad.top_p = 1.5f;
  std::vector<sampling_params> params{sampling_params{}, sampling_params{}, bad};
  const batch_view<const float> in{logits.data(), B, V};
  CHECK_THROWS_WITH(sample_from_logits<float>(in, params, rng, out),
                    Catch::Contains("params.top_p[row 2]"));
  params.pop_back();
  CHECK_THROWS_WITH(sample_from_logits<float>(in, params, rng, out), Catch::Contains("params"));
  const std::vector<sampling_params> one(1);
  const std::vector<std::uint8_t> two_flags = {1, 0};
  CHECK_THROWS_WITH(sample_from_logits<float>(in, one, rng, out, two_flags),
                    Catch::Contains("is_greedy"));
  logits[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(sample_from_logits<float>(in, one, rng, out),
                    Catch::Contains("logits[row 1][column 1]: NaN entry"));
  const std::vector<std::uint8_t> all_greedy(3, 1);
  CHECK_THROWS_WITH(sample_from_logits<float>(in, one, rng, out, all_greedy),
                    Catch::Contains("logits[row 1][column 1]: NaN entry"));
}
