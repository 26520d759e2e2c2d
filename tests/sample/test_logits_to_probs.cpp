// The selection-based transforms (single row and batched, fp32/bf16/fp16) against the
// sort-based definitions (specula/testing/reference_transforms.hpp), bit for bit, on random
// rows with ties and -inf entries over the parameter edges; the nucleus selection's own
// decisions; and the batched entry point's input checks.

#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "specula/core/float16.hpp"
#include "specula/sample/select.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/testing/reference_transforms.hpp"

using namespace specula;

namespace {

const float ninf = -std::numeric_limits<float>::infinity();

/// Whether two rows have the same bits.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Index of the first entry whose bits differ (or the size).
std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return i;
  return a.size();
}

/// A random logit row of type T: `style` 0 continuous (normal, scale 3), 1 heavy ties (a few
/// distinct values), 2 peaked (one large logit, the rest low), 3 spread over [-40, 0] (a long
/// tail of probabilities below 2^-29), with a fraction `masked` of -inf.
template <class T>
std::vector<T> random_logits(std::mt19937& g, std::size_t v, int style, double masked) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<T> row(v);
  for (std::size_t i = 0; i < v; ++i) {
    float x = 0.0f;
    if (style == 0) x = normal(g);
    if (style == 1) x = 0.5f * static_cast<float>(level(g));
    if (style == 2) x = i == v / 3 ? 12.0f : -4.0f + 0.25f * normal(g);
    if (style == 3) x = static_cast<float>(-40.0 * u(g));
    if (u(g) < masked) x = ninf;
    row[i] = from_float<T>(x);
  }
  if (v > 0 && masked > 0.0) row[v / 2] = from_float<T>(1.0f);  // at least one finite logit
  return row;
}

template <class T>
std::vector<float> widen(const std::vector<T>& row) {
  std::vector<float> out;
  out.reserve(row.size());
  for (const T& x : row) out.push_back(to_float(x));
  return out;
}

/// The sort-based pipeline on float copies of the rows.
template <class T>
std::vector<float> reference_probs(const sampling_params& sp, const std::vector<T>& cond,
                                   const std::vector<T>& uncond) {
  std::vector<float> work = widen(cond);
  const std::vector<float> u = widen(uncond);
  std::vector<float> probs(work.size()), scratch(work.size());
  testing::reference_logits_to_probs(sp, work, u, probs, scratch);
  return probs;
}

std::vector<sampling_params> parameter_grid(index_t v) {
  std::vector<sampling_params> grid;
  const std::vector<index_t> ks = {0, 1, 2, 5, v - 1, v, v + 3};
  const std::vector<float> ps = {1.0f, 0.9f, 0.5f, 1e-6f, 0.999f, 0.99999994f};
  const std::vector<float> ms = {0.0f, 0.05f, 1.0f};
  int n = 0;
  for (const index_t k : ks)
    for (const float p : ps)
      for (const float m : ms) {
        sampling_params sp;
        sp.top_k = std::max<index_t>(k, 0);
        sp.top_p = p;
        sp.min_p = m;
        sp.temperature = (n % 3 == 0) ? 1.0f : (n % 3 == 1 ? 0.7f : 1.3f);
        sp.cfg_scale = (n % 2 == 0) ? 1.5f : -0.5f;
        grid.push_back(sp);
        ++n;
      }
  return grid;
}

/// Checks single-row and batched (seq and par) results against the reference for every
/// parameter set of the grid, on rows of type T.
template <class T>
void check_against_reference(std::size_t v, int style, double masked, bool cfg,
                             std::uint32_t seed) {
  std::mt19937 g(seed);
  const auto grid = parameter_grid(static_cast<index_t>(v));
  const auto rows = static_cast<index_t>(grid.size());
  // One batch: row r has its own logits and grid[r].
  std::vector<T> logits, uncond;
  std::vector<std::vector<float>> want;
  for (index_t r = 0; r < rows; ++r) {
    // With CFG a -inf logit mixes to NaN or +-inf (an error either way): no masking then.
    const auto c = random_logits<T>(g, v, style, cfg ? 0.0 : masked);
    const auto u = cfg ? random_logits<T>(g, v, 0, 0.0) : std::vector<T>{};
    logits.insert(logits.end(), c.begin(), c.end());
    uncond.insert(uncond.end(), u.begin(), u.end());
    want.push_back(reference_probs(grid[static_cast<std::size_t>(r)], c, u));
  }
  const auto cols = static_cast<index_t>(v);
  const batch_view<const T> in{logits.data(), rows, cols};
  const batch_view<const T> un{cfg ? uncond.data() : nullptr, cfg ? rows : 0, cols};
  std::vector<float> seq_out(v * grid.size()), par_out(v * grid.size());
  logits_to_probs<T>(host::seq, in, un, grid, batch_view<float>{seq_out.data(), rows, cols});
  logits_to_probs<T>(host::par, in, un, grid, batch_view<float>{par_out.data(), rows, cols});
  for (index_t r = 0; r < rows; ++r) {
    const auto& sp = grid[static_cast<std::size_t>(r)];
    INFO("V " << v << " style " << style << " masked " << masked << " cfg " << cfg << " row " << r
              << ": top_k " << sp.top_k << " top_p " << sp.top_p << " min_p " << sp.min_p
              << " temperature " << sp.temperature);
    const auto begin = seq_out.begin() + r * cols;
    const std::vector<float> got_seq(begin, begin + cols);
    const std::vector<float> got_par(par_out.begin() + r * cols, par_out.begin() + (r + 1) * cols);
    const auto& ref = want[static_cast<std::size_t>(r)];
    INFO("first difference at " << first_difference(got_seq, ref));
    REQUIRE(same_bits(got_seq, ref));
    REQUIRE(same_bits(got_par, ref));
    if constexpr (std::is_same_v<T, float>) {
      // The single-row entry point, which must leave its input alone.
      const std::vector<float> c(logits.begin() + r * cols, logits.begin() + (r + 1) * cols);
      const std::vector<float> u =
          cfg ? std::vector<float>(uncond.begin() + r * cols, uncond.begin() + (r + 1) * cols)
              : std::vector<float>{};
      const std::vector<float> c_before = c;
      std::vector<float> probs(v), scratch(v);
      logits_to_probs(sp, c, u, probs, scratch);
      REQUIRE(same_bits(probs, ref));
      REQUIRE(same_bits(c, c_before));
      // In place: probs aliasing the logits, as the old in-place pipeline allowed.
      std::vector<float> inplace = c;
      logits_to_probs(sp, inplace, u, inplace, scratch);
      REQUIRE(same_bits(inplace, ref));
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("batched and single-row logits_to_probs equal the sort-based pipeline",
                   "[sample][law]", float, bfloat16, half) {
  std::uint32_t seed = 1;
  for (const std::size_t v : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{300}})
    for (const int style : {0, 1, 2, 3})
      for (const double masked : {0.0, 0.3})
        for (const bool cfg : {false, true})
          check_against_reference<TestType>(v, style, masked, cfg, seed++);
}

TEMPLATE_TEST_CASE("large rows reach every radix level and the sort fallback", "[sample][law]",
                   float, bfloat16, half) {
  // 6000 entries: buckets above the gather limit (ties: a single value fills one bucket).
  std::uint32_t seed = 100;
  for (const int style : {0, 1, 2, 3})
    check_against_reference<TestType>(6000, style, 0.1, style == 0, seed++);
}

TEST_CASE("softmax, top-k and top-p filters equal the sort-based definitions", "[sample][law]") {
  std::mt19937 g(7);
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t v = trial < 30 ? 50 + static_cast<std::size_t>(trial) * 7 : 5000;
    const auto logits = random_logits<float>(g, v, trial % 4, trial % 2 == 0 ? 0.2 : 0.0);
    std::vector<float> scratch(v), got(v), ref(v);
    softmax(logits, got);
    testing::reference_softmax(logits, ref);
    REQUIRE(same_bits(got, ref));
    for (const index_t k :
         {index_t{1}, index_t{3}, static_cast<index_t>(v / 2), static_cast<index_t>(v - 1)}) {
      std::vector<float> a = logits, b = logits;
      top_k_filter(a, k, scratch);
      testing::reference_top_k(b, k, scratch);
      REQUIRE(same_bits(a, b));
    }
    for (const float p : {0.3f, 0.9f, 0.999f, 0.99999994f}) {
      std::vector<float> a = ref, b = ref;
      top_p_filter(a, p, scratch);
      testing::reference_keep_at_least(b, testing::reference_top_p_threshold(b, p, scratch));
      INFO("trial " << trial << " top_p " << p);
      REQUIRE(same_bits(a, b));
    }
  }
}

TEST_CASE("top-p and top-k filters handle rows outside the fast path's domain", "[sample][law]") {
  std::vector<float> scratch(8);
  // Not a probability row: negative, large and infinite entries go to the sort.
  for (const std::vector<float>& row :
       {std::vector<float>{0.5f, -0.25f, 0.75f, 0.0f}, std::vector<float>{3.0f, 1.0f, 0.5f, 0.5f},
        std::vector<float>{0.1f, -ninf, 0.2f, 0.3f}}) {
    std::vector<float> a = row, b = row;
    top_p_filter(a, 0.6f, scratch);
    testing::reference_keep_at_least(b, testing::reference_top_p_threshold(b, 0.6f, scratch));
    CHECK(same_bits(a, b));
  }
  // NaN in top-k: no order; the filter does what nth_element on a copy does.
  std::vector<float> a = {1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f, 2.0f};
  std::vector<float> b = a;
  top_k_filter(a, 2, scratch);
  testing::reference_top_k(b, 2, scratch);
  CHECK(same_bits(a, b));
}

TEST_CASE("nucleus selection decides exactly when the sort's rounding cannot matter",
          "[sample][law]") {
  std::mt19937 g(11);
  int selected = 0;
  int declined = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t v = 100 + static_cast<std::size_t>(trial % 7) * 900;
    const auto logits = random_logits<float>(g, v, trial % 4, trial % 3 == 0 ? 0.5 : 0.0);
    std::vector<float> probs(v), scratch(v);
    testing::reference_softmax(logits, probs);
    const float top_p = std::array<float, 5>{0.5f, 0.9f, 0.95f, 0.9999f,
                                             0.99999994f}[static_cast<std::size_t>(trial % 5)];
    detail::nucleus_cut cut;
    const bool ok = detail::nucleus_threshold_selected(
        static_cast<index_t>(v), top_p,
        [&](index_t i) { return probs[static_cast<std::size_t>(i)]; }, cut);
    if (!ok) {
      ++declined;
      continue;
    }
    ++selected;
    const float want = testing::reference_top_p_threshold(probs, top_p, scratch);
    INFO("trial " << trial << " V " << v << " top_p " << top_p);
    REQUIRE(cut.threshold == want);
    double kept = 0.0;  // index order, as the sort-based renormalisation sums
    for (const float p : probs)
      if (!(p < want)) kept += p;
    REQUIRE(cut.kept_mass == kept);
  }
  // Both outcomes occur on these rows (top_p next to 1 with a long tail declines).
  CHECK(selected > 250);
  CHECK(declined > 0);
}

TEST_CASE("nucleus selection declines when the descending sum's rounding decides",
          "[sample][law]") {
  // 5/16 and 3/16, then 100 values of 2^-60: each is lost when the descending sum adds it to
  // 0.5, so the sort-based total is 0.5 and its target for top_p = 0.625 is exactly 5/16,
  // reached by the first value alone; the exact total is a little above 0.5, whose target
  // would need the second value too. Selection must leave this row to the sort.
  std::vector<float> probs = {0.3125f, 0.1875f};
  for (int i = 0; i < 100; ++i) probs.push_back(std::ldexp(1.0f, -60));
  const auto n = static_cast<index_t>(probs.size());
  const auto at = [&](index_t i) { return probs[static_cast<std::size_t>(i)]; };
  std::vector<float> scratch(probs.size());
  detail::nucleus_cut cut;
  CHECK_FALSE(detail::nucleus_threshold_selected(n, 0.625f, at, cut));
  CHECK(testing::reference_top_p_threshold(probs, 0.625f, scratch) == 0.3125f);
  std::vector<float> a = probs;
  top_p_filter(a, 0.625f, scratch);
  CHECK(a[0] == 1.0f);
  CHECK(a[1] == 0.0f);
  // The same rows through the whole pipeline: logits whose softmax has such a tail.
  std::vector<float> logits = {0.0f, -0.5f};
  for (int i = 0; i < 2000; ++i) logits.push_back(-25.0f - 0.001f * static_cast<float>(i));
  for (const float top_p : {0.99999994f, 0.9999999f, 0.625f}) {
    sampling_params sp;
    sp.top_p = top_p;
    std::vector<float> got(logits.size()), work = logits, want(logits.size()), s(logits.size());
    logits_to_probs(sp, logits, {}, got, s);
    testing::reference_logits_to_probs(sp, work, {}, want, s);
    INFO("top_p " << top_p);
    CHECK(same_bits(got, want));
    std::vector<float> batched(logits.size());
    const auto v = static_cast<index_t>(logits.size());
    const std::vector<sampling_params> one = {sp};
    logits_to_probs<float>(batch_view<const float>{logits.data(), 1, v}, {}, one,
                           batch_view<float>{batched.data(), 1, v});
    CHECK(same_bits(batched, want));
  }
  // A tail that holds the threshold (top_p next to 1): declined too.
  std::vector<float> tail = {0.5f, 0.25f, 0.125f};
  for (int i = 0; i < 3000; ++i) tail.push_back(std::ldexp(1.5f, -30));
  CHECK_FALSE(detail::nucleus_threshold_selected(
      static_cast<index_t>(tail.size()), 0.99999994f,
      [&](index_t i) { return tail[static_cast<std::size_t>(i)]; }, cut));
}

TEST_CASE("kth_largest counts ties and signed zeros like nth_element", "[sample]") {
  const std::vector<float> row = {0.0f, -0.0f, 2.0f, 2.0f, ninf, -1.0f, 2.0f, 0.0f};
  for (index_t k = 1; k <= static_cast<index_t>(row.size()); ++k) {
    float got = 0.0f;
    REQUIRE(detail::kth_largest(
        static_cast<index_t>(row.size()), k,
        [&](index_t i) { return row[static_cast<std::size_t>(i)]; }, got));
    std::vector<float> s = row;
    std::nth_element(s.begin(), s.begin() + (k - 1), s.end(), std::greater<float>());
    CHECK(got == s[static_cast<std::size_t>(k - 1)]);  // -0 == +0
  }
}

TEST_CASE("batched logits_to_probs: per-row parameters and a shared entry", "[sample]") {
  std::mt19937 g(5);
  const index_t v = 64;
  const auto row0 = random_logits<float>(g, v, 0, 0.0);
  const auto row1 = random_logits<float>(g, v, 0, 0.0);
  std::vector<float> logits = row0;
  logits.insert(logits.end(), row1.begin(), row1.end());
  sampling_params a;
  a.top_k = 3;
  sampling_params b;
  b.top_p = 0.5f;
  const std::vector<sampling_params> both = {a, b};
  std::vector<float> out(2 * v);
  logits_to_probs<float>(batch_view<const float>{logits.data(), 2, v}, {}, both,
                         batch_view<float>{out.data(), 2, v});
  CHECK(same_bits(std::vector<float>(out.begin(), out.begin() + v),
                  reference_probs<float>(a, row0, {})));
  CHECK(same_bits(std::vector<float>(out.begin() + v, out.end()),
                  reference_probs<float>(b, row1, {})));
  const std::vector<sampling_params> shared = {b};
  logits_to_probs<float>(batch_view<const float>{logits.data(), 2, v}, {}, shared,
                         batch_view<float>{out.data(), 2, v});
  CHECK(same_bits(std::vector<float>(out.begin(), out.begin() + v),
                  reference_probs<float>(b, row0, {})));
  // Row strides larger than the row.
  std::vector<float> padded(2 * (v + 5), 7.0f), padded_out(2 * (v + 3));
  std::copy(row0.begin(), row0.end(), padded.begin());
  std::copy(row1.begin(), row1.end(), padded.begin() + v + 5);
  logits_to_probs<float>(batch_view<const float>{padded.data(), 2, v, v + 5}, {}, both,
                         batch_view<float>{padded_out.data(), 2, v, v + 3});
  CHECK(same_bits(std::vector<float>(padded_out.begin() + v + 3, padded_out.begin() + 2 * v + 3),
                  reference_probs<float>(b, row1, {})));
}

TEST_CASE("batched logits_to_probs rejects bad input naming the argument and row",
          "[sample][bad_input]") {
  const index_t v = 4;
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, 1.0f, 1.0f,
                               1.0f, 1.0f, 0.5f, 0.5f, 0.0f, 0.0f};
  std::vector<float> out(12);
  const batch_view<const float> in{logits.data(), 3, v};
  const batch_view<float> probs{out.data(), 3, v};
  std::vector<sampling_params> params(3);
  const auto run = [&] { logits_to_probs<float>(host::seq, in, {}, params, probs); };
  REQUIRE_NOTHROW(run());

  params[2].top_p = 1.5f;
  CHECK_THROWS_WITH(run(), Catch::Contains("params.top_p[row 2]") && Catch::Contains("(0, 1]"));
  params[2] = {};
  params[1].temperature = 0.0f;
  CHECK_THROWS_WITH(run(), Catch::Contains("params.temperature[row 1]"));
  params[1] = {};
  params[0].top_k = -2;
  CHECK_THROWS_WITH(run(), Catch::Contains("params.top_k[row 0]"));
  params[0] = {};
  params[0].min_p = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(run(), Catch::Contains("params.min_p[row 0]"));
  params[0] = {};
  params[1].cfg_scale = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(run(), Catch::Contains("params.cfg_scale[row 1]"));
  params[1] = {};

  const std::vector<sampling_params> two(2);
  CHECK_THROWS_WITH(logits_to_probs<float>(host::seq, in, {}, two, probs),
                    Catch::Contains("params") && Catch::Contains("needs 1 entry or 3"));
  CHECK_THROWS_WITH(
      logits_to_probs<float>(host::seq, in, {}, params, batch_view<float>{out.data(), 2, v}),
      Catch::Contains("probs") && Catch::Contains("shape"));
  CHECK_THROWS_WITH(logits_to_probs<float>(
                        host::seq, in, batch_view<const float>{logits.data(), 2, v}, params, probs),
                    Catch::Contains("uncond"));
  CHECK_THROWS_WITH(
      logits_to_probs<float>(host::seq, batch_view<const float>{logits.data(), 3, v, 2}, {}, params,
                             probs),
      Catch::Contains("logits") && Catch::Contains("row_stride"));
  // Rows without entries (a vocabulary of 0): refused as such, not as rows without mass.
  CHECK_THROWS_WITH(
      logits_to_probs<float>(host::seq, batch_view<const float>{logits.data(), 3, 0}, {}, params,
                             batch_view<float>{out.data(), 3, 0}),
      Catch::Equals("specula: logits: empty input; rows have no entries (a vocabulary of 0)"));
  CHECK_NOTHROW(logits_to_probs<float>(host::seq, batch_view<const float>{logits.data(), 0, 0}, {},
                                       params, batch_view<float>{out.data(), 0, 0}));
  CHECK_THROWS_WITH(
      logits_to_probs<float>(host::seq, in, {}, params, batch_view<float>{logits.data(), 3, v}),
      Catch::Equals("specula: probs: overlapping buffers; must not overlap logits or uncond"));
  try {
    logits_to_probs<float>(host::seq, in, {}, params, batch_view<float>{logits.data(), 3, v});
    FAIL("no exception");
  } catch (const invalid_input& e) {
    CHECK(e.code() == status::overlapping_buffers);
    CHECK(e.argument() == "probs");
  }

  logits[v + 2] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(run(), Catch::Contains("logits[row 1][column 2]: NaN entry"));
  logits[v + 2] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(run(), Catch::Contains("logits[row 1][column 2]: infinite entry"));
  logits[v + 2] = 1.0f;
  for (index_t i = 0; i < v; ++i) logits[static_cast<std::size_t>(2 * v + i)] = ninf;
  CHECK_THROWS_WITH(run(), Catch::Contains("logits[row 2]: row has no positive mass"));
  // With host::par the lowest failing row is reported.
  logits[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(logits_to_probs<float>(host::par, in, {}, params, probs),
                    Catch::Contains("logits[row 0][column 0]"));
  logits[0] = 0.0f;
  for (index_t i = 0; i < v; ++i) logits[static_cast<std::size_t>(2 * v + i)] = 0.0f;
  // CFG of two -inf logits is NaN (as in the single-row pipeline), reported at its column.
  std::vector<float> un(12, 0.0f);
  logits[3] = ninf;
  un[3] = ninf;
  CHECK_THROWS_WITH(logits_to_probs<float>(host::seq, in, batch_view<const float>{un.data(), 3, v},
                                           params, probs),
                    Catch::Contains("logits[row 0][column 3]: NaN entry"));
  // bf16 NaN patterns are found too.
  std::vector<bfloat16> bf(12, from_float<bfloat16>(0.5f));
  bf[7] = bfloat16{0x7FC1};
  std::vector<float> bout(12);
  CHECK_THROWS_WITH(logits_to_probs<bfloat16>(batch_view<const bfloat16>{bf.data(), 3, v}, {},
                                              params, batch_view<float>{bout.data(), 3, v}),
                    Catch::Contains("logits[row 1][column 3]: NaN entry"));
}

TEST_CASE("single-row logits_to_probs keeps its checks", "[sample][bad_input]") {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f}, probs(3), scratch(3), small(1);
  sampling_params sp;
  sp.top_k = 2;
  CHECK_THROWS_WITH(logits_to_probs(sp, logits, {}, probs, small), Catch::Contains("scratch"));
  sp.top_k = 0;
  sp.top_p = 0.5f;
  CHECK_THROWS_WITH(logits_to_probs(sp, logits, {}, probs, small), Catch::Contains("scratch"));
  sp.top_p = 1.0f;
  CHECK_NOTHROW(logits_to_probs(sp, logits, {}, probs, small));  // no filter: no scratch
  std::vector<float> short_probs(2);
  CHECK_THROWS_WITH(logits_to_probs(sp, logits, {}, short_probs, scratch),
                    Catch::Contains("probs"));
  std::vector<float> short_uncond(2);
  CHECK_THROWS_WITH(logits_to_probs(sp, logits, short_uncond, probs, scratch),
                    Catch::Contains("uncond"));
  logits[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(logits_to_probs(sp, logits, {}, probs, scratch),
                    Catch::Contains("logits[column 1]: NaN entry"));
  CHECK_THROWS_WITH(logits_to_probs(sp, std::span<const float>{}, {}, std::span<float>{}, scratch),
                    Catch::Contains("logits") && Catch::Contains("a vocabulary of 0"));
}
