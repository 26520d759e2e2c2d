// check_level::reads validates each row the verifier reads in full inside the pass that sums
// its weights (checking_passes, detail::dense_tile_sums): on every instruction set, checked
// calls give the unchecked results on valid input, and a bad entry in a row that only that pass
// reads (a bonus row, a rejected position's p and q rows, a candidate position's rows) is
// reported with the argument, row and column check_probability_row gives. Rows are long enough
// for the AVX2 groups of tiles, a partial tile and a tail shorter than a vector.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../isa_cases.hpp"
#include "bad_input_util.hpp"
#include "specula/core/simd.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/tree.hpp"

using namespace specula;
using specula::test::expected_error;
using specula::test::require_error;

namespace {

/// A probability row of length v (float sum within 1e-6 of 1), with -0 and +0 entries.
std::vector<float> prob_row(index_t v, std::uint32_t id) {
  std::vector<double> w(static_cast<std::size_t>(v));
  double sum = 0.0;
  for (index_t i = 0; i < v; ++i) {
    const double u = uniform_at(request_rng{5, id, 0}, draw_id{static_cast<std::uint32_t>(i), 0});
    w[static_cast<std::size_t>(i)] = u * u * u;
    sum += u * u * u;
  }
  std::vector<float> row(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) row[i] = static_cast<float>(w[i] / sum);
  if (v > 20) {
    row[4] += row[3] + row[static_cast<std::size_t>(v - 2)];
    row[3] = -0.0f;
    row[static_cast<std::size_t>(v - 2)] = 0.0f;
  }
  return row;
}

/// A bad entry, and the status check_probability_row reports for it.
struct corruption {
  const char* name;
  float value;  // NaN marks "add 0.01": a row whose sum is off
  status code;
};

const float nan = std::numeric_limits<float>::quiet_NaN();
const float inf = std::numeric_limits<float>::infinity();
const corruption corruptions[] = {{"NaN", nan, status::nan_value},
                                  {"negative", -1e-3f, status::negative_value},
                                  {"+inf", inf, status::inf_value},
                                  {"-inf", -inf, status::inf_value},
                                  {"bad sum", 0.0f, status::bad_row_sum}};

void corrupt(std::vector<float>& rows, index_t row, index_t v, index_t col, const corruption& c) {
  float& x = rows[static_cast<std::size_t>(row * v + col)];
  if (c.code == status::bad_row_sum)
    x += 0.01f;
  else
    x = c.value;
}

/// B = 3 requests of L = 3 drafts (token 0 at every position, p = q at the drafts: all
/// accepted). With `reject`, p(0) = 0 at position 1 of every request: rejected there, so the
/// verifier reads that position's p row (and q row, dense drafts) in full and nothing else;
/// otherwise it reads the bonus rows in full.
struct chain_fixture {
  index_t vocab;
  bool one_hot;
  std::vector<index_t> offsets = {0, 3, 6, 9};
  std::vector<token_t> tokens = std::vector<token_t>(9, 0);
  std::vector<float> draft, target;
  std::vector<request_rng> rng = {{1, 0, 0}, {1, 1, 0}, {1, 2, 0}};
  std::vector<token_t> out = std::vector<token_t>(12);
  std::vector<std::int32_t> n = std::vector<std::int32_t>(3);
  std::vector<std::uint32_t> flags = std::vector<std::uint32_t>(3);

  chain_fixture(index_t v, bool reject, bool one_hot_drafts) : vocab(v), one_hot(one_hot_drafts) {
    for (index_t b = 0; b < 3; ++b) {
      for (index_t i = 0; i < 3; ++i) {
        auto q = prob_row(v, static_cast<std::uint32_t>(10 * b + i));
        if (one_hot) {  // p = q: p(0) = 1
          q.assign(q.size(), 0.0f);
          q[0] = 1.0f;
        }
        auto p = q;
        if (reject && i == 1) {
          p = prob_row(v, static_cast<std::uint32_t>(100 + b));
          p[1] += p[0];
          p[0] = 0.0f;
        }
        if (!one_hot) draft.insert(draft.end(), q.begin(), q.end());
        target.insert(target.end(), p.begin(), p.end());
      }
      const auto bonus = prob_row(v, static_cast<std::uint32_t>(200 + b));
      target.insert(target.end(), bonus.begin(), bonus.end());
    }
  }
  [[nodiscard]] chain_batch_input<float> in() const {
    return {
        vocab, offsets, tokens, {draft.data(), one_hot ? 0 : 9, vocab}, {target.data(), 12, vocab},
        rng};
  }
  chain_batch_output output() { return {out, n, {}, flags}; }
};

}  // namespace

SPECULA_ISA_TEST_CASE("checked chain calls at check_level::reads: unchecked results, fused checks",
                      "[verify][bad_input][simd]") {
  for (index_t v : {7, 1000, 4099})
    for (bool reject : {false, true})
      for (bool one_hot : {false, true}) {
        if (one_hot && !reject) continue;  // one-hot accepted drafts read as the dense ones
        {
          INFO("V = " << v << (reject ? ", reject" : ", accept")
                      << (one_hot ? ", one-hot" : ", dense") << ", isa " << simd::name(path));
          chain_fixture want(v, reject, one_hot);
          verify_chain_unchecked(host::seq, want.in(), want.output());
          for (index_t b = 0; b < 3; ++b)
            CHECK(want.n[static_cast<std::size_t>(b)] == (reject ? 1 : 3));
          chain_fixture got(v, reject, one_hot);
          verify_chain(host::seq, got.in(), got.output());
          CHECK(got.out == want.out);
          CHECK(got.n == want.n);
          CHECK(got.flags == want.flags);

          // Request 1: the rows a fused pass reads alone.
          const index_t target_row = reject ? 4 + 1 : 4 + 3;  // position 1, or the bonus row
          const index_t draft_row = 3 + 1;
          for (const corruption& c : corruptions)
            for (index_t col : {index_t{1}, v / 2, v - 1}) {
              INFO(c.name << " at column " << col);
              const index_t reported = c.code == status::bad_row_sum ? -1 : col;
              chain_fixture f(v, reject, one_hot);
              corrupt(f.target, target_row, v, col, c);
              require_error([&] { verify_chain(host::seq, f.in(), f.output()); },
                            {c.code, "target_probs", target_row, reported});
              if (reject && !one_hot) {
                chain_fixture g(v, reject, one_hot);
                corrupt(g.draft, draft_row, v, col, c);
                require_error([&] { verify_chain(host::seq, g.in(), g.output()); },
                              {c.code, "draft_probs", draft_row, reported});
              }
            }
        }
      }
}

SPECULA_ISA_TEST_CASE("checked candidates and tree calls check the rows their passes read",
                      "[verify][bad_input][simd]") {
  const index_t v = 4099;
  {
    SECTION("candidates: both candidates rejected, p and q read in full") {
      auto p = prob_row(v, 1);
      const auto q = prob_row(v, 2);
      p[7] += p[2] + p[5];
      p[2] = p[5] = 0.0f;  // both candidates rejected
      const std::vector<token_t> cand = {2, 5};
      std::vector<double> ws(candidates_workspace_size(2));
      const request_rng rng{4, 0, 0};
      auto call = [&](const std::vector<float>& pr, const std::vector<float>& qr, auto proposal) {
        return verify_candidates_checked(exact_rule{}, rng, row_view<const float>(pr),
                                         proposal(row_view<const float>(qr)),
                                         row_view<const token_t>(cand), row_view<double>(ws), 0);
      };
      auto run_all = [&](auto proposal) {
        philox_source src{rng};
        const auto want = verify_candidates(exact_rule{}, src, row_view<const float>(p),
                                            proposal(row_view<const float>(q)), cand.data(), 2,
                                            default_residual_floor, 0, ws.data());
        const auto got = call(p, q, proposal);
        CHECK(got.token == want.token);
        CHECK(got.accepted == want.accepted);
        CHECK(got.flags == want.flags);
        for (const corruption& c : corruptions) {
          INFO(c.name);
          const index_t reported = c.code == status::bad_row_sum ? -1 : v - 3;
          auto pb = p, qb = q;
          corrupt(pb, 0, v, v - 3, c);
          require_error([&] { call(pb, q, proposal); }, {c.code, "p", -1, reported});
          corrupt(qb, 0, v, v - 3, c);
          require_error([&] { call(p, qb, proposal); }, {c.code, "q", -1, reported});
        }
      };
      run_all([](row_view<const float> r) { return with_replacement<float>{r}; });
      run_all([](row_view<const float> r) { return without_replacement<float>{r}; });
    }
    SECTION("tree: the accepted path's leaf row is read in full (bonus)") {
      // Root with children 1 and 2 (tokens 0 and 1; p(0) = 1: node 1 accepted); node 1 has
      // child 3 (token 2, p = q = 1: accepted), a leaf whose row gives the bonus token.
      const token_tree tree(std::vector<index_t>{-1, 0, 0, 1}, std::vector<token_t>{-1, 0, 1, 2});
      std::vector<float> target, draft;
      for (index_t u = 0; u < 4; ++u) {
        std::vector<float> p(static_cast<std::size_t>(v), 0.0f);
        if (u < 2) {
          p[u == 0 ? 0 : 2] = 1.0f;
        } else {
          p = prob_row(v, static_cast<std::uint32_t>(u));
        }
        auto q = p;
        if (u == 0) q[0] = q[1] = 0.5f;  // both children drawable; token 0 accepted
        target.insert(target.end(), p.begin(), p.end());
        draft.insert(draft.end(), q.begin(), q.end());
      }
      const std::vector<token_tree> trees = {tree};
      const std::vector<request_rng> rng = {{6, 0, 0}};
      std::vector<token_t> out(4);
      std::vector<std::int32_t> n(1);
      tree_workspace ws;
      auto run = [&](const std::vector<float>& t, bool checked) {
        const tree_batch_input<float> in{v, trees, {t.data(), 4, v}, {draft.data(), 4, v}, rng};
        tree_options o;
        o.sampling = sibling_sampling::with_replacement;
        if (checked)
          verify_tree(host::seq, in, tree_batch_output{out, n, {}, {}}, o);
        else
          verify_tree_unchecked(host::seq, in, tree_batch_output{out, n, {}, {}}, ws, o);
      };
      run(target, false);
      const auto want = out;
      CHECK(n[0] == 2);
      run(target, true);
      CHECK(out == want);
      for (const corruption& c : corruptions) {
        INFO(c.name);
        auto bad = target;
        corrupt(bad, 3, v, 1000, c);
        require_error([&] { run(bad, true); },
                      {c.code, "target_probs", 3, c.code == status::bad_row_sum ? -1 : 1000});
      }
    }
  }
}

SPECULA_ISA_TEST_CASE(
    "checked residual passes refuse what check_probability_row refuses at sums "
    "near the tolerance",
    "[verify][bad_input][simd]") {
  // The AVX2 and AVX-512 kernels sum p and q in float lanes and decide "valid" only when their
  // error bound proves it; rows whose sums lie within that bound of the tolerance are scanned
  // exactly. Rows p (sum about 1 + 5e-4) and q (about 1 - 4e-4), both read in full by one
  // residual pass (candidates drawn with replacement and a chain, rejected), against tolerances
  // around each row's |S - 1|, S the sum of check_probability_row's definition (its generic loop
  // over a double copy): one ulp either side, and steps of 2.5e-7 across the band the float sums
  // cannot decide. The checked calls must refuse exactly the rows the definition refuses (p first).
  for (index_t v : {4099, 32003}) {
    auto p = prob_row(v, 11);
    auto q = prob_row(v, 12);
    p[7] += p[0] + p[2] + p[5];
    p[0] = p[2] = p[5] = 0.0f;  // the chain's token 0 and both candidates rejected
    for (float& x : p) x *= 1.0005f;
    for (float& x : q) x *= 0.9996f;
    const std::vector<double> wide_p(p.begin(), p.end()), wide_q(q.begin(), q.end());
    auto definition = [](const std::vector<double>& row, double tolerance) {
      return check_probability_row(row_view<const double>(row), tolerance);
    };
    const double off_p = std::abs(definition(wide_p, 0.0).value - 1.0);
    const double off_q = std::abs(definition(wide_q, 0.0).value - 1.0);
    REQUIRE(off_p > 4e-4);
    REQUIRE(off_q > 3e-4);
    std::vector<double> tolerances;
    for (double off : {off_p, off_q}) {
      tolerances.push_back(std::nextafter(off, 0.0));
      tolerances.push_back(off);
      tolerances.push_back(std::nextafter(off, 1.0));
      for (int j = -16; j <= 16; ++j) tolerances.push_back(off + j * 2.5e-7);
    }
    const std::vector<token_t> cand = {2, 5};
    std::vector<double> ws(candidates_workspace_size(2));
    // The chain: request 1 rejected at position 1 (target row 5, draft row 4), the only rows
    // off by more than 1e-6.
    chain_fixture f(v, true, false);
    std::copy(p.begin(), p.end(), f.target.begin() + 5 * v);
    std::copy(q.begin(), q.end(), f.draft.begin() + 4 * v);
    for (double tol : tolerances) {
      INFO("V = " << v << ", tolerance " << tol << " (p off by " << off_p << ", q by " << off_q
                  << ")");
      const bool p_ok = definition(wide_p, tol).ok();
      const bool q_ok = definition(wide_q, tol).ok();
      auto expect = [&](const std::function<void()>& call, const char* p_name, const char* q_name,
                        index_t p_row, index_t q_row) {
        if (p_ok && q_ok)
          CHECK_NOTHROW(call());
        else
          require_error(call,
                        {status::bad_row_sum, p_ok ? q_name : p_name, p_ok ? q_row : p_row, -1});
      };
      candidates_options o;
      o.sum_tolerance = tol;
      expect(
          [&] {
            (void)verify_candidates_checked(
                exact_rule{}, request_rng{4, 0, 0}, row_view<const float>(p),
                with_replacement<float>{row_view<const float>(q)},  // a fused residual
                row_view<const token_t>(cand), row_view<double>(ws), 0, o);
          },
          "p", "q", -1, -1);
      chain_options co;
      co.sum_tolerance = tol;
      expect([&] { verify_chain(host::seq, f.in(), f.output(), co); }, "target_probs",
             "draft_probs", 5, 4);
    }
  }
}
