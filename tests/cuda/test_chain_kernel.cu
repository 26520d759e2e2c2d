// Device chain verification against the host backend: same inputs and seeds must give the same
// tokens, flags and accepted counts (flattened and padded layouts, dense and one-hot drafts,
// exact, relaxed-scheduled and greedy rules), plus bad input (out-of-range and -1 tokens, NaN
// rows, rows without mass). Skips without a GPU.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "device_buffer.cuh"
#include "device_enumerate.cuh"
#include "specula/cuda/chain.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/rules.cuh"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/typical.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/greedy.hpp"

// This file compiles the shared instantiations of kernel_instances.cuh that it owns.
#define SPECULA_TEST_CHAIN_INSTANCES
#include "kernel_instances.cuh"

using namespace specula;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

bool have_gpu() { return cuda_test::have_gpu("device chain-verification checks"); }

using cuda_test::device_vector;

/// A random ragged batch with float rows (drafts sampled from q so q(x) > 0).
struct batch {
  index_t vocab;
  std::vector<index_t> offsets{0};
  std::vector<token_t> tokens;
  std::vector<float> draft, target;
  std::vector<request_rng> rng;

  batch(index_t v, const std::vector<index_t>& lens, std::uint64_t seed) : vocab(v) {
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      offsets.push_back(offsets.back() + lens[b]);
      for (index_t i = 0; i < lens[b]; ++i) {
        const auto q = testing::random_probability_row(v, seed, id++, 0.2);
        auto p = testing::random_probability_row(v, seed, id++, 0.1);
        for (index_t y = 0; y < v; ++y)
          p[static_cast<std::size_t>(y)] =
              0.6 * q[static_cast<std::size_t>(y)] + 0.4 * p[static_cast<std::size_t>(y)];
        const token_t x =
            cuda_test::draw_from(q, uniform_at(request_rng{seed, id++, 9}, draw_id{0, 0}));
        tokens.push_back(x);
        draft.insert(draft.end(), q.begin(), q.end());
        target.insert(target.end(), p.begin(), p.end());
      }
      const auto bonus = testing::random_probability_row(v, seed, id++, 0.1);
      target.insert(target.end(), bonus.begin(), bonus.end());
      rng.push_back(request_rng{seed + b, static_cast<std::uint32_t>(b), 4});
    }
  }
  [[nodiscard]] index_t size() const { return static_cast<index_t>(offsets.size()) - 1; }
  [[nodiscard]] index_t drafts() const { return offsets.back(); }
};

struct results {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> n;
  std::vector<std::uint8_t> acc;
  std::vector<std::uint32_t> flags;
};

template <class Rule = exact_rule>
results run_host(const batch& bt, bool one_hot, const Rule& rule = {},
                 const std::vector<std::uint8_t>& is_greedy = {}) {
  results r{std::vector<token_t>(static_cast<std::size_t>(bt.drafts() + bt.size())),
            std::vector<std::int32_t>(static_cast<std::size_t>(bt.size())),
            std::vector<std::uint8_t>(static_cast<std::size_t>(bt.drafts())),
            std::vector<std::uint32_t>(static_cast<std::size_t>(bt.size()))};
  chain_batch_input<float> in{bt.vocab,
                              bt.offsets,
                              bt.tokens,
                              one_hot
                                  ? batch_view<const float>{}
                                  : batch_view<const float>{bt.draft.data(), bt.drafts(), bt.vocab},
                              {bt.target.data(), bt.drafts() + bt.size(), bt.vocab},
                              bt.rng};
  in.is_greedy = is_greedy;
  verify_chain_unchecked(host::seq, in, chain_batch_output{r.tokens, r.n, r.acc, r.flags}, {},
                         rule);
  return r;
}

/// Greedy chain verification of the batch on the host.
results run_host_greedy(const batch& bt) {
  results r{std::vector<token_t>(static_cast<std::size_t>(bt.drafts() + bt.size())),
            std::vector<std::int32_t>(static_cast<std::size_t>(bt.size())),
            std::vector<std::uint8_t>(static_cast<std::size_t>(bt.drafts())),
            std::vector<std::uint32_t>(static_cast<std::size_t>(bt.size()))};
  verify_chain_greedy(
      host::seq,
      chain_batch_input<float>{bt.vocab,
                               bt.offsets,
                               bt.tokens,
                               {},
                               {bt.target.data(), bt.drafts() + bt.size(), bt.vocab},
                               bt.rng},
      chain_batch_output{r.tokens, r.n, r.acc, r.flags});
  return r;
}

/// How a device run is made: the stream it is enqueued on (null: the legacy default stream), and
/// extra elements between rows (row_stride = V + row_pad, the padding filled with NaN, which a
/// kernel ignoring the stride would read).
struct device_setup {
  cudaStream_t stream = nullptr;
  index_t row_pad = 0;
  /// Receives the split path's workspace after the run (when not null).
  std::vector<std::byte>* workspace_after = nullptr;
  /// Per-request greedy flags (chain_batch_input::is_greedy), or none.
  std::vector<std::uint8_t> is_greedy = {};
  /// NaN entries before the first row: with 1 or 2, no row is 16-byte aligned (the passes' vector
  /// loads are not taken).
  index_t lead = 0;
};

/// Rows of `cols` entries laid out with a stride of cols + pad after `lead` entries (pad and lead
/// entries NaN).
std::vector<float> with_stride(const std::vector<float>& rows, index_t cols, index_t pad,
                               index_t lead = 0) {
  if (pad == 0 && lead == 0) return rows;
  const auto n = static_cast<index_t>(rows.size()) / cols;
  std::vector<float> out(static_cast<std::size_t>(lead + n * (cols + pad)),
                         std::numeric_limits<float>::quiet_NaN());
  for (index_t r = 0; r < n; ++r)
    std::copy_n(rows.begin() + r * cols, cols, out.begin() + lead + r * (cols + pad));
  return out;
}

template <class Rule = exact_rule>
results run_device(const batch& bt, bool one_hot, const Rule& rule = {}, bool greedy = false,
                   int split = 1, const device_setup& setup = {}) {
  const index_t stride = bt.vocab + setup.row_pad;
  device_vector<index_t> off(bt.offsets);
  device_vector<token_t> tok(bt.tokens);
  device_vector<float> dr(with_stride(bt.draft, bt.vocab, setup.row_pad, setup.lead)),
      tg(with_stride(bt.target, bt.vocab, setup.row_pad, setup.lead));
  device_vector<request_rng> rng(bt.rng);
  device_vector<token_t> out(
      std::vector<token_t>(static_cast<std::size_t>(bt.drafts() + bt.size()), 77));
  device_vector<std::int32_t> n(std::vector<std::int32_t>(static_cast<std::size_t>(bt.size()), -5));
  device_vector<std::uint8_t> acc(
      std::vector<std::uint8_t>(static_cast<std::size_t>(bt.drafts()), 9));
  device_vector<std::uint32_t> fl(
      std::vector<std::uint32_t>(static_cast<std::size_t>(bt.size()), 0));
  chain_batch_input<float> in{
      bt.vocab,
      {off.ptr, bt.size() + 1},
      {tok.ptr, bt.drafts()},
      one_hot ? batch_view<const float>{}
              : batch_view<const float>{dr.ptr + setup.lead, bt.drafts(), bt.vocab, stride},
      {tg.ptr + setup.lead, bt.drafts() + bt.size(), bt.vocab, stride},
      {rng.ptr, bt.size()}};
  device_vector<std::uint8_t> greedy_flags(setup.is_greedy);
  if (!setup.is_greedy.empty()) in.is_greedy = greedy_flags.cview();
  const chain_batch_output o{out.view(), n.view(), acc.view(), fl.view()};
  // The workspace starts as all-ones bytes (NaN doubles), so a run shows whether it was written.
  device_vector<std::byte> ws(std::vector<std::byte>(
      split == 1 ? 8 : sc::chain_workspace_bytes(bt.size(), bt.vocab), std::byte{0xff}));
  const auto pol = sc::par_on(setup.stream).with_workspace(ws.ptr, ws.n).with_row_split(split);
  if (greedy)
    sc::throw_on_error(sc::verify_chain_greedy_async(pol, in, o), "greedy");
  else
    sc::verify_chain(pol, in, o, chain_options{}, rule);
  sc::throw_on_error(cudaStreamSynchronize(setup.stream), "chain kernel");
  if (setup.workspace_after != nullptr) *setup.workspace_after = ws.to_host();
  return {out.to_host(), n.to_host(), acc.to_host(), fl.to_host()};
}

void require_equal(const results& a, const results& b) {
  CHECK(a.tokens == b.tokens);
  CHECK(a.n == b.n);
  CHECK(a.acc == b.acc);
  CHECK(a.flags == b.flags);
}

}  // namespace

TEST_CASE("device chain verification equals the host backend", "[cuda][device]") {
  if (!have_gpu()) return;
  for (index_t vocab : {7, 300, 5000, 128256}) {
    for (std::uint64_t seed = 1; seed <= (vocab > 10000 ? 2u : 6u); ++seed) {
      const batch bt(vocab, {3, 0, 5, 1, 8, 2}, seed);
      INFO("vocab " << vocab << " seed " << seed);
      require_equal(run_device(bt, false), run_host(bt, false));
      require_equal(run_device(bt, true), run_host(bt, true));
    }
  }
}

TEST_CASE("device chain verification with per-request greedy flags equals the host",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const std::vector<std::uint8_t> mask = {1, 0, 1, 0, 0, 1};
  for (index_t vocab : {300, 128256}) {
    batch bt(vocab, {3, 0, 5, 1, 8, 2}, 41);
    // Request 0 drafts the arg-max of its target rows (accepted greedily).
    for (index_t i = 0; i < 3; ++i) {
      const auto row = bt.target.begin() + i * vocab;
      bt.tokens[static_cast<std::size_t>(i)] =
          static_cast<token_t>(std::max_element(row, row + vocab) - row);
    }
    const auto host = run_host(bt, false, exact_rule{}, mask);
    CHECK(host.n[0] == 3);
    for (int split : {1, 0}) {  // one CTA per request; the split path where it applies
      device_setup setup;
      setup.is_greedy = mask;
      INFO("vocab " << vocab << " split " << split);
      require_equal(run_device(bt, false, exact_rule{}, false, split, setup), host);
    }
    // The sampled requests are those of the call without flags.
    const auto plain = run_host(bt, false);
    for (std::size_t b : {1u, 3u, 4u}) {
      CHECK(host.n[b] == plain.n[b]);
      CHECK(host.flags[b] == plain.flags[b]);
    }
  }
}

TEST_CASE("device chain verification split across CTAs per row equals the host", "[cuda][device]") {
  if (!have_gpu()) return;
  const auto sch = relaxation_schedule::make_exponential(2.0, 0.5, 6);
  const scheduled_relaxed_rule relaxed{sch, resampling::optimal};
  for (index_t vocab : {300, 5000, 128256}) {
    const batch bt(vocab, {3, 0, 5, 1}, 21);
    for (int split : {2, 5, 64, 0}) {
      INFO("vocab " << vocab << " split " << split);
      require_equal(run_device(bt, false, exact_rule{}, false, split), run_host(bt, false));
      require_equal(run_device(bt, true, exact_rule{}, false, split), run_host(bt, true));
      require_equal(run_device(bt, false, relaxed, false, split), run_host(bt, false, relaxed));
    }
  }
}

TEST_CASE("device chain verification with a relaxed schedule equals the host",
          "[cuda][relaxed][device]") {
  if (!have_gpu()) return;
  const auto sch = relaxation_schedule::make_exponential(2.0, 0.5, 6);
  const scheduled_relaxed_rule rule{sch, resampling::optimal};
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const batch bt(1000, {6, 4, 2}, seed);
    require_equal(run_device(bt, false, rule), run_host(bt, false, rule));
  }
}

TEST_CASE("device chain verification with row-aware rules (LANTERN++, typical) equals the host",
          "[cuda][relaxed][device]") {
  if (!have_gpu()) return;
  const index_t V = 500;
  // Neighbour table from random 4-dimensional embeddings (k = 8), copied to the device.
  std::vector<float> emb;
  for (index_t t = 0; t < V * 4; ++t)
    emb.push_back(static_cast<float>(
        uniform_at(request_rng{41, 0, 0}, draw_id{static_cast<std::uint32_t>(t), 0})));
  const neighbour_table table(batch_view<const float>(emb.data(), V, 4), 8);
  const lantern_rule host_rule = lantern_rule::make_relative(table, 0.5, resampling::optimal);
  const auto device_rule = sc::to_device(host_rule);  // the table's ids in device memory
  const typical_rule typical = typical_rule::make(0.09, 0.3);
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const batch bt(V, {5, 3, 0, 7}, seed);
    INFO("seed " << seed);
    require_equal(run_device(bt, false, device_rule.rule()), run_host(bt, false, host_rule));
    // Typical: equal unless some p(x) lies within a few ulps of the entropy threshold (the host
    // and the device take log from different libraries).
    require_equal(run_device(bt, false, typical), run_host(bt, false, typical));
  }
  // Cool-SD's schedule composed with LANTERN++, with a custom schedule: the table and the ω
  // values copied by to_device, alone and per request. ω ≥ 1 never walks a neighbour list in
  // the optimal resampling (rules/lantern.hpp); ω < 1 walks those of tokens with ω·p < q.
  for (const std::vector<double>& omegas :
       {std::vector<double>{2.0, 1.5, 1.25}, std::vector<double>{0.6, 0.8, 1.4}}) {
    const scheduled_lantern_rule scheduled{host_rule,
                                           relaxation_schedule::make_custom(omegas.data(), 3)};
    const auto device_scheduled = sc::to_device(scheduled);
    const std::vector<scheduled_lantern_rule> each(4, scheduled);
    const per_request<scheduled_lantern_rule> host_each{{each.data(), 4}};
    const auto device_each = sc::to_device(host_each);
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      const batch bt(V, {5, 3, 0, 7}, seed);
      INFO("scheduled, omega_1 " << omegas[0] << ", seed " << seed);
      require_equal(run_device(bt, false, device_scheduled.rule()), run_host(bt, false, scheduled));
      require_equal(run_device(bt, false, device_each.rule()), run_host(bt, false, host_each));
    }
  }
}

TEST_CASE("device greedy chain verification equals the host", "[cuda][device]") {
  if (!have_gpu()) return;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    batch bt(2000, {4, 1, 6}, seed);
    // Make some drafts the argmax so that greedy chains get accepted.
    index_t row = 0;
    for (index_t b = 0; b < bt.size(); ++b) {
      const index_t len =
          bt.offsets[static_cast<std::size_t>(b + 1)] - bt.offsets[static_cast<std::size_t>(b)];
      for (index_t i = 0; i < len; ++i) {
        const float* p =
            bt.target.data() + (bt.offsets[static_cast<std::size_t>(b)] + b + i) * bt.vocab;
        if ((i + seed) % 3 != 0)
          bt.tokens[static_cast<std::size_t>(row)] =
              static_cast<token_t>(argmax_lowest(row_view<const float>(p, bt.vocab)));
        ++row;
      }
    }
    require_equal(run_device(bt, true, exact_rule{}, true), run_host_greedy(bt));
  }
}

TEST_CASE("device chain verification: batch-position invariance", "[cuda][device]") {
  if (!have_gpu()) return;
  const batch full(800, {2, 5, 3}, 11);
  const auto all = run_device(full, false);
  // Request 1 alone.
  batch one = full;
  one.offsets = {0, 5};
  one.tokens.assign(full.tokens.begin() + 2, full.tokens.begin() + 7);
  one.draft.assign(full.draft.begin() + 2 * 800, full.draft.begin() + 7 * 800);
  one.target.assign(full.target.begin() + 3 * 800, full.target.begin() + 9 * 800);
  one.rng = {full.rng[1]};
  const auto alone = run_device(one, false);
  CHECK(alone.n[0] == all.n[1]);
  CHECK(std::vector<token_t>(alone.tokens.begin(), alone.tokens.end()) ==
        std::vector<token_t>(all.tokens.begin() + 3, all.tokens.begin() + 9));
}

TEST_CASE("device chain verification: bad input sets flags and reads nothing out of bounds",
          "[cuda][bad_input][device]") {
  if (!have_gpu()) return;
  batch bt(64, {3, 2, 2}, 5);
  bt.tokens[1] = 64;        // out of range in request 0
  bt.tokens[3] = no_token;  // -1 inside request 1
  // Request 2: a target row of NaN at its first position and no mass at its bonus row.
  for (index_t y = 0; y < 64; ++y)
    bt.target[static_cast<std::size_t>((5 + 2) * 64 + y)] = std::numeric_limits<float>::quiet_NaN();
  const auto r = run_device(bt, false);
  CHECK((r.flags[0] & chain_invalid_input) != 0);
  CHECK((r.flags[1] & chain_invalid_input) != 0);
  CHECK((r.flags[0] & chain_valid) == 0);
  CHECK(r.n[0] == 0);
  CHECK(r.tokens[0] == no_token);
  // NaN rows: p(x) is NaN, so the draft is rejected; the residual of NaN weights is empty and
  // the fallback to p finds no mass either: no token, not valid.
  CHECK((r.flags[2] & chain_valid) == 0);
  CHECK(r.tokens[static_cast<std::size_t>(5 + 2)] == no_token);
  // Launch checks (extents, null data, strides, rules, workspace alignment) run on the host
  // before any CUDA call: tests/cuda/test_launch_checks.cu.
}

TEST_CASE("device G-test: one speculative round per request reproduces the toy model's law",
          "[cuda][stats][device]") {
  if (!have_gpu()) return;
  // 200 000 requests, each one round of draft length 3 on a toy model (V = 5, horizon 4), all in
  // one launch; the emitted tokens are extended to 4 with target samples on the host. The law of
  // the 4 tokens must be the target's (G-test); the same rounds with the residual replaced by p
  // (a planted bias, run through the relaxed rule slot) must fail.
  const testing::toy_ar_model target(5, 4, 2024, 0.3);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.6, 77, 0.3);
  const index_t V = 5, L = 3;
  const std::uint32_t runs = 200000;
  batch bt(V, {}, 1);
  for (std::uint32_t r = 0; r < runs; ++r) {
    std::vector<token_t> ctx;
    const request_rng drng{91, r, 0};
    for (index_t i = 0; i < L; ++i) {
      const auto q = draft.row(ctx);
      const auto p = target.row(ctx);
      auto w = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
      const auto x = static_cast<token_t>(sample_inverse_cdf(
          V, w, 1.0, uniform_at(drng, draw_id{static_cast<std::uint32_t>(i), 0})));
      bt.tokens.push_back(x);
      bt.draft.insert(bt.draft.end(), q.begin(), q.end());
      bt.target.insert(bt.target.end(), p.begin(), p.end());
      ctx.push_back(x);
    }
    const auto p = target.row(ctx);
    bt.target.insert(bt.target.end(), p.begin(), p.end());
    bt.offsets.push_back(bt.offsets.back() + L);
    bt.rng.push_back(request_rng{92, r, 0});
  }
  const auto law = [&] {
    // Law of the first 4 tokens = the toy model's sequence law (horizon 4).
    return target.sequence_law();
  }();
  auto counts_of = [&](const results& res) {
    std::vector<std::uint64_t> counts(law.size(), 0);
    for (std::uint32_t r = 0; r < runs; ++r) {
      std::vector<token_t> seq;
      const auto base = static_cast<std::size_t>(r) * (L + 1);
      for (index_t i = 0; i <= res.n[r]; ++i)
        seq.push_back(res.tokens[base + static_cast<std::size_t>(i)]);
      for (std::uint32_t j = 0; static_cast<index_t>(seq.size()) < 4; ++j) {
        const auto p = target.row(seq);
        auto w = [&](index_t y) { return p[static_cast<std::size_t>(y)]; };
        seq.push_back(static_cast<token_t>(
            sample_inverse_cdf(V, w, 1.0, uniform_at(request_rng{93, r, 0}, draw_id{j, 0}))));
      }
      ++counts[static_cast<std::size_t>(target.sequence_index(seq))];
    }
    return counts;
  };
  std::string summary;
  const double fit = cuda_test::g_test_p_value(counts_of(run_device(bt, false)), law, summary);
  INFO("G-test exact rule: " << summary);
  CHECK(fit > 1e-4);
  // Planted bias: ω = 3 accepts too often (and G* then cannot restore p).
  const double bad =
      cuda_test::g_test_p_value(counts_of(run_device(bt, false, relaxed_rule{3.0})), law, summary);
  INFO("G-test relaxed (negative control): " << summary);
  CHECK(bad < 1e-4);
}

namespace {

/// A batch in the padded layout [B, L, V]: drafts -1 after each request's length, unused rows
/// filled with a uniform row.
struct padded_batch {
  index_t vocab, size, max_draft;
  std::vector<token_t> tokens;
  std::vector<float> q, p;
  std::vector<request_rng> rng;

  padded_batch(const batch& bt, index_t L)
      : vocab(bt.vocab),
        size(bt.size()),
        max_draft(L),
        tokens(static_cast<std::size_t>(size * L), no_token),
        q(static_cast<std::size_t>(size * L * vocab), 1.0f / static_cast<float>(vocab)),
        p(static_cast<std::size_t>(size * (L + 1) * vocab), 1.0f / static_cast<float>(vocab)),
        rng(bt.rng) {
    const index_t V = vocab;
    for (index_t b = 0; b < size; ++b) {
      const auto sb = static_cast<std::size_t>(b);
      const index_t len = bt.offsets[sb + 1] - bt.offsets[sb];
      for (index_t i = 0; i < len; ++i) {
        tokens[static_cast<std::size_t>(b * L + i)] =
            bt.tokens[static_cast<std::size_t>(bt.offsets[sb] + i)];
        std::copy_n(bt.draft.begin() + (bt.offsets[sb] + i) * V, V, q.begin() + (b * L + i) * V);
      }
      for (index_t i = 0; i <= len; ++i)
        std::copy_n(bt.target.begin() + (bt.offsets[sb] + b + i) * V, V,
                    p.begin() + (b * (L + 1) + i) * V);
    }
  }
  [[nodiscard]] results empty_results() const {
    return {std::vector<token_t>(static_cast<std::size_t>(size * (max_draft + 1))),
            std::vector<std::int32_t>(static_cast<std::size_t>(size)),
            std::vector<std::uint8_t>(static_cast<std::size_t>(size * max_draft)),
            std::vector<std::uint32_t>(static_cast<std::size_t>(size))};
  }
};

results run_host_padded(const padded_batch& pb, bool one_hot) {
  results r = pb.empty_results();
  const index_t B = pb.size, L = pb.max_draft, V = pb.vocab;
  const padded_chain_input<float> in{
      V,
      B,
      L,
      pb.tokens,
      {},
      one_hot ? batch_view<const float>{} : batch_view<const float>{pb.q.data(), B * L, V},
      {pb.p.data(), B * (L + 1), V},
      pb.rng};
  verify_chain_unchecked(host::seq, in, padded_chain_output{r.tokens, r.n, r.acc, r.flags});
  return r;
}

/// The padded batch on the device: `split` CTAs per row (as run_device), rows after `lead` NaN
/// entries; the workspace after the run in *workspace_after when given.
results run_device_padded(const padded_batch& pb, bool one_hot, int split = 1, index_t lead = 0,
                          std::vector<std::byte>* workspace_after = nullptr) {
  const results init = pb.empty_results();
  const index_t B = pb.size, L = pb.max_draft, V = pb.vocab;
  device_vector<token_t> tok(pb.tokens), out(std::vector<token_t>(init.tokens.size(), 77));
  device_vector<float> q(with_stride(pb.q, V, 0, lead)), p(with_stride(pb.p, V, 0, lead));
  device_vector<request_rng> rng(pb.rng);
  device_vector<std::int32_t> n(std::vector<std::int32_t>(init.n.size(), -5));
  device_vector<std::uint8_t> acc(std::vector<std::uint8_t>(init.acc.size(), 9));
  device_vector<std::uint32_t> fl(init.flags);
  const padded_chain_input<float> in{
      V,
      B,
      L,
      {tok.ptr, B * L},
      {},
      one_hot ? batch_view<const float>{} : batch_view<const float>{q.ptr + lead, B * L, V},
      {p.ptr + lead, B * (L + 1), V},
      {rng.ptr, B}};
  device_vector<std::byte> ws(
      std::vector<std::byte>(split == 1 ? 8 : sc::chain_workspace_bytes(B, V), std::byte{0xff}));
  const auto pol = sc::par_on(nullptr).with_workspace(ws.ptr, ws.n).with_row_split(split);
  sc::verify_chain(pol, in, padded_chain_output{out.view(), n.view(), acc.view(), fl.view()});
  sc::throw_on_error(cudaDeviceSynchronize(), "padded chain kernel");
  if (workspace_after != nullptr) *workspace_after = ws.to_host();
  return {out.to_host(), n.to_host(), acc.to_host(), fl.to_host()};
}

/// True when every byte of a workspace still holds the 0xff it started with.
bool untouched(const std::vector<std::byte>& w) {
  for (std::byte x : w)
    if (x != std::byte{0xff}) return false;
  return true;
}

}  // namespace

TEST_CASE("device chain verification, padded layout, equals the host", "[cuda][device]") {
  if (!have_gpu()) return;
  const padded_batch pb(batch(300, {2, 4, 0}, 17), 4);
  require_equal(run_device_padded(pb, false), run_host_padded(pb, false));
  require_equal(run_device_padded(pb, true), run_host_padded(pb, true));
}

TEST_CASE("device padded chain verification split across CTAs per row equals the host",
          "[cuda][device]") {
  if (!have_gpu()) return;
  for (index_t vocab : {300, 5000, 128256}) {
    const padded_batch pb(batch(vocab, {3, 0, 5, 1}, 43), 5);
    const results host = run_host_padded(pb, false);
    const results host_one_hot = run_host_padded(pb, true);
    for (int split : {2, 5, 64, 0}) {
      INFO("vocab " << vocab << " split " << split);
      require_equal(run_device_padded(pb, false, split), host);
      require_equal(run_device_padded(pb, true, split), host_one_hot);
    }
  }
  // The split path runs when asked (the workspace holds the stopping rows' tile sums) and not
  // otherwise.
  const padded_batch pb(batch(5000, {3, 2}, 29), 3);
  std::vector<std::byte> after;
  require_equal(run_device_padded(pb, false, 4, 0, &after), run_host_padded(pb, false));
  CHECK_FALSE(untouched(after));
  require_equal(run_device_padded(pb, false, 1, 0, &after), run_host_padded(pb, false));
  CHECK(untouched(after));
}

TEST_CASE("device chain verification reads 16-byte aligned and unaligned rows alike",
          "[cuda][device]") {
  // Aligned rows are read with 16-byte loads redistributed by warp shuffles, unaligned ones
  // element by element (block_passes.cuh): the same weights summed in the same order.
  if (!have_gpu()) return;
  const auto sch = relaxation_schedule::make_exponential(2.0, 0.5, 6);
  const scheduled_relaxed_rule relaxed{sch, resampling::optimal};
  const typical_rule typical = typical_rule::make(0.09, 0.3);
  for (index_t vocab : {1024, 5000, 128256}) {  // 1024: full tiles only; others a partial one
    const batch bt(vocab, {3, 0, 5, 1, 4}, 47);
    const results host = run_host(bt, false), host_one_hot = run_host(bt, true),
                  host_relaxed = run_host(bt, false, relaxed),
                  host_typical = run_host(bt, false, typical);
    for (index_t lead : {0, 1, 2}) {
      for (int split : {1, 4}) {
        INFO("vocab " << vocab << " lead " << lead << " split " << split);
        device_setup setup;
        setup.lead = lead;
        require_equal(run_device(bt, false, exact_rule{}, false, split, setup), host);
        require_equal(run_device(bt, true, exact_rule{}, false, split, setup), host_one_hot);
        require_equal(run_device(bt, false, relaxed, false, split, setup), host_relaxed);
        // Typical: the entropy is one CTA-wide pass in the host's order (equal unless some p(x)
        // lies within a few ulps of the threshold: log differs between the libraries).
        require_equal(run_device(bt, false, typical, false, split, setup), host_typical);
      }
    }
    const padded_batch pb(bt, 5);
    for (index_t lead : {0, 1})
      require_equal(run_device_padded(pb, false, 1, lead), run_host_padded(pb, false));
  }
}

namespace {

/// A non-default stream, destroyed at scope exit.
struct stream_guard {
  cudaStream_t s = nullptr;
  stream_guard() {
    sc::throw_on_error(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  }
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;
  ~stream_guard() { cudaStreamDestroy(s); }
};

}  // namespace

TEST_CASE("device chain verification on a non-default stream with strided rows equals the host",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const stream_guard stream;
  for (index_t vocab : {300, 151936}) {  // 151 936: beyond 512 recorded tiles (Qwen's vocabulary)
    const batch bt(vocab, {3, 0, 5, 1}, 23);
    for (int split : {1, 4}) {
      INFO("vocab " << vocab << " split " << split);
      const device_setup setup{stream.s, 37};
      require_equal(run_device(bt, false, exact_rule{}, false, split, setup), run_host(bt, false));
      require_equal(run_device(bt, true, exact_rule{}, false, split, setup), run_host(bt, true));
    }
    require_equal(run_device(bt, true, exact_rule{}, true, 1, device_setup{stream.s, 37}),
                  run_host_greedy(bt));
  }
}

TEST_CASE("device chain verification: the split path runs when asked and not otherwise",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const batch bt(5000, {3, 2}, 29);
  std::vector<std::byte> after;
  // With row_split = 4 the first kernel writes the stopping rows' tile sums to the workspace.
  require_equal(run_device(bt, false, exact_rule{}, false, 4, device_setup{nullptr, 0, &after}),
                run_host(bt, false));
  CHECK_FALSE(untouched(after));
  // With row_split = 1 the workspace is never written.
  require_equal(run_device(bt, false, exact_rule{}, false, 1, device_setup{nullptr, 0, &after}),
                run_host(bt, false));
  CHECK(untouched(after));
}

TEST_CASE("device chain verification with per-request rules and a custom schedule equals the host",
          "[cuda][relaxed][device]") {
  if (!have_gpu()) return;
  const batch bt(700, {4, 2, 6, 0, 3}, 31);
  // One relaxed rule per request (the array copied to the device by to_device).
  std::vector<relaxed_rule> rules;
  for (index_t b = 0; b < bt.size(); ++b)
    rules.push_back(relaxed_rule{1.0 + 0.3 * static_cast<double>(b),
                                 b % 2 == 0 ? resampling::optimal : resampling::vanilla});
  const per_request<relaxed_rule> host_rules{{rules.data(), bt.size()}};
  const auto device_rules = sc::to_device(host_rules);
  require_equal(run_device(bt, false, device_rules.rule()), run_host(bt, false, host_rules));
  // A custom ω schedule (its values copied to the device), alone and per request.
  const std::vector<double> omegas{2.0, 1.5, 1.25, 1.1};
  const scheduled_relaxed_rule custom{relaxation_schedule::make_custom(omegas.data(), 4),
                                      resampling::optimal};
  const auto device_custom = sc::to_device(custom);
  require_equal(run_device(bt, false, device_custom.rule()), run_host(bt, false, custom));
  const std::vector<scheduled_relaxed_rule> customs(static_cast<std::size_t>(bt.size()), custom);
  const per_request<scheduled_relaxed_rule> host_customs{{customs.data(), bt.size()}};
  const auto device_customs = sc::to_device(host_customs);
  require_equal(run_device(bt, false, device_customs.rule()), run_host(bt, false, host_customs));
}

TEST_CASE("device padded chain verification with explicit lengths equals the host",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t V = 400, L = 5, B = 4;
  const std::vector<std::int32_t> lengths{2, 5, 0, 3};
  std::vector<token_t> tokens;
  std::vector<float> q, p;
  std::vector<request_rng> rng;
  std::uint32_t id = 0;
  for (index_t b = 0; b < B; ++b) {
    for (index_t i = 0; i <= L; ++i) {
      const auto pr = testing::random_probability_row(V, 33, id++, 0.1);
      p.insert(p.end(), pr.begin(), pr.end());
      if (i == L) break;
      const auto qr = testing::random_probability_row(V, 33, id++, 0.2);
      q.insert(q.end(), qr.begin(), qr.end());
      // Every slot holds a valid token, also past the request's length: only draft_lengths
      // says where a draft ends.
      tokens.push_back(cuda_test::draw_from(qr, uniform_at(request_rng{34, id++, 0}, draw_id{})));
    }
    rng.push_back(request_rng{35, static_cast<std::uint32_t>(b), 0});
  }
  std::vector<token_t> h_out(static_cast<std::size_t>(B * (L + 1)));
  std::vector<std::int32_t> h_n(static_cast<std::size_t>(B));
  std::vector<std::uint8_t> h_acc(static_cast<std::size_t>(B * L));
  std::vector<std::uint32_t> h_fl(static_cast<std::size_t>(B));
  const padded_chain_input<float> hin{
      V, B, L, tokens, lengths, {q.data(), B * L, V}, {p.data(), B * (L + 1), V}, rng};
  verify_chain_unchecked(host::seq, hin, padded_chain_output{h_out, h_n, h_acc, h_fl});

  device_vector<token_t> d_tok(tokens), d_out(std::vector<token_t>(h_out.size(), 77));
  device_vector<std::int32_t> d_len(lengths), d_n(std::vector<std::int32_t>(h_n.size(), 9));
  device_vector<float> d_q(q), d_p(p);
  device_vector<request_rng> d_rng(rng);
  device_vector<std::uint8_t> d_acc(std::vector<std::uint8_t>(h_acc.size(), 9));
  device_vector<std::uint32_t> d_fl(h_fl);
  const padded_chain_input<float> din{V,
                                      B,
                                      L,
                                      {d_tok.ptr, B * L},
                                      index_view(d_len.ptr, B),
                                      {d_q.ptr, B * L, V},
                                      {d_p.ptr, B * (L + 1), V},
                                      {d_rng.ptr, B}};
  sc::verify_chain(sc::par_on(nullptr), din,
                   padded_chain_output{d_out.view(), d_n.view(), d_acc.view(), d_fl.view()});
  sc::throw_on_error(cudaDeviceSynchronize(), "padded chain kernel");
  CHECK(d_out.to_host() == h_out);
  CHECK(d_n.to_host() == h_n);
  CHECK(d_acc.to_host() == h_acc);
  CHECK(d_fl.to_host() == h_fl);
}

namespace specula::cuda_test {

/// One request's chain under the scripted source (the chain kernels' path: the host's
/// verify_chain_request with CTA-wide passes), relaxed rule ω (1 = exact), rows of T.
template <class T>
__global__ void scripted_chain_kernel(const token_t* drafts, const T* p_rows, const T* q_rows,
                                      index_t vocab, index_t length, script_run run,
                                      token_t* out_tokens, std::int32_t* num_accepted,
                                      double omega) {
  __shared__ specula::cuda::detail::chain_storage storage;
  const specula::cuda::detail::chain_passes passes(storage);
  scripted_source src = run.source();
  const auto r = verify_chain_request(
      relaxed_rule{omega, resampling::optimal}, src, length, drafts,
      [&](index_t i) { return row_view<const T>(p_rows + i * vocab, vocab); },
      [&](index_t i) { return dense_proposal<T>{row_view<const T>(q_rows + i * vocab, vocab)}; },
      default_residual_floor, out_tokens, nullptr, passes);
  if (threadIdx.x == 0) {
    *num_accepted = r.num_accepted;
    *run.depth = src.depth;
  }
}

/// One enumerated 2-token draft (x1 ~ q, x2 ~ q(. | x1)) of the toy model, with its rows in T:
/// the target rows after (), (x1), (x1, x2) and the draft rows after (), (x1).
template <class T>
struct chain_law_draft {
  std::vector<token_t> tokens;
  std::vector<T> p_rows, q_rows;
  double probability = 0.0;  ///< drafting probability, from the model's double rows
};

template <class T, class Visit>
void for_each_chain_draft(const testing::toy_ar_model& target, const testing::toy_ar_model& draft,
                          Visit&& visit) {
  const index_t V = target.vocab_size();
  for (token_t x1 = 0; x1 < V; ++x1)
    for (token_t x2 = 0; x2 < V; ++x2) {
      const std::vector<token_t> a{x1}, ab{x1, x2};
      chain_law_draft<T> d;
      d.tokens = ab;
      d.probability =
          draft.row({})[static_cast<std::size_t>(x1)] * draft.row(a)[static_cast<std::size_t>(x2)];
      if (!(d.probability > 0.0)) continue;
      for (const auto& pre : {std::vector<token_t>{}, a, ab}) {
        const auto pr = target.row(pre);
        d.p_rows.insert(d.p_rows.end(), pr.begin(), pr.end());
      }
      for (const auto& pre : {std::vector<token_t>{}, a}) {
        const auto qr = draft.row(pre);
        d.q_rows.insert(d.q_rows.end(), qr.begin(), qr.end());
      }
      visit(d);
    }
}

/// Exact law of the first two tokens of one round with a 2-token draft on the toy model: drafts
/// enumerated on the host, verification on the device (rows of law_row).
std::vector<double> device_chain_two_token_law(const testing::toy_ar_model& target,
                                               const testing::toy_ar_model& draft, double omega) {
  const index_t V = target.vocab_size();
  std::vector<double> law(static_cast<std::size_t>(V * V), 0.0);
  script_buffers sb;
  device_vector<token_t> tok(std::vector<token_t>(2)), out(std::vector<token_t>(3));
  device_vector<law_row> p(std::vector<law_row>(static_cast<std::size_t>(3 * V))),
      q(std::vector<law_row>(static_cast<std::size_t>(2 * V)));
  device_vector<std::int32_t> nacc(std::vector<std::int32_t>(1));
  for_each_chain_draft<law_row>(target, draft, [&](const chain_law_draft<law_row>& d) {
    tok.assign(d.tokens);
    p.assign(d.p_rows);
    q.assign(d.q_rows);
    enumerate_device(
        sb,
        [&](const script_run& run) {
          scripted_chain_kernel<law_row><<<1, specula::cuda::chain_block_threads>>>(
              tok.ptr, p.ptr, q.ptr, V, 2, run, out.ptr, nacc.ptr, omega);
        },
        [&](double prob) {
          add_two_token_outcome(law, target, out.to_host(), nacc.to_host()[0],
                                d.probability * prob);
        });
  });
  return law;
}

/// The host replay of device_chain_two_token_law with rows of T: the same verifier, the same
/// scripted decisions, the host's sequential passes (the device's summation order).
template <class T>
std::vector<double> host_chain_two_token_law(const testing::toy_ar_model& target,
                                             const testing::toy_ar_model& draft, double omega) {
  const index_t V = target.vocab_size();
  std::vector<double> law(static_cast<std::size_t>(V * V), 0.0);
  std::vector<token_t> out(3);
  std::int32_t nacc = 0;
  for_each_chain_draft<T>(target, draft, [&](const chain_law_draft<T>& d) {
    enumerate_host(
        [&](scripted_source& src) {
          nacc = verify_chain_request(
                     relaxed_rule{omega, resampling::optimal}, src, 2, d.tokens.data(),
                     [&](index_t i) { return row_view<const T>(d.p_rows.data() + i * V, V); },
                     [&](index_t i) {
                       return dense_proposal<T>{row_view<const T>(d.q_rows.data() + i * V, V)};
                     },
                     default_residual_floor, out.data(), nullptr)
                     .num_accepted;
        },
        [&](double prob) { add_two_token_outcome(law, target, out, nacc, d.probability * prob); });
  });
  return law;
}

}  // namespace specula::cuda_test

namespace {

/// The models of the exact-law tests (host replay and device).
const cuda_test::law_models& chain_law() {
  static const cuda_test::law_models m(4, 3, 505, 0.2, 0.6);
  return m;
}

}  // namespace

TEST_CASE("host replay of the device chain exact-law test: the rows it runs on give the law",
          "[cuda][exact][host]") {
  // Runs on the host what the device test below runs on the GPU (same rows, same decisions, the
  // same summation order), so a mistake in the test itself shows without a GPU.
  cuda_test::check_host_replay(cuda_test::two_token_law(chain_law().target),
                               [](auto row, double omega) {
                                 return cuda_test::host_chain_two_token_law<decltype(row)>(
                                     chain_law().target, chain_law().draft, omega);
                               });
}

TEST_CASE("device chain verification: exact law of the first two tokens by enumeration",
          "[cuda][exact][device]") {
  if (!have_gpu()) return;
  const auto expected = cuda_test::two_token_law(chain_law().target);
  CHECK(cuda_test::max_abs_diff(
            cuda_test::device_chain_two_token_law(chain_law().target, chain_law().draft, 1.0),
            expected) < 1e-12);
  // Negative control: ω = 2 (accepts too often).
  CHECK(cuda_test::max_abs_diff(
            cuda_test::device_chain_two_token_law(chain_law().target, chain_law().draft, 2.0),
            expected) > 1e-3);
}
