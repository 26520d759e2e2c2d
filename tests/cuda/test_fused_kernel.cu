// Fused chain verification from logits against the unfused device pipeline
// (logits_to_probs_async, then verify_chain_async): the same tokens, flags and counts, bit for
// bit, for fp32, bf16 and fp16 logits, with CFG and every filter, dense and one-hot drafts; rows
// that fail the transform; greedy and sampled requests in one launch (is_greedy). Skips without
// a GPU.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "device_buffer.cuh"
#include "specula/cuda/fused.cuh"
#include "specula/rules/relaxed.hpp"
#include "specula/testing/toy_models.hpp"

// This file compiles the shared instantiations of kernel_instances.cuh that it owns.
#define SPECULA_TEST_FUSED_INSTANCES
#include "kernel_instances.cuh"

using namespace specula;
using cuda_test::device_vector;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

bool have_gpu() { return cuda_test::have_gpu("device fused-verification checks"); }

using cuda_test::from_float;
using cuda_test::to_float;

/// A ragged batch with target logits and fp32 draft rows; drafts sampled from q.
struct logit_batch {
  index_t vocab;
  std::vector<index_t> offsets{0};
  std::vector<token_t> tokens;
  std::vector<float> draft, logits, uncond;
  std::vector<request_rng> rng;

  logit_batch(index_t v, const std::vector<index_t>& lens, std::uint64_t seed) : vocab(v) {
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      offsets.push_back(offsets.back() + lens[b]);
      for (index_t i = 0; i <= lens[b]; ++i) {
        const auto q = testing::random_probability_row(v, seed, id++, 0.2);
        const auto l = testing::random_probability_row(v, seed, id++, 0.0);
        const auto u = testing::random_probability_row(v, seed, id++, 0.0);
        for (index_t y = 0; y < v; ++y) {
          // Logits correlated with q so that drafts are often accepted.
          const auto sy = static_cast<std::size_t>(y);
          logits.push_back(static_cast<float>(std::log(q[sy] + 1e-3) + 2.0 * l[sy]));
          uncond.push_back(static_cast<float>(3.0 * u[sy]));
        }
        if (i == lens[b]) break;  // the bonus row has no draft
        const token_t x =
            cuda_test::draw_from(q, uniform_at(request_rng{seed, id++, 9}, draw_id{0, 0}));
        tokens.push_back(x);
        draft.insert(draft.end(), q.begin(), q.end());
      }
      rng.push_back(request_rng{seed + b, static_cast<std::uint32_t>(b), 4});
    }
  }
  [[nodiscard]] index_t batch() const { return static_cast<index_t>(rng.size()); }
  [[nodiscard]] index_t drafts() const { return offsets.back(); }
  [[nodiscard]] index_t rows() const { return drafts() + batch(); }
};

struct results {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> n;
  std::vector<std::uint8_t> acc;
  std::vector<std::uint32_t> flags;
  std::vector<std::uint32_t> status;
  bool operator==(const results&) const = default;
};

/// fused = true: verify_chain_from_logits_async; false: logits_to_probs_async + verify_chain.
template <class T, class Rule = exact_rule>
results run(const logit_batch& bt, const std::vector<sampling_params>& params, bool cfg,
            bool one_hot, bool fused, const Rule& rule = {},
            const std::vector<std::uint8_t>& is_greedy = {}) {
  std::vector<T> lg, un;
  for (float x : bt.logits) lg.push_back(from_float<T>(x));
  for (float x : bt.uncond) un.push_back(from_float<T>(x));
  const auto rows = static_cast<std::size_t>(bt.rows());
  device_vector<T> d_lg(lg), d_un(un);
  device_vector<sampling_params> d_par(params);
  device_vector<index_t> off(bt.offsets);
  device_vector<token_t> tok(bt.tokens);
  device_vector<float> dr(bt.draft);
  device_vector<request_rng> rng(bt.rng);
  device_vector<token_t> out(std::vector<token_t>(rows, 77));
  device_vector<std::int32_t> n(
      std::vector<std::int32_t>(static_cast<std::size_t>(bt.batch()), -5));
  device_vector<std::uint8_t> acc(
      std::vector<std::uint8_t>(static_cast<std::size_t>(bt.drafts()), 9));
  device_vector<std::uint32_t> fl(
      std::vector<std::uint32_t>(static_cast<std::size_t>(bt.batch()), 0));
  device_vector<std::uint32_t> st(std::vector<std::uint32_t>(rows, 99));
  const batch_view<const T> logits{d_lg.ptr, bt.rows(), bt.vocab};
  const batch_view<const T> uncond =
      cfg ? batch_view<const T>{d_un.ptr, bt.rows(), bt.vocab} : batch_view<const T>{};
  const batch_view<const float> q =
      one_hot ? batch_view<const float>{} : batch_view<const float>{dr.ptr, bt.drafts(), bt.vocab};
  const chain_batch_output o{out.view(), n.view(), acc.view(), fl.view()};
  if (fused) {
    device_vector<std::byte> ws(std::vector<std::byte>(sc::fused_chain_workspace_bytes(bt.rows())));
    // int32 offsets for the one-hot runs, int64 for the others (both layouts of index_view).
    device_vector<std::int32_t> off32(
        std::vector<std::int32_t>(bt.offsets.begin(), bt.offsets.end()));
    const index_view offsets = one_hot ? index_view(off32.cview()) : index_view(off.cview());
    sc::fused_chain_input<T> in{bt.vocab, offsets, tok.cview(),   q,
                                logits,   uncond,  d_par.cview(), rng.cview()};
    device_vector<std::uint8_t> greedy(is_greedy);
    if (!is_greedy.empty()) in.is_greedy = greedy.cview();
    sc::throw_on_error(
        sc::verify_chain_from_logits_async(sc::par_on(nullptr).with_workspace(ws.ptr, ws.n), in, o,
                                           chain_options{}, rule, st.ptr),
        "fused");
    sc::throw_on_error(cudaDeviceSynchronize(), "fused kernels");
  } else {
    device_vector<float> probs(std::vector<float>(rows * static_cast<std::size_t>(bt.vocab)));
    sc::throw_on_error(
        sc::logits_to_probs_async<T>(sc::par_on(nullptr), logits, uncond, d_par.cview(),
                                     {probs.ptr, bt.rows(), bt.vocab}, st.ptr),
        "logits_to_probs");
    const chain_batch_input<float> in{
        bt.vocab, off.cview(), tok.cview(), q, {probs.ptr, bt.rows(), bt.vocab}, rng.cview()};
    sc::verify_chain(sc::par_on(nullptr), in, o, chain_options{}, rule);
    sc::throw_on_error(cudaDeviceSynchronize(), "unfused kernels");
  }
  return {out.to_host(), n.to_host(), acc.to_host(), fl.to_host(), st.to_host()};
}

std::vector<std::vector<sampling_params>> settings(index_t rows) {
  sampling_params plain;
  sampling_params filtered{0.8f, 50, 0.9f, 0.0f, 1.0f};
  sampling_params min_p{1.3f, 0, 1.0f, 0.05f, 1.5f};
  std::vector<sampling_params> mixed;
  for (index_t r = 0; r < rows; ++r)
    mixed.push_back(r % 3 == 0 ? plain : (r % 3 == 1 ? filtered : min_p));
  return {{plain}, {filtered}, {min_p}, mixed};
}

template <class T>
void check_equal_to_unfused(index_t vocab) {
  const logit_batch bt(vocab, {3, 0, 5, 1, 8}, 13);
  for (const auto& params : settings(bt.rows()))
    for (bool cfg : {false, true})
      for (bool one_hot : {false, true}) {
        INFO("vocab " << vocab << " params " << params.size() << " cfg " << cfg << " one-hot "
                      << one_hot);
        CHECK(run<T>(bt, params, cfg, one_hot, true) == run<T>(bt, params, cfg, one_hot, false));
      }
}

}  // namespace

TEST_CASE("fused verification from fp32 logits equals logits_to_probs + verify_chain",
          "[cuda][fused][device]") {
  if (!have_gpu()) return;
  for (index_t vocab : {7, 3000, 128256}) check_equal_to_unfused<float>(vocab);
  const logit_batch bt(2000, {4, 2}, 5);
  const relaxed_rule relaxed{1.7, resampling::optimal};
  CHECK(run<float>(bt, {sampling_params{}}, false, false, true, relaxed) ==
        run<float>(bt, {sampling_params{}}, false, false, false, relaxed));
}

TEST_CASE("fused verification reads bf16 and fp16 logits directly", "[cuda][fused][device]") {
  if (!have_gpu()) return;
  for (index_t vocab : {300, 32000}) {
    check_equal_to_unfused<__nv_bfloat16>(vocab);
    check_equal_to_unfused<__half>(vocab);
  }
}

TEST_CASE("fused verification: rows that fail the transform behave as in the unfused path",
          "[cuda][fused][bad_input][device]") {
  if (!have_gpu()) return;
  logit_batch bt(100, {2, 3}, 8);
  // Request 0's first row: a NaN logit; request 1's bonus row: all -Inf.
  bt.logits[5] = std::numeric_limits<float>::quiet_NaN();
  for (index_t y = 0; y < 100; ++y)
    bt.logits[static_cast<std::size_t>((2 + 1 + 3) * 100 + y)] =
        -std::numeric_limits<float>::infinity();
  // A row with invalid parameters (temperature 0).
  std::vector<sampling_params> params(static_cast<std::size_t>(bt.rows()));
  params[4].temperature = 0.0f;
  const auto fused = run<float>(bt, params, false, false, true);
  CHECK(fused == run<float>(bt, params, false, false, false));
  CHECK(fused.status[0] == static_cast<std::uint32_t>(status::nan_value));
  CHECK(fused.status[4] == static_cast<std::uint32_t>(status::invalid_parameter));
  CHECK(fused.status[6] == static_cast<std::uint32_t>(status::no_mass));
  CHECK((fused.flags[0] & chain_valid) == 0);
}

// Launch checks of the fused path run on the host: tests/cuda/test_launch_checks.cu.

namespace {

/// The arg-max (lowest on ties) of logit row `row` of T after the CFG mix with `scale`, each
/// operation rounded to float on its own (volatile: never contracted), written apart from the
/// library's cfg_mix_op.
template <class T>
token_t mixed_argmax(const logit_batch& bt, index_t row, bool cfg, float scale) {
  const auto v = static_cast<std::size_t>(bt.vocab);
  token_t best = 0;
  float best_x = -std::numeric_limits<float>::infinity();
  for (std::size_t y = 0; y < v; ++y) {
    const std::size_t at = static_cast<std::size_t>(row) * v + y;
    const float c = to_float(from_float<T>(bt.logits[at]));
    float x = c;
    if (cfg) {
      const float u = to_float(from_float<T>(bt.uncond[at]));
      const volatile float diff = c - u;
      const volatile float scaled = scale * diff;
      x = u + scaled;
    }
    if (x > best_x) {
      best_x = x;
      best = static_cast<token_t>(y);
    }
  }
  return best;
}

template <class T>
void check_mixed_greedy(index_t vocab) {
  logit_batch bt(vocab, {3, 0, 5, 1, 8}, 21);
  const std::vector<std::uint8_t> mask = {1, 1, 0, 1, 0};
  for (const auto& params : settings(bt.rows()))
    for (bool cfg : {false, true}) {
      const auto scale = [&](index_t row) {
        return params[params.size() == 1 ? 0 : static_cast<std::size_t>(row)].cfg_scale;
      };
      // Request 0 drafts the arg-max of its mixed rows; request 3 a token that is not.
      for (index_t i = 0; i < 3; ++i)
        bt.tokens[static_cast<std::size_t>(i)] = mixed_argmax<T>(bt, i, cfg, scale(i));
      const index_t d3 = bt.offsets[3];  // request 3's draft; its target row is d3 + 3
      bt.tokens[static_cast<std::size_t>(d3)] = static_cast<token_t>(
          (mixed_argmax<T>(bt, d3 + 3, cfg, scale(d3 + 3)) + 1) % static_cast<token_t>(vocab));
      INFO("vocab " << vocab << " params " << params.size() << " cfg " << cfg);
      const auto mixed = run<T>(bt, params, cfg, false, true, exact_rule{}, mask);
      const auto plain = run<T>(bt, params, cfg, false, true);
      for (index_t b = 0; b < bt.batch(); ++b) {
        const auto ub = static_cast<std::size_t>(b);
        const index_t d0 = bt.offsets[ub], len = bt.offsets[ub + 1] - d0;
        if (mask[ub] == 0) {  // sampled: bit for bit the call without flags
          CHECK(mixed.n[ub] == plain.n[ub]);
          CHECK(mixed.flags[ub] == plain.flags[ub]);
          for (index_t i = 0; i <= len; ++i)
            CHECK(mixed.tokens[static_cast<std::size_t>(d0 + b + i)] ==
                  plain.tokens[static_cast<std::size_t>(d0 + b + i)]);
          continue;
        }
        index_t n = 0;
        while (n < len && bt.tokens[static_cast<std::size_t>(d0 + n)] ==
                              mixed_argmax<T>(bt, d0 + b + n, cfg, scale(d0 + b + n)))
          ++n;
        CHECK(mixed.n[ub] == n);
        CHECK(mixed.tokens[static_cast<std::size_t>(d0 + b + n)] ==
              mixed_argmax<T>(bt, d0 + b + n, cfg, scale(d0 + b + n)));
        CHECK(mixed.flags[ub] == (chain_valid | (n == len ? chain_bonus : 0u)));
      }
      CHECK(mixed.n[0] == 3);
      CHECK(mixed.n[3] == 0);
    }
}

}  // namespace

TEST_CASE(
    "fused verification with per-request greedy flags: greedy requests take the arg-max "
    "of their mixed logits, sampled ones are unchanged",
    "[cuda][fused][device]") {
  if (!have_gpu()) return;
  for (index_t vocab : {300, 32000}) {
    check_mixed_greedy<float>(vocab);
    check_mixed_greedy<__nv_bfloat16>(vocab);
  }
}
