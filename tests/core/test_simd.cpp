// The explicit SIMD kernels of core/simd.hpp give the bits of the scalar definitions they
// replace, on every instruction set this CPU supports (each one forced in turn): tile sums of
// rows and residuals, the candidate recursion, the validation pass and argmax, on rows with
// lengths that are not multiples of the vector and tile sizes and with NaN, -0, negative,
// subnormal and infinite entries.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "../isa_cases.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/simd.hpp"
#include "specula/core/validate.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/categorical.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain_core.hpp"

using namespace specula;

namespace {

using specula_test::isa_guard;
using specula_test::on_scalar;

/// A float row of length n: mostly small positive values, with special entries when asked.
std::vector<float> make_row(index_t n, std::uint32_t id, bool special) {
  std::vector<float> row(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    const double u = uniform_at(request_rng{91, id, 0}, draw_id{static_cast<std::uint32_t>(i), 0});
    row[static_cast<std::size_t>(i)] = static_cast<float>(u * u / static_cast<double>(n));
  }
  if (special && n > 0) {
    const float specials[] = {0.0f,
                              -0.0f,
                              -1e-3f,
                              std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(),
                              1e-40f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (std::size_t k = 0; k < std::size(specials); ++k)
      row[(k * 37 + static_cast<std::size_t>(id)) % row.size()] = specials[k];
  }
  return row;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// Hides a weight function's dense form: the passes then take the element calls.
template <class W>
struct element_calls {
  const W& w;
  double operator()(index_t i) const { return w(i); }
};

template <class W>
void check_passes_match_element_calls(index_t n, const W& w, const char* what = "") {
  INFO(what);
  const element_calls<W> ref{w};
  const double expected = positive_mass(n, ref);
  weight_summary s_ref, s;
  summarize_weights(n, ref, s_ref);
  {
    INFO("n = " << n);
    CHECK(same_bits(positive_mass(n, w), expected));
    summarize_weights(n, w, s);
    CHECK(same_bits(s.total, s_ref.total));
    REQUIRE(s.recorded == s_ref.recorded);
    for (index_t k = 0; k < s.recorded; ++k) CHECK(same_bits(s.tile_sum[k], s_ref.tile_sum[k]));
    for (double u : {1e-9, 0.25, 0.5, 0.999999}) {
      CHECK(sample_inverse_cdf(n, w, s, u) == sample_inverse_cdf(n, ref, s_ref, u));
      CHECK(sample_inverse_cdf(n, w, expected, u) == sample_inverse_cdf(n, ref, expected, u));
    }
  }
}

const index_t lengths[] = {1, 7, 8, 9, 255, 256, 257, 511, 512, 1000, 4099, 131072 + 777};

}  // namespace

TEST_CASE("force_isa picks a supported instruction set", "[core][simd]") {
  isa_guard guard;
  CHECK(simd::force_isa(simd::isa::scalar) == simd::isa::scalar);
  CHECK(simd::active_isa() == simd::isa::scalar);
  const simd::isa best = simd::force_isa(simd::isa::avx512);
  CHECK(best == simd::supported_isa());
  CHECK(simd::active_isa() == best);
}

SPECULA_ISA_TEST_CASE("SIMD row and residual tile sums equal the element calls bit for bit",
                      "[core][simd]") {
  for (index_t n : lengths)
    for (bool special : {false, true}) {
      const auto p = make_row(n, 1, special);
      const auto q = make_row(n, 2, special);
      const row_view<const float> pr(p), qr(q);
      check_passes_match_element_calls(n, detail::row_weights<float>{pr});

      using bound = detail::scalar_bound_rule<exact_rule>;
      const bound rule{};
      const dense_proposal<float> dense{qr};
      check_passes_match_element_calls(
          n, detail::chain_residual<bound, row_view<const float>, dense_proposal<float>>{rule, pr,
                                                                                         dense});
      for (token_t x : {token_t{0}, static_cast<token_t>(n / 2), static_cast<token_t>(n - 1)}) {
        const one_hot_proposal one_hot{x};
        check_passes_match_element_calls(
            n, detail::chain_residual<bound, row_view<const float>, one_hot_proposal>{rule, pr,
                                                                                      one_hot});
      }
    }
}

SPECULA_ISA_TEST_CASE("SIMD candidate recursion equals the element calls bit for bit",
                      "[core][simd]") {
  // Rows whose last tile ends 1, 7, 0, 5 and 3 elements past a multiple of 8: tails in either
  // half of the AVX2 kernels' two masks.
  for (index_t n : {9, 263, 1000, 1029, 4099})
    for (bool last_tile : {true, false}) {
      // Entries past the end of the rows that weigh (p = 0.5, q = 0): a kernel reading past a
      // row's last element would add them.
      auto p = make_row(n, 3, false);
      auto q = make_row(n, 4, false);
      p.resize(static_cast<std::size_t>(n) + 8, 0.5f);
      q.resize(static_cast<std::size_t>(n) + 8, 0.0f);
      const row_view<const float> pr(p.data(), n), qr(q.data(), n);
      // A repeat; the last element among the candidates, or the last (partial) tile without one,
      // so that the tile kernels sum its tail.
      const std::vector<token_t> cand = {1, static_cast<token_t>(last_tile ? n - 1 : 2), 5, 1};
      INFO("last tile holds a candidate: " << last_tile);
      // Normalisers as the recursion meets them, and ones whose product passes
      // threshold_form_max_scale at the second step (then no pass is made: the step falls back).
      const std::vector<double> inv_z_sets[2] = {{1.7, 2.3, 0.9, 1.1}, {1e200, 1e3, 1e-3, 1.0}};
      const std::vector<double> renorm = {1.0, 1.25, 1.5, 2.0};
      const exact_rule rule{};
      auto run = [&](const auto& proposal) {
        using prop = std::remove_cvref_t<decltype(proposal)>;
        for (int set = 0; set < 2; ++set) {
          const detail::candidate_recursion<exact_rule, float, prop> rec{
              rule, pr, proposal, cand.data(), inv_z_sets[set].data(), renorm.data()};
          for (index_t k = 1; k <= 4; ++k) {
            const detail::candidate_residual<exact_rule, float, prop> r{rec, k};
            CHECK(r.usable() == (set == 0 || k == 1));
            if (r.usable()) check_passes_match_element_calls(n, r, "candidate residual");
          }
        }
        check_passes_match_element_calls(n,
                                         detail::first_candidate_residual<exact_rule, float, prop>{
                                             rule, pr, proposal, cand[0], renorm.data() + 1},
                                         "first step");
        // renorm 1 (nothing removed yet): a simple form for the tile kernels (simple_form).
        check_passes_match_element_calls(n,
                                         detail::first_candidate_residual<exact_rule, float, prop>{
                                             rule, pr, proposal, cand[0], renorm.data()},
                                         "first step, renorm 1");
      };
      run(without_replacement<float>{qr});
      run(with_replacement<float>{qr});
      run(one_hot_candidates{});
      check_passes_match_element_calls(
          n,
          detail::proposal_mass_weights<without_replacement<float>>{without_replacement<float>{qr}},
          "proposal mass");
    }
}

SPECULA_ISA_TEST_CASE("SIMD validation pass and argmax equal the scalar loops", "[core][simd]") {
  for (index_t n : lengths)
    for (bool special : {false, true}) {
      auto row = make_row(n, 5, special);
      // Ties for the maximum, with -0 and +0 among them when the row is all zeros.
      if (n > 10)
        row[static_cast<std::size_t>(n / 3)] = row[static_cast<std::size_t>(n - 2)] = 7.0f;
      double low_ref = 0.0;
      const double sum_ref =
          on_scalar([&] { return detail::row_sum_and_min(row.data(), n, low_ref); });
      const index_t arg_ref = detail::argmax_f32_scalar(row.data(), n);
      {
        INFO("n = " << n << ", special = " << special);
        double low = 0.0;
        CHECK(same_bits(detail::row_sum_and_min(row.data(), n, low), sum_ref));
        CHECK(same_bits(low, low_ref));
        CHECK(argmax_lowest(row_view<const float>(row)) == arg_ref);
        const auto d = check_probability_row(row_view<const float>(row), 1e-3, 4);
        const auto d_ref = [&] {
          std::vector<double> wide(row.begin(), row.end());  // the generic loop, double rows
          return check_probability_row(row_view<const double>(wide), 1e-3, 4);
        }();
        CHECK(d.code == d_ref.code);
        CHECK(d.column == d_ref.column);
        CHECK(
            (same_bits(d.value, d_ref.value) || (std::isnan(d.value) && std::isnan(d_ref.value))));
      }
    }
  // Edge rows for argmax: all NaN, NaN first, all -inf, signed zeros.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      std::vector<float>(19, nan),
      {nan, -inf, -inf, nan},
      std::vector<float>(33, -inf),
      {-0.0f, 0.0f, 0.0f, -0.0f, -1.0f, -0.0f, 0.0f, 0.0f, 0.0f},
      {}};
  for (const auto& r : rows) {
    CHECK(argmax_lowest(row_view<const float>(r)) ==
          detail::argmax_f32_scalar(r.data(), static_cast<index_t>(r.size())));
  }
  CHECK(detail::argmax_f32_scalar(rows[0].data(), 19) == -1);
  CHECK(detail::argmax_f32_scalar(rows[1].data(), 4) == 1);
  CHECK(detail::argmax_f32_scalar(rows[3].data(), 9) == 0);
}

SPECULA_ISA_TEST_CASE("checked passes sum the weights and validate the rows they read in one pass",
                      "[core][simd]") {
  // For every form the fused kernels take (a row, the residual max(p - q, 0), the one-hot
  // residual with a skip index): the weight sums are those of the unchecked pass whenever the
  // rows hold no NaN, and the scan holds each row's check_probability_row sum (row_sum_and_min;
  // with q, for rows without negative entries) and the minimum of both rows, bit for bit on
  // every instruction set.
  for (index_t n : lengths)
    for (bool special : {false, true}) {
      const auto p = make_row(n, 6, special);
      const auto q = make_row(n, 7, special && n > 300);  // also: bad p with clean q
      const bool has_nan = special;
      auto scanned = [&](const auto& w, detail::dense_scan& scan, weight_summary& s) {
        detail::summarize_weights_scanning(n, w, s, &scan);
      };
      auto reference = [&](const float* row, double& low) {
        return on_scalar([&] { return detail::row_sum_and_min(row, n, low); });
      };
      double p_low = 0.0, q_low = 0.0;
      const double p_sum = reference(p.data(), p_low);
      const double q_sum = reference(q.data(), q_low);
      using bound = detail::scalar_bound_rule<exact_rule>;
      const bound rule{};
      const row_view<const float> pr(p), qr(q);
      const detail::row_weights<float> row{pr};
      const dense_proposal<float> dense{qr};
      const detail::chain_residual<bound, row_view<const float>, dense_proposal<float>> residual{
          rule, pr, dense};
      const one_hot_proposal one_hot{static_cast<token_t>(n / 2)};
      const detail::chain_residual<bound, row_view<const float>, one_hot_proposal> skipping{
          rule, pr, one_hot};
      detail::dense_scan ref_scan[3];
      // The scalar path first (the reference scans), then the forced one.
      for (simd::isa run : {simd::isa::scalar, path}) {
        isa_guard guard;
        simd::force_isa(run);
        INFO("run on " << simd::name(run) << ", n = " << n << ", special = " << special);
        int form = 0;
        auto check_form = [&](const auto& w, bool with_q, bool weights_equal) {
          weight_summary s, s_ref;
          detail::dense_scan scan;
          scanned(w, scan, s);
          summarize_weights(n, w, s_ref);
          if (weights_equal) {
            CHECK(same_bits(s.total, s_ref.total));
            REQUIRE(s.recorded == s_ref.recorded);
            for (index_t k = 0; k < s.recorded; ++k)
              CHECK(same_bits(s.tile_sum[k], s_ref.tile_sum[k]));
          }
          if (run == simd::isa::scalar) ref_scan[form] = scan;
          // With q the scalar and SSE2 kernels add plain entries (the same sums for rows without
          // negatives); the AVX2 and AVX-512 kernels add float lanes, within the bound of
          // entry_sum_within: it must not prove a tolerance below the true |S - 1|, and it
          // does prove one 1e-5 S above it.
          const bool float_lanes = with_q && run >= simd::isa::avx2;
          CHECK((scan.float_lane_adds > 0) == float_lanes);
          if (float_lanes) {
            CHECK(std::isnan(scan.p_sum) == std::isnan(ref_scan[form].p_sum));
            CHECK(std::isnan(scan.q_sum) == std::isnan(ref_scan[form].q_sum));
            if (!special)
              for (const auto& [sum, ref] : {std::pair{scan.p_sum, p_sum}, {scan.q_sum, q_sum}}) {
                const double off = std::abs(ref - 1.0);
                CHECK_FALSE(detail::entry_sum_within(sum, scan.float_lane_adds, n,
                                                     std::nextafter(off, 0.0)));
                CHECK(detail::entry_sum_within(sum, scan.float_lane_adds, n, off + 1e-5 * ref));
              }
          } else {
            if (!with_q || !special) CHECK(same_bits(scan.p_sum, p_sum));
            if (with_q && !special) CHECK(same_bits(scan.q_sum, q_sum));
            auto same = [](double a, double b) {
              return same_bits(a, b) || (std::isnan(a) && std::isnan(b));
            };
            CHECK(same(scan.p_sum, ref_scan[form].p_sum));
            CHECK(same(scan.q_sum, ref_scan[form].q_sum));
          }
          // The minimum of both rows; a NaN in q may hide a negative p (q's sum is then NaN).
          const double low = with_q ? std::min(p_low, q_low) : p_low;
          if (!with_q || !std::isnan(q_sum)) CHECK(same_bits(static_cast<double>(scan.low), low));
          CHECK(same_bits(static_cast<double>(scan.low), static_cast<double>(ref_scan[form].low)));
          ++form;
        };
        check_form(row, false, !has_nan);
        check_form(residual, true, true);
        check_form(skipping, false, !has_nan);
      }
    }
}

SPECULA_ISA_TEST_CASE("checked passes over rows with sign bits keep the unchecked weights",
                      "[core][simd]") {
  // Without q, the AVX2 and AVX-512 kernels sum the plain entries and sum a tile again with the
  // clamp max(p, 0) only when it holds a sign bit: rows with -0 or a negative entry (no NaN)
  // must still get the unchecked weights, tile by tile, and the minimum.
  for (index_t n : {256, 4099, 131072 + 777}) {
    auto p = make_row(n, 9, false);
    p[static_cast<std::size_t>(n / 2)] = -0.0f;
    if (n > 300) p[static_cast<std::size_t>(n / 3)] = -1e-3f;
    const detail::row_weights<float> row{row_view<const float>(p)};
    weight_summary s, s_ref;
    detail::dense_scan scan;
    detail::summarize_weights_scanning(n, row, s, &scan);
    summarize_weights(n, row, s_ref);
    INFO("n = " << n);
    CHECK(same_bits(s.total, s_ref.total));
    REQUIRE(s.recorded == s_ref.recorded);
    for (index_t k = 0; k < s.recorded; ++k) CHECK(same_bits(s.tile_sum[k], s_ref.tile_sum[k]));
    CHECK(scan.low == (n > 300 ? -1e-3f : 0.0f));
  }
}

SPECULA_ISA_TEST_CASE(
    "checked residual passes count every entry once, whatever the rows' alignment",
    "[core][simd]") {
  // The AVX2 and AVX-512 run kernels read the entries they check in blocks aligned apart from
  // the weights' loads, and add the entries before the first and after the last block on their
  // own. Rows placed at every float offset modulo a cache line (p and q apart), with heavy
  // entries (0.125) where a head, a block or a tail starts or ends: the weights keep the
  // scalar bits; each row's sum is proven within a tolerance just above its true distance from
  // 1 and not below it (an entry missed or added twice moves the sum by 0.125 or more); a
  // negative entry and a NaN at the rows' first or last entries are seen.
  for (index_t n : {index_t{40}, index_t{4099}, index_t{2 * 64 * 256 + 100}})
    for (index_t op : {0, 1, 4, 7, 12, 15})
      for (index_t oq : {0, 3, 8, 15}) {
        std::vector<float> pbuf(static_cast<std::size_t>(n + 64)), qbuf(pbuf.size());
        const auto at = [](std::vector<float>& buf, index_t offset) {
          const auto addr = reinterpret_cast<std::uintptr_t>(buf.data());
          return buf.data() + (64 - addr % 64) % 64 / sizeof(float) + offset;
        };
        float* p = at(pbuf, op);
        float* q = at(qbuf, oq);
        const auto pr = make_row(n, 11, false), qr = make_row(n, 12, false);
        std::copy(pr.begin(), pr.end(), p);
        std::copy(qr.begin(), qr.end(), q);
        for (index_t i : {index_t{0}, index_t{1}, index_t{15}, index_t{16}, index_t{17}, n / 2,
                          n - 17, n - 16, n - 1}) {
          p[i] = 0.125f;
          q[n - 1 - i] = 0.125f;
        }
        const row_view<const float> prow(p, n), qrow(q, n);
        using bound = detail::scalar_bound_rule<exact_rule>;
        const bound rule{};
        const dense_proposal<float> dense{qrow};
        const detail::chain_residual<bound, row_view<const float>, dense_proposal<float>> residual{
            rule, prow, dense};
        INFO("n = " << n << ", p offset " << op << ", q offset " << oq);
        double p_low = 0.0, q_low = 0.0;
        const double p_ref = on_scalar([&] { return detail::row_sum_and_min(p, n, p_low); });
        const double q_ref = on_scalar([&] { return detail::row_sum_and_min(q, n, q_low); });
        weight_summary s, s_ref;
        on_scalar([&] { summarize_weights(n, residual, s_ref); });
        detail::dense_scan scan;
        detail::summarize_weights_scanning(n, residual, s, &scan);
        CHECK(same_bits(s.total, s_ref.total));
        REQUIRE(s.recorded == s_ref.recorded);
        for (index_t k = 0; k < s.recorded; ++k) CHECK(same_bits(s.tile_sum[k], s_ref.tile_sum[k]));
        for (const auto& [sum, ref] : {std::pair{scan.p_sum, p_ref}, {scan.q_sum, q_ref}}) {
          const double off = std::abs(ref - 1.0);
          CHECK_FALSE(
              detail::entry_sum_within(sum, scan.float_lane_adds, n, std::nextafter(off, 0.0)));
          CHECK(detail::entry_sum_within(sum, scan.float_lane_adds, n, off + 1e-4 * ref));
        }
        CHECK(scan.low == 0.0f);
        // A negative entry first in p and last in q, then a NaN first in q.
        const float p0 = p[0], ql = q[n - 1];
        p[0] = -0.25f;
        q[n - 1] = -0.5f;
        detail::dense_scan bad;
        detail::summarize_weights_scanning(n, residual, s, &bad);
        CHECK(bad.low == -0.5f);
        p[0] = p0;
        q[n - 1] = ql;
        q[0] = std::numeric_limits<float>::quiet_NaN();
        detail::dense_scan nan_scan;
        detail::summarize_weights_scanning(n, residual, s, &nan_scan);
        CHECK(std::isnan(nan_scan.q_sum));
        CHECK_FALSE(std::isnan(nan_scan.p_sum));
      }
}

SPECULA_ISA_TEST_CASE("float-lane entry sums prove only what holds for the exact row sum",
                      "[core][simd]") {
  // A row on which float lanes lose the most: the first 16 entries of each of 16 tiles are 2^-8
  // and the others just under half an ulp of any lane's sum, so that every float addition of
  // them rounds to nothing (the lanes sum to exactly 1) while the exact sum exceeds 1 by
  // 3840 * 0.49 * 2^-31 (about 8.8e-7, near gamma_15 in float). Taken as p and q of a
  // residual: for every tolerance, entry_sum_within proves |S - 1| <= tolerance only when it
  // holds for S, check_probability_row's sum (its generic loop over a double copy).
  const index_t n = 16 * 256;
  std::vector<float> row(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i)
    row[static_cast<std::size_t>(i)] = i % 256 < 16 ? 0x1p-8f : 0.49f * 0x1p-31f;
  const std::vector<double> wide(row.begin(), row.end());
  const diagnostic d = check_probability_row(row_view<const double>(wide), 0.0);
  REQUIRE(d.code == status::bad_row_sum);
  const double off = d.value - 1.0;
  REQUIRE(off > 8e-7);
  const row_view<const float> r(row);
  using bound = detail::scalar_bound_rule<exact_rule>;
  const bound rule{};
  const dense_proposal<float> dense{r};
  const detail::chain_residual<bound, row_view<const float>, dense_proposal<float>> residual{
      rule, r, dense};
  detail::dense_scan scan;
  weight_summary s;
  detail::summarize_weights_scanning(n, residual, s, &scan);
  if (scan.float_lane_adds > 0) CHECK(scan.q_sum < d.value);  // the lanes did lose
  std::vector<double> tolerances = {std::nextafter(off, 0.0), off, std::nextafter(off, 1.0)};
  for (int j = 0; j <= 200; ++j) tolerances.push_back(j * 5e-8);
  int proven = 0;
  for (double tol : tolerances) {
    INFO("tolerance " << tol << ", |S - 1| = " << off);
    const bool holds = check_probability_row(row_view<const double>(wide), tol).ok();
    CHECK(holds == (off <= tol));
    for (double sum : {scan.p_sum, scan.q_sum})
      if (detail::entry_sum_within(sum, scan.float_lane_adds, n, tol)) {
        CHECK(holds);
        ++proven;
      }
  }
  CHECK(proven > 0);
}
