// The example backend's kernels (gemm.hpp, kernels.hpp) against naive double-precision
// references, on every instruction set the dispatcher can pick (forced one at a time; sets this
// CPU cannot run are skipped with a message), and the transformer with each set and thread count.

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <specula_example/sessions.hpp>

#include "transformer_test_util.hpp"

using namespace specula;
using namespace specula::example;
using specula::example::testing::random_tokens;
using specula::example::testing::random_tree;
using specula::example::testing::random_weights;
using specula::example::testing::reference_logits;
using specula::example::testing::small_config;
namespace kd = specula::example::detail;

namespace {

/// The instruction sets this CPU runs; the others are reported as skipped.
std::vector<cpu_isa> runnable_isas() {
  std::vector<cpu_isa> out;
  for (const cpu_isa isa : {cpu_isa::generic, cpu_isa::avx2, cpu_isa::avx512}) {
    if (cpu_supports(isa))
      out.push_back(isa);
    else
      WARN("skipped instruction set " << to_string(isa) << ": this CPU (or build) cannot run it");
  }
  return out;
}

std::vector<float> random_floats(std::mt19937_64& g, index_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

/// c = A·Wᵀ (+ c) through the packed kernels for panels [p0, p1), A rows of lda floats.
void packed_product(cpu_isa isa, const std::vector<float>& a, index_t m, index_t lda,
                    const packed_weights& w, std::vector<float>& c, bool accumulate, index_t p0,
                    index_t p1) {
  const kd::gemm_args g{.m = m,
                        .n = w.out(),
                        .k = w.in(),
                        .a = a.data(),
                        .lda = lda,
                        .b = w.data(),
                        .c = c.data(),
                        .ldc = w.out(),
                        .accumulate = accumulate};
  kd::gemm_panels(isa, g, p0, p1);
}

}  // namespace

TEST_CASE("packed products match the naive double-precision reference on every instruction set",
          "[backend][kernel]") {
  std::mt19937_64 g(21);
  // Rows across the tile heights (1..12) and row chunks (96 rows for AVX2, 192 for AVX-512);
  // widths that are and are not multiples of the 16-column panel; odd inner sizes.
  const std::vector<index_t> ms{1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 31, 64, 97, 200};
  const std::vector<std::pair<index_t, index_t>> shapes{{1, 1},   {7, 3},     {16, 16}, {17, 31},
                                                        {33, 64}, {100, 257}, {48, 5},  {63, 130}};
  for (const cpu_isa isa : runnable_isas()) {
    INFO("isa " << to_string(isa));
    for (const auto& [n, k] : shapes)
      for (const index_t m : ms) {
        INFO("m " << m << ", n " << n << ", k " << k);
        const index_t lda = k + 3;  // rows of A are not contiguous
        const auto a = random_floats(g, m * lda);
        const auto w = random_floats(g, n * k);
        const packed_weights pw(k, {w});
        REQUIRE(pw.out() == n);
        for (const bool accumulate : {false, true}) {
          std::vector<float> c = random_floats(g, m * n);
          const std::vector<float> before = c;
          packed_product(isa, a, m, lda, pw, c, accumulate, 0, pw.panels());
          double worst = 0.0;
          for (index_t r = 0; r < m; ++r)
            for (index_t o = 0; o < n; ++o) {
              double ref = accumulate ? before[static_cast<std::size_t>(r * n + o)] : 0.0;
              double mag = std::abs(ref);
              for (index_t i = 0; i < k; ++i) {
                const double t = static_cast<double>(a[static_cast<std::size_t>(r * lda + i)]) *
                                 w[static_cast<std::size_t>(o * k + i)];
                ref += t;
                mag += std::abs(t);
              }
              // fp32 accumulation of k + 1 terms: error within (k + 1) eps of the magnitudes.
              const double err = std::abs(c[static_cast<std::size_t>(r * n + o)] - ref);
              worst =
                  std::max(worst, err / ((static_cast<double>(k) + 1.0) * 1.2e-7 * mag + 1e-30));
            }
          CHECK(worst <= 1.0);
        }
      }
  }
}

TEST_CASE("a row's product does not depend on the other rows or on the panel split",
          "[backend][kernel]") {
  std::mt19937_64 g(22);
  const index_t m = 37, n = 83, k = 45;
  const auto a = random_floats(g, m * k);
  const auto w = random_floats(g, n * k);
  const packed_weights pw(k, {w});
  for (const cpu_isa isa : runnable_isas()) {
    INFO("isa " << to_string(isa));
    std::vector<float> all(static_cast<std::size_t>(m * n));
    packed_product(isa, a, m, k, pw, all, false, 0, pw.panels());
    // Each row alone, bit for bit.
    for (index_t r = 0; r < m; ++r) {
      const std::vector<float> row(a.begin() + r * k, a.begin() + (r + 1) * k);
      std::vector<float> one(static_cast<std::size_t>(n));
      packed_product(isa, row, 1, k, pw, one, false, 0, pw.panels());
      for (index_t o = 0; o < n; ++o)
        REQUIRE(one[static_cast<std::size_t>(o)] == all[static_cast<std::size_t>(r * n + o)]);
    }
    // Panel ranges as threads split them write their columns only, with the same values.
    std::vector<float> split(all.size(), -7.0f);
    const index_t cut = 2;
    packed_product(isa, a, m, k, pw, split, false, 0, cut);
    for (index_t r = 0; r < m; ++r)
      for (index_t o = 0; o < n; ++o)
        CHECK(split[static_cast<std::size_t>(r * n + o)] ==
              (o < cut * kd::panel_width ? all[static_cast<std::size_t>(r * n + o)] : -7.0f));
    packed_product(isa, a, m, k, pw, split, false, cut, pw.panels());
    CHECK(split == all);
  }
}

TEST_CASE("a linear layer split over threads equals the single-threaded product",
          "[backend][kernel]") {
  std::mt19937_64 g(28);
  const index_t m = 40, n = 300, k = 100;  // 2.4 Mflop: above kd::parallel_min_flops
  REQUIRE(2.0 * m * n * k >= kd::parallel_min_flops);
  const auto x = random_floats(g, m * k), w = random_floats(g, n * k);
  const kd::linear_weights lw(matmul_kernel::builtin, k, {w});
  for (const cpu_isa isa : runnable_isas()) {
    INFO("isa " << to_string(isa));
    std::vector<float> one(static_cast<std::size_t>(m * n)), two(one.size(), -1.0f);
    kd::linear({matmul_kernel::builtin, isa, 1}, x.data(), m, k, lw, one.data());
    for (int rep = 0; rep < 20; ++rep)
      kd::linear({matmul_kernel::builtin, isa, 2}, x.data(), m, k, lw, two.data());
    CHECK(two == one);
  }
}

TEST_CASE("stacked packing equals the separate products", "[backend][kernel]") {
  std::mt19937_64 g(23);
  const index_t k = 19, m = 9;
  const auto w1 = random_floats(g, 5 * k), w2 = random_floats(g, 21 * k),
             x = random_floats(g, m * k);
  const packed_weights both(k, {w1, w2}), first(k, {w1}), second(k, {w2});
  REQUIRE(both.out() == 26);
  CHECK_THROWS_AS(packed_weights(k, {std::span<const float>(w1).first(7)}), std::invalid_argument);
  std::vector<float> y(static_cast<std::size_t>(m * 26)), y1(static_cast<std::size_t>(m * 5)),
      y2(static_cast<std::size_t>(m * 21));
  packed_product(cpu_isa::generic, x, m, k, both, y, false, 0, both.panels());
  packed_product(cpu_isa::generic, x, m, k, first, y1, false, 0, first.panels());
  packed_product(cpu_isa::generic, x, m, k, second, y2, false, 0, second.panels());
  for (index_t r = 0; r < m; ++r)
    for (index_t o = 0; o < 26; ++o)
      CHECK(y[static_cast<std::size_t>(r * 26 + o)] ==
            (o < 5 ? y1[static_cast<std::size_t>(r * 5 + o)]
                   : y2[static_cast<std::size_t>(r * 21 + o - 5)]));
}

TEST_CASE("softmax rows and SiLU gating match double precision on every instruction set",
          "[backend][kernel]") {
  std::mt19937_64 g(24);
  for (const cpu_isa isa : runnable_isas()) {
    INFO("isa " << to_string(isa));
    for (const index_t n : {1, 2, 7, 8, 9, 15, 16, 17, 33, 100}) {
      INFO("n " << n);
      auto s = random_floats(g, n);
      for (auto& x : s) x *= 8.0f;
      if (n > 2) s[1] = -INFINITY;  // a masked key
      const float scale = 0.37f;
      double mx = -1e300;
      for (const float x : s) mx = std::max(mx, static_cast<double>(x));
      std::vector<double> e(s.size());
      double sum = 0.0;
      for (std::size_t j = 0; j < s.size(); ++j) sum += e[j] = std::exp((s[j] - mx) * scale);
      auto got = s;
      const float z = kd::softmax_row(isa, got.data(), n, scale);
      CHECK(std::abs(z - sum) <= 1e-6 * sum);
      for (std::size_t j = 0; j < s.size(); ++j)
        // The float argument (s - max) * scale carries a relative error of a few ulp of itself.
        CHECK(std::abs(got[j] - e[j]) <=
              2.4e-7 * (4.0 + std::abs(std::log(e[j] + 1e-300))) * e[j] + 1e-30);
      if (n > 2) CHECK(got[1] == 0.0f);

      auto gate = random_floats(g, n), up = random_floats(g, n);
      for (auto& x : gate) x *= 6.0f;
      gate[0] = -120.0f;  // exp(120) overflows float: silu must still be ~0, not NaN
      auto out = gate;
      kd::silu_mul(isa, out.data(), up.data(), n);
      for (std::size_t j = 0; j < gate.size(); ++j) {
        const double x = gate[j];
        const double ref = x / (1.0 + std::exp(-x)) * up[j];
        CHECK(std::abs(out[j] - ref) <= 1e-6 * std::abs(ref) + 1e-30);
      }
    }
  }
}

TEST_CASE("block attention matches a naive per-row attention on every instruction set",
          "[backend][kernel]") {
  std::mt19937_64 g(25);
  struct shape {
    index_t ctx, n, group, hd;
  };
  const std::vector<shape> shapes{{0, 1, 1, 2},    {5, 3, 2, 6},    {17, 9, 4, 8},
                                  {40, 70, 3, 18}, {129, 1, 4, 32}, {3, 20, 1, 40}};
  for (const cpu_isa isa : runnable_isas()) {
    INFO("isa " << to_string(isa));
    kd::attention_scratch scratch;  // reused across shapes, as in a pass
    for (const auto& [ctx, n, group, hd] : shapes) {
      INFO("ctx " << ctx << ", n " << n << ", group " << group << ", hd " << hd);
      const index_t stride = hd + 5, q_stride = group * hd + 3, words = (n + 63) / 64;
      const auto ck = random_floats(g, ctx * stride + 1), cv = random_floats(g, ctx * stride + 1),
                 pk = random_floats(g, n * stride), pv = random_floats(g, n * stride),
                 q = random_floats(g, n * q_stride);
      std::vector<std::uint64_t> mask(static_cast<std::size_t>(n * words), 0);
      std::bernoulli_distribution bit(0.4);
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < n; ++j)
          if (j == i || bit(g))
            mask[static_cast<std::size_t>(i * words + j / 64)] |= std::uint64_t{1} << (j % 64);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> out(q.size(), 0.0f);
      kd::attend_block(isa, q.data(), out.data(), q_stride, group, hd, ck.data(), cv.data(), ctx,
                       pk.data(), pv.data(), n, stride, mask.data(), scale, scratch);
      double worst = 0.0;
      for (index_t i = 0; i < n; ++i)
        for (index_t h = 0; h < group; ++h) {
          const float* qr = q.data() + i * q_stride + h * hd;
          std::vector<double> w;
          std::vector<const float*> vals;
          for (index_t j = 0; j < ctx + n; ++j) {
            if (j >= ctx &&
                ((mask[static_cast<std::size_t>(i * words + (j - ctx) / 64)] >> ((j - ctx) % 64)) &
                 1u) == 0)
              continue;
            const float* kr = j < ctx ? ck.data() + j * stride : pk.data() + (j - ctx) * stride;
            double dot = 0.0;
            for (index_t t = 0; t < hd; ++t) dot += static_cast<double>(qr[t]) * kr[t];
            w.push_back(dot * scale);
            vals.push_back(j < ctx ? cv.data() + j * stride : pv.data() + (j - ctx) * stride);
          }
          double mx = -1e300, z = 0.0;
          for (const double x : w) mx = std::max(mx, x);
          for (double& x : w) z += x = std::exp(x - mx);
          for (index_t t = 0; t < hd; ++t) {
            double ref = 0.0;
            for (std::size_t j = 0; j < w.size(); ++j) ref += w[j] / z * vals[j][t];
            worst = std::max(
                worst, std::abs(out[static_cast<std::size_t>(i * q_stride + h * hd + t)] - ref));
          }
        }
      CHECK(worst < 1e-5);
    }
  }
}

TEST_CASE("the transformer matches the reference with every instruction set and thread count",
          "[backend][kernel]") {
  const transformer_weights w = random_weights(small_config(), 31);
  std::mt19937_64 g(26);
  const std::vector<token_t> tokens = random_tokens(g, 40, w.config.vocab_size);
  const auto ref = reference_logits(w, tokens);
  const index_t V = w.config.vocab_size;
  for (const cpu_isa isa : runnable_isas())
    for (const int threads : {1, 2}) {
      INFO("isa " << to_string(isa) << ", threads " << threads);
      const transformer m(w, backend_options{matmul_kernel::builtin, isa, threads});
      CHECK(m.options().isa == isa);
      std::vector<float> logits(tokens.size() * static_cast<std::size_t>(V));
      m.evaluate_sequences(tokens, 40, batch_view<float>(logits.data(), 40, V));
      double worst = 0.0;
      for (std::size_t i = 0; i < ref.size(); ++i)
        worst = std::max(worst, std::abs(logits[i] - ref[i]));
      CHECK(worst < 1e-4);
      // A tree pass equals the stepwise passes of its paths.
      transformer_session s(m);
      const std::vector<token_t> context(tokens.begin(), tokens.begin() + 7);
      s.prefill(context);
      const token_tree tree = random_tree(g, 23, 4, V, context.back());
      std::vector<float> rows(static_cast<std::size_t>(tree.size() * V));
      s.evaluate(tree, batch_view<float>(rows.data(), tree.size(), V));
      const auto path = tree.path_to(tree.size() - 1);
      transformer_session step(m);
      step.prefill(context);
      std::vector<float> row(static_cast<std::size_t>(V));
      double tree_worst = 0.0;
      for (const index_t node : path) {
        const token_tree one(std::vector<index_t>{-1}, std::vector<token_t>{tree.token(node)});
        step.evaluate(one, batch_view<float>(row.data(), 1, V));
        const index_t first = 0;
        step.commit(std::span<const index_t>(&first, 1));
        for (index_t v = 0; v < V; ++v)
          tree_worst =
              std::max(tree_worst, std::abs(static_cast<double>(row[static_cast<std::size_t>(v)]) -
                                            rows[static_cast<std::size_t>(node * V + v)]));
      }
      CHECK(tree_worst < 1e-4);
    }
}

TEST_CASE("concurrent passes on distinct caches equal serial ones", "[backend][kernel]") {
  const transformer m(random_weights(small_config(), 32),
                      backend_options{matmul_kernel::builtin, best_cpu_isa(), 2});
  const index_t V = m.vocab_size();
  std::mt19937_64 g(27);
  const int callers = 4;
  std::vector<std::vector<token_t>> seqs(callers);
  for (auto& s : seqs) s = random_tokens(g, 30, V);
  std::vector<std::vector<float>> serial(callers), parallel(callers);
  for (int c = 0; c < callers; ++c) {
    serial[static_cast<std::size_t>(c)].resize(static_cast<std::size_t>(30 * V));
    m.evaluate_sequences(seqs[static_cast<std::size_t>(c)], 30,
                         batch_view<float>(serial[static_cast<std::size_t>(c)].data(), 30, V));
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c)
    threads.emplace_back([&, c] {
      auto& out = parallel[static_cast<std::size_t>(c)];
      out.resize(static_cast<std::size_t>(30 * V));
      for (int rep = 0; rep < 5; ++rep)
        m.evaluate_sequences(seqs[static_cast<std::size_t>(c)], 30,
                             batch_view<float>(out.data(), 30, V));
    });
  for (auto& t : threads) t.join();
  CHECK(parallel == serial);
}

TEST_CASE("backend options are checked", "[backend][kernel][bad_input]") {
  const transformer_weights w = random_weights(small_config(), 33);
  CHECK_THROWS_AS(transformer(w, backend_options{matmul_kernel::builtin, cpu_isa::generic, -1}),
                  invalid_input);
  for (const cpu_isa isa : {cpu_isa::avx2, cpu_isa::avx512})
    if (!cpu_supports(isa))
      CHECK_THROWS_AS(transformer(w, backend_options{matmul_kernel::builtin, isa, 1}),
                      invalid_input);
  if (!have_blas())
    CHECK_THROWS_AS(transformer(w, backend_options{matmul_kernel::blas, cpu_isa::generic, 1}),
                    invalid_input);
  const transformer m(w, backend_options{matmul_kernel::builtin, cpu_isa::generic, 0});
  CHECK(m.options().threads == hardware_threads());
  CHECK(transformer(w).options().threads == 1);
}
