// The CTA-wide row passes (cuda/specula/cuda/block_passes.cuh) on the device: their mass and
// signed sum against the host's positive_mass and ordered_sum, bit for bit, for rows at every
// alignment (full tiles loaded ahead, partial tiles element by element); and the inverse-CDF
// sample over their summary (the tile it lands in scanned by the whole CTA) against the host's
// sample_inverse_cdf for the same uniforms.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "device_buffer.cuh"
#include "specula/cuda/block_passes.cuh"
#include "specula/cuda/chain.cuh"
#include "specula/rules/exact.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/typical.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain_core.hpp"

using namespace specula;
namespace sc = specula::cuda;

namespace {

constexpr int threads = 256;

/// A signed weight function without a vector form: p(i) − q(i).
struct signed_difference {
  const float* p;
  const float* q;
  __host__ __device__ double operator()(index_t i) const noexcept {
    return static_cast<double>(p[i]) - static_cast<double>(q[i]);
  }
};

constexpr std::size_t results_size = 7;

/// The passes' results over one row p (and q): out[0] the mass of p, out[1] the exact chain
/// residual's mass with dense q, out[2] with a one-hot proposal at token 3, out[3] the relaxed
/// (ω = 1.7) residual's, out[4] the signed sum of p (the vector path without the clamp), out[5]
/// the signed sum of p − q (element loads), out[6] typical acceptance's entropy.
__global__ void passes_kernel(const float* p, const float* q, index_t n, double* out) {
  __shared__ sc::block_passes_storage<threads, 1> storage;
  const sc::block_passes<threads> passes(storage);
  const row_view<const float> pr(p, n);
  const dense_proposal<float> dq{row_view<const float>(q, n)};
  const one_hot_proposal oh{3};
  const detail::scalar_bound_rule<exact_rule> exact{};
  const detail::scalar_bound_rule<relaxed_rule> relaxed{relaxed_rule{1.7, resampling::optimal}};
  const double r0 = passes.mass(n, detail::row_weights<float>{pr});
  const double r1 = passes.mass(
      n, detail::chain_residual<decltype(exact), row_view<const float>, dense_proposal<float>>{
             exact, pr, dq});
  const double r2 = passes.mass(
      n, detail::chain_residual<decltype(exact), row_view<const float>, one_hot_proposal>{exact, pr,
                                                                                          oh});
  const double r3 = passes.mass(
      n, detail::chain_residual<decltype(relaxed), row_view<const float>, dense_proposal<float>>{
             relaxed, pr, dq});
  const double r4 = passes.sum(n, detail::row_weights<float>{pr});
  const double r5 = passes.sum(n, signed_difference{p, q});
  const double r6 = passes.sum(n, typical_rule::entropy_terms<float>{pr});
  if (threadIdx.x == 0) {
    out[0] = r0;
    out[1] = r1;
    out[2] = r2;
    out[3] = r3;
    out[4] = r4;
    out[5] = r5;
    out[6] = r6;
  }
}

/// Rows p and q of length n in float (seeded), with a NaN at index 9 when the row is long enough
/// (NaN weighs nothing).
std::pair<std::vector<float>, std::vector<float>> float_rows(index_t n, std::uint64_t seed) {
  const auto pd = testing::random_probability_row(n, seed, 0, 0.3);
  const auto qd = testing::random_probability_row(n, seed, 1, 0.3);
  std::vector<float> p(pd.begin(), pd.end()), q(qd.begin(), qd.end());
  if (n > 10) p[9] = std::numeric_limits<float>::quiet_NaN();
  return {p, q};
}

std::vector<double> host_passes(const std::vector<float>& pv, const std::vector<float>& qv) {
  const auto n = static_cast<index_t>(pv.size());
  const row_view<const float> pr(pv.data(), n);
  const dense_proposal<float> dq{row_view<const float>(qv.data(), n)};
  const one_hot_proposal oh{3};
  const detail::scalar_bound_rule<exact_rule> exact{};
  const detail::scalar_bound_rule<relaxed_rule> relaxed{relaxed_rule{1.7, resampling::optimal}};
  return {
      positive_mass(n, detail::row_weights<float>{pr}),
      positive_mass(
          n,
          detail::chain_residual<decltype(exact), row_view<const float>, dense_proposal<float>>{
              exact, pr, dq}),
      positive_mass(
          n,
          detail::chain_residual<decltype(exact), row_view<const float>, one_hot_proposal>{exact,
                                                                                           pr, oh}),
      positive_mass(
          n,
          detail::chain_residual<decltype(relaxed), row_view<const float>, dense_proposal<float>>{
              relaxed, pr, dq}),
      ordered_sum(n, detail::row_weights<float>{pr}),
      ordered_sum(n, signed_difference{pv.data(), qv.data()}),
      ordered_sum(n, typical_rule::entropy_terms<float>{pr})};
}

}  // namespace

TEST_CASE("block passes equal the host's sums bit for bit at every row offset", "[cuda][device]") {
  if (!cuda_test::have_gpu("block passes")) return;
  for (index_t n : {1, 7, 255, 256, 1000, 1024, 5000, 131079}) {
    const auto [p, q] = float_rows(n, 61);
    const std::vector<double> want = host_passes(p, q);
    for (index_t lead : {0, 1, 2, 4}) {  // row pointers offset by `lead` floats
      INFO("n " << n << " lead " << lead);
      std::vector<float> pl(static_cast<std::size_t>(lead), 0.5f), ql = pl;
      pl.insert(pl.end(), p.begin(), p.end());
      ql.insert(ql.end(), q.begin(), q.end());
      const cuda_test::device_vector<float> dp(pl), dq(ql);
      cuda_test::device_vector<double> out(std::vector<double>(results_size, -1.0));
      passes_kernel<<<1, threads>>>(dp.ptr + lead, dq.ptr + lead, n, out.ptr);
      sc::throw_on_error(cudaDeviceSynchronize(), "passes kernel");
      const std::vector<double> got = out.to_host();
      for (std::size_t i = 0; i + 1 < results_size; ++i) {
        INFO("result " << i << ": " << got[i] << " against " << want[i]);
        // The signed sum (result 5) of a row holding a NaN is NaN on both sides (no clamp).
        CHECK((got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))));
      }
      // The entropy's terms take log from CUDA's library on the device (within 1 ulp of the
      // host's): the same order, so the sums agree to rounding of the terms.
      CHECK(got[6] == Approx(want[6]).epsilon(1e-13));
    }
  }
}

namespace {

/// Inverse-CDF samples over the passes' summary of w for each uniform of u (all threads sample;
/// thread 0 writes): the residual of p against q (two rows) when `residual`, else p's weights.
/// Threads < 256 scans a tile in several chunks; rows longer than MaxTiles tiles have the rest
/// of their tile sums recomputed by the walk.
template <int Threads, index_t MaxTiles>
__global__ void sample_kernel(const float* p, const float* q, index_t n, bool residual,
                              const double* u, index_t count, index_t* out) {
  __shared__ sc::block_passes_storage<Threads, MaxTiles> storage;
  const sc::block_passes<Threads> passes(storage);
  const row_view<const float> pr(p, n);
  const dense_proposal<float> dq{row_view<const float>(q, n)};
  const detail::scalar_bound_rule<exact_rule> exact{};
  const detail::chain_residual<decltype(exact), row_view<const float>, dense_proposal<float>> res{
      exact, pr, dq};
  const detail::row_weights<float> rw{pr};
  // One summary, many draws: the scans (in the passes' shared scratch) leave the recorded tile
  // sums as they were.
  auto draw_all = [&](const auto& w) {
    typename sc::block_passes<Threads>::summary_type s;
    passes.summarize(n, w, s);
    for (index_t k = 0; k < count; ++k) {
      const index_t i = sample_inverse_cdf(n, w, s, u[k]);
      if (threadIdx.x == 0) out[k] = i;
    }
  };
  if (residual)
    draw_all(res);
  else
    draw_all(rw);
}

}  // namespace

TEST_CASE("block passes' inverse-CDF sample equals the host's for the same uniforms",
          "[cuda][device]") {
  if (!cuda_test::have_gpu("block passes sample")) return;
  for (index_t n : {1, 7, 255, 256, 257, 1000, 5000, 131079}) {
    const auto [p, q] = float_rows(n, 67);
    const row_view<const float> pr(p.data(), n);
    const dense_proposal<float> hq{row_view<const float>(q.data(), n)};
    const detail::scalar_bound_rule<exact_rule> exact{};
    const detail::chain_residual<decltype(exact), row_view<const float>, dense_proposal<float>> res{
        exact, pr, hq};
    const detail::row_weights<float> rw{pr};
    // Uniforms: spread over (0, 1), just past each of a few running sums (a scan that stops
    // one element early or late shows), and next to 1 (the walk's fallback). At most about 32
    // running sums per row: each draw costs the host's reference and every device walk O(n), and
    // with a draw per 97 elements the 131079-element row alone took 17 s on an H200 and over
    // 290 s under compute-sanitizer (memcheck, initcheck, racecheck).
    const index_t stride = std::max<index_t>(97, n / 32);
    std::vector<double> u;
    for (int k = 1; k < 64; ++k) u.push_back((k - 0.5) / 63.0);
    u.push_back(1.0 - 0x1p-53);
    u.push_back(0x1p-60);
    for (const bool residual : {false, true}) {
      std::vector<double> us = u;
      const double total = residual ? positive_mass(n, res) : positive_mass(n, rw);
      double acc = 0.0;
      for (index_t i = 0; i < n; ++i) {
        const double wi = residual ? res(i) : rw(i);
        if (!(wi > 0.0)) continue;
        acc += wi;
        if (i % stride == 5 && total > 0.0) {
          us.push_back(acc / total);
          us.push_back(std::nextafter(acc / total, 1.0));
        }
      }
      std::vector<index_t> want;
      for (const double x : us)
        want.push_back(residual ? sample_inverse_cdf(n, res, total, x)
                                : sample_inverse_cdf(n, rw, total, x));
      const cuda_test::device_vector<float> dp(p), dqv(q);
      const cuda_test::device_vector<double> du(us);
      const auto count = static_cast<index_t>(us.size());
      for (int variant = 0; variant < 3; ++variant) {
        cuda_test::device_vector<index_t> out(std::vector<index_t>(us.size(), -3));
        if (variant == 0)  // every tile sum recorded
          sample_kernel<threads, 1024>
              <<<1, threads>>>(dp.ptr, dqv.ptr, n, residual, du.ptr, count, out.ptr);
        else if (variant == 1)  // 8 recorded, the rest recomputed
          sample_kernel<threads, 8>
              <<<1, threads>>>(dp.ptr, dqv.ptr, n, residual, du.ptr, count, out.ptr);
        else  // 64 threads: a tile scanned in four chunks
          sample_kernel<64, 8><<<1, 64>>>(dp.ptr, dqv.ptr, n, residual, du.ptr, count, out.ptr);
        sc::throw_on_error(cudaDeviceSynchronize(), "sample kernel");
        const std::vector<index_t> got = out.to_host();
        for (std::size_t k = 0; k < us.size(); ++k) {
          INFO("n " << n << " residual " << residual << " variant " << variant << " u " << us[k]);
          CHECK(got[k] == want[k]);
        }
      }
    }
  }
}
