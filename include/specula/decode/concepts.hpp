#pragma once

/// @file
/// The concepts decoding loops are written against: Model, Proposal and Verifier.
///
/// - A **model** evaluates a batch of new token nodes against its committed context and keeps
///   or drops them: `evaluate(nodes, logits)` writes one logit row per node of a token tree
///   (node 0 is the last committed token; a chain, a tree and a Jacobi window are all trees),
///   `commit(path)` keeps the nodes of an accepted root-to-node path in its cache and rolls back
///   the rest. `batched_model` is the same for several requests in one call; `masked_model` is
///   a bidirectional model evaluating whole sequences with mask tokens (masked diffusion).
/// - A **proposal** drafts the next step: `propose(context, tree, q_rows)` fills a token tree
///   below the last committed token and, for stochastic drafts, one proposal row per node (the
///   row each node's children were drawn from); it returns whether q_rows were written (false
///   for deterministic drafts such as greedy or n-gram ones).
/// - A **verifier** decides what to keep: called with the tree batch (target rows, optional q
///   rows, random streams) and the outputs, it fills the accepted path and emitted tokens.
///   `tree_verifier<Policy, Rule>` (stochastic, any rule) and `greedy_tree_verifier<Policy>`
///   model it.
///
/// The decoding-loop templates constrain their parameters with these concepts, so a type that
/// does not fit is reported at the call with the requirement it misses.

#include <concepts>
#include <span>
#include <vector>

#include "specula/backend/host.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/rules/exact.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

namespace specula {

/// A model (see file comment).
template <class M>
concept model = requires(M& m, const token_tree& nodes, batch_view<float> logits,
                         std::span<const index_t> path) {
  { m.vocab_size() } -> std::convertible_to<index_t>;
  m.evaluate(nodes, logits);
  m.commit(path);
};

/// A model that can also start a request and truncate its committed context (what the decoding
/// loops need: a draft model's rejected drafts are rolled back after each step).
/// - `prefill(prompt)`: commit all of the prompt but its last token (the first tree's root);
/// - `context_size()`: committed tokens;
/// - `rollback(n)`: keep the first n committed tokens.
template <class M>
concept session_model = model<M> && requires(M& m, std::span<const token_t> prompt, index_t n) {
  m.prefill(prompt);
  { m.context_size() } -> std::convertible_to<index_t>;
  m.rollback(n);
};

/// Several requests of one model evaluated in one call: `evaluate(requests, trees, logits)`
/// evaluates one tree for each listed request (distinct indices in [0, batch_size()), any
/// subset, in the listed order; same conventions as `model`) and writes their node rows
/// concatenated in that order; `commit(request, path)` commits one request's accepted path.
template <class M>
concept batched_model = requires(M& m, std::span<const index_t> requests,
                                 std::span<const token_tree> trees, batch_view<float> logits,
                                 index_t request, std::span<const index_t> path) {
  { m.vocab_size() } -> std::convertible_to<index_t>;
  { m.batch_size() } -> std::convertible_to<index_t>;
  m.evaluate(requests, trees, logits);
  m.commit(request, path);
};

/// A batched model whose requests can be started and truncated one by one (`session_model`'s
/// operations with the request index first). The batched decoding loops take one.
template <class M>
concept batched_session_model = batched_model<M> &&
    requires(M& m, index_t request, std::span<const token_t> prompt, index_t n) {
  m.prefill(request, prompt);
  { m.context_size(request) } -> std::convertible_to<index_t>;
  m.rollback(request, n);
};

/// A masked (diffusion) model: `evaluate_sequences(tokens, length, logits)` evaluates
/// `tokens.size() / length` whole sequences bidirectionally, one logit row per position;
/// positions holding `mask_token()` are the ones to predict.
template <class M>
concept masked_model = requires(const M& m, std::span<const token_t> tokens, index_t length,
                                batch_view<float> logits) {
  { m.vocab_size() } -> std::convertible_to<index_t>;
  { m.mask_token() } -> std::convertible_to<token_t>;
  m.evaluate_sequences(tokens, length, logits);
};

/// One request's part of a dual-cache pass (`dual_cache_model::evaluate_cached`): `tokens` holds
/// `tokens.size() / length` node sequences of `length` tokens that differ only inside the window
/// [window_begin, window_end) (the active block).
/// - `refresh`: node 0 is evaluated over its whole sequence, exactly as `evaluate_sequences`
///   would (`length` logit rows), and `*cache` then holds its state at every position outside the
///   window (a transformer: each layer's keys and values there); the other nodes are evaluated
///   as below against that fresh state, in the same call.
/// - otherwise every node is evaluated over the window only (window_end - window_begin rows): its
///   window tokens attend to each other and to the cached state outside the window, which must
///   come from a refresh with the same length and window and the same tokens outside it.
template <class Cache>
struct dual_cache_pass {
  Cache* cache = nullptr;
  std::span<const token_t> tokens;
  index_t length = 0;
  index_t window_begin = 0;
  index_t window_end = 0;
  bool refresh = false;

  [[nodiscard]] index_t nodes() const noexcept {
    return length > 0 ? static_cast<index_t>(tokens.size()) / length : 0;
  }
  /// Logit rows the pass writes: `length` for a refreshed node 0, the window for every other node.
  [[nodiscard]] index_t rows() const noexcept {
    const index_t n = nodes();
    const index_t w = window_end - window_begin;
    return n == 0 ? 0 : refresh ? length + (n - 1) * w : n * w;
  }
};

/// A masked model that opts into the dual (prefix and suffix) cache of Fast-dLLM: a per-request
/// `dual_cache` type and `evaluate_cached(passes, logits)`, which evaluates several requests'
/// `dual_cache_pass`es in one call and writes their rows concatenated in order (each pass's rows
/// in node order). The diffusion loops use it when `ssd_options::cache` is `ssd_cache::dual`;
/// a masked model without it runs them uncached only.
template <class M>
concept dual_cache_model = masked_model<M> && std::default_initializable<typename M::dual_cache> &&
    requires(const M& m, std::span<const dual_cache_pass<typename M::dual_cache>> passes,
             batch_view<float> logits) {
  m.evaluate_cached(passes, logits);
};

/// A proposal (see file comment).
template <class P>
concept proposal = requires(P& p, std::span<const token_t> context, token_tree& tree,
                            std::vector<float>& q_rows) {
  { p.propose(context, tree, q_rows) } -> std::convertible_to<bool>;
};

/// A verifier (see file comment).
template <class V>
concept verifier = requires(const V& v, const tree_batch_input<float>& in,
                            const tree_batch_output& out) {
  v(in, out);
};

/// Stochastic tree verification (verify_tree) as a verifier object.
template <host::policy Policy = host::sequential_policy, class Rule = exact_rule>
struct tree_verifier {
  Policy policy{};
  Rule rule{};
  tree_options options{};
  void operator()(const tree_batch_input<float>& in, const tree_batch_output& out) const {
    verify_tree(policy, in, out, options, rule);
  }
  /// With the caller's workspace (the decoding loops keep one per request): no allocation
  /// once it has grown to the largest tree.
  void operator()(const tree_batch_input<float>& in, const tree_batch_output& out,
                  tree_workspace& ws) const {
    verify_tree(policy, in, out, ws, options, rule);
  }
};

/// Greedy tree verification (verify_tree_greedy) as a verifier object.
template <host::policy Policy = host::sequential_policy>
struct greedy_tree_verifier {
  Policy policy{};
  void operator()(const tree_batch_input<float>& in, const tree_batch_output& out) const {
    verify_tree_greedy(policy, in, out);
  }
};

static_assert(verifier<tree_verifier<>>);
static_assert(verifier<greedy_tree_verifier<>>);

}  // namespace specula
