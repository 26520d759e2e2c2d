// specula's exp (core/exp.hpp) and the softmax passes (sample/softmax_passes.hpp): exp_f32
// against a correctly rounded exp (std::exp in double, rounded to float), and every
// instruction-set path of the passes and of logits_to_probs against the scalar definitions, bit
// for bit, on rows with lengths that are not multiples of the vector and tile sizes, with -inf,
// -0, ties, temperature and the top-k / top-p / min-p cuts.

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../isa_cases.hpp"
#include "specula/core/exp.hpp"
#include "specula/core/float16.hpp"
#include "specula/core/rng.hpp"
#include "specula/sample/softmax_passes.hpp"
#include "specula/sample/transforms.hpp"

using namespace specula;

namespace {

const float inf = std::numeric_limits<float>::infinity();

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

/// exp(x) correctly rounded to float, from the double exp (whose error, below one ulp of double,
/// decides the float rounding except within about 2^-52 of a midpoint; such arguments are
/// skipped by the caller's tolerance of 1 ulp either way).
float rounded_exp(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

/// Distance in ulps between two non-negative floats.
std::int64_t ulps(float a, float b) {
  const auto d = static_cast<std::int64_t>(bits(a)) - static_cast<std::int64_t>(bits(b));
  return d < 0 ? -d : d;
}

/// Floats spread over [lo, hi]: every `stride`-th bit pattern, in value order.
std::vector<float> spread(float lo, float hi, std::uint32_t stride) {
  std::vector<float> out;
  for (float x = lo; x < hi;) {
    out.push_back(x);
    const std::uint32_t b = bits(x);
    // Walk the bit patterns: down in magnitude for negatives, up for positives.
    const float next = x < 0.0f
                           ? (b - 0x80000000u > stride ? std::bit_cast<float>(b - stride) : 0.0f)
                           : std::bit_cast<float>(b + stride);
    if (!(next > x)) break;
    x = next;
  }
  out.push_back(hi);
  return out;
}

/// A row of n logits: normal-ish values of scale 3, with specials when asked.
std::vector<float> make_logits(index_t n, std::uint32_t id, bool special) {
  std::vector<float> row(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    const double u = uniform_at(request_rng{5, id, 0}, draw_id{static_cast<std::uint32_t>(i), 0});
    row[static_cast<std::size_t>(i)] = static_cast<float>(6.0 * (u - 0.5) * (1.0 + 2.0 * u * u));
  }
  if (special && n > 3) {
    row[static_cast<std::size_t>(n / 2)] = -inf;
    row[static_cast<std::size_t>(n / 3)] = -0.0f;
    row[static_cast<std::size_t>(n - 1)] = row[0];   // a tie
    row[static_cast<std::size_t>(n / 4)] = -200.0f;  // e underflows to 0
  }
  return row;
}

const index_t lengths[] = {1,   7,   8,   9,   15,  16,   17,   24,   31,   33,
                           255, 256, 257, 264, 271, 1000, 4099, 4104, 32003};

}  // namespace

TEST_CASE("exp_f32 is within 1 ulp of the correctly rounded exp", "[sample][softmax]") {
  using detail::exp_f32;
  CHECK(exp_f32(0.0f) == 1.0f);  // the largest logit of a row gets e = 1 exactly
  CHECK(exp_f32(-0.0f) == 1.0f);
  CHECK(exp_f32(-inf) == 0.0f);
  CHECK(exp_f32(inf) == inf);
  CHECK(exp_f32(-104.0f) == 0.0f);
  CHECK(exp_f32(-1000.0f) == 0.0f);
  CHECK(exp_f32(89.0f) == inf);
  CHECK(exp_f32(88.7f) == Approx(std::exp(static_cast<double>(88.7f))).epsilon(1e-6));
  CHECK(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  // Every 4099th float of [-104, 89] (about 560000 arguments, subnormal results included).
  std::int64_t worst = 0;
  float worst_x = 0.0f;
  for (const float x : spread(-104.0f, 89.0f, 4099)) {
    const float want = rounded_exp(x);
    if (std::isinf(want)) continue;
    const std::int64_t e = ulps(exp_f32(x), want);
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  }
  INFO("worst at x = " << worst_x);
  CHECK(worst <= 1);
}

SPECULA_ISA_TEST_CASE("exp kernels give exp_f32's bits", "[sample][softmax]") {
  // exp_pass with s = 1, m = 0 and no threshold computes exp_f32(x) for every x.
  const auto xs = spread(-110.0f, 95.0f, 40009);
  std::vector<float> out(xs.size());
  (void)detail::exp_pass(xs.data(), static_cast<index_t>(xs.size()), 1.0f, 0.0f, -inf, out.data());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < xs.size(); ++i)
    differ += bits(out[i]) != bits(detail::exp_f32(xs[i]));
  CHECK(differ == 0);
}

SPECULA_ISA_TEST_CASE("softmax passes equal their scalar definitions bit for bit",
                      "[sample][softmax]") {
  for (const index_t n : lengths)
    for (const bool special : {false, true}) {
      INFO("n = " << n << ", special = " << special);
      auto x = make_logits(n, static_cast<std::uint32_t>(n), special);
      const auto ext = detail::logit_max(x.data(), n);
      const auto ext_ref = detail::logit_max_scalar(x.data(), n);
      CHECK(ext.max == ext_ref.max);
      CHECK(ext.bad == ext_ref.bad);
      for (const float s : {1.0f, 1.25f}) {
        const float m = ext.max * s;
        for (const float thr : {-inf, m - 2.0f, m}) {
          std::vector<float> e(x.size()), e_ref(x.size());
          const double sum = detail::exp_pass(x.data(), n, s, m, thr, e.data());
          const double sum_ref = detail::exp_pass_scalar(x.data(), n, s, m, thr, e_ref.data());
          CHECK(std::bit_cast<std::uint64_t>(sum) == std::bit_cast<std::uint64_t>(sum_ref));
          std::size_t differ = 0;
          for (index_t i = 0; i < n; ++i)
            differ +=
                bits(e[static_cast<std::size_t>(i)]) != bits(e_ref[static_cast<std::size_t>(i)]);
          CHECK(differ == 0);
          // The last pass with each combination of cuts.
          for (int cuts = 0; cuts < 4; ++cuts) {
            detail::probability_cuts c;
            c.set_sum(sum);
            c.top_p = (cuts & 1) != 0;
            c.thr_p = static_cast<float>(0.5 / sum);
            c.inv_p = 1.3;
            c.min_p = (cuts & 2) != 0;
            c.thr_m = static_cast<float>(0.8 / sum);
            c.inv_m = 1.1;
            auto p = e;
            auto p_ref = e;
            detail::probability_pass(p.data(), n, c);
            detail::probability_pass_scalar(p_ref.data(), n, c);
            differ = 0;
            for (index_t i = 0; i < n; ++i)
              differ +=
                  bits(p[static_cast<std::size_t>(i)]) != bits(p_ref[static_cast<std::size_t>(i)]);
            CHECK(differ == 0);
          }
        }
      }
      // NaN and +inf are found wherever they are.
      for (const float bad : {std::numeric_limits<float>::quiet_NaN(), inf}) {
        auto y = x;
        y[static_cast<std::size_t>(n - 1)] = bad;
        CHECK(detail::logit_max(y.data(), n).bad);
        CHECK(detail::logit_max(y.data(), n).max == detail::logit_max_scalar(y.data(), n).max);
      }
    }
}

SPECULA_ISA_TEST_CASE("logits_to_probs gives the scalar path's bits", "[sample][softmax]") {
  std::vector<sampling_params> cases(6);
  cases[1].temperature = 0.7f;
  cases[2].top_k = 50;
  cases[3].top_p = 0.9f;
  cases[4].temperature = 1.3f;
  cases[4].top_k = 1000;
  cases[4].top_p = 0.95f;
  cases[4].min_p = 0.02f;
  cases[5].min_p = 0.1f;
  for (const index_t n : {index_t{17}, index_t{1000}, index_t{32003}})
    for (const auto& sp : cases) {
      INFO("n = " << n << ", temperature " << sp.temperature << ", top_k " << sp.top_k << ", top_p "
                  << sp.top_p << ", min_p " << sp.min_p);
      const auto x = make_logits(n, 3, true);
      std::vector<bfloat16> xb;
      for (const float v : x) xb.push_back(from_float<bfloat16>(v));
      const std::vector<sampling_params> params = {sp};
      std::vector<float> got(x.size()), want(x.size()), got_b(x.size()), want_b(x.size());
      const auto run = [&](std::vector<float>& out, std::vector<float>& out_b) {
        logits_to_probs<float>(batch_view<const float>{x.data(), 1, n}, {}, params,
                               batch_view<float>{out.data(), 1, n});
        logits_to_probs<bfloat16>(batch_view<const bfloat16>{xb.data(), 1, n}, {}, params,
                                  batch_view<float>{out_b.data(), 1, n});
      };
      run(got, got_b);
      specula_test::on_scalar([&] {
        run(want, want_b);
        return 0;
      });
      std::size_t differ = 0;
      for (std::size_t i = 0; i < x.size(); ++i)
        differ += (bits(got[i]) != bits(want[i])) + (bits(got_b[i]) != bits(want_b[i]));
      CHECK(differ == 0);
    }
}

TEST_CASE("softmax is within its stated error bound of the exact softmax", "[sample][softmax]") {
  // sample/softmax_passes.hpp: p_i = (e_i / S*) (1 + t_i), |t_i| <= 17.1 u, where e_i, within
  // 1 ulp (2 u relatively) of exp(x_i - m) (x_i - m rounded to float, as the passes compute
  // it), and S* their exact sum; so against exp in double of the same arguments, normalised in
  // double, the error is at most 17.1 u + 2 u + 2 u; and the row sums to 1 within 17.1 u.
  const double u = std::ldexp(1.0, -24);
  for (const index_t n : {index_t{1000}, index_t{32003}, index_t{151936}}) {
    INFO("n = " << n);
    const auto x = make_logits(n, 11, false);
    std::vector<float> p(x.size());
    softmax(x, p);
    float m = -inf;
    for (const float v : x) m = std::max(m, v);
    std::vector<double> ex(x.size());
    double exact_sum = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float arg = x[i] - m;
      ex[i] = std::exp(static_cast<double>(arg));
      exact_sum += ex[i];
    }
    double worst = 0.0, row_sum = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      row_sum += p[i];
      if (x[i] - m < -87.0f) continue;  // e_i subnormal: the relative bound does not hold
      worst = std::max(worst, std::fabs(static_cast<double>(p[i]) / (ex[i] / exact_sum) - 1.0));
    }
    CHECK(worst <= 21.2 * u);
    CHECK(std::fabs(row_sum - 1.0) <= 17.2 * u);
    // The bound is not vacuous: the error is more than the double sum's would leave.
    CHECK(worst > 0.5 * u);
  }
}
