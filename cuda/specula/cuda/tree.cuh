#pragma once

/// @file
/// Token-tree and K-candidate verification on the GPU: the device counterparts of
/// specula/verify/tree.hpp, specula/verify/candidates.hpp and greedy tree verification
/// (specula/verify/greedy.hpp).
///
/// One CTA per request runs the host's own per-request verifier (verify_tree_request,
/// verify_candidates, greedy_tree_request) with block_passes: every thread executes the scalar
/// walk, and the full-row passes (the residual normalisers Z_k, the proposal's remaining mass,
/// the final sample's tile sums, the greedy argmax) are split across the CTA in the host's fixed
/// order. Same inputs and seeds give the host's tokens.
///
/// Trees arrive flat: per request, its nodes' parent indices (local, -1 for the root, node 0)
/// and tokens. The CTA validates its tree in shared memory before walking it — parents precede
/// children, at most tree_max_nodes nodes and tree_max_children children per node, tokens in
/// [0, V), a positive proposal probability for every drafted child and distinct siblings when
/// they were drawn without replacement — and builds the first-child / next-sibling links (siblings
/// in index order, as token_tree). A request that fails gets chain_invalid_input and no token;
/// nothing is read out of bounds. Walks are bounded: every step moves to a child, which has a
/// larger index.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/block_passes.cuh"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/launch_checks.cuh"
#include "specula/cuda/policy.cuh"
#include "specula/rules/exact.hpp"
#include "specula/rules/rule.hpp"
#include "specula/sample/random_source.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/chain_core.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

/// Threads per CTA of the tree and candidate kernels.
inline constexpr int tree_block_threads = 256;
/// Most nodes a device tree may have (the tree is kept in shared memory).
inline constexpr index_t tree_max_nodes = 512;
/// Most children of one node, and most candidates at one position.
inline constexpr index_t tree_max_children = 32;
/// Most tile sums the tree and candidate kernels record (in dynamic shared memory, 8 bytes each,
/// sized at launch for the vocabulary): rows up to 4096 · 256 = 1 048 576 tokens have every
/// tile sum recorded, so the final sample walks them and scans a single tile; longer rows have
/// the rest recomputed.
inline constexpr index_t tree_max_tiles = 4096;

namespace detail {

/// The threshold form of the candidate recursion over float rows (verify/candidates.hpp:
/// candidate_residual): tiles without a candidate are read ahead (block_passes.cuh), their
/// weights the residual's own off_candidate_value on the loaded values; the tiles holding one
/// of the k candidates are read element by element.
template <class Rule, class Proposal>
requires specula::detail::threshold_candidate_form<Rule, Proposal>
struct vector_weights<specula::detail::candidate_residual<Rule, float, Proposal>> {
  using weights = specula::detail::candidate_residual<Rule, float, Proposal>;
  static constexpr bool one_hot = requires { Proposal::zero_off_candidates; };
  static constexpr bool enabled = true;
  static constexpr int rows = one_hot ? 1 : 2;
  /// 8 loads per row at a time: with all 32 of both rows in flight tree_kernel and
  /// candidates_kernel spilled (128 registers, up to 92 / 128 bytes of spill stores / loads),
  /// with 16 candidates_kernel still did (12 / 32 bytes); with 8 none does (nvcc 13.0, sm_90).
  static constexpr int batch = 8;
  [[nodiscard]] __device__ static const float* p(const weights& w) noexcept { return w.rec.p.data; }
  [[nodiscard]] __device__ static const float* q(const weights& w) noexcept {
    if constexpr (one_hot)
      return nullptr;
    else
      return w.rec.proposal.q.data;
  }
  [[nodiscard]] __device__ static double weight(const weights& w, index_t, float p_y,
                                                float q_y) noexcept {
    return w.off_candidate_value(static_cast<double>(p_y), static_cast<double>(q_y));
  }
  [[nodiscard]] __device__ static bool plain(const weights& w, index_t begin,
                                             index_t end) noexcept {
    return w.no_candidate_in(begin, end);
  }
};

}  // namespace detail

/// A batch of flat trees on the device (all pointers device memory). Request b's nodes are
/// [node_offsets[b], node_offsets[b + 1]); their rows are those rows of target_probs (and of
/// draft_probs: q_u, the row u's children were drawn from; or no rows for deterministic
/// children).
template <class T>
struct tree_device_input {
  index_t vocab_size = 0;
  row_view<const index_t> node_offsets;  ///< B + 1, starting at 0
  row_view<const index_t> parents;       ///< total nodes: local parent index, -1 for node 0
  row_view<const token_t> tokens;        ///< total nodes: node tokens (node 0's is ignored)
  batch_view<const T> target_probs;      ///< total nodes x V (logits allowed for greedy)
  batch_view<const T> draft_probs;       ///< total nodes x V, or no rows
  row_view<const request_rng> rng;       ///< B (unused by greedy verification)
};

/// A batch of trees in the flat layout of tree_device_input, on the host (copy it to the device).
struct flat_trees {
  std::vector<index_t> node_offsets{0};
  std::vector<index_t> parents;
  std::vector<token_t> tokens;
};

/// Flattens validated token trees (parents and tokens, request after request).
inline flat_trees flatten_trees(row_view<const token_tree> trees) {
  flat_trees f;
  for (index_t b = 0; b < trees.size; ++b) {
    const token_tree& t = trees[b];
    for (index_t i = 0; i < t.size(); ++i) {
      f.parents.push_back(t.parent(i));
      f.tokens.push_back(t.token(i));
    }
    f.node_offsets.push_back(f.node_offsets.back() + t.size());
  }
  return f;
}

/// K candidates per request at one position, on the device. Request b's candidates are
/// candidates[candidate_offsets[b] .. candidate_offsets[b + 1]) (at most tree_max_children);
/// its rows are target_probs.row(b) and draft_probs.row(b) (q, the candidates were drawn from
/// it; no rows for deterministic candidates).
template <class T>
struct candidates_device_input {
  index_t vocab_size = 0;
  row_view<const index_t> candidate_offsets;  ///< B + 1, starting at 0
  row_view<const token_t> candidates;         ///< total candidates
  batch_view<const T> target_probs;           ///< B x V
  batch_view<const T> draft_probs;            ///< B x V, or no rows
  row_view<const request_rng> rng;            ///< B
  std::uint32_t position = 0;                 ///< draw position (draw_id{position, ...})
};

/// Per-request results of K-candidate verification (device pointers).
struct candidates_device_output {
  row_view<token_t> tokens;         ///< B: the accepted candidate or the residual sample
  row_view<std::int32_t> accepted;  ///< B: index of the accepted candidate, or -1
  row_view<std::uint32_t> flags;    ///< B (chain_valid, chain_residual_fallback,
                                    ///< chain_invalid_input), or empty
};

namespace detail {

using tree_passes = block_passes<tree_block_threads>;
/// Static shared memory of the tree kernels' passes; the tile sums are dynamic shared memory.
using tree_storage = block_passes_scratch<tree_block_threads>;

/// Tile sums the tree kernels record for rows of `vocab` tokens.
[[nodiscard]] constexpr index_t tree_recorded_tiles(index_t vocab) noexcept {
  const index_t tiles = (vocab + specula::detail::sum_tile - 1) / specula::detail::sum_tile;
  return tiles < tree_max_tiles ? tiles : tree_max_tiles;
}

/// Dynamic shared memory of a tree or candidate kernel launch for rows of `vocab` tokens.
[[nodiscard]] constexpr std::size_t tree_dynamic_smem(index_t vocab) noexcept {
  return static_cast<std::size_t>(tree_recorded_tiles(vocab)) * sizeof(double);
}

/// The passes of a tree kernel: `scratch` in static shared memory, the tile sums of rows of
/// `vocab` tokens in the launch's dynamic shared memory (tree_dynamic_smem(vocab) bytes).
__device__ inline tree_passes make_tree_passes(tree_storage& scratch, index_t vocab) {
  extern __shared__ double tree_tile_sums[];
  return tree_passes(scratch, tree_tile_sums, tree_recorded_tiles(vocab));
}

/// Allows a kernel more than the default 48 KiB of shared memory when its dynamic part needs it
/// (rows beyond 524 288 tokens; the static part is below 24 KiB).
template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel* kernel, std::size_t bytes) {
  if (bytes <= 16 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

/// The recursion state of verify_tree_request / verify_candidates (the candidate lists, the
/// normalisers 1/Z_k and the renormalisers), kept once per CTA in shared memory: one thread
/// writes them, a barrier publishes them, every thread reads them by broadcast
/// (block_passes.cuh). In per-thread arrays
/// it lived in local memory (dynamically indexed in every weight evaluation).
struct tree_recursion_state {
  double z[candidates_workspace_size(tree_max_children)];
  token_t candidates[tree_max_children];
  index_t children[tree_max_children];
  [[nodiscard]] __device__ tree_request_workspace workspace() { return {z, candidates, children}; }
};

/// A request's tree in shared memory.
struct shared_tree {
  index_t parent[tree_max_nodes];
  index_t depth[tree_max_nodes];
  index_t first_child[tree_max_nodes];
  index_t next_sibling[tree_max_nodes];
  token_t token[tree_max_nodes];
  index_t size;
  index_t max_depth;
  int max_children;

  [[nodiscard]] __device__ tree_view view() const {
    return {parent, depth, first_child, next_sibling, token, size, max_depth, max_children};
  }
};

/// Loads and validates request b's tree (every thread; ends with a barrier). `q` (when
/// q.rows > 0) is checked for positive probabilities of drafted children; `distinct` requires
/// distinct sibling tokens.
template <class T>
__device__ bool load_tree(shared_tree& t, index_t base, index_t size, index_t vocab,
                          row_view<const index_t> parents, row_view<const token_t> tokens,
                          batch_view<const T> q, bool distinct) {
  const int tid = static_cast<int>(threadIdx.x);
  // The verdict of each phase is a barrier reduction (__syncthreads_and), so every thread leaves
  // at the same barrier.
  if (!(size >= 1 && size <= tree_max_nodes && base >= 0 && base + size <= parents.size &&
        base + size <= tokens.size))
    return false;  // uniform: depends only on arguments every thread shares
  if (tid == 0) t.max_children = 0;
  bool ok = true;
  for (index_t i = tid; i < size; i += tree_block_threads) {
    const index_t p = parents[base + i];
    const token_t x = i == 0 ? no_token : tokens[base + i];
    bool good = i == 0 ? p == -1 : (p >= 0 && p < i && x >= 0 && static_cast<index_t>(x) < vocab);
    if (good && i > 0 && q.rows > 0) good = static_cast<double>(q.row(base + p)[x]) > 0.0;
    ok = ok && good;
    t.parent[i] = p;
    t.token[i] = x;
  }
  if (__syncthreads_and(ok ? 1 : 0) == 0) return false;
  // Links: siblings in index order. O(size) per node, split across the threads.
  for (index_t i = tid; i < size; i += tree_block_threads) {
    index_t first = -1;
    index_t next = -1;
    int children = 0;
    for (index_t j = i + 1; j < size; ++j) {
      if (t.parent[j] == i) {
        if (first < 0) first = j;
        ++children;
      }
      if (i > 0 && t.parent[j] == t.parent[i]) {
        if (next < 0) next = j;
        if (distinct && t.token[j] == t.token[i]) ok = false;
      }
    }
    if (children > tree_max_children) ok = false;
    atomicMax(&t.max_children, children);
    t.first_child[i] = first;
    t.next_sibling[i] = next;
  }
  if (__syncthreads_and(ok ? 1 : 0) == 0) return false;
  if (tid == 0) {
    t.size = size;
    index_t deepest = 0;
    t.depth[0] = 0;
    for (index_t i = 1; i < size; ++i) {
      t.depth[i] = t.depth[t.parent[i]] + 1;
      if (t.depth[i] > deepest) deepest = t.depth[i];
    }
    t.max_depth = deepest;
  }
  __syncthreads();
  return true;
}

/// Writes the outputs of a request whose tree failed validation (only when its node range is
/// sane, so nothing is written out of bounds).
__device__ inline void write_invalid_tree(index_t b, index_t base, index_t size,
                                          const tree_batch_output& out) {
  if (threadIdx.x != 0) return;
  if (size >= 1 && size <= tree_max_nodes && base >= 0 && base + size <= out.output_tokens.size) {
    for (index_t i = 0; i < size; ++i) {
      out.output_tokens[base + i] = no_token;
      if (base + size <= out.accepted_nodes.size) out.accepted_nodes[base + i] = -1;
    }
  } else if (base >= 0 && base < out.output_tokens.size) {
    // Offsets outside the arrays: still no stale token in the request's first slot.
    out.output_tokens[base] = no_token;
    if (base < out.accepted_nodes.size) out.accepted_nodes[base] = -1;
  }
  out.num_accepted[b] = 0;
  if (!out.flags.empty()) out.flags[b] = chain_invalid_input;
}

/// How the children of a tree kernel's nodes were proposed: one kernel per kind, so that each
/// holds one candidate recursion (three inlined in one kernel ran out of registers).
enum class tree_proposal : std::uint8_t { one_hot, with_replacement, without_replacement };

template <class Rule, class T, tree_proposal Proposal>
SPECULA_KERNEL void __launch_bounds__(tree_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    tree_kernel(Rule rule, tree_device_input<T> in, tree_batch_output out, double residual_floor) {
  __shared__ tree_storage storage;
  __shared__ shared_tree tree;
  __shared__ tree_recursion_state state;
  const tree_passes passes = make_tree_passes(storage, in.vocab_size);
  const auto b = static_cast<index_t>(blockIdx.x);
  const index_t base = in.node_offsets[b];
  const index_t size = in.node_offsets[b + 1] - base;
  constexpr bool wor = Proposal == tree_proposal::without_replacement;
  const bool room = base + size <= out.output_tokens.size && base + size <= in.target_probs.rows &&
                    (in.draft_probs.rows == 0 || base + size <= in.draft_probs.rows) &&
                    (out.accepted_nodes.empty() || base + size <= out.accepted_nodes.size);
  if (!room ||
      !load_tree(tree, base, size, in.vocab_size, in.parents, in.tokens, in.draft_probs, wor)) {
    write_invalid_tree(b, base, size, out);
    return;
  }
  const tree_request_workspace ws = state.workspace();
  philox_source src{in.rng[b]};
  auto target_row = [&](index_t u) { return in.target_probs.row(base + u); };
  index_t* nodes = out.accepted_nodes.empty() ? nullptr : out.accepted_nodes.data + base;
  const tree_view tv = tree.view();
  const auto& rule_b = specula::detail::request_rule(rule, b);
  auto run = [&](auto proposal_for) {
    return verify_tree_request(rule_b, src, tv, target_row, proposal_for, residual_floor,
                               out.output_tokens.data + base, nodes, ws, passes);
  };
  tree_request_result r;
  if constexpr (Proposal == tree_proposal::one_hot)
    r = run([](index_t) { return one_hot_candidates{}; });
  else if constexpr (Proposal == tree_proposal::with_replacement)
    r = run([&](index_t u) { return with_replacement<T>{in.draft_probs.row(base + u)}; });
  else
    r = run([&](index_t u) { return without_replacement<T>{in.draft_probs.row(base + u)}; });
  if (threadIdx.x == 0) {
    out.num_accepted[b] = r.num_accepted;
    if (!out.flags.empty()) out.flags[b] = r.flags;
  }
}

template <class T>
SPECULA_KERNEL void __launch_bounds__(tree_block_threads)
    greedy_tree_kernel(tree_device_input<T> in, tree_batch_output out) {
  __shared__ tree_storage storage;
  __shared__ shared_tree tree;
  const tree_passes passes(storage, nullptr, 0);  // argmax only: no tile sums
  const auto b = static_cast<index_t>(blockIdx.x);
  const index_t base = in.node_offsets[b];
  const index_t size = in.node_offsets[b + 1] - base;
  const bool room = base + size <= out.output_tokens.size && base + size <= in.target_probs.rows &&
                    (out.accepted_nodes.empty() || base + size <= out.accepted_nodes.size);
  if (!room || !load_tree(tree, base, size, in.vocab_size, in.parents, in.tokens,
                          batch_view<const T>{}, false)) {
    write_invalid_tree(b, base, size, out);
    return;
  }
  index_t* nodes = out.accepted_nodes.empty() ? nullptr : out.accepted_nodes.data + base;
  const auto r = greedy_tree_request(
      tree.view(), [&](index_t u) { return in.target_probs.row(base + u); },
      out.output_tokens.data + base, nodes, passes);
  if (threadIdx.x == 0) {
    out.num_accepted[b] = r.num_accepted;
    if (!out.flags.empty()) out.flags[b] = r.flags;
  }
}

template <class Rule, class T>
SPECULA_KERNEL void __launch_bounds__(tree_block_threads, SPECULA_CUDA_VERIFIER_MIN_CTAS)
    candidates_kernel(Rule rule, candidates_device_input<T> in, candidates_device_output out,
                      double residual_floor, sibling_sampling sampling) {
  __shared__ tree_storage storage;
  __shared__ double z[candidates_workspace_size(tree_max_children)];  // see tree_recursion_state
  const tree_passes passes = make_tree_passes(storage, in.vocab_size);
  const auto b = static_cast<index_t>(blockIdx.x);
  const index_t first = in.candidate_offsets[b];
  const index_t k = in.candidate_offsets[b + 1] - first;
  const token_t* cand = in.candidates.data + (first >= 0 ? first : 0);
  const bool dense = in.draft_probs.rows > 0;
  const bool wor = dense && sampling == sibling_sampling::without_replacement;
  // Validation (every thread; k is small).
  bool ok = k >= 0 && k <= tree_max_children && first >= 0 && first + k <= in.candidates.size &&
            b < in.target_probs.rows && (!dense || b < in.draft_probs.rows);
  for (index_t j = 0; ok && j < k; ++j) {
    const token_t x = cand[j];
    ok = x >= 0 && static_cast<index_t>(x) < in.vocab_size;
    if (ok && dense) ok = static_cast<double>(in.draft_probs.row(b)[x]) > 0.0;
    for (index_t i = 0; ok && wor && i < j; ++i) ok = cand[i] != x;
  }
  if (!ok) {
    if (threadIdx.x == 0) {
      out.tokens[b] = no_token;
      out.accepted[b] = -1;
      if (!out.flags.empty()) out.flags[b] = chain_invalid_input;
    }
    return;
  }
  philox_source src{in.rng[b]};
  const auto p = in.target_probs.row(b);
  const auto& rule_b = specula::detail::request_rule(rule, b);
  candidates_result r;
  if (!dense)
    r = verify_candidates(rule_b, src, p, one_hot_candidates{}, cand, k, residual_floor,
                          in.position, z, passes);
  else if (sampling == sibling_sampling::with_replacement)
    r = verify_candidates(rule_b, src, p, with_replacement<T>{in.draft_probs.row(b)}, cand, k,
                          residual_floor, in.position, z, passes);
  else
    r = verify_candidates(rule_b, src, p, without_replacement<T>{in.draft_probs.row(b)}, cand, k,
                          residual_floor, in.position, z, passes);
  if (threadIdx.x == 0) {
    out.tokens[b] = r.token;
    out.accepted[b] = static_cast<std::int32_t>(r.accepted);
    if (!out.flags.empty()) out.flags[b] = r.flags;
  }
}

}  // namespace detail

namespace detail {

/// Host checks of a tree launch (no device memory is read): node offsets, rows of vocab_size
/// entries (draft rows optional), random streams (`sampled`), outputs for the batch. The node
/// count is device data, so node rows and per-node outputs are bounded by the kernel.
template <class T>
launch_check check_tree_launch(const tree_device_input<T>& in, const tree_batch_output& out,
                               index_t batch, bool sampled) {
  launch_check c;
  c.grid(batch)
      .require(in.vocab_size > 0)
      .array(in.node_offsets, batch + 1)
      .rows(in.target_probs, in.vocab_size, 1)
      .array(out.num_accepted, batch)
      .optional_array(out.flags, batch)
      .require(out.output_tokens.empty() || out.output_tokens.data != nullptr)
      .require(out.accepted_nodes.empty() || out.accepted_nodes.data != nullptr)
      .require(in.parents.empty() || in.parents.data != nullptr)
      .require(in.tokens.empty() || in.tokens.data != nullptr);
  if (sampled) c.optional_rows(in.draft_probs, in.vocab_size, 1).array(in.rng, batch);
  return c;
}

}  // namespace detail

/// Enqueues token-tree verification of every request (one CTA each) on pol.stream. Outputs as
/// the host's verify_tree (tree_batch_output with device pointers, laid out like the node rows).
/// An empty batch is a no-op; returns cudaErrorInvalidValue without launching for an empty
/// vocabulary, missing or short arrays, rows of another length or with a stride below it, or a
/// rule whose data the device cannot read (detail::check_rule); malformed trees and bad tokens
/// are reported per request (chain_invalid_input).
template <class T, batch_tree_rule Rule = exact_rule>
cudaError_t verify_tree_async(const par_policy& pol, const tree_device_input<T>& in,
                              const tree_batch_output& out, const tree_options& options = {},
                              const Rule& rule = {}) {
  const index_t batch = in.node_offsets.size - 1;
  if (batch == 0 || in.node_offsets.size == 0) return cudaSuccess;  // B = 0 is a no-op
  if (const cudaError_t e = detail::check_tree_launch(in, out, batch, true).status();
      e != cudaSuccess)
    return e;
  if (const cudaError_t e = detail::check_rule(rule, in.vocab_size, batch); e != cudaSuccess)
    return e;
  const std::size_t smem = detail::tree_dynamic_smem(in.vocab_size);
  auto launch = [&](auto* kernel) {
    if (const cudaError_t e = detail::allow_dynamic_smem(kernel, smem); e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(batch), tree_block_threads, smem, pol.stream>>>(
        rule, in, out, options.residual_floor);
    return cudaGetLastError();
  };
  using detail::tree_proposal;
  if (in.draft_probs.rows == 0) return launch(detail::tree_kernel<Rule, T, tree_proposal::one_hot>);
  if (options.sampling == sibling_sampling::with_replacement)
    return launch(detail::tree_kernel<Rule, T, tree_proposal::with_replacement>);
  return launch(detail::tree_kernel<Rule, T, tree_proposal::without_replacement>);
}

/// Enqueues greedy tree verification (rows may be logits; draft_probs and rng are ignored).
template <class T>
cudaError_t verify_tree_greedy_async(const par_policy& pol, const tree_device_input<T>& in,
                                     const tree_batch_output& out) {
  const index_t batch = in.node_offsets.size - 1;
  if (batch == 0 || in.node_offsets.size == 0) return cudaSuccess;  // B = 0 is a no-op
  if (const cudaError_t e = detail::check_tree_launch(in, out, batch, false).status();
      e != cudaSuccess)
    return e;
  detail::greedy_tree_kernel<T>
      <<<static_cast<unsigned>(batch), tree_block_threads, 0, pol.stream>>>(in, out);
  return cudaGetLastError();
}

/// Enqueues verification of K candidates per request at one position (one CTA each).
/// `options.sampling` says how candidates with a q row were drawn. Launch checks as
/// verify_tree_async; the candidate offsets are device data, bounded by the kernel.
template <class T, batch_tree_rule Rule = exact_rule>
cudaError_t verify_candidates_async(const par_policy& pol, const candidates_device_input<T>& in,
                                    const candidates_device_output& out,
                                    const tree_options& options = {}, const Rule& rule = {}) {
  const index_t batch = in.candidate_offsets.size - 1;
  if (batch == 0 || in.candidate_offsets.size == 0) return cudaSuccess;  // B = 0 is a no-op
  detail::launch_check c;
  c.grid(batch)
      .require(in.vocab_size > 0)
      .array(in.candidate_offsets, batch + 1)
      .require(in.candidates.empty() || in.candidates.data != nullptr)
      .rows(in.target_probs, in.vocab_size, batch)
      .optional_rows(in.draft_probs, in.vocab_size, batch)
      .array(in.rng, batch)
      .array(out.tokens, batch)
      .array(out.accepted, batch)
      .optional_array(out.flags, batch);
  if (const cudaError_t e = c.status(); e != cudaSuccess) return e;
  if (const cudaError_t e = detail::check_rule(rule, in.vocab_size, batch); e != cudaSuccess)
    return e;
  const std::size_t smem = detail::tree_dynamic_smem(in.vocab_size);
  if (const cudaError_t e = detail::allow_dynamic_smem(detail::candidates_kernel<Rule, T>, smem);
      e != cudaSuccess)
    return e;
  detail::candidates_kernel<Rule, T>
      <<<static_cast<unsigned>(batch), tree_block_threads, smem, pol.stream>>>(
          rule, in, out, options.residual_floor, options.sampling);
  return cudaGetLastError();
}

SPECULA_CUDA_NAMESPACE_END
