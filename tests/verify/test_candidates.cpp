// K candidates at one position (recursive rejection): exact laws for K = 1..4 without and with
// replacement and for deterministic candidates; negative controls; K = 1 equals the chain; K
// rejected candidates against the recursion materialised in long double.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "chain_test_util.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/testing/catch2.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"

using namespace specula;
using specula::test::make_pair;
using specula::test::pair_kind;
using specula::test::unnormalised_without_replacement;
using specula::test::view;

namespace {

enum class draw_mode { without, with };

/// Experiment: draw K candidates from q (through the source), verify them, return the token.
template <class MakeProposal>
auto k_candidates(const std::vector<double>& p, const std::vector<double>& q, index_t k,
                  draw_mode mode, MakeProposal make) {
  return [&p, &q, k, mode, make](auto& src) -> index_t {
    const auto n = static_cast<index_t>(q.size());
    std::vector<token_t> cand(static_cast<std::size_t>(k));
    auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
    index_t got = k;
    if (mode == draw_mode::without) {
      got = sample_without_replacement_sequential(src, n, qw, k, 77, 0, cand.data());
    } else {
      for (index_t j = 0; j < k; ++j)
        cand[static_cast<std::size_t>(j)] = static_cast<token_t>(
            src.categorical(n, qw, 1.0, draw_id{77, static_cast<std::uint32_t>(j)}));
    }
    std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)));
    const auto r = verify_candidates(exact_rule{}, src, view(p), make(view(q)), cand.data(), got,
                                     0.0, 0, ws.data());
    REQUIRE((r.flags & chain_valid) != 0);
    return r.token;
  };
}

const pair_kind kinds[] = {pair_kind::dense, pair_kind::sparse, pair_kind::q_zero_off_support,
                           pair_kind::equal, pair_kind::disjoint};

}  // namespace

TEST_CASE("K candidates without replacement: exact law equals p (K = 1..4, 120 cases)",
          "[verify][tree][law]") {
  int cases = 0;
  for (index_t k = 1; k <= 4; ++k)
    for (pair_kind kind : kinds)
      for (std::uint64_t seed = 1; seed <= 6; ++seed) {
        const index_t vocab = 3 + static_cast<index_t>((seed + static_cast<std::uint64_t>(k)) % 3);
        const auto pr = make_pair(kind, vocab, seed * 101 + static_cast<std::uint64_t>(k));
        INFO("K " << k << " kind " << static_cast<int>(kind) << " seed " << seed);
        SPECULA_REQUIRE_LOSSLESS(pr.p, k_candidates(pr.p, pr.q, k, draw_mode::without, [](auto q) {
                                   return without_replacement<double>{q};
                                 }));
        ++cases;
      }
  CHECK(cases == 120);
}

TEST_CASE("K i.i.d. candidates (with replacement): exact law equals p", "[verify][tree][law]") {
  for (index_t k = 1; k <= 3; ++k)
    for (pair_kind kind : kinds)
      for (std::uint64_t seed = 1; seed <= 4; ++seed) {
        const index_t vocab = 3 + static_cast<index_t>(seed % 2);
        const auto pr = make_pair(kind, vocab, seed * 31 + static_cast<std::uint64_t>(k));
        INFO("K " << k << " kind " << static_cast<int>(kind) << " seed " << seed);
        SPECULA_REQUIRE_LOSSLESS(pr.p, k_candidates(pr.p, pr.q, k, draw_mode::with, [](auto q) {
                                   return with_replacement<double>{q};
                                 }));
      }
}

TEST_CASE("deterministic candidates (one-hot proposals): exact law equals p for any choice",
          "[verify][tree][law]") {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const index_t vocab = 4;
    const auto p = testing::random_probability_row(vocab, seed, 0, 0.3);
    // Fixed candidate lists, including tokens with p = 0 and repeats.
    const std::vector<std::vector<token_t>> lists = {{0}, {3, 1}, {2, 2, 0}, {1, 0, 3, 2}};
    for (const auto& cand : lists) {
      const auto k = static_cast<index_t>(cand.size());
      SPECULA_REQUIRE_LOSSLESS(p, [&](auto& src) -> index_t {
        std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)));
        const auto r = verify_candidates(exact_rule{}, src, view(p), one_hot_candidates{},
                                         cand.data(), k, 0.0, 0, ws.data());
        return r.token;
      });
    }
  }
}

TEST_CASE("without replacement: exact when earlier candidates hold nearly all of a float q",
          "[verify][tree][law]") {
  // Float rows as a softmax leaves them: entries that do not sum to exactly 1, the first
  // holding all but ~1e-7 of the mass (toy_ar_model(4, 5, 77)'s row(1, 2, 2) is the first).
  // 1 - q(c_1) cancels to 1.19e-7 where the remaining mass is 1.39e-7: renormalising by it
  // made q^(2)(c_2) = 1.16 and the output law off by 0.018 (SJD-PAC trees with D >= 2).
  const std::vector<std::vector<float>> qs = {{0.99999988f, 0.0f, 1.3855572e-07f, 0.0f},
                                              {0.99999988f, 3.1e-08f, 1.1e-07f, 0.0f},
                                              {2.9e-08f, 0.99999994f, 0.0f, 4.4e-08f}};
  for (std::uint64_t seed = 1; seed <= 5; ++seed)
    for (const auto& qf : qs)
      for (index_t k = 2; k <= 3; ++k) {
        const index_t vocab = 4;
        const auto pd = testing::random_probability_row(vocab, seed, 3, 0.2);
        std::vector<float> pf(pd.begin(), pd.end());
        double sum = 0.0;
        for (const float x : pf) sum += x;
        std::vector<double> target;
        for (const float x : pf) target.push_back(static_cast<double>(x) / sum);
        INFO("seed " << seed << " K " << k << " q(1) " << qf[1]);
        SPECULA_REQUIRE_LOSSLESS_TOL(
            target,
            [&](auto& src) -> index_t {
              std::vector<token_t> cand(static_cast<std::size_t>(k));
              auto qw = [&](index_t y) {
                return static_cast<double>(qf[static_cast<std::size_t>(y)]);
              };
              const index_t got =
                  sample_without_replacement_sequential(src, vocab, qw, k, 77, 0, cand.data());
              std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)));
              const auto r = verify_candidates(
                  exact_rule{}, src, row_view<const float>(pf.data(), vocab),
                  without_replacement<float>{row_view<const float>(qf.data(), vocab)}, cand.data(),
                  got, 0.0, 0, ws.data());
              return r.token;
            },
            1e-6);
      }
}

namespace {

/// A source that rejects every candidate and records what the verifier asks of it: the
/// probability of each acceptance test, and the distribution of the residual sample (the weights
/// it is handed, normalised here in long double).
struct rejecting_probe {
  std::vector<double> accept;
  std::vector<long double> law;
  int samples = 0;
  bool bernoulli(double prob, draw_id /*at*/) {
    accept.push_back(prob);
    return false;
  }
  template <class W>
  index_t record(index_t n, W&& w) {
    law.assign(static_cast<std::size_t>(n), 0.0L);
    long double sum = 0.0L;
    for (index_t x = 0; x < n; ++x) sum += law[static_cast<std::size_t>(x)] = w(x);
    for (auto& v : law) v /= sum;
    ++samples;
    return 0;
  }
  template <class W>
  index_t categorical(index_t n, W&& w, double /*total*/, draw_id /*at*/) {
    return record(n, w);
  }
  template <class W>
  index_t categorical(index_t n, W&& w, const weight_summary& /*summary*/, draw_id /*at*/) {
    return record(n, w);
  }
};
static_assert(random_source<rejecting_probe>);

enum class ref_proposal { without, with, one_hot, without_unnormalised };

/// What K rejected candidates leave, written out from the definition with every residual
/// target materialised in long double: q^(j) is q (i.i.d.), q with c_1..c_{j-1} removed and
/// divided by the mass left (without replacement; q itself at j = 1), or one-hot at c_j; the
/// test of c_j accepts with min(1, p^(j)(c_j) / q^(j)(c_j)) (1 where q^(j)(c_j) = 0), and
/// p^(j+1) = Norm(max(p^(j) - q^(j), 0)). `without_unnormalised` drops the division (a wrong
/// recursion, for the negative control).
struct materialised_recursion {
  std::vector<long double> accept;
  std::vector<long double> residual;  // p^(K+1)
};

template <class Row>
materialised_recursion materialise(const Row& p, const Row& q, const std::vector<token_t>& cand,
                                   ref_proposal kind) {
  const std::size_t n = p.size();
  std::vector<long double> cur(p.begin(), p.end()), qj(n);
  std::vector<bool> removed(n, false);
  materialised_recursion out;
  for (std::size_t j = 0; j < cand.size(); ++j) {
    const auto c = static_cast<std::size_t>(cand[j]);
    long double rest = 0.0L;
    for (std::size_t x = 0; x < n; ++x)
      if (!removed[x]) rest += q[x];
    for (std::size_t x = 0; x < n; ++x) {
      switch (kind) {
        case ref_proposal::one_hot:
          qj[x] = x == c ? 1.0L : 0.0L;
          break;
        case ref_proposal::with:
          qj[x] = q[x];
          break;
        case ref_proposal::without:
          qj[x] = removed[x] ? 0.0L : j == 0 ? q[x] : q[x] / rest;
          break;
        case ref_proposal::without_unnormalised:
          qj[x] = removed[x] ? 0.0L : q[x];
          break;
      }
    }
    out.accept.push_back(qj[c] > 0.0L ? std::min(1.0L, cur[c] / qj[c]) : 1.0L);
    long double z = 0.0L;
    for (std::size_t x = 0; x < n; ++x) z += cur[x] = std::max(cur[x] - qj[x], 0.0L);
    for (auto& v : cur) v /= z;
    if (kind == ref_proposal::without || kind == ref_proposal::without_unnormalised)
      removed[c] = true;
  }
  out.residual = cur;
  return out;
}

long double total_variation(const std::vector<long double>& a, const std::vector<long double>& b) {
  long double tv = 0.0L;
  for (std::size_t x = 0; x < a.size(); ++x) tv += std::fabs(a[x] - b[x]);
  return tv / 2;
}

/// Runs verify_candidates (residual floor 0) on rows of type T under the probe.
template <class T>
rejecting_probe reject_all(const std::vector<T>& p, const std::vector<T>& q,
                           const std::vector<token_t>& cand, ref_proposal kind,
                           bool fallback = false) {
  rejecting_probe probe;
  const row_view<const T> pr(p.data(), static_cast<index_t>(p.size()));
  const row_view<const T> qr(q.data(), static_cast<index_t>(q.size()));
  const auto k = static_cast<index_t>(cand.size());
  std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)));
  candidates_result r;
  if (kind == ref_proposal::one_hot)
    r = verify_candidates(exact_rule{}, probe, pr, one_hot_candidates{}, cand.data(), k, 0.0, 0,
                          ws.data());
  else if (kind == ref_proposal::with)
    r = verify_candidates(exact_rule{}, probe, pr, with_replacement<T>{qr}, cand.data(), k, 0.0, 0,
                          ws.data());
  else
    r = verify_candidates(exact_rule{}, probe, pr, without_replacement<T>{qr}, cand.data(), k, 0.0,
                          0, ws.data());
  REQUIRE(r.accepted == -1);
  REQUIRE(((r.flags & chain_residual_fallback) != 0) == fallback);
  return probe;
}

template <class T>
std::vector<T> rows_of(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

}  // namespace

TEMPLATE_TEST_CASE(
    "K rejected candidates: acceptance tests and residual sample follow the "
    "materialised recursion",
    "[verify][tree]", float, double) {
  using T = TestType;
  const index_t vocab = 1000;  // four tiles of the host passes, the last one partial
  struct scenario {
    const char* name;
    std::vector<double> p, q;
    std::vector<token_t> cand;
    ref_proposal kind;
  };
  std::vector<scenario> scenarios;
  const auto p = testing::random_probability_row(vocab, 11, 0, 0.0);
  const auto q = testing::random_probability_row(vocab, 11, 1, 0.0);
  // Candidates in one tile and across tile boundaries (255 | 256), the last element among them.
  const std::vector<token_t> six = {3, 700, 4, 999, 256, 255};
  scenarios.push_back({"without replacement", p, q, six, ref_proposal::without});
  scenarios.push_back({"i.i.d., a repeat", p, q, {3, 700, 3, 999}, ref_proposal::with});
  // q next to p (a relative 1e-6 apart): Z_1 ~ 1e-6, so the later steps subtract a tiny
  // multiple of q from p - q, where rounding relative to p would show.
  std::vector<double> near = p;
  for (std::size_t x = 0; x < near.size(); ++x) near[x] *= 1.0 + 1e-6 * (x % 3 == 0 ? 1 : -1);
  scenarios.push_back({"without replacement, q next to p", p, near, six, ref_proposal::without});
  scenarios.push_back({"i.i.d., q next to p", p, near, {3, 700, 4}, ref_proposal::with});
  // One-hot candidates holding all but 1e-3 of the target at each step: Z_j ~ 1e-3.
  std::vector<double> geometric(static_cast<std::size_t>(vocab), 1e-24);
  for (std::size_t x = 0; x < 6; ++x) geometric[x] = std::pow(1e-3, static_cast<double>(x));
  scenarios.push_back(
      {"one-hot, Z ~ 1e-3", geometric, geometric, {0, 1, 2, 3, 4}, ref_proposal::one_hot});
  scenarios.push_back({"one-hot, a repeat", p, q, {5, 5, 999, 0}, ref_proposal::one_hot});
  for (const auto& sc : scenarios) {
    INFO(sc.name);
    const auto pt = rows_of<T>(sc.p), qt = rows_of<T>(sc.q);
    const auto probe = reject_all(pt, qt, sc.cand, sc.kind);
    const auto ref = materialise(pt, qt, sc.cand, sc.kind);
    REQUIRE(probe.samples == 1);
    REQUIRE(probe.accept.size() == sc.cand.size());
    for (std::size_t j = 0; j < sc.cand.size(); ++j) {
      INFO("test " << j + 1);
      CHECK(std::fabs(probe.accept[j] - ref.accept[j]) <= 1e-12L * ref.accept[j]);
    }
    const long double tv = total_variation(probe.law, ref.residual);
    INFO("total variation " << static_cast<double>(tv));
    CHECK(tv <= 1e-12L);
  }
  if constexpr (std::is_same_v<T, double>) {
    // Normalisers of ~1e-100: P_3 = 1e200 passes threshold_form_max_scale (2^512), so the third
    // step falls back to sampling from p^(3), as an exhausted residual does (reaching it has
    // probability 1e-200 here).
    std::vector<double> steep(static_cast<std::size_t>(vocab), 1e-300);
    steep[0] = 1.0;
    steep[1] = 1e-100;
    steep[2] = 1e-200;
    const std::vector<token_t> three = {0, 1, 2};
    const auto probe = reject_all(steep, steep, three, ref_proposal::one_hot, true);
    const auto ref = materialise(steep, steep, {0, 1}, ref_proposal::one_hot);
    REQUIRE(probe.accept.size() == 3);
    CHECK(total_variation(probe.law, ref.residual) <= 1e-12L);
  }
  if constexpr (std::is_same_v<T, double>) {
    // A residual mass below the smallest normal double (1e-310 here) counts as empty: 1 / Z_1
    // would overflow. The first step falls back and samples p itself.
    std::vector<double> tiny(static_cast<std::size_t>(vocab), 0.0);
    tiny[0] = 1.0;
    tiny[1] = 1e-310;
    const std::vector<token_t> two = {0, 1};
    const auto probe = reject_all(tiny, tiny, two, ref_proposal::one_hot, true);
    REQUIRE(probe.accept.size() == 1);
    const std::vector<long double> target(tiny.begin(), tiny.end());
    CHECK(total_variation(probe.law, target) <= 1e-12L);
  }
  // Negative control: a recursion without the renormalisation of q after a removal.
  const auto pt = rows_of<T>(p), qt = rows_of<T>(q);
  const auto probe = reject_all(pt, qt, six, ref_proposal::without);
  const auto wrong = materialise(pt, qt, six, ref_proposal::without_unnormalised);
  CHECK(total_variation(probe.law, wrong.residual) > 1e-6L);  // 1e6 times the tolerance
}

TEST_CASE("negative controls: wrong proposals for the candidates are biased",
          "[verify][tree][law]") {
  const auto pr = make_pair(pair_kind::dense, 5, 4242);
  // q^(k) not renormalised after removing earlier candidates.
  const auto a = testing::check_lossless(
      pr.p, k_candidates(pr.p, pr.q, 3, draw_mode::without,
                         [](auto q) { return unnormalised_without_replacement<double>{q}; }));
  // Candidates drawn without replacement but verified as if i.i.d.
  const auto b = testing::check_lossless(
      pr.p, k_candidates(pr.p, pr.q, 3, draw_mode::without,
                         [](auto q) { return with_replacement<double>{q}; }));
  INFO(a.describe() << "\n" << b.describe());
  CHECK(a.max_abs_error > 1e-3);
  CHECK(b.max_abs_error > 1e-3);
}

TEST_CASE("one candidate draws and decides exactly like chain verification", "[verify][tree]") {
  for (std::uint32_t r = 0; r < 300; ++r) {
    const index_t vocab = 50;
    const auto pd = testing::random_probability_row(vocab, r, 0, 0.2);
    const auto qd = testing::random_probability_row(vocab, r, 1, 0.2);
    std::vector<float> p(pd.begin(), pd.end()), q(qd.begin(), qd.end());
    token_t x = 0;
    for (index_t y = 0; y < vocab; ++y)
      if (q[static_cast<std::size_t>(y)] > 0.0f) x = static_cast<token_t>(y);
    const request_rng rng{9, r, 0};
    philox_source src{rng};
    double ws[2];
    const auto c = verify_candidates(exact_rule{}, src, row_view<const float>(p),
                                     without_replacement<float>{row_view<const float>(q)}, &x, 1,
                                     default_residual_floor, 0, ws);
    token_t out[2];
    auto target_row = [&](index_t) { return row_view<const float>(p); };
    auto prop = [&](index_t) { return dense_proposal<float>{row_view<const float>(q)}; };
    const auto ch = verify_chain_request(exact_rule{}, src, 1, &x, target_row, prop,
                                         default_residual_floor, out, nullptr);
    REQUIRE(ch.num_accepted == (c.accepted == 0 ? 1 : 0));
    if (ch.num_accepted == 0) REQUIRE(out[0] == c.token);
  }
}

TEST_CASE("verify_candidates_checked rejects bad input, naming the argument",
          "[verify][bad_input]") {
  const std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f};
  const std::vector<float> q = {0.4f, 0.3f, 0.2f, 0.1f};
  std::vector<token_t> cand = {1, 3};
  std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(2)));
  const request_rng rng{9, 0, 0};
  auto call = [&](const std::vector<float>& pr, const std::vector<float>& qr,
                  const std::vector<token_t>& c, std::vector<double>& w,
                  check_level level = check_level::reads) {
    candidates_options o;
    o.check = level;
    return verify_candidates_checked(exact_rule{}, rng, row_view<const float>(pr),
                                     without_replacement<float>{row_view<const float>(qr)},
                                     row_view<const token_t>(c), row_view<double>(w), 0, o);
  };
  auto expect = [](auto&& f, status code, const std::string& argument) {
    try {
      f();
      FAIL("no exception; expected " << argument << ": " << describe(code));
    } catch (const invalid_input& e) {
      INFO(e.what());
      CHECK(e.code() == code);
      CHECK(e.argument() == argument);
    }
  };
  SECTION("valid input gives the unchecked result") {
    std::vector<double> ws2 = ws;
    philox_source src{rng};
    const auto want = verify_candidates(exact_rule{}, src, row_view<const float>(p),
                                        without_replacement<float>{row_view<const float>(q)},
                                        cand.data(), 2, default_residual_floor, 0, ws2.data());
    for (check_level level : {check_level::reads, check_level::full}) {
      const auto got = call(p, q, cand, ws, level);
      CHECK(got.token == want.token);
      CHECK(got.accepted == want.accepted);
      CHECK(got.flags == want.flags);
    }
  }
  for (check_level level : {check_level::reads, check_level::full}) {
    SECTION("candidate -1, at either level") {
      std::vector<token_t> bad = {1, -1};
      expect([&] { call(p, q, bad, ws, level); }, status::token_out_of_range, "candidates");
    }
    SECTION("candidate >= vocab, at either level") {
      std::vector<token_t> bad = {4};
      expect([&] { call(p, q, bad, ws, level); }, status::token_out_of_range, "candidates");
    }
    SECTION("workspace too small, at either level") {
      std::vector<double> small(3);
      expect([&] { call(p, q, cand, small, level); }, status::length_mismatch, "workspace");
    }
    SECTION("repeated candidate drawn without replacement") {
      std::vector<token_t> rep = {3, 3};
      expect([&] { call(p, q, rep, ws, level); }, status::invalid_parameter, "candidates");
    }
    SECTION("q(c) = 0") {
      std::vector<float> q0 = {0.5f, 0.0f, 0.4f, 0.1f};
      expect([&] { call(p, q0, cand, ws, level); }, status::zero_draft_probability, "q");
    }
    SECTION("NaN at p(c)") {
      std::vector<float> pn = p;
      pn[3] = std::numeric_limits<float>::quiet_NaN();
      expect([&] { call(pn, q, cand, ws, level); }, status::nan_value, "p");
    }
    SECTION("q row of another length") {
      std::vector<float> q5 = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
      expect([&] { call(p, q5, cand, ws, level); }, status::length_mismatch, "q");
    }
  }
  SECTION("candidates the recursion never tests are checked at full but not at reads") {
    // p = q: the first candidate is accepted with probability min(1, p/q) = 1, so p(3) and q(3)
    // of the second are never read.
    const std::vector<float> row = {0.1f, 0.2f, 0.3f, 0.4f};
    const auto clean = call(row, row, cand, ws, check_level::reads);
    REQUIRE(clean.accepted == 0);
    for (const bool in_q : {false, true}) {
      INFO((in_q ? "q(3)" : "p(3)"));
      std::vector<float> bad = row;
      bad[3] = in_q ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      const auto& pr = in_q ? row : bad;
      const auto& qr = in_q ? bad : row;
      expect([&] { call(pr, qr, cand, ws, check_level::full); },
             in_q ? status::zero_draft_probability : status::nan_value, in_q ? "q" : "p");
      candidates_result got;
      REQUIRE_NOTHROW(got = call(pr, qr, cand, ws, check_level::reads));
      CHECK(got.token == clean.token);
      CHECK(got.accepted == clean.accepted);
      CHECK(got.flags == clean.flags);
    }
    SECTION("and a tested candidate's are refused at reads") {
      std::vector<float> bad = row;
      bad[1] = -1e-9f;  // p(1), the first candidate
      expect([&] { call(bad, row, cand, ws, check_level::reads); }, status::negative_value, "p");
      expect([&] { call(row, bad, cand, ws, check_level::reads); }, status::negative_value, "q");
    }
  }
  SECTION("a negative p entry away from the candidates: read after a rejection") {
    // p(1) = p(3) = 0: both candidates are rejected, so p and q are read in full.
    std::vector<float> pr = {0.6f, 0.0f, 0.5f, 0.0f};
    pr[2] = -0.1f;
    pr[0] = 1.1f;
    for (check_level level : {check_level::reads, check_level::full})
      expect([&] { call(pr, q, cand, ws, level); }, status::negative_value, "p");
  }
}
