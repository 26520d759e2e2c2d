// The CTA-wide row passes (cuda/specula/cuda/block_passes.cuh): the 16-byte-load schedule of a
// tile (host, runs everywhere), and on the device the passes' mass and signed sum against the
// host's positive_mass and ordered_sum, bit for bit, for 16-byte aligned rows (vector loads) and
// unaligned ones (element loads).

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
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

TEST_CASE("block passes' 16-byte-load schedule hands every lane its own elements in order",
          "[cuda][host]") {
  // Lane L of a tile's 8 lanes loads elements 32m + 4L + c (c = 0..3); lane k must sum the
  // elements k + 8j in increasing j. Emulate the shuffle rounds: in round r lane k reads
  // component vector_given_component(src, r) of lane src = vector_source_lane(k, r).
  for (int m = 0; m < 8; ++m) {
    for (int k = 0; k < 8; ++k) {
      int received[4] = {-1, -1, -1, -1};
      for (int r = 0; r < 4; ++r) {
        const int src = sc::detail::vector_source_lane(k, r);
        REQUIRE(src >= 0);
        REQUIRE(src < 8);
        const int c = sc::detail::vector_given_component(src, r);
        received[r] = 32 * m + 4 * src + c;
      }
      for (int s = 0; s < 4; ++s) {
        INFO("m " << m << " lane " << k << " slot " << s);
        CHECK(received[sc::detail::vector_round_of(k, s)] == k + 8 * (4 * m + s));
      }
    }
    // Each source lane hands over one component per round: no two readers of a lane want
    // different components in the same round.
    for (int r = 0; r < 4; ++r)
      for (int k1 = 0; k1 < 8; ++k1)
        for (int k2 = 0; k2 < 8; ++k2)
          if (sc::detail::vector_source_lane(k1, r) == sc::detail::vector_source_lane(k2, r))
            CHECK((k1 & 3) == (k2 & 3));
  }
}

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

TEST_CASE("block passes equal the host's sums bit for bit, with and without vector loads",
          "[cuda][device]") {
  if (!cuda_test::have_gpu("block passes")) return;
  for (index_t n : {1, 7, 255, 256, 1000, 1024, 5000, 131079}) {
    auto pd = testing::random_probability_row(n, 61, 0, 0.3);
    auto qd = testing::random_probability_row(n, 61, 1, 0.3);
    std::vector<float> p(pd.begin(), pd.end()), q(qd.begin(), qd.end());
    if (n > 10) p[9] = std::numeric_limits<float>::quiet_NaN();  // NaN weighs nothing
    const std::vector<double> want = host_passes(p, q);
    for (index_t lead : {0, 1, 2, 4}) {  // 0 and 4: 16-byte aligned rows
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
