#pragma once

/// @file
/// Jacobi decoding (Jacobi Forcing, §2.1): greedy fixed-point iteration over a window of guessed
/// future tokens, with the model's KV cache.
///
/// Each step evaluates the last committed token (the root) followed by the window's `n` guesses
/// as one chain. Row j's argmax `a_j` is the greedy next token after the root and guesses
/// 1..j; the longest prefix of guesses that equals these argmaxes is accepted (greedy
/// verification), then `a_k` after it — so every step emits at least one token and the output
/// is identical to greedy decoding. The argmaxes past the accepted prefix, `a_{k+1} .. a_n`,
/// are the next iteration's guesses (the Jacobi update); the window is refilled to `n` guesses
/// by repeating the last guess or with random tokens.
///
/// Block mode (`jacobi_options::block_mode`) is the iteration Jacobi Forcing collects its
/// training trajectories with (§2.2, Appendix C; the released trajectory generator): a block of
/// `window` positions — the root and `window − 1` guesses — is iterated until all of it has
/// converged; converged tokens stay in the block's state, the guesses are not refilled past the
/// block's end, and the token after a converged block starts the next one. The output is greedy
/// decoding in both modes. `jacobi_options::on_iteration` sees every iteration's state (the
/// trajectory points) and, in block mode, every converged block (its fixed point).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/decode/speculative.hpp"
#include "specula/decode/step.hpp"
#include "specula/decode/task.hpp"
#include "specula/verify/greedy.hpp"

namespace specula {

/// How empty window slots are filled.
enum class jacobi_init {
  repeat_last,     ///< copy the last known token (the root or the last guess)
  random,          ///< uniform random tokens from the request's stream
  sample_context,  ///< tokens drawn uniformly from the sequence so far (prompt and output), as
                   ///< the released Jacobi Forcing trajectory generator initialises a block
};

/// One iteration of jacobi_decode as `jacobi_options::on_iteration` sees it. The spans are valid
/// during the call only.
struct jacobi_iteration {
  std::uint32_t step = 0;  ///< iteration (forward pass) of the request, from 0
  index_t block = 0;       ///< block mode: the block, from 0; sliding mode: = step
  index_t position = 0;    ///< output position of state[0] (0: the first generated token; the
                           ///< root, the last prompt token, is position −1)
  /// The evaluated state: the root followed by the guesses (sliding mode); in block mode the
  /// block's tokens, converged prefix (root included) then guesses. For a converged block: its
  /// fixed point.
  std::span<const token_t> state;
  index_t converged = 0;     ///< leading tokens of `state` known to be final (>= 1: the root)
  bool fixed_point = false;  ///< block mode: the block has converged and `state` is its fixed point
};

/// Options of jacobi_decode.
struct jacobi_options {
  index_t window = 16;          ///< guesses per step (n), >= 1
  index_t max_new_tokens = 64;  ///< >= 1
  jacobi_init init = jacobi_init::repeat_last;
  token_t stop_token = no_token;  ///< generation ends after emitting it (-1: never)
  /// More tokens that end generation once emitted, as `stop_token` does (e.g. a model's
  /// several end-of-turn tokens); each in [0, vocab_size).
  std::vector<token_t> stop_tokens;
  /// Iterate fixed blocks of `window` positions (root included) to convergence instead of a
  /// sliding window (see file comment).
  bool block_mode = false;
  /// Called before every forward pass with the iteration's state and, in block mode, once for
  /// every converged block with its fixed point (a block cut short by max_new_tokens — fewer
  /// than `window` positions left — or by the stop token is not reported). Empty: no calls.
  std::function<void(const jacobi_iteration&)> on_iteration;
};

namespace detail {

/// Where a greedy loop's rows live (jacobi_task, multiblock_task's greedy variant; see
/// sjd_host_rows for the pattern): `greedy_host_rows` (the default) takes the logits of the
/// loop's target passes; a *resident* policy runs the pass itself (`target(tree)`) and keeps what
/// a greedy loop reads of a row, its argmax (the example transformer's resident_greedy_ops: row
/// summaries computed on the GPU).
/// - `verify(tree, vocab, out_tokens, out_nodes)`: greedy verification of the tree;
/// - `argmax(row, vocab)`: row's argmax (lowest id on ties).
struct greedy_host_rows {
  static constexpr bool resident = false;
  std::vector<float> logits;
  index_t verify(const token_tree& chain, index_t V, std::vector<token_t>& out_tokens,
                 std::vector<index_t>& out_nodes) const {
    return verify_one(greedy_tree_verifier<>{}, chain, V, logits, {}, request_rng{}, out_tokens,
                      out_nodes);
  }
  [[nodiscard]] token_t argmax(index_t row, index_t V) const {
    return static_cast<token_t>(argmax_lowest(row_view<const float>(logits.data() + row * V, V)));
  }
};

/// Jacobi decoding of one request (see file comment), as a task; `m` is its handle.
/// `resident_rows`: the rows policy when `Rows` is resident, else unused.
template <class Handle, class Rows = greedy_host_rows>
decode_task jacobi_task(Handle m, std::span<const token_t> prompt, jacobi_options options,
                        request_rng rng, decode_stats& st, std::vector<token_t>& result,
                        Rows* resident_rows = nullptr) {
  std::conditional_t<Rows::resident, int, Rows> local_rows{};
  Rows& rows = rows_policy(local_rows, resident_rows);
  if (prompt.empty()) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompt");
  require_parameter(options.window >= 1, "window", static_cast<double>(options.window),
                    "must be >= 1");
  require_parameter(options.max_new_tokens >= 1, "max_new_tokens",
                    static_cast<double>(options.max_new_tokens), "must be >= 1");
  const index_t V = m.vocab_size();
  const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };

  const auto prompt_len = static_cast<index_t>(prompt.size());
  std::vector<token_t>& seq =
      co_await start_request(prompt, options.stop_token, options.stop_tokens, V, result, st, m);
  std::vector<token_t> guesses, chain_tokens, out_tokens, state;
  std::vector<index_t> out_nodes;
  std::uint32_t draws = 0;
  const auto fill = [&](index_t want) {
    while (static_cast<index_t>(guesses.size()) < want) {
      const auto draw = [&](index_t n) {
        const double u = uniform_at(rng, draw_id{draws++, 1});
        return std::min<index_t>(n - 1, static_cast<index_t>(u * static_cast<double>(n)));
      };
      if (options.init == jacobi_init::random)
        guesses.push_back(static_cast<token_t>(draw(V)));
      else if (options.init == jacobi_init::sample_context)
        guesses.push_back(seq[sz(draw(static_cast<index_t>(seq.size())))]);
      else
        guesses.push_back(guesses.empty() ? seq.back() : guesses.back());
    }
  };
  const bool report = static_cast<bool>(options.on_iteration);
  // Block mode: the block starts at output position block_start − 1 (its root); `converged`
  // of its tokens, root included, are final.
  index_t block = 0, block_start = 0, converged = 1;

  for (std::uint32_t step = 0;; ++step) {
    const index_t generated = static_cast<index_t>(seq.size()) - prompt_len;
    const index_t remaining = options.max_new_tokens - generated;
    if (remaining <= 0) break;
    const index_t room = options.block_mode ? options.window - converged : options.window;
    const index_t n = std::min(room, remaining - 1);
    if (static_cast<index_t>(guesses.size()) > n) guesses.resize(sz(n));
    fill(n);

    chain_tokens.assign(1, seq.back());
    chain_tokens.insert(chain_tokens.end(), guesses.begin(), guesses.end());
    if (report) {
      jacobi_iteration it;
      it.step = step;
      it.block = options.block_mode ? block : static_cast<index_t>(step);
      if (options.block_mode) {
        state.assign(seq.end() - converged, seq.end());
        state.insert(state.end(), guesses.begin(), guesses.end());
        it.position = block_start - 1;
        it.converged = converged;
      } else {
        state = chain_tokens;
        it.position = generated - 1;
        it.converged = 1;
      }
      it.state = state;
      options.on_iteration(it);
    }
    const token_tree chain = trees::chain(chain_tokens);
    const index_t nodes = chain.size();
    co_await rows_pass(
        rows, st, [&](auto& r) { r.target(chain); },
        [&](auto& r) { return target_pass(chain, r.logits, st); });
    index_t k = 0;
    {
      scoped_timer timer(st.verify_seconds);
      k = rows.verify(chain, V, out_tokens, out_nodes);
      // The Jacobi update: argmaxes after the accepted prefix become the next guesses.
      guesses.clear();
      for (index_t j = k + 1; j < nodes; ++j) guesses.push_back(rows.argmax(j, V));
    }
    m.commit(std::span<const index_t>(out_nodes.data(), sz(k + 1)));
    const bool stopped =
        emit_step(out_tokens, k, stop_set{options.stop_token, options.stop_tokens}, seq, st);
    if (options.block_mode) {
      // Every guess of the block accepted: it has converged and the bonus token starts the next
      // block. Or the block's last position is the last token to generate: it has converged and
      // there is no next block.
      const bool all_accepted = k == n && n == room;
      const bool ends_output = !all_accepted && !stopped && converged + k + 1 == options.window &&
                               remaining - (k + 1) == 0;
      if (report && (all_accepted || ends_output)) {
        const auto last = all_accepted ? seq.end() - 1 : seq.end();
        state.assign(last - options.window, last);
        options.on_iteration(
            jacobi_iteration{step, block, block_start - 1, state, options.window, true});
      }
      if (all_accepted) {
        ++block;
        block_start += options.window;
        converged = 1;
        guesses.clear();
      } else {
        converged += k + 1;
      }
    }
    if (stopped) break;
  }
  trim_cache(m, static_cast<index_t>(seq.size()) - 1);
  result.assign(seq.begin() + prompt_len, seq.end());
}

}  // namespace detail

/// Greedy Jacobi decoding of up to `options.max_new_tokens` tokens after `prompt` (see file
/// comment); `rng` seeds random window initialisation. The model is restarted with
/// `prefill(prompt)`. Adds to `*stats` when given. `control` adds cancellation between passes
/// (decode/control.hpp).
template <session_model Model>
std::vector<token_t> jacobi_decode(Model& m, std::span<const token_t> prompt,
                                   const jacobi_options& options, request_rng rng = {},
                                   decode_stats* stats = nullptr,
                                   const request_control& control = {}) {
  std::vector<token_t> out;
  detail::decode_solo(
      m, static_cast<detail::no_draft*>(nullptr), stats,
      [&](decode_stats& st) {
        return detail::jacobi_task(detail::solo<Model>{&m}, prompt, options, rng, st, out);
      },
      control);
  return out;
}

/// jacobi_decode for several requests at once: request r decodes `prompts[r]` with `rngs[r]` as
/// request r of `m`, all requests' steps sharing forward passes (decode/task.hpp); adds to
/// `stats[r]` when `stats` is given. Each output equals jacobi_decode of that request alone.
/// `control` adds isolation, cancellation and per-request limits (decode/control.hpp).
template <batched_session_model Model>
std::vector<std::vector<token_t>> jacobi_decode_batch(Model& m,
                                                      std::span<const std::vector<token_t>> prompts,
                                                      const jacobi_options& options,
                                                      std::span<const request_rng> rngs,
                                                      std::span<decode_stats> stats = {},
                                                      const batch_control& control = {}) {
  std::vector<std::vector<token_t>> out(prompts.size());
  detail::decode_batch(
      m, static_cast<detail::no_draft*>(nullptr), m.batch_size(), prompts, rngs.size(), stats,
      [&](index_t r, decode_stats& st) {
        const auto i = static_cast<std::size_t>(r);
        return detail::jacobi_task(detail::member<Model>{&m, r}, prompts[i],
                                   detail::request_options(options, control, r), rngs[i], st,
                                   out[i]);
      },
      control, m.vocab_size());
  return out;
}

}  // namespace specula
