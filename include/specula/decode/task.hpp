#pragma once

/// @file
/// How one decoding-loop body serves a single request and a batch of requests.
///
/// Every decoding loop is written once, as a coroutine (`detail::decode_task`) over one request.
/// Where it needs a forward pass it suspends with a `detail::pass_request` (`co_await
/// detail::target_pass(...)`, `draft_pass`, `sequences_pass`) naming the tree or sequences to
/// evaluate and the buffer that receives the logit rows; a driver performs the pass and resumes
/// it. Everything else — drafting, verification, committing to its own cache (through a
/// `detail::solo` or `detail::member` handle) — the coroutine does itself.
///
/// - `detail::run_solo` drives one task against a `model` / `masked_model` (and a draft model):
///   one pass per suspension, as a plain loop would.
/// - `detail::run_batch` drives several tasks against a `batched_model` (and a batched draft
///   model): each round it evaluates every task waiting for the draft model in one batched call,
///   then every task waiting for the target, then (masked models) every task waiting for whole
///   sequences — one call per distinct sequence length — then every task waiting for a
///   dual-cache pass (one `evaluate_cached` call), and resumes them. Tasks that finished
///   drop out; the others keep going.
///
/// A request's randomness comes from its own `request_rng`, and a batched pass computes each
/// request's rows as a single-request pass would, so a batched request's output equals the same
/// request decoded alone (tested for every loop).

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <exception>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/stats.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula::detail {

/// Which model a suspended task waits for.
enum class pass_kind {
  target,     ///< the target model over `tree`
  draft,      ///< the draft model over `tree`
  sequences,  ///< the (masked) target model over whole sequences `tokens` of `length`
  cached,     ///< the (masked) target model over node sequences through a dual cache
};

/// What a suspended task asks for. The driver resizes `*logits` to one row per node (per token
/// for sequences) and fills it; target and sequence passes are timed into `stats->
/// forward_seconds` and counted in `stats->target_forwards`, draft passes counted in
/// `stats->draft_forwards` (their time belongs to the task's drafting). A cached pass is a
/// `dual_cache_pass` whose cache, of the model's `dual_cache` type, lives in the task (`cache`
/// points to it; only a driver whose model is a `dual_cache_model` serves such a pass, and it
/// casts back to that type); it is timed and counted as a target pass.
struct pass_request {
  pass_kind kind = pass_kind::target;
  const token_tree* tree = nullptr;
  std::span<const token_t> tokens;
  index_t length = 0;
  std::vector<float>* logits = nullptr;
  decode_stats* stats = nullptr;
  void* cache = nullptr;
  index_t window_begin = 0;
  index_t window_end = 0;
  bool refresh = false;

  /// The pass as the model's `dual_cache_pass` (cached passes only).
  template <class Cache>
  [[nodiscard]] dual_cache_pass<Cache> as_cached() const {
    return {static_cast<Cache*>(cache), tokens, length, window_begin, window_end, refresh};
  }
};

/// A decoding loop over one request, suspended at each forward pass (see file comment).
class decode_task {
 public:
  struct promise_type {
    pass_request pending{};
    std::exception_ptr error;
    decode_task get_return_object() {
      return decode_task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { error = std::current_exception(); }
  };
  using handle_type = std::coroutine_handle<promise_type>;

  decode_task() = default;
  explicit decode_task(handle_type h) : h_(h) {}
  decode_task(decode_task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  decode_task& operator=(decode_task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  decode_task(const decode_task&) = delete;
  decode_task& operator=(const decode_task&) = delete;
  ~decode_task() {
    if (h_) h_.destroy();
  }

  [[nodiscard]] bool done() const noexcept { return !h_ || h_.done(); }
  /// Runs the task to its next pass (or its end); rethrows what the loop threw.
  void resume() {
    h_.resume();
    if (h_.promise().error) std::rethrow_exception(std::exchange(h_.promise().error, {}));
  }
  [[nodiscard]] const pass_request& pending() const noexcept { return h_.promise().pending; }

 private:
  handle_type h_{};
};

/// `co_await`ed by a loop: hands the request to the driver and resumes when the rows are in.
struct pass_awaiter {
  pass_request request;
  [[nodiscard]] bool await_ready() const noexcept { return false; }
  void await_suspend(decode_task::handle_type h) const noexcept { h.promise().pending = request; }
  void await_resume() const noexcept {}
};

inline pass_awaiter target_pass(const token_tree& tree, std::vector<float>& logits,
                                decode_stats& st) {
  return {{pass_kind::target, &tree, {}, 0, &logits, &st}};
}
inline pass_awaiter draft_pass(const token_tree& tree, std::vector<float>& logits,
                               decode_stats& st) {
  return {{pass_kind::draft, &tree, {}, 0, &logits, &st}};
}
inline pass_awaiter sequences_pass(std::span<const token_t> tokens, index_t length,
                                   std::vector<float>& logits, decode_stats& st) {
  return {{pass_kind::sequences, nullptr, tokens, length, &logits, &st}};
}
/// A dual-cache pass (see `dual_cache_pass`) over the node sequences `tokens` of `length`;
/// `cache` is the task's own `Model::dual_cache`.
template <class Cache>
pass_awaiter cached_pass(Cache& cache, std::span<const token_t> tokens, index_t length,
                         index_t window_begin, index_t window_end, bool refresh,
                         std::vector<float>& logits, decode_stats& st) {
  return {{pass_kind::cached, nullptr, tokens, length, &logits, &st, &cache, window_begin,
           window_end, refresh}};
}

/// A single request's model as the handle a loop uses for everything but evaluation.
template <class M>
struct solo {
  M* m;
  [[nodiscard]] index_t vocab_size() const { return m->vocab_size(); }
  void prefill(std::span<const token_t> prompt) const { m->prefill(prompt); }
  void commit(std::span<const index_t> path) const { m->commit(path); }
  [[nodiscard]] index_t context_size() const { return m->context_size(); }
  void rollback(index_t n) const { m->rollback(n); }
};

/// One request of a batched model as the same handle.
template <class M>
struct member {
  M* m;
  index_t request;
  [[nodiscard]] index_t vocab_size() const { return m->vocab_size(); }
  void prefill(std::span<const token_t> prompt) const { m->prefill(request, prompt); }
  void commit(std::span<const index_t> path) const { m->commit(request, path); }
  [[nodiscard]] index_t context_size() const { return m->context_size(request); }
  void rollback(index_t n) const { m->rollback(request, n); }
};

/// Stands in for the draft model of loops that have none.
struct no_draft {};

/// A loop asked for a pass its driver's model cannot serve (an internal error: the public
/// functions constrain their models so that this cannot happen).
[[noreturn]] inline void unservable_pass() {
  throw std::logic_error(
      "specula: a decoding loop asked for a forward pass its model cannot serve");
}

/// Serves one request's pass with an unbatched model.
template <class M>
void serve_solo(M& m, const pass_request& rq) {
  decode_stats& st = *rq.stats;
  const index_t V = m.vocab_size();
  if (rq.kind == pass_kind::sequences) {
    if constexpr (masked_model<M>) {
      const auto rows = static_cast<index_t>(rq.tokens.size());
      rq.logits->resize(static_cast<std::size_t>(rows * V));
      scoped_timer timer(st.forward_seconds);
      m.evaluate_sequences(rq.tokens, rq.length, batch_view<float>(rq.logits->data(), rows, V));
      ++st.target_forwards;
      return;
    }
    unservable_pass();
  }
  if (rq.kind == pass_kind::cached) {
    if constexpr (dual_cache_model<M>) {
      const auto pass = rq.as_cached<typename M::dual_cache>();
      const index_t rows = pass.rows();
      rq.logits->resize(static_cast<std::size_t>(rows * V));
      scoped_timer timer(st.forward_seconds);
      m.evaluate_cached(std::span(&pass, 1), batch_view<float>(rq.logits->data(), rows, V));
      ++st.target_forwards;
      return;
    }
    unservable_pass();
  }
  if constexpr (!model<M>) {
    unservable_pass();
  } else {
    rq.logits->resize(static_cast<std::size_t>(rq.tree->size() * V));
    const batch_view<float> rows(rq.logits->data(), rq.tree->size(), V);
    if (rq.kind == pass_kind::draft) {
      m.evaluate(*rq.tree, rows);
      ++st.draft_forwards;
      return;
    }
    scoped_timer timer(st.forward_seconds);
    m.evaluate(*rq.tree, rows);
    ++st.target_forwards;
  }
}

/// Runs one task to its end: target passes on `target`, draft passes on `*draft`.
template <class Target, class Draft = no_draft>
void run_solo(decode_task& task, Target& target, Draft* draft = nullptr) {
  for (task.resume(); !task.done(); task.resume()) {
    const pass_request& rq = task.pending();
    if (rq.kind == pass_kind::draft) {
      if constexpr (std::is_same_v<Draft, no_draft>)
        unservable_pass();
      else
        serve_solo(*draft, rq);
    } else {
      serve_solo(target, rq);
    }
  }
}

/// Serves, in one batched call, the tree passes of `waiting` (task indices) on `m`.
template <batched_model M>
void serve_trees(M& m, std::span<decode_task> tasks, std::span<const index_t> waiting,
                 bool is_target, std::vector<token_tree>& trees, std::vector<float>& rows) {
  const index_t V = m.vocab_size();
  trees.clear();
  index_t total = 0;
  for (const index_t r : waiting) {
    trees.push_back(*tasks[static_cast<std::size_t>(r)].pending().tree);
    total += trees.back().size();
  }
  rows.resize(static_cast<std::size_t>(total * V));
  const auto t0 = std::chrono::steady_clock::now();
  m.evaluate(waiting, std::span<const token_tree>(trees), batch_view<float>(rows.data(), total, V));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  index_t row = 0;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    const pass_request& rq = tasks[static_cast<std::size_t>(waiting[i])].pending();
    const auto n = static_cast<std::size_t>(trees[i].size() * V);
    rq.logits->assign(rows.begin() + row * V,
                      rows.begin() + row * V + static_cast<std::ptrdiff_t>(n));
    row += trees[i].size();
    if (is_target) {
      rq.stats->forward_seconds += seconds;
      ++rq.stats->target_forwards;
    } else {
      ++rq.stats->draft_forwards;
    }
  }
}

/// Serves the sequence passes of `waiting` on `m`: one call per distinct sequence length.
template <masked_model M>
void serve_sequences(const M& m, std::span<decode_task> tasks, std::span<const index_t> waiting,
                     std::vector<token_t>& tokens, std::vector<float>& rows) {
  const index_t V = m.vocab_size();
  std::vector<index_t> lengths;
  for (const index_t r : waiting)
    lengths.push_back(tasks[static_cast<std::size_t>(r)].pending().length);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  for (const index_t length : lengths) {
    tokens.clear();
    for (const index_t r : waiting) {
      const pass_request& rq = tasks[static_cast<std::size_t>(r)].pending();
      if (rq.length == length) tokens.insert(tokens.end(), rq.tokens.begin(), rq.tokens.end());
    }
    const auto total = static_cast<index_t>(tokens.size());
    rows.resize(static_cast<std::size_t>(total * V));
    const auto t0 = std::chrono::steady_clock::now();
    m.evaluate_sequences(tokens, length, batch_view<float>(rows.data(), total, V));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ptrdiff_t at = 0;
    for (const index_t r : waiting) {
      const pass_request& rq = tasks[static_cast<std::size_t>(r)].pending();
      if (rq.length != length) continue;
      const auto n = static_cast<std::ptrdiff_t>(rq.tokens.size()) * V;
      rq.logits->assign(rows.begin() + at, rows.begin() + at + n);
      at += n;
      rq.stats->forward_seconds += seconds;
      ++rq.stats->target_forwards;
    }
  }
}

/// Serves the cached passes of `waiting` on `m` in one `evaluate_cached` call.
template <dual_cache_model M>
void serve_cached(const M& m, std::span<decode_task> tasks, std::span<const index_t> waiting,
                  std::vector<float>& rows) {
  const index_t V = m.vocab_size();
  std::vector<dual_cache_pass<typename M::dual_cache>> passes;
  index_t total = 0;
  for (const index_t r : waiting) {
    passes.push_back(
        tasks[static_cast<std::size_t>(r)].pending().template as_cached<typename M::dual_cache>());
    total += passes.back().rows();
  }
  rows.resize(static_cast<std::size_t>(total * V));
  const auto t0 = std::chrono::steady_clock::now();
  m.evaluate_cached(std::span<const dual_cache_pass<typename M::dual_cache>>(passes),
                    batch_view<float>(rows.data(), total, V));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ptrdiff_t at = 0;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    const pass_request& rq = tasks[static_cast<std::size_t>(waiting[i])].pending();
    const auto n = static_cast<std::ptrdiff_t>(passes[i].rows()) * V;
    rq.logits->assign(rows.begin() + at, rows.begin() + at + n);
    at += n;
    rq.stats->forward_seconds += seconds;
    ++rq.stats->target_forwards;
  }
}

/// Runs every task to its end, batching their passes (see file comment). Task i is request i of
/// the batched models.
template <class Target, class Draft = no_draft>
void run_batch(std::span<decode_task> tasks, Target& target, Draft* draft = nullptr) {
  for (decode_task& t : tasks) t.resume();
  std::vector<index_t> waiting;
  std::vector<token_tree> trees;
  std::vector<token_t> tokens;
  std::vector<float> rows;
  constexpr pass_kind order[] = {pass_kind::draft, pass_kind::target, pass_kind::sequences,
                                 pass_kind::cached};
  for (bool any = true; any;) {
    any = false;
    for (const pass_kind kind : order) {
      waiting.clear();
      for (std::size_t r = 0; r < tasks.size(); ++r)
        if (!tasks[r].done() && tasks[r].pending().kind == kind)
          waiting.push_back(static_cast<index_t>(r));
      if (waiting.empty()) continue;
      any = true;
      if (kind == pass_kind::sequences) {
        if constexpr (masked_model<Target>)
          serve_sequences(target, tasks, waiting, tokens, rows);
        else
          unservable_pass();
      } else if (kind == pass_kind::cached) {
        if constexpr (dual_cache_model<Target>)
          serve_cached(target, tasks, waiting, rows);
        else
          unservable_pass();
      } else if (kind == pass_kind::target) {
        if constexpr (batched_model<Target>)
          serve_trees(target, tasks, waiting, true, trees, rows);
        else
          unservable_pass();
      } else {
        if constexpr (std::is_same_v<Draft, no_draft>)
          unservable_pass();
        else
          serve_trees(*draft, tasks, waiting, false, trees, rows);
      }
      for (const index_t r : waiting) tasks[static_cast<std::size_t>(r)].resume();
    }
  }
}

/// Checks a batch call's per-request arguments: `prompts` fit the model's batch, one rng per
/// prompt, and `stats` empty or one per prompt.
inline void check_batch_arguments(std::size_t prompts, index_t batch_size, std::size_t rngs,
                                  std::size_t stats) {
  if (prompts == 0) throw_if_failed({status::empty_input, -1, -1, 0.0}, "prompts");
  if (static_cast<index_t>(prompts) > batch_size)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(prompts)}, "prompts",
                    "more prompts than the model's batch_size()");
  if (rngs != prompts)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rngs)}, "rngs",
                    "one request_rng per prompt");
  if (stats != 0 && stats != prompts)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(stats)}, "stats",
                    "empty or one decode_stats per prompt");
}

/// Runs one request: `make(stats)` creates its task (stats: `*stats` or a local), driven by
/// run_solo on `target` (and `*draft`).
template <class Target, class Draft = no_draft, class MakeTask>
void decode_solo(Target& target, Draft* draft, decode_stats* stats, MakeTask&& make) {
  decode_stats local;
  decode_task task = make(stats != nullptr ? *stats : local);
  run_solo(task, target, draft);
}

/// Runs a batch: `make(r, stats_r)` creates request r's task, with stats_r = `stats[r]` or a
/// local; the arguments are checked first (check_batch_arguments, and every prompt non-empty).
template <class Target, class Draft = no_draft, class MakeTask>
void decode_batch(Target& target, Draft* draft, index_t batch_size,
                  std::span<const std::vector<token_t>> prompts, std::size_t rngs,
                  std::span<decode_stats> stats, MakeTask&& make) {
  check_batch_arguments(prompts.size(), batch_size, rngs, stats.size());
  for (std::size_t r = 0; r < prompts.size(); ++r)
    if (prompts[r].empty())
      throw_if_failed({status::empty_input, static_cast<index_t>(r), -1, 0.0}, "prompts");
  std::vector<decode_stats> local(stats.empty() ? prompts.size() : 0);
  std::vector<decode_task> tasks;
  tasks.reserve(prompts.size());
  for (std::size_t r = 0; r < prompts.size(); ++r)
    tasks.push_back(make(static_cast<index_t>(r), stats.empty() ? local[r] : stats[r]));
  run_batch(std::span<decode_task>(tasks), target, draft);
}

}  // namespace specula::detail
