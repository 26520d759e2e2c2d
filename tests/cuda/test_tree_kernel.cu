// Device token-tree, K-candidate and greedy tree verification, and device sampling without
// replacement, against the host backend: same inputs and seeds must give the same outputs
// (every sibling sampling, dense and one-hot, several vocabularies, row splits); malformed trees
// and bad input; the exact output law of the device code path by enumerating its randomness;
// a G-test of the production kernel with a negative control. Skips without a GPU.

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "device_buffer.cuh"
#include "device_enumerate.cuh"
#include "specula/cuda/rules.cuh"
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/tree.cuh"
#include "specula/rules/relaxed.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

// This file compiles the shared instantiations of kernel_instances.cuh that it owns.
#define SPECULA_TEST_TREE_INSTANCES
#include "kernel_instances.cuh"

using namespace specula;
using cuda_test::device_vector;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

bool have_gpu() { return cuda_test::have_gpu("device tree-verification checks"); }

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

/// Draws `count` children tokens from q (without or with replacement) for a node.
std::vector<token_t> draw_children(const std::vector<float>& q, index_t count,
                                   sibling_sampling sampling, const request_rng& rng) {
  const auto n = static_cast<index_t>(q.size());
  auto w = [&](index_t i) { return static_cast<double>(q[static_cast<std::size_t>(i)]); };
  std::vector<token_t> out(static_cast<std::size_t>(count), no_token);
  if (sampling == sibling_sampling::without_replacement) {
    std::vector<double> keys(static_cast<std::size_t>(count));
    const index_t got =
        sample_without_replacement_keys(n, w, count, rng, 0, out.data(), keys.data());
    out.resize(static_cast<std::size_t>(got));
  } else {
    for (index_t c = 0; c < count; ++c)
      out[static_cast<std::size_t>(c)] = static_cast<token_t>(sample_inverse_cdf(
          n, w, positive_mass(n, w), uniform_at(rng, draw_id{static_cast<std::uint32_t>(c), 0})));
  }
  return out;
}

/// A batch of trees with random rows; children drawn from their parent's q row.
struct tree_data {
  index_t vocab = 0;
  std::vector<token_tree> trees;
  std::vector<float> target, draft;
  std::vector<request_rng> rng;

  tree_data(index_t v, const std::vector<token_tree>& shapes, std::uint64_t seed,
            sibling_sampling sampling)
      : vocab(v) {
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < shapes.size(); ++b) {
      token_tree t = shapes[b];
      std::vector<token_t> tokens(static_cast<std::size_t>(t.size()), no_token);
      std::vector<std::vector<float>> q_rows;
      for (index_t u = 0; u < t.size(); ++u) {
        const auto q = to_float(testing::random_probability_row(v, seed, id++, 0.2));
        auto p = testing::random_probability_row(v, seed, id++, 0.1);
        for (index_t y = 0; y < v; ++y)
          p[static_cast<std::size_t>(y)] =
              0.6 * q[static_cast<std::size_t>(y)] + 0.4 * p[static_cast<std::size_t>(y)];
        draft.insert(draft.end(), q.begin(), q.end());
        const auto pf = to_float(p);
        target.insert(target.end(), pf.begin(), pf.end());
        q_rows.push_back(q);
      }
      for (index_t u = 0; u < t.size(); ++u) {
        const auto kids = t.children(u);
        const auto drawn =
            draw_children(q_rows[static_cast<std::size_t>(u)], static_cast<index_t>(kids.size()),
                          sampling, request_rng{seed, id++, 3});
        for (std::size_t c = 0; c < kids.size(); ++c)
          tokens[static_cast<std::size_t>(kids[c])] = c < drawn.size() ? drawn[c] : 0;
      }
      t.set_tokens(tokens);
      trees.push_back(t);
      rng.push_back(request_rng{seed + b, static_cast<std::uint32_t>(b), 5});
    }
  }
  [[nodiscard]] index_t batch() const { return static_cast<index_t>(trees.size()); }
  [[nodiscard]] index_t nodes() const { return static_cast<index_t>(target.size()) / vocab; }
};

struct tree_results {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> n;
  std::vector<index_t> nodes;
  std::vector<std::uint32_t> flags;
  bool operator==(const tree_results&) const = default;
};

tree_results empty_results(const tree_data& d) {
  return {std::vector<token_t>(static_cast<std::size_t>(d.nodes()), 55),
          std::vector<std::int32_t>(static_cast<std::size_t>(d.batch()), -7),
          std::vector<index_t>(static_cast<std::size_t>(d.nodes()), 99),
          std::vector<std::uint32_t>(static_cast<std::size_t>(d.batch()), 0)};
}

template <class Rule = exact_rule>
tree_results run_host(const tree_data& d, bool one_hot, sibling_sampling sampling,
                      bool greedy = false, const Rule& rule = {}) {
  auto r = empty_results(d);
  const tree_batch_input<float> in{
      d.vocab,
      {d.trees.data(), d.batch()},
      {d.target.data(), d.nodes(), d.vocab},
      one_hot ? batch_view<const float>{}
              : batch_view<const float>{d.draft.data(), d.nodes(), d.vocab},
      d.rng};
  const tree_batch_output out{r.tokens, r.n, r.nodes, r.flags};
  if (greedy) {
    verify_tree_greedy(host::seq, in, out);
  } else {
    tree_workspace ws;
    tree_options o;
    o.sampling = sampling;
    verify_tree_unchecked(host::seq, in, out, ws, o, rule);
  }
  return r;
}

/// Rows of `cols` entries laid out with a stride of cols + pad (pad entries NaN).
std::vector<float> with_stride(const std::vector<float>& rows, index_t cols, index_t pad) {
  if (pad == 0) return rows;
  const auto n = static_cast<index_t>(rows.size()) / cols;
  std::vector<float> out(static_cast<std::size_t>(n * (cols + pad)),
                         std::numeric_limits<float>::quiet_NaN());
  for (index_t r = 0; r < n; ++r)
    std::copy_n(rows.begin() + r * cols, cols, out.begin() + r * (cols + pad));
  return out;
}

/// Where a device run is enqueued (null: the legacy default stream) and the extra (NaN)
/// elements between rows.
struct device_setup {
  cudaStream_t stream = nullptr;
  index_t row_pad = 0;
};

/// Device run; `flat` may be edited by the caller (malformed trees).
template <class Rule = exact_rule>
tree_results run_device(const tree_data& d, const sc::flat_trees& flat, bool one_hot,
                        sibling_sampling sampling, bool greedy = false, const Rule& rule = {},
                        const device_setup& setup = {}) {
  auto r = empty_results(d);
  const index_t stride = d.vocab + setup.row_pad;
  device_vector<index_t> off(flat.node_offsets), par(flat.parents);
  device_vector<token_t> tok(flat.tokens);
  device_vector<float> tg(with_stride(d.target, d.vocab, setup.row_pad)),
      dr(with_stride(d.draft, d.vocab, setup.row_pad));
  device_vector<request_rng> rng(d.rng);
  device_vector<token_t> out(r.tokens);
  device_vector<std::int32_t> n(r.n);
  device_vector<index_t> nodes(r.nodes);
  device_vector<std::uint32_t> fl(r.flags);
  const sc::tree_device_input<float> in{
      d.vocab,
      off.cview(),
      par.cview(),
      tok.cview(),
      {tg.ptr, d.nodes(), d.vocab, stride},
      one_hot ? batch_view<const float>{}
              : batch_view<const float>{dr.ptr, d.nodes(), d.vocab, stride},
      rng.cview()};
  const tree_batch_output o{out.view(), n.view(), nodes.view(), fl.view()};
  const auto pol = sc::par_on(setup.stream);
  if (greedy) {
    sc::throw_on_error(sc::verify_tree_greedy_async(pol, in, o), "greedy");
  } else {
    tree_options opt;
    opt.sampling = sampling;
    sc::throw_on_error(sc::verify_tree_async(pol, in, o, opt, rule), "tree");
  }
  sc::throw_on_error(cudaStreamSynchronize(setup.stream), "tree kernel");
  return {out.to_host(), n.to_host(), nodes.to_host(), fl.to_host()};
}

std::vector<token_tree> shapes() {
  return {trees::full(2, 2), trees::chain(3), trees::sjd_pac(3, 2, 16), trees::full(3, 1),
          token_tree{}};
}

}  // namespace

TEST_CASE("device tree verification equals the host backend", "[cuda][tree][device]") {
  if (!have_gpu()) return;
  for (const auto sampling :
       {sibling_sampling::without_replacement, sibling_sampling::with_replacement}) {
    for (index_t vocab : {7, 300, 5000}) {
      for (std::uint64_t seed = 1; seed <= 4; ++seed) {
        const tree_data d(vocab, shapes(), seed, sampling);
        const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
        INFO("vocab " << vocab << " seed " << seed << " with replacement "
                      << (sampling == sibling_sampling::with_replacement));
        CHECK(run_device(d, flat, false, sampling) == run_host(d, false, sampling));
        CHECK(run_device(d, flat, true, sampling) == run_host(d, true, sampling));
      }
    }
  }
  // A 128 256-token vocabulary with the SJD-PAC shape.
  const tree_data big(128256, {trees::sjd_pac(3, 2, 64), trees::full(2, 2)}, 9,
                      sibling_sampling::without_replacement);
  const auto flat = sc::flatten_trees({big.trees.data(), big.batch()});
  CHECK(run_device(big, flat, false, sibling_sampling::without_replacement) ==
        run_host(big, false, sibling_sampling::without_replacement));
}

TEST_CASE("device tree verification on a non-default stream with strided rows equals the host",
          "[cuda][tree][device]") {
  if (!have_gpu()) return;
  cudaStream_t stream = nullptr;
  sc::throw_on_error(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // 151 936 (Qwen's vocabulary): 594 tiles, beyond the 512 the tree kernels used to record.
  for (index_t vocab : {300, 151936}) {
    const tree_data d(vocab, {trees::full(2, 2), trees::chain(3), trees::sjd_pac(3, 2, 16)}, 19,
                      sibling_sampling::without_replacement);
    const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
    const device_setup setup{stream, 29};
    INFO("vocab " << vocab);
    for (const auto sampling :
         {sibling_sampling::without_replacement, sibling_sampling::with_replacement}) {
      CHECK(run_device(d, flat, false, sampling, false, exact_rule{}, setup) ==
            run_host(d, false, sampling));
      CHECK(run_device(d, flat, true, sampling, false, exact_rule{}, setup) ==
            run_host(d, true, sampling));
    }
    CHECK(run_device(d, flat, true, sibling_sampling::without_replacement, true, exact_rule{},
                     setup) == run_host(d, true, sibling_sampling::without_replacement, true));
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("device tree verification with per-request rules equals the host",
          "[cuda][tree][relaxed][device]") {
  if (!have_gpu()) return;
  const tree_data d(500, shapes(), 27, sibling_sampling::without_replacement);
  const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
  std::vector<relaxed_rule> rules;
  for (index_t b = 0; b < d.batch(); ++b)
    rules.push_back(relaxed_rule{1.0 + 0.4 * static_cast<double>(b), resampling::optimal});
  const per_request<relaxed_rule> host_rules{{rules.data(), d.batch()}};
  const auto device_rules = sc::to_device(host_rules);
  CHECK(run_device(d, flat, false, sibling_sampling::without_replacement, false,
                   device_rules.rule()) ==
        run_host(d, false, sibling_sampling::without_replacement, false, host_rules));
}

TEST_CASE("device tree verification with a relaxed rule equals the host", "[cuda][tree][device]") {
  if (!have_gpu()) return;
  const relaxed_rule rule{1.8, resampling::optimal};
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const tree_data d(400, shapes(), seed, sibling_sampling::without_replacement);
    const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
    CHECK(run_device(d, flat, false, sibling_sampling::without_replacement, false, rule) ==
          run_host(d, false, sibling_sampling::without_replacement, false, rule));
  }
}

TEST_CASE("device greedy tree verification equals the host", "[cuda][tree][device]") {
  if (!have_gpu()) return;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    tree_data d(900, shapes(), seed, sibling_sampling::without_replacement);
    // Make one child per node the argmax of its parent's row so that paths get accepted.
    index_t base = 0;
    for (auto& t : d.trees) {
      std::vector<token_t> tokens(t.tokens().begin(), t.tokens().end());
      for (index_t u = 0; u < t.size(); ++u) {
        const auto kids = t.children(u);
        if (kids.empty() || (u + static_cast<index_t>(seed)) % 3 == 0) continue;
        const float* row = d.target.data() + (base + u) * d.vocab;
        const auto a = static_cast<token_t>(argmax_lowest(row_view<const float>(row, d.vocab)));
        if (std::find(tokens.begin(), tokens.end(), a) == tokens.end())
          tokens[static_cast<std::size_t>(kids.back())] = a;
      }
      t.set_tokens(tokens);
      base += t.size();
    }
    const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
    CHECK(run_device(d, flat, true, sibling_sampling::without_replacement, true) ==
          run_host(d, true, sibling_sampling::without_replacement, true));
  }
}

TEST_CASE("device tree verification: malformed trees and bad tokens are flagged per request",
          "[cuda][tree][bad_input][device]") {
  if (!have_gpu()) return;
  const tree_data d(50,
                    {trees::full(2, 2), trees::full(2, 2), trees::full(2, 2), trees::full(2, 2),
                     trees::full(2, 2), trees::full(2, 2)},
                    3, sibling_sampling::without_replacement);
  auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
  const index_t n = d.trees[0].size();
  flat.parents[static_cast<std::size_t>(0 * n + 3)] = 5;  // request 0: parent after the child
  flat.parents[static_cast<std::size_t>(1 * n + 0)] = 0;  // request 1: root with a parent
  flat.tokens[static_cast<std::size_t>(2 * n + 4)] = 50;  // request 2: token out of range
  flat.tokens[static_cast<std::size_t>(3 * n + 2)] =      // request 3: duplicate siblings
      flat.tokens[static_cast<std::size_t>(3 * n + 1)];
  flat.tokens[static_cast<std::size_t>(4 * n + 5)] = -1;  // request 4: -1 token
  const auto dev = run_device(d, flat, false, sibling_sampling::without_replacement);
  for (index_t b = 0; b < 5; ++b) {
    INFO("request " << b);
    CHECK(dev.flags[static_cast<std::size_t>(b)] == chain_invalid_input);
    CHECK(dev.n[static_cast<std::size_t>(b)] == 0);
    CHECK(dev.tokens[static_cast<std::size_t>(b * n)] == no_token);
  }
  // Request 5 is untouched and equals the host.
  const auto host = run_host(d, false, sibling_sampling::without_replacement);
  CHECK(dev.n[5] == host.n[5]);
  CHECK(dev.flags[5] == host.flags[5]);
  CHECK(std::vector<token_t>(dev.tokens.begin() + 5 * n, dev.tokens.end()) ==
        std::vector<token_t>(host.tokens.begin() + 5 * n, host.tokens.end()));
  // Duplicate siblings are fine when drawn with replacement (the same request 3 verifies).
  const auto wr = run_device(d, flat, false, sibling_sampling::with_replacement);
  CHECK((wr.flags[3] & chain_invalid_input) == 0);
}

TEST_CASE("device tree verification: oversized trees and bad launches",
          "[cuda][tree][bad_input][device]") {
  if (!have_gpu()) return;
  // A chain of tree_max_nodes + 1 nodes, and a node with tree_max_children + 1 children.
  std::vector<index_t> long_chain(static_cast<std::size_t>(sc::tree_max_nodes + 1));
  for (std::size_t i = 0; i < long_chain.size(); ++i) long_chain[i] = static_cast<index_t>(i) - 1;
  const tree_data d(40,
                    {token_tree(long_chain, {}, tree_limits{1 << 16, 1 << 12, 1 << 12}),
                     trees::full(sc::tree_max_children + 1, 1)},
                    4, sibling_sampling::with_replacement);
  const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
  const auto r = run_device(d, flat, false, sibling_sampling::with_replacement);
  CHECK(r.flags[0] == chain_invalid_input);
  CHECK(r.flags[1] == chain_invalid_input);
  // Node offsets that run past the arrays: the request is flagged, nothing is read or written
  // out of bounds.
  auto flat2 = flat;
  flat2.node_offsets = {0, d.trees[0].size(), d.trees[0].size() + 10000};
  const auto r2 = run_device(d, flat2, false, sibling_sampling::with_replacement);
  CHECK(r2.flags[1] == chain_invalid_input);
  // Launch checks (extents, strides, rules): tests/cuda/test_launch_checks.cu (host-side).
}

// ---------------------------------------------------------------------------------------------
// The candidate recursion's threshold form in the CTA passes

namespace {

/// The mass of candidate_residual (exact rule, fp32 rows) at steps k = 1..4 for each proposal
/// kind (without replacement, i.i.d., one-hot): out[4 * kind + k - 1]. Tiles without a
/// candidate are read ahead through vector_weights (cuda/tree.cuh), the others element by
/// element.
__global__ void threshold_mass_kernel(const float* p, const float* q, index_t n,
                                      const token_t* cand, const double* inv_z,
                                      const double* renorm, double* out) {
  __shared__ sc::block_passes_storage<sc::tree_block_threads, 1> storage;
  const sc::block_passes<sc::tree_block_threads> passes(storage);
  const row_view<const float> pr(p, n), qr(q, n);
  const exact_rule rule{};
  auto masses = [&](const auto& proposal, int kind) {
    using prop = std::remove_cvref_t<decltype(proposal)>;
    const detail::candidate_recursion<exact_rule, float, prop> rec{rule, pr,    proposal,
                                                                   cand, inv_z, renorm};
    for (index_t k = 1; k <= 4; ++k) {
      const double m = passes.mass(n, detail::candidate_residual<exact_rule, float, prop>{rec, k});
      if (threadIdx.x == 0) out[4 * kind + k - 1] = m;
    }
  };
  masses(without_replacement<float>{qr}, 0);
  masses(with_replacement<float>{qr}, 1);
  masses(one_hot_candidates{}, 2);
}

}  // namespace

TEST_CASE("device passes sum the candidate recursion's threshold form like the host",
          "[cuda][tree][device]") {
  if (!have_gpu()) return;
  const exact_rule rule{};
  const std::vector<double> inv_z = {1.7, 2.3, 0.9, 1.1};
  const std::vector<double> renorm = {1.0, 1.25, 1.5, 2.0};
  for (index_t n : {7, 255, 256, 1000, 5000, 131079})
    for (bool last_tile : {true, false}) {
      const auto q = to_float(testing::random_probability_row(n, 71, 1, 0.2));
      const auto p = to_float(testing::random_probability_row(n, 71, 0, 0.1));
      // Candidates in the first tile, the middle, the last (partial) tile or not, and a repeat.
      const std::vector<token_t> cand = {static_cast<token_t>(1 % n), static_cast<token_t>(n / 2),
                                         static_cast<token_t>(last_tile ? n - 1 : 2 % n),
                                         static_cast<token_t>(1 % n)};
      const row_view<const float> pr(p.data(), n), qr(q.data(), n);
      std::vector<double> want;
      auto host = [&](const auto& proposal) {
        using prop = std::remove_cvref_t<decltype(proposal)>;
        const detail::candidate_recursion<exact_rule, float, prop> rec{
            rule, pr, proposal, cand.data(), inv_z.data(), renorm.data()};
        for (index_t k = 1; k <= 4; ++k)
          want.push_back(
              positive_mass(n, detail::candidate_residual<exact_rule, float, prop>{rec, k}));
      };
      host(without_replacement<float>{qr});
      host(with_replacement<float>{qr});
      host(one_hot_candidates{});
      const device_vector<float> dp(p), dq(q);
      const device_vector<token_t> dc(cand);
      const device_vector<double> dz(inv_z), dr(renorm);
      device_vector<double> out(std::vector<double>(12, -1.0));
      threshold_mass_kernel<<<1, sc::tree_block_threads>>>(dp.ptr, dq.ptr, n, dc.ptr, dz.ptr,
                                                           dr.ptr, out.ptr);
      sc::throw_on_error(cudaDeviceSynchronize(), "threshold mass kernel");
      const auto got = out.to_host();
      for (std::size_t i = 0; i < want.size(); ++i) {
        INFO("n " << n << " last tile " << last_tile << " proposal " << i / 4 << " k " << i % 4 + 1
                  << ": " << got[i] << " against " << want[i]);
        CHECK(got[i] == want[i]);
      }
    }
}

// K candidates at one position

namespace {

struct cand_data {
  index_t vocab = 0;
  std::vector<index_t> offsets{0};
  std::vector<token_t> cand;
  std::vector<float> target, draft;
  std::vector<request_rng> rng;
  cand_data(index_t v, const std::vector<index_t>& ks, std::uint64_t seed,
            sibling_sampling sampling)
      : vocab(v) {
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < ks.size(); ++b) {
      const auto q = to_float(testing::random_probability_row(v, seed, id++, 0.2));
      const auto p = to_float(testing::random_probability_row(v, seed, id++, 0.1));
      const auto c = draw_children(q, ks[b], sampling, request_rng{seed, id++, 1});
      cand.insert(cand.end(), c.begin(), c.end());
      offsets.push_back(static_cast<index_t>(cand.size()));
      draft.insert(draft.end(), q.begin(), q.end());
      target.insert(target.end(), p.begin(), p.end());
      rng.push_back(request_rng{seed, static_cast<std::uint32_t>(b), 8});
    }
  }
  [[nodiscard]] index_t batch() const { return static_cast<index_t>(rng.size()); }
};

struct cand_results {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> accepted;
  std::vector<std::uint32_t> flags;
  bool operator==(const cand_results&) const = default;
};

cand_results cand_host(const cand_data& d, bool one_hot, sibling_sampling sampling,
                       std::uint32_t position) {
  cand_results r;
  for (index_t b = 0; b < d.batch(); ++b) {
    philox_source src{d.rng[static_cast<std::size_t>(b)]};
    const row_view<const float> p(d.target.data() + b * d.vocab, d.vocab);
    const row_view<const float> q(d.draft.data() + b * d.vocab, d.vocab);
    const index_t first = d.offsets[static_cast<std::size_t>(b)];
    const index_t k = d.offsets[static_cast<std::size_t>(b) + 1] - first;
    std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)) + 1);
    const token_t* c = d.cand.data() + first;
    candidates_result res;
    if (one_hot)
      res = verify_candidates(exact_rule{}, src, p, one_hot_candidates{}, c, k,
                              default_residual_floor, position, ws.data());
    else if (sampling == sibling_sampling::with_replacement)
      res = verify_candidates(exact_rule{}, src, p, with_replacement<float>{q}, c, k,
                              default_residual_floor, position, ws.data());
    else
      res = verify_candidates(exact_rule{}, src, p, without_replacement<float>{q}, c, k,
                              default_residual_floor, position, ws.data());
    r.tokens.push_back(res.token);
    r.accepted.push_back(static_cast<std::int32_t>(res.accepted));
    r.flags.push_back(res.flags);
  }
  return r;
}

cand_results cand_device(const cand_data& d, bool one_hot, sibling_sampling sampling,
                         std::uint32_t position) {
  const auto B = static_cast<std::size_t>(d.batch());
  device_vector<index_t> off(d.offsets);
  device_vector<token_t> cand(d.cand);
  device_vector<float> tg(d.target), dr(d.draft);
  device_vector<request_rng> rng(d.rng);
  device_vector<token_t> tok(std::vector<token_t>(B, 77));
  device_vector<std::int32_t> acc(std::vector<std::int32_t>(B, 77));
  device_vector<std::uint32_t> fl(std::vector<std::uint32_t>(B, 77));
  const sc::candidates_device_input<float> in{
      d.vocab,
      off.cview(),
      cand.cview(),
      {tg.ptr, d.batch(), d.vocab},
      one_hot ? batch_view<const float>{} : batch_view<const float>{dr.ptr, d.batch(), d.vocab},
      rng.cview(),
      position};
  tree_options o;
  o.sampling = sampling;
  sc::throw_on_error(
      sc::verify_candidates_async(sc::par_on(nullptr), in, {tok.view(), acc.view(), fl.view()}, o),
      "candidates");
  sc::throw_on_error(cudaDeviceSynchronize(), "candidates kernel");
  return {tok.to_host(), acc.to_host(), fl.to_host()};
}

}  // namespace

TEST_CASE("device K-candidate verification equals the host", "[cuda][tree][device]") {
  if (!have_gpu()) return;
  for (const auto sampling :
       {sibling_sampling::without_replacement, sibling_sampling::with_replacement}) {
    for (index_t vocab : {6, 1000, 128256}) {
      for (std::uint64_t seed = 1; seed <= (vocab > 10000 ? 1u : 5u); ++seed) {
        const cand_data d(vocab, {1, 2, 3, 4, 0, 4, 2}, seed, sampling);
        INFO("vocab " << vocab << " seed " << seed);
        CHECK(cand_device(d, false, sampling, 3) == cand_host(d, false, sampling, 3));
        CHECK(cand_device(d, true, sampling, 0) == cand_host(d, true, sampling, 0));
      }
    }
  }
}

TEST_CASE("device K-candidate verification: bad candidates are flagged",
          "[cuda][tree][bad_input][device]") {
  if (!have_gpu()) return;
  cand_data d(30, {2, 2, 2, 2}, 7, sibling_sampling::without_replacement);
  d.cand[0] = 30;         // request 0: out of range
  d.cand[3] = d.cand[2];  // request 1: repeated without replacement
  d.cand[5] = no_token;   // request 2: -1
  const auto r = cand_device(d, false, sibling_sampling::without_replacement, 0);
  for (std::size_t b = 0; b < 3; ++b) {
    CHECK(r.flags[b] == chain_invalid_input);
    CHECK(r.tokens[b] == no_token);
    CHECK(r.accepted[b] == -1);
  }
  CHECK((r.flags[3] & chain_valid) != 0);
}

// ---------------------------------------------------------------------------------------------
// Exact law of the device code path, by enumerating its random decisions.
//
// A scripted source answers each decision with the option the host's driver prescribes and
// records how many options there were and the exact probability of the one taken, with the
// host enumerator's rules (specula/testing/enumerate.hpp). The kernel below runs the device
// code path (validated shared-memory tree, CTA-wide passes, redundant scalar walk) under it; the
// driver explores every path depth-first, one launch per path.

namespace specula::cuda_test {

/// One request's tree under the scripted source (the tree kernel's path), rows of T.
template <class T>
__global__ void scripted_tree_kernel(sc::tree_device_input<T> in, script_run run,
                                     token_t* out_tokens, std::int32_t* num_accepted,
                                     double omega) {
  __shared__ sc::detail::tree_storage storage;
  __shared__ sc::detail::shared_tree tree;
  __shared__ sc::detail::tree_recursion_state state;
  const sc::detail::tree_passes passes = sc::detail::make_tree_passes(storage, in.vocab_size);
  const index_t size = in.node_offsets[1];
  if (!sc::detail::load_tree(tree, 0, size, in.vocab_size, in.parents, in.tokens, in.draft_probs,
                             true))
    return;
  scripted_source src = run.source();
  const auto r = verify_tree_request(
      relaxed_rule{omega, resampling::optimal}, src, tree.view(),
      [&](index_t u) { return in.target_probs.row(u); },
      [&](index_t u) { return without_replacement<T>{in.draft_probs.row(u)}; },
      default_residual_floor, out_tokens, nullptr, state.workspace(), passes);
  if (threadIdx.x == 0) {
    *num_accepted = r.num_accepted;
    *run.depth = src.depth;
  }
}

/// The exact-law test's tree: root with 2 children, each with 2 children (7 nodes).
inline const std::vector<index_t>& law_tree_parents() {
  static const std::vector<index_t> parents{-1, 0, 0, 1, 1, 2, 2};
  return parents;
}

/// One enumerated draft of the law test's tree: children of every node drawn from q without
/// replacement (all ordered draws), with its node rows in T (prefixes (), (a), (b), (a, a1),
/// (a, a2), (b, b1), (b, b2)) and its drafting probability (from the model's double rows).
template <class T>
struct tree_law_draft {
  std::vector<token_t> tokens;
  std::vector<T> p_rows, q_rows;
  double probability = 0.0;
};

template <class T, class Visit>
void for_each_tree_draft(const testing::toy_ar_model& target, const testing::toy_ar_model& draft,
                         Visit&& visit) {
  const index_t V = target.vocab_size();
  // Ordered pairs of distinct tokens drawn without replacement from q, with probabilities.
  auto pairs = [&](std::span<const double> q) {
    std::vector<std::pair<std::array<token_t, 2>, double>> out;
    for (index_t a = 0; a < V; ++a)
      for (index_t b = 0; b < V; ++b) {
        if (a == b) continue;
        const double pa = q[static_cast<std::size_t>(a)];
        const double pb = q[static_cast<std::size_t>(b)] / (1.0 - pa);
        if (pa > 0 && pb > 0)
          out.push_back({{static_cast<token_t>(a), static_cast<token_t>(b)}, pa * pb});
      }
    return out;
  };
  for (const auto& [root_kids, p_root] : pairs(draft.row({}))) {
    const std::vector<token_t> c1{root_kids[0]}, c2{root_kids[1]};
    for (const auto& [kids1, p1] : pairs(draft.row(c1)))
      for (const auto& [kids2, p2] : pairs(draft.row(c2))) {
        tree_law_draft<T> d;
        d.tokens = {no_token, root_kids[0], root_kids[1], kids1[0], kids1[1], kids2[0], kids2[1]};
        const auto& t = d.tokens;
        const std::vector<std::vector<token_t>> prefix{
            {}, {t[1]}, {t[2]}, {t[1], t[3]}, {t[1], t[4]}, {t[2], t[5]}, {t[2], t[6]}};
        for (const auto& pre : prefix) {
          const auto p = target.row(pre);
          const auto q = draft.row(pre);
          d.p_rows.insert(d.p_rows.end(), p.begin(), p.end());
          d.q_rows.insert(d.q_rows.end(), q.begin(), q.end());
        }
        d.probability = p_root * p1 * p2;
        visit(d);
      }
  }
}

/// Exact law of the first two tokens of one tree verification on the toy model: drafts
/// enumerated on the host, verification enumerated on the device (rows of law_row); a single
/// emitted token is extended by the target's exact conditional.
std::vector<double> device_two_token_law(const testing::toy_ar_model& target,
                                         const testing::toy_ar_model& draft, double omega) {
  const index_t V = target.vocab_size();
  std::vector<double> law(static_cast<std::size_t>(V * V), 0.0);
  device_vector<index_t> off(std::vector<index_t>{0, 7}), par(law_tree_parents());
  device_vector<token_t> tok(std::vector<token_t>(7, no_token));
  device_vector<law_row> tg(std::vector<law_row>(static_cast<std::size_t>(7 * V))),
      dr(std::vector<law_row>(static_cast<std::size_t>(7 * V)));
  script_buffers sb;
  device_vector<token_t> out(std::vector<token_t>(7, no_token));
  device_vector<std::int32_t> nacc(std::vector<std::int32_t>(1, 0));
  const sc::tree_device_input<law_row> in{
      V, off.cview(), par.cview(), tok.cview(), {tg.ptr, 7, V}, {dr.ptr, 7, V}, {}};
  for_each_tree_draft<law_row>(target, draft, [&](const tree_law_draft<law_row>& d) {
    tok.assign(d.tokens);
    tg.assign(d.p_rows);
    dr.assign(d.q_rows);
    enumerate_device(
        sb,
        [&](const script_run& run) {
          scripted_tree_kernel<law_row>
              <<<1, sc::tree_block_threads, sc::detail::tree_dynamic_smem(V)>>>(in, run, out.ptr,
                                                                                nacc.ptr, omega);
        },
        [&](double prob) {
          add_two_token_outcome(law, target, out.to_host(), nacc.to_host()[0],
                                d.probability * prob);
        });
  });
  return law;
}

/// The host replay of device_two_token_law with rows of T: the host's verify_tree_request on the
/// same tree, rows and scripted decisions, with its sequential passes (the device's order).
template <class T>
std::vector<double> host_two_token_law(const testing::toy_ar_model& target,
                                       const testing::toy_ar_model& draft, double omega) {
  const index_t V = target.vocab_size();
  std::vector<double> law(static_cast<std::size_t>(V * V), 0.0);
  std::vector<token_t> out(7, no_token);
  std::int32_t nacc = 0;
  std::vector<double> z(static_cast<std::size_t>(candidates_workspace_size(2)));
  std::vector<token_t> cand(2);
  std::vector<index_t> children(2);
  for_each_tree_draft<T>(target, draft, [&](const tree_law_draft<T>& d) {
    const token_tree tree(law_tree_parents(), d.tokens);
    enumerate_host(
        [&](scripted_source& src) {
          nacc = verify_tree_request(
                     relaxed_rule{omega, resampling::optimal}, src, tree.view(),
                     [&](index_t u) { return row_view<const T>(d.p_rows.data() + u * V, V); },
                     [&](index_t u) {
                       return without_replacement<T>{row_view<const T>(d.q_rows.data() + u * V, V)};
                     },
                     default_residual_floor, out.data(), nullptr,
                     tree_request_workspace{z.data(), cand.data(), children.data()})
                     .num_accepted;
        },
        [&](double prob) { add_two_token_outcome(law, target, out, nacc, d.probability * prob); });
  });
  return law;
}

}  // namespace specula::cuda_test

namespace {

/// The models of the exact-law tests (host replay and device).
const cuda_test::law_models& tree_law() {
  static const cuda_test::law_models m(3, 3, 404, 0.0, 0.7);
  return m;
}

}  // namespace

TEST_CASE("host replay of the device tree exact-law test: the rows it runs on give the law",
          "[cuda][tree][exact][host]") {
  // Runs on the host what the device test below runs on the GPU, so a mistake in the test
  // itself (such as rows of another precision than the drafting probabilities) shows without a
  // GPU.
  cuda_test::check_host_replay(cuda_test::two_token_law(tree_law().target), [](auto row,
                                                                               double omega) {
    return cuda_test::host_two_token_law<decltype(row)>(tree_law().target, tree_law().draft, omega);
  });
}

TEST_CASE("device tree verification: exact law of the first two tokens by enumeration",
          "[cuda][tree][exact][device]") {
  if (!have_gpu()) return;
  const auto expected = cuda_test::two_token_law(tree_law().target);
  const auto law = cuda_test::device_two_token_law(tree_law().target, tree_law().draft, 1.0);
  CHECK(cuda_test::max_abs_diff(law, expected) < 1e-12);
  // Negative control: ω = 2 accepts too often; its law differs from the target's.
  CHECK(cuda_test::max_abs_diff(
            cuda_test::device_two_token_law(tree_law().target, tree_law().draft, 2.0), expected) >
        1e-3);
}

TEST_CASE("device G-test: one tree round per request reproduces the toy model's law",
          "[cuda][tree][stats][device]") {
  if (!have_gpu()) return;
  // 100 000 requests, each a full binary tree of depth 2 drafted from the toy draft model
  // without replacement; the law of the first two tokens (a single emitted token extended by a
  // target sample) must be the target's; ω = 3 (planted bias) must fail.
  const testing::toy_ar_model target(5, 3, 77, 0.3);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.6, 78, 0.3);
  const index_t V = 5;
  const std::uint32_t runs = 100000;
  std::vector<token_tree> trees;
  std::vector<float> p_rows, q_rows;
  std::vector<request_rng> rng;
  for (std::uint32_t r = 0; r < runs; ++r) {
    token_tree t = trees::full(2, 2);
    std::vector<token_t> tokens(static_cast<std::size_t>(t.size()), no_token);
    std::vector<std::vector<token_t>> prefix(static_cast<std::size_t>(t.size()));
    for (index_t u = 0; u < t.size(); ++u) {
      const auto& pre = prefix[static_cast<std::size_t>(u)];
      const auto q = draft.row(pre);
      const auto p = target.row(pre);
      q_rows.insert(q_rows.end(), q.begin(), q.end());
      p_rows.insert(p_rows.end(), p.begin(), p.end());
      const auto kids = t.children(u);
      const auto drawn = draw_children(
          std::vector<float>(q.begin(), q.end()), static_cast<index_t>(kids.size()),
          sibling_sampling::without_replacement, request_rng{61, r, static_cast<std::uint32_t>(u)});
      for (std::size_t c = 0; c < kids.size(); ++c) {
        tokens[static_cast<std::size_t>(kids[c])] = drawn[c];
        auto child_prefix = pre;
        child_prefix.push_back(drawn[c]);
        prefix[static_cast<std::size_t>(kids[c])] = child_prefix;
      }
    }
    t.set_tokens(tokens);
    trees.push_back(t);
    rng.push_back(request_rng{62, r, 0});
  }
  tree_data d(V, {}, 1, sibling_sampling::without_replacement);
  d.trees = trees;
  d.target = p_rows;
  d.draft = q_rows;
  d.rng = rng;
  const auto flat = sc::flatten_trees({d.trees.data(), d.batch()});
  const auto law = cuda_test::two_token_law(target);
  auto counts_of = [&](const tree_results& res) {
    std::vector<std::uint64_t> counts(law.size(), 0);
    const index_t n = trees[0].size();
    for (std::uint32_t r = 0; r < runs; ++r) {
      const token_t* o = res.tokens.data() + r * n;
      token_t second = o[1];
      if (res.n[r] == 0) {
        const auto next = target.row(std::vector<token_t>{o[0]});
        auto w = [&](index_t y) { return next[static_cast<std::size_t>(y)]; };
        second = static_cast<token_t>(
            sample_inverse_cdf(V, w, 1.0, uniform_at(request_rng{63, r, 0}, draw_id{0, 0})));
      }
      ++counts[static_cast<std::size_t>(o[0] * V + second)];
    }
    return counts;
  };
  std::string summary;
  const double fit = cuda_test::g_test_p_value(
      counts_of(run_device(d, flat, false, sibling_sampling::without_replacement)), law, summary);
  INFO("G-test exact rule: " << summary);
  CHECK(fit > 1e-4);
  const double bad = cuda_test::g_test_p_value(
      counts_of(run_device(d, flat, false, sibling_sampling::without_replacement, false,
                           relaxed_rule{3.0, resampling::optimal})),
      law, summary);
  INFO("G-test relaxed (negative control): " << summary);
  CHECK(bad < 1e-4);
}

// ---------------------------------------------------------------------------------------------
// Sampling without replacement

TEST_CASE("device sampling without replacement equals the host, whatever the row split",
          "[cuda][sample][device]") {
  if (!have_gpu()) return;
  for (index_t vocab : {5, 1000, 128256}) {
    const index_t rows = 3;
    std::vector<float> w;
    std::vector<request_rng> rng;
    for (index_t r = 0; r < rows; ++r) {
      const auto row =
          to_float(testing::random_probability_row(vocab, 31, static_cast<std::uint32_t>(r), 0.3));
      w.insert(w.end(), row.begin(), row.end());
      rng.push_back(request_rng{32, static_cast<std::uint32_t>(r), 2});
    }
    for (index_t k : {1, 4, 16}) {
      std::vector<token_t> expect(static_cast<std::size_t>(rows * k), no_token);
      std::vector<std::int32_t> expect_n;
      for (index_t r = 0; r < rows; ++r) {
        auto wf = [&](index_t i) {
          return static_cast<double>(w[static_cast<std::size_t>(r * vocab + i)]);
        };
        std::vector<double> keys(static_cast<std::size_t>(k));
        expect_n.push_back(static_cast<std::int32_t>(
            sample_without_replacement_keys(vocab, wf, k, rng[static_cast<std::size_t>(r)], 6,
                                            expect.data() + r * k, keys.data())));
      }
      device_vector<float> dw(w);
      device_vector<request_rng> drng(rng);
      device_vector<std::byte> ws(
          std::vector<std::byte>(sc::sample_without_replacement_workspace_bytes(rows, k)));
      for (int split : {1, 2, 7, 0}) {
        device_vector<token_t> out(std::vector<token_t>(static_cast<std::size_t>(rows * k), 9));
        device_vector<std::int32_t> cnt(
            std::vector<std::int32_t>(static_cast<std::size_t>(rows), 9));
        const auto pol = sc::par_on(nullptr).with_workspace(ws.ptr, ws.n).with_row_split(split);
        sc::throw_on_error(
            sc::sample_without_replacement_async(pol, batch_view<const float>{dw.ptr, rows, vocab},
                                                 k, drng.cview(), 6, out.view(), cnt.view()),
            "sample_without_replacement");
        sc::throw_on_error(cudaDeviceSynchronize(), "sampling kernel");
        INFO("vocab " << vocab << " k " << k << " split " << split);
        CHECK(out.to_host() == expect);
        CHECK(cnt.to_host() == expect_n);
      }
    }
  }
  // Bad arguments are refused without a launch (k outside [1, sample_max_k] on a one-row batch;
  // an empty batch is a no-op whatever k is, as every entry point).
  const device_vector<float> one_row(std::vector<float>{0.5f, 0.5f});
  const batch_view<const float> one{one_row.ptr, 1, 2};
  CHECK(sc::sample_without_replacement_async(sc::par_on(nullptr), one, 0, {}, 0, {}, {}) ==
        cudaErrorInvalidValue);
  CHECK(sc::sample_without_replacement_async(sc::par_on(nullptr), one, sc::sample_max_k + 1, {}, 0,
                                             {}, {}) == cudaErrorInvalidValue);
  CHECK(sc::sample_without_replacement_async(sc::par_on(nullptr), batch_view<const float>{}, 0, {},
                                             0, {}, {}) == cudaSuccess);
}
