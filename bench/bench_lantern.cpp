// LANTERN neighbour tables and verification at LANTERN's k = 1000 (bench/README.md).
//
// lantern/table/<l2|cosine>/V:<V>/d:<d>/k:<k>: one neighbour_table build from a V×d matrix of
//   normal entries (one iteration per repetition: a build takes seconds to minutes); bytes: the
//   embedding matrix read once plus the table written (V·k·10); counters GFMA_per_s (V²·d
//   multiply-adds of the screening over the time) and table_MB.
// lantern/verify/<exact|optimal|vanilla|lantern|lantern_official>/V:<V>/k:1000: one unchecked
//   chain call (verify_chain_unchecked, B = 1, L = 1) whose draft x = argmax p is rejected
//   (q = (p + one_hot(x))/2, p = softmax of normal logits, σ = 3), with
//   lantern_rule::make_relative(table, 2, r, lantern_cap::official) (LANTERN++'s λ = 2) or the
//   exact rule; bytes: the p and q rows once (8V, the exact rule's floor); counter A = |A| of the
//   drafted token. The table is synthetic (row t: t + o_j mod V for 1000 distinct random
//   offsets o_j, random-looking ids as a codebook's are), since the cost does not depend on the
//   geometry.
// lantern/tree/<exact|optimal|vanilla>/V:<V>/K:4[/k:1000]: one unchecked verify_tree call of a
//   root with K = 4 children (p's 4 most likely tokens, q = p/2 + 1/8 on each), every child
//   rejected: the K-candidate recursion, pointwise for the exact rule, with two materialised
//   residual rows for the row-aware LANTERN++ rule (λ = 2, k = 1000); bytes: p and q once per
//   candidate (8V·K).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/rules/exact.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/tree.hpp"
#include "stream_baseline.hpp"

namespace {

using namespace specula;

std::vector<float> normal_matrix(index_t rows, index_t cols, std::uint64_t seed) {
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  const request_rng rng{seed, 0, 0};
  for (std::size_t i = 0; i < m.size(); i += 2) {
    const double u1 = std::max(uniform_at(rng, draw_id{static_cast<std::uint32_t>(i), 0}), 1e-300);
    const double u2 = uniform_at(rng, draw_id{static_cast<std::uint32_t>(i), 1});
    const double r = std::sqrt(-2.0 * std::log(u1));
    m[i] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
    if (i + 1 < m.size()) m[i + 1] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
  }
  return m;
}

void bm_table(benchmark::State& state, index_t V, index_t d, index_t k, neighbour_metric m) {
  const auto e = normal_matrix(V, d, 7);
  const double bytes = static_cast<double>(V * d) * 4 + static_cast<double>(V * k) * 10;
  const double stream = bench::stream_bytes_per_second(static_cast<std::size_t>(bytes));
  double secs = 0;
  std::int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const neighbour_table t(batch_view<const float>(e.data(), V, d), k, m);
    benchmark::DoNotOptimize(t.view().ids);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
  }
  state.counters["bytes"] = bytes;
  state.counters["stream_GBps"] = stream / 1e9;
  state.counters["frac_of_stream"] = bytes * static_cast<double>(iters) / secs / stream;
  state.counters["GFMA_per_s"] = static_cast<double>(V) * static_cast<double>(V) *
                                 static_cast<double>(d) * static_cast<double>(iters) / secs / 1e9;
  state.counters["table_MB"] = static_cast<double>(V * k) * 10 / 1e6;
}

/// Row t's neighbours: t + o_j mod V for k distinct offsets o_j in [1, V).
neighbour_table synthetic_table(index_t V, index_t k) {
  std::vector<index_t> off(static_cast<std::size_t>(V - 1));
  std::iota(off.begin(), off.end(), 1);
  const request_rng rng{99, 0, 0};
  for (index_t i = 0; i < k; ++i) {  // partial Fisher–Yates
    const auto j =
        i + static_cast<index_t>(uniform_at(rng, draw_id{static_cast<std::uint32_t>(i), 0}) *
                                 static_cast<double>(V - 1 - i));
    std::swap(off[static_cast<std::size_t>(i)], off[static_cast<std::size_t>(std::min(j, V - 2))]);
  }
  std::vector<token_t> ids(static_cast<std::size_t>(V * k));
  for (index_t t = 0; t < V; ++t)
    for (index_t j = 0; j < k; ++j)
      ids[static_cast<std::size_t>(t * k + j)] =
          static_cast<token_t>((t + off[static_cast<std::size_t>(j)]) % V);
  return neighbour_table(std::move(ids), V, k);
}

/// Softmax of normal logits (σ = 3), as the transform benchmarks use.
std::vector<float> softmax_row(index_t V, std::uint64_t seed) {
  auto l = normal_matrix(1, V, seed);
  double mx = -1e300, s = 0;
  for (float v : l) mx = std::max(mx, 3.0 * v);
  std::vector<double> w(l.size());
  for (std::size_t i = 0; i < l.size(); ++i) s += (w[i] = std::exp(3.0 * l[i] - mx));
  std::vector<float> p(l.size());
  for (std::size_t i = 0; i < l.size(); ++i) p[i] = static_cast<float>(w[i] / s);
  return p;
}

/// The verify scenario: p = softmax of normal logits, x = argmax p, q = (p + one_hot(x)) / 2,
/// so that f(x) = min(1, mass / q(x)) < 1 and A is not empty (cap p(x) >= small neighbours).
struct verify_rows {
  std::vector<float> p, q;
  token_t x;
  explicit verify_rows(index_t V) : p(softmax_row(V, 2)), q(p) {
    x = static_cast<token_t>(std::max_element(p.begin(), p.end()) - p.begin());
    for (auto& v : q) v *= 0.5f;
    q[static_cast<std::size_t>(x)] += 0.5f;
    p.resize(static_cast<std::size_t>(2 * V));
    std::copy(p.begin(), p.begin() + V, p.begin() + V);  // p_2 (unused: the draft is rejected)
  }
};

template <class Rule>
void bm_verify(benchmark::State& state, index_t V, const Rule& rule, double a_size) {
  const verify_rows rows(V);
  const std::vector<index_t> off = {0, 1};
  const std::vector<token_t> drafts = {rows.x};
  std::vector<request_rng> rng = {{0, 0, 0}};
  std::vector<token_t> out(2);
  std::vector<std::int32_t> acc(1);
  const chain_batch_input<float> in{V,  off, drafts, {rows.q.data(), 1, V}, {rows.p.data(), 2, V},
                                    rng};
  const chain_batch_output o{out, acc, {}, {}};
  // A seed whose acceptance test rejects x.
  for (std::uint64_t s = 1; s < 1000; ++s) {
    rng[0] = {s, 0, 0};
    verify_chain_unchecked(host::seq, in, o, {}, rule);
    if (acc[0] == 0) break;
  }
  if (acc[0] != 0) {
    state.SkipWithError("no rejecting seed");
    return;
  }
  bench::run_against_stream(state, 8.0 * static_cast<double>(V),
                            [&] { verify_chain_unchecked(host::seq, in, o, {}, rule); });
  state.counters["accepted_mean"] = acc[0];
  state.counters["A"] = a_size;
}

/// K siblings under a root, all rejected: the K-candidate recursion of verify_tree. Rows: p as
/// in verify_rows, the children the K most likely tokens of p, q = p/2 + 1/(2K) on each child
/// (so every child has f < 1). A seed whose verification rejects every child is used.
template <class Rule>
void bm_tree_verify(benchmark::State& state, index_t V, index_t K, const Rule& rule) {
  const verify_rows rows(V);
  std::vector<index_t> order(static_cast<std::size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](index_t a, index_t b) {
    return rows.p[static_cast<std::size_t>(a)] > rows.p[static_cast<std::size_t>(b)];
  });
  std::vector<index_t> parents = {-1};
  std::vector<token_t> tokens = {0};
  for (index_t j = 0; j < K; ++j) {
    parents.push_back(0);
    tokens.push_back(static_cast<token_t>(order[static_cast<std::size_t>(j)]));
  }
  const std::vector<token_tree> trees = {token_tree(parents, tokens)};
  const index_t n = K + 1;
  std::vector<float> p, q;
  for (index_t u = 0; u < n; ++u) p.insert(p.end(), rows.p.begin(), rows.p.begin() + V);
  std::vector<float> q0(rows.p.begin(), rows.p.begin() + V);
  for (auto& v : q0) v *= 0.5f;
  for (index_t j = 0; j < K; ++j)
    q0[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] +=
        0.5f / static_cast<float>(K);
  for (index_t u = 0; u < n; ++u) q.insert(q.end(), q0.begin(), q0.end());
  std::vector<request_rng> rng = {{0, 0, 0}};
  std::vector<token_t> out(static_cast<std::size_t>(n));
  std::vector<std::int32_t> acc(1);
  const tree_batch_input<float> in{V, trees, {p.data(), n, V}, {q.data(), n, V}, rng};
  const tree_batch_output o{out, acc, {}, {}};
  tree_workspace ws;
  for (std::uint64_t s = 1; s < 1000; ++s) {
    rng[0] = {s, 0, 0};
    verify_tree_unchecked(host::seq, in, o, ws, {}, rule);
    if (acc[0] == 0) break;
  }
  if (acc[0] != 0) {
    state.SkipWithError("no seed rejects every child");
    return;
  }
  // The floor: p and q read once per candidate (K passes of 8V bytes).
  bench::run_against_stream(state, 8.0 * static_cast<double>(V * K),
                            [&] { verify_tree_unchecked(host::seq, in, o, ws, {}, rule); });
}

const int registered = [] {
  for (const index_t V : {index_t{32000}, index_t{128256}})
    for (const index_t k : {index_t{64}, index_t{1000}})
      for (const index_t d : {index_t{64}, index_t{256}}) {
        const std::string name = "lantern/table/l2/V:" + std::to_string(V) +
                                 "/d:" + std::to_string(d) + "/k:" + std::to_string(k);
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& s) { bm_table(s, V, d, k, neighbour_metric::l2); })
            ->Iterations(1)
            ->Unit(benchmark::kSecond);
      }
  benchmark::RegisterBenchmark(
      "lantern/table/cosine/V:32000/d:64/k:1000",
      [](benchmark::State& s) { bm_table(s, 32000, 64, 1000, neighbour_metric::cosine); })
      ->Iterations(1)
      ->Unit(benchmark::kSecond);

  for (const index_t V : {index_t{32000}, index_t{128256}}) {
    const std::string suffix = "/V:" + std::to_string(V) + "/k:1000";
    benchmark::RegisterBenchmark(("lantern/verify/exact" + suffix).c_str(),
                                 [=](benchmark::State& s) { bm_verify(s, V, exact_rule{}, 0); })
        ->Unit(benchmark::kMicrosecond);
    for (const auto r : {resampling::optimal, resampling::vanilla, resampling::lantern,
                         resampling::lantern_official}) {
      const char* rn = r == resampling::optimal   ? "optimal"
                       : r == resampling::vanilla ? "vanilla"
                       : r == resampling::lantern ? "lantern"
                                                  : "lantern_official";
      benchmark::RegisterBenchmark(
          ("lantern/verify/" + std::string(rn) + suffix).c_str(),
          [=](benchmark::State& s) {
            static std::unique_ptr<neighbour_table> table;  // built once per V
            static index_t table_v = 0;
            if (table_v != V) {
              table = std::make_unique<neighbour_table>(synthetic_table(V, 1000));
              table_v = V;
            }
            const auto rule = lantern_rule::make_relative(*table, 2.0, r, lantern_cap::official);
            const verify_rows rows(V);
            const auto b = rule.bind(row_view<const float>(rows.p.data(), V), rows.x);
            bm_verify(s, V, rule, static_cast<double>(b.count));
          })
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // Trees: K = 4 rejected siblings, the exact rule's pointwise recursion against a row-aware
  // rule's materialised residual rows (LANTERN++ λ = 2, k = 1000, G*).
  for (const index_t V : {index_t{32000}, index_t{128256}}) {
    const std::string suffix = "/V:" + std::to_string(V) + "/K:4";
    benchmark::RegisterBenchmark(("lantern/tree/exact" + suffix).c_str(), [=](benchmark::State& s) {
      bm_tree_verify(s, V, 4, exact_rule{});
    })->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("lantern/tree/optimal" + suffix + "/k:1000").c_str(),
                                 [=](benchmark::State& s) {
                                   const neighbour_table table = synthetic_table(V, 1000);
                                   bm_tree_verify(s, V, 4, lantern_rule::make_relative(table, 2.0));
                                 })
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(
        ("lantern/tree/vanilla" + suffix + "/k:1000").c_str(),
        [=](benchmark::State& s) {
          const neighbour_table table = synthetic_table(V, 1000);
          bm_tree_verify(s, V, 4, lantern_rule::make_relative(table, 2.0, resampling::vanilla));
        })
        ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}();

}  // namespace
