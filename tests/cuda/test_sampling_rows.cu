// One token per row on the device (cuda/specula/cuda/sampling.cuh): sample_from_probs_async
// against the host's sample_from_probs (the same tokens, bit for bit: the same sampling step and
// summation order), sample_from_logits_async against logits_to_probs_async followed by
// sample_from_probs_async (fp32 / bf16 / fp16, every filter), greedy rows against the first
// arg-max computed here, G-tests of both calls against laws written apart from the library (the
// hand-normalised weights; the sort-based reference pipeline) with negative controls, and the
// statuses of bad rows. Skips without a GPU.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "device_buffer.cuh"
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/transforms.cuh"
#include "specula/sample/sampling.hpp"
#include "specula/testing/reference_transforms.hpp"
#include "specula/testing/toy_models.hpp"

// This file compiles the shared instantiations of kernel_instances.cuh that it owns.
#define SPECULA_TEST_SAMPLING_INSTANCES
#include "kernel_instances.cuh"

using namespace specula;
using cuda_test::device_vector;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

bool have_gpu() { return cuda_test::have_gpu("device row-sampling checks"); }

using cuda_test::from_float;
using cuda_test::to_float;

std::vector<request_rng> streams(index_t n, std::uint64_t seed) {
  std::vector<request_rng> r;
  for (index_t i = 0; i < n; ++i) r.push_back({seed, static_cast<std::uint32_t>(i), 5});
  return r;
}

/// Tokens and statuses of one device call.
struct sampled {
  std::vector<token_t> tokens;
  std::vector<std::uint32_t> status;
};

/// sample_from_probs_async on host rows (row stride `stride` >= V).
template <class T>
sampled device_probs(const std::vector<T>& rows, index_t B, index_t V, index_t stride,
                     const std::vector<request_rng>& rng) {
  device_vector<T> d(rows);
  device_vector<request_rng> d_rng(rng);
  device_vector<token_t> out(std::vector<token_t>(static_cast<std::size_t>(B), 77));
  device_vector<std::uint32_t> st(std::vector<std::uint32_t>(static_cast<std::size_t>(B), 99));
  sc::throw_on_error(
      sc::sample_from_probs_async<T>(sc::par_on(nullptr), batch_view<const T>{d.ptr, B, V, stride},
                                     d_rng.cview(), out.view(), st.ptr),
      "sample_from_probs_async");
  sc::throw_on_error(cudaDeviceSynchronize(), "sample_probs_kernel");
  return {out.to_host(), st.to_host()};
}

/// sample_from_logits_async (fused) or logits_to_probs_async + sample_from_probs_async.
template <class T>
sampled device_logits(const std::vector<float>& logits_f, index_t B, index_t V,
                      const std::vector<sampling_params>& params,
                      const std::vector<request_rng>& rng, bool fused,
                      const std::vector<std::uint8_t>& is_greedy = {}) {
  std::vector<T> lg;
  for (float x : logits_f) lg.push_back(from_float<T>(x));
  device_vector<T> d(lg);
  device_vector<sampling_params> d_par(params);
  device_vector<request_rng> d_rng(rng);
  device_vector<std::uint8_t> d_greedy(is_greedy);
  device_vector<token_t> out(std::vector<token_t>(static_cast<std::size_t>(B), 77));
  device_vector<std::uint32_t> st(std::vector<std::uint32_t>(static_cast<std::size_t>(B), 99));
  const batch_view<const T> in{d.ptr, B, V};
  const auto pol = sc::par_on(nullptr);
  if (fused) {
    const row_view<const std::uint8_t> greedy =
        is_greedy.empty() ? row_view<const std::uint8_t>{} : d_greedy.cview();
    sc::throw_on_error(sc::sample_from_logits_async<T>(pol, in, d_par.cview(), d_rng.cview(),
                                                       out.view(), greedy, st.ptr),
                       "sample_from_logits_async");
  } else {
    device_vector<float> probs(std::vector<float>(static_cast<std::size_t>(B * V)));
    sc::throw_on_error(
        sc::logits_to_probs_async<T>(pol, in, {}, d_par.cview(), {probs.ptr, B, V}, st.ptr),
        "logits_to_probs_async");
    // Rows that failed the transform are NaN rows: the sampler flags them too.
    sc::throw_on_error(
        sc::sample_from_probs_async<float>(pol, {probs.ptr, B, V}, d_rng.cview(), out.view()),
        "sample_from_probs_async");
    sc::throw_on_error(cudaDeviceSynchronize(), "unfused");
  }
  sc::throw_on_error(cudaDeviceSynchronize(), "sample kernels");
  return {out.to_host(), st.to_host()};
}

/// Random logits N(0, 2.5^2) from the toy rows' Philox streams (log of a random row, scaled).
std::vector<float> random_logits(index_t B, index_t V, std::uint64_t seed) {
  std::vector<float> out;
  for (index_t r = 0; r < B; ++r) {
    const auto p = testing::random_probability_row(V, seed, static_cast<std::uint32_t>(r), 0.0);
    for (double x : p) out.push_back(static_cast<float>(std::log(x + 1e-12)));
  }
  return out;
}

using testing::reference_law;
std::vector<double> normalised(const std::vector<float>& w) { return testing::normalised_law(w); }

std::vector<sampling_params> mixed_params(index_t rows, index_t V) {
  const sampling_params plain;
  const sampling_params filtered{0.8f, 50 < V ? 50 : V - 1, 0.9f, 0.0f, 1.0f};
  const sampling_params min_p{1.3f, 0, 1.0f, 0.05f, 1.0f};
  std::vector<sampling_params> out;
  for (index_t r = 0; r < rows; ++r)
    out.push_back(r % 3 == 0 ? plain : (r % 3 == 1 ? filtered : min_p));
  return out;
}

template <class T>
void check_fused_equals_unfused(index_t V) {
  const index_t B = 37;
  const auto logits = random_logits(B, V, 100 + static_cast<std::uint64_t>(V));
  const auto rng = streams(B, 9);
  for (const auto& params :
       {std::vector<sampling_params>{sampling_params{}},
        std::vector<sampling_params>{mixed_params(1, V)[0]}, mixed_params(B, V)}) {
    INFO("V " << V << " params " << params.size());
    const auto fused = device_logits<T>(logits, B, V, params, rng, true);
    const auto unfused = device_logits<T>(logits, B, V, params, rng, false);
    CHECK(fused.tokens == unfused.tokens);
    CHECK(fused.status == unfused.status);
    for (std::uint32_t s : fused.status) CHECK(s == 0u);
  }
}

}  // namespace

TEST_CASE("device sample_from_probs equals the host's, bit for bit", "[cuda][sample][device]") {
  if (!have_gpu()) return;
  for (const index_t V : {index_t{7}, index_t{3000}, index_t{151936}}) {
    const index_t B = V > 10000 ? 9 : 65;
    const index_t stride = V + 3;  // strided rows, NaN between them (never read)
    std::vector<float> rows(static_cast<std::size_t>(B * stride),
                            std::numeric_limits<float>::quiet_NaN());
    for (index_t r = 0; r < B; ++r) {
      // Sparse rows (zeros drawn never) that need not sum to 1.
      const auto p = testing::random_probability_row(V, 3, static_cast<std::uint32_t>(r), 0.3);
      for (index_t y = 0; y < V; ++y)
        rows[static_cast<std::size_t>(r * stride + y)] =
            static_cast<float>(p[static_cast<std::size_t>(y)] * (1.0 + 0.5 * (r % 3)));
    }
    const auto rng = streams(B, 21);
    std::vector<token_t> host(static_cast<std::size_t>(B));
    sample_from_probs(host::seq, batch_view<const float>{rows.data(), B, V, stride}, rng, host);
    const auto dev = device_probs(rows, B, V, stride, rng);
    INFO("V " << V);
    CHECK(dev.tokens == host);
    for (std::uint32_t s : dev.status) CHECK(s == 0u);
    // Double rows: the same weights, the same tokens.
    std::vector<double> rows_d(rows.begin(), rows.end());
    CHECK(device_probs(rows_d, B, V, stride, rng).tokens == host);
  }
}

TEST_CASE("device sample_from_probs: bad rows get a status and -1, other rows are unaffected",
          "[cuda][sample][bad_input][device]") {
  if (!have_gpu()) return;
  const index_t V = 600, B = 6;
  std::vector<float> rows(static_cast<std::size_t>(B * V), 1.0f / V);
  rows[static_cast<std::size_t>(1 * V + 400)] = std::numeric_limits<float>::quiet_NaN();
  rows[static_cast<std::size_t>(2 * V + 3)] = std::numeric_limits<float>::infinity();
  rows[static_cast<std::size_t>(3 * V + 599)] = -0.25f;
  rows[static_cast<std::size_t>(3 * V + 100)] = std::numeric_limits<float>::quiet_NaN();  // later
  for (index_t y = 0; y < V; ++y) rows[static_cast<std::size_t>(4 * V + y)] = 0.0f;
  const auto rng = streams(B, 4);
  const auto dev = device_probs(rows, B, V, V, rng);
  CHECK(dev.status[1] == static_cast<std::uint32_t>(status::nan_value));
  CHECK(dev.status[2] == static_cast<std::uint32_t>(status::inf_value));
  CHECK(dev.status[3] == static_cast<std::uint32_t>(status::nan_value));  // the first, at 100
  CHECK(dev.status[4] == static_cast<std::uint32_t>(status::no_mass));
  for (index_t r = 1; r <= 4; ++r) CHECK(dev.tokens[static_cast<std::size_t>(r)] == no_token);
  // Rows 0 and 5 are what they are alone.
  for (const index_t r : {index_t{0}, index_t{5}}) {
    const std::vector<float> one(rows.begin() + r * V, rows.begin() + (r + 1) * V);
    const std::vector<request_rng> own = {rng[static_cast<std::size_t>(r)]};
    CHECK(dev.status[static_cast<std::size_t>(r)] == 0u);
    CHECK(device_probs(one, 1, V, V, own).tokens[0] == dev.tokens[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("device sample_from_logits equals logits_to_probs_async + sample_from_probs_async",
          "[cuda][sample][device]") {
  if (!have_gpu()) return;
  for (const index_t V : {index_t{7}, index_t{3000}, index_t{128256}}) {
    check_fused_equals_unfused<float>(V);
    check_fused_equals_unfused<__nv_bfloat16>(V);
    check_fused_equals_unfused<__half>(V);
  }
}

TEST_CASE(
    "device sample_from_logits: greedy rows take the first arg-max, sampled rows are "
    "unchanged by them",
    "[cuda][sample][device]") {
  if (!have_gpu()) return;
  const index_t V = 5000, B = 24;
  auto logits = random_logits(B, V, 55);
  // Ties for the max in row 4 (ids 10 and 4000): the lowest wins.
  logits[static_cast<std::size_t>(4 * V + 10)] = 50.0f;
  logits[static_cast<std::size_t>(4 * V + 4000)] = 50.0f;
  std::vector<std::uint8_t> greedy(static_cast<std::size_t>(B), 0);
  for (index_t r = 0; r < B; r += 2) greedy[static_cast<std::size_t>(r)] = 1;
  const auto params = mixed_params(B, V);
  auto rng = streams(B, 8);
  const auto mixed = device_logits<__nv_bfloat16>(logits, B, V, params, rng, true, greedy);
  const auto plain = device_logits<__nv_bfloat16>(logits, B, V, params, rng, true);
  for (index_t r = 0; r < B; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    INFO("row " << r);
    CHECK(mixed.status[ur] == 0u);
    if (greedy[ur] == 0) {
      CHECK(mixed.tokens[ur] == plain.tokens[ur]);
      continue;
    }
    token_t best = 0;
    float best_x = -std::numeric_limits<float>::infinity();
    for (index_t y = 0; y < V; ++y) {
      const float x = to_float(from_float<__nv_bfloat16>(
          logits[ur * static_cast<std::size_t>(V) + static_cast<std::size_t>(y)]));
      if (x > best_x) {
        best_x = x;
        best = static_cast<token_t>(y);
      }
    }
    CHECK(mixed.tokens[ur] == best);
  }
  CHECK(mixed.tokens[4] == 10);
}

TEST_CASE("device sample_from_logits: bad rows get their status and -1",
          "[cuda][sample][bad_input][device]") {
  if (!have_gpu()) return;
  const index_t V = 300, B = 5;
  auto logits = random_logits(B, V, 6);
  logits[static_cast<std::size_t>(0 * V + 7)] = std::numeric_limits<float>::quiet_NaN();
  logits[static_cast<std::size_t>(1 * V + 8)] = std::numeric_limits<float>::infinity();
  for (index_t y = 0; y < V; ++y)
    logits[static_cast<std::size_t>(2 * V + y)] = -std::numeric_limits<float>::infinity();
  std::vector<sampling_params> params(static_cast<std::size_t>(B));
  params[3].top_p = 0.0f;  // invalid
  const auto rng = streams(B, 2);
  for (const bool greedy_rows : {false, true}) {
    // Greedy rows check their logits and parameters as the sampled ones.
    const std::vector<std::uint8_t> greedy(static_cast<std::size_t>(B), greedy_rows ? 1 : 0);
    const auto dev = device_logits<float>(logits, B, V, params, rng, true, greedy);
    INFO("greedy " << greedy_rows);
    CHECK(dev.status[0] == static_cast<std::uint32_t>(status::nan_value));
    CHECK(dev.status[1] == static_cast<std::uint32_t>(status::inf_value));
    CHECK(dev.status[2] == static_cast<std::uint32_t>(status::no_mass));
    CHECK(dev.status[3] == static_cast<std::uint32_t>(status::invalid_parameter));
    CHECK(dev.status[4] == 0u);
    for (index_t r = 0; r < 4; ++r) CHECK(dev.tokens[static_cast<std::size_t>(r)] == no_token);
    CHECK(dev.tokens[4] >= 0);
  }
}

TEST_CASE("device sample_from_probs fits each row's law (G-test)",
          "[cuda][sample][stats][device]") {
  if (!have_gpu()) return;
  const index_t V = 5, per_row = 20000, B = 2 * per_row;
  const std::vector<std::vector<float>> laws = {{0.1f, 0.2f, 0.3f, 0.4f, 0.0f},
                                                {3.0f, 0.0f, 0.0f, 1.0f, 1.0f}};
  std::vector<float> rows;
  for (index_t r = 0; r < B; ++r) {
    const auto& row = laws[static_cast<std::size_t>(r % 2)];
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const auto dev = device_probs(rows, B, V, V, streams(B, 31));
  for (std::size_t k = 0; k < 2; ++k) {
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(V), 0);
    for (index_t r = static_cast<index_t>(k); r < B; r += 2)
      ++counts[static_cast<std::size_t>(dev.tokens[static_cast<std::size_t>(r)])];
    std::string summary;
    const double fit = cuda_test::g_test_p_value(counts, normalised(laws[k]), summary);
    INFO("law " << k << ": " << summary);
    CHECK(fit > 1e-4);
    const double bad = cuda_test::g_test_p_value(counts, normalised(laws[1 - k]), summary);
    INFO("negative control: " << summary);
    CHECK(bad < 1e-9);
  }
}

TEST_CASE("device sample_from_logits fits the reference pipeline's law (G-test)",
          "[cuda][sample][stats][device]") {
  if (!have_gpu()) return;
  const testing::filtered_rows_case c(15000);
  const auto& logits = c.logits;
  const auto& params = c.params;
  const index_t V = c.vocab(), B = c.rows;
  const auto dev = device_logits<float>(c.data, B, V, c.per_row, streams(B, 12), true);
  const auto plain = reference_law(params[0], logits);
  for (std::size_t k = 0; k < 4; ++k) {
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(V), 0);
    for (index_t r = static_cast<index_t>(k); r < B; r += 4)
      ++counts[static_cast<std::size_t>(dev.tokens[static_cast<std::size_t>(r)])];
    std::string summary;
    const double fit = cuda_test::g_test_p_value(counts, reference_law(params[k], logits), summary);
    INFO("params " << k << ": " << summary);
    CHECK(fit > 1e-4);
    if (k > 0) {  // negative control: the filters are applied
      const double bad = cuda_test::g_test_p_value(counts, plain, summary);
      INFO("negative control: " << summary);
      CHECK(bad < 1e-9);
    }
  }
}
