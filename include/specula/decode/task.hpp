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
///   dual-cache pass (one `evaluate_cached` call, a task's pass can hold several
///   `dual_cache_pass`es), and resumes them. Tasks that finished
///   drop out; the others keep going.
///
/// A request's randomness comes from its own `request_rng`, and a batched pass computes each
/// request's rows as a single-request pass would, so a batched request's output equals the same
/// request decoded alone (tested for every loop).
///
/// Faults (docs/decoding.md): each task publishes its committed sequence (`co_await
/// detail::publish(...)`); the handles check every model call (`commit`, `rollback`, `prefill`
/// move `context_size()` where they must) and the drivers every pass's rows (finite or -inf,
/// not all -inf; `vocab_size()` unchanged). On a fault the driver brings the request's caches
/// back to its committed tokens (`restore_caches`) and throws `decode_error`, or, with
/// `batch_control::isolate`, drops that request only.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <coroutine>
#include <exception>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/control.hpp"
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

/// One `dual_cache_pass` of a cached pass: node sequences `tokens` of the request's `length`
/// through `*cache`, a cache of the model's `dual_cache` type that lives in the task (only a
/// driver whose model is a `dual_cache_model` serves such a pass, and it casts back to that type).
struct cached_group {
  void* cache = nullptr;
  std::span<const token_t> tokens;
  index_t window_begin = 0;
  index_t window_end = 0;
  bool refresh = false;
};

/// What a suspended task asks for. The driver resizes `*logits` to one row per node (per token
/// for sequences) and fills it; target and sequence passes are timed into `stats->
/// forward_seconds` and counted in `stats->target_forwards`, draft passes counted in
/// `stats->draft_forwards` (their time belongs to the task's drafting). A cached pass is one or
/// more `dual_cache_pass`es of the request (`groups`, each through its own cache), evaluated in
/// one call; it is timed and counted as one target pass.
struct pass_request {
  pass_kind kind = pass_kind::target;
  const token_tree* tree = nullptr;
  std::span<const token_t> tokens;
  index_t length = 0;
  std::vector<float>* logits = nullptr;
  decode_stats* stats = nullptr;
  std::span<const cached_group> groups;  ///< cached passes only

  /// Appends the pass's groups to `out` as the model's `dual_cache_pass`es (cached passes only)
  /// and returns the logit rows they write.
  template <class Cache>
  index_t append_cached(std::vector<dual_cache_pass<Cache>>& out) const {
    index_t rows = 0;
    for (const cached_group& g : groups) {
      out.push_back({static_cast<Cache*>(g.cache), g.tokens, length, g.window_begin, g.window_end,
                     g.refresh});
      rows += out.back().rows();
    }
    return rows;
  }
};

/// What a task publishes once its arguments are checked (see `publish`): its sequence (prompt,
/// then the committed output; SSD: the prompt and the partly unmasked positions), where its
/// result goes, and whether its models were prefilled. It lives in the task's promise, so it
/// outlives the loop's locals, which an exception unwinds.
struct task_state {
  std::vector<token_t> seq;
  index_t prompt_len = 0;
  std::vector<token_t>* result = nullptr;
  decode_stats* stats = nullptr;
  index_t steps_at_start = 0;
  bool published = false;
  bool prefilled = false;  ///< set by the loop once every model of the request is prefilled
  bool has_cache = true;   ///< false for masked (stateless) models

  [[nodiscard]] std::vector<token_t> committed() const {
    if (!published) return {};
    return {seq.begin() + prompt_len, seq.end()};
  }
  [[nodiscard]] index_t step() const noexcept {
    return stats == nullptr ? -1 : stats->steps - steps_at_start;
  }
};

/// A decoding loop over one request, suspended at each forward pass (see file comment).
class decode_task {
 public:
  struct promise_type {
    pass_request pending{};
    task_state state{};
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
  /// The published state (empty before `publish`, and for a task destroyed by `drop`).
  [[nodiscard]] const task_state& state() const noexcept {
    static const task_state none{};
    return h_ ? h_.promise().state : none;
  }
  /// Ends the task where it stands (its frame is destroyed), writing its committed output to
  /// its result.
  void drop() {
    if (!h_) return;
    const task_state& s = h_.promise().state;
    if (s.published && s.result != nullptr) *s.result = s.committed();
    h_.destroy();
    h_ = {};
  }

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

/// `co_await`ed by a loop whose rows policy may run a pass itself (a *resident* policy: the
/// rows stay where its model computes them): ready at once when it did (`ran`), else `pass`
/// goes to the driver as a pass_awaiter's request.
struct optional_pass_awaiter {
  bool ran = false;
  pass_awaiter pass{};
  [[nodiscard]] bool await_ready() const noexcept { return ran; }
  void await_suspend(decode_task::handle_type h) const noexcept { pass.await_suspend(h); }
  void await_resume() const noexcept {}
};

/// A task's rows policy (sjd.hpp, ssd.hpp): `*resident` when `Rows` is resident (required),
/// else `local` (the task's own host policy).
template <class Rows>
Rows& rows_policy(std::conditional_t<Rows::resident, int, Rows>& local, Rows* resident) {
  if constexpr (Rows::resident) {
    require_parameter(resident != nullptr, "rows", 0.0, "a resident rows policy is needed");
    return *resident;
  } else {
    (void)resident;
    return local;
  }
}

/// The forward pass of a loop with a rows policy `rows` (sjd.hpp, ssd.hpp): a resident policy
/// runs it now (`run(rows)`, counted and timed as the driver counts a target pass), else the
/// driver serves `make_pass(rows)` (a pass_awaiter). Both are generic lambdas, instantiated
/// for the policy that uses them only.
template <class Rows, class Run, class MakePass>
optional_pass_awaiter rows_pass(Rows& rows, decode_stats& st, Run&& run, MakePass&& make_pass) {
  if constexpr (Rows::resident) {
    scoped_timer timer(st.forward_seconds);
    run(rows);
    ++st.target_forwards;
    return {true, {}};
  } else {
    return {false, make_pass(rows)};
  }
}

/// `co_await publish(...)` (no suspension) moves the task's sequence into its promise, where
/// the drivers read it, and gives the loop that record (its `seq` to work on, `prefilled` to
/// set). Call it once the arguments are checked, before the models' prefill.
struct publish_awaiter {
  task_state state;
  task_state* out = nullptr;
  [[nodiscard]] bool await_ready() const noexcept { return false; }
  bool await_suspend(decode_task::handle_type h) noexcept {
    h.promise().state = std::move(state);
    out = &h.promise().state;
    return false;
  }
  [[nodiscard]] task_state& await_resume() const noexcept { return *out; }
};
inline publish_awaiter publish(std::vector<token_t> seq, index_t prompt_len,
                               std::vector<token_t>& result, decode_stats& st,
                               bool has_cache = true) {
  return {task_state{std::move(seq), prompt_len, &result, &st, st.steps, true, false, has_cache}};
}
/// A request's publish: its sequence starts as the prompt.
inline publish_awaiter publish(std::span<const token_t> prompt, std::vector<token_t>& result,
                               decode_stats& st) {
  return publish(std::vector<token_t>(prompt.begin(), prompt.end()),
                 static_cast<index_t>(prompt.size()), result, st);
}

inline pass_awaiter target_pass(const token_tree& tree, std::vector<float>& logits,
                                decode_stats& st) {
  return {{pass_kind::target, &tree, {}, 0, &logits, &st, {}}};
}
inline pass_awaiter draft_pass(const token_tree& tree, std::vector<float>& logits,
                               decode_stats& st) {
  return {{pass_kind::draft, &tree, {}, 0, &logits, &st, {}}};
}
inline pass_awaiter sequences_pass(std::span<const token_t> tokens, index_t length,
                                   std::vector<float>& logits, decode_stats& st) {
  return {{pass_kind::sequences, nullptr, tokens, length, &logits, &st, {}}};
}
/// A pass of one or more dual-cache passes (see `dual_cache_pass`), `groups`, over node sequences
/// of `length`, each through one of the task's own `Model::dual_cache`s (distinct ones); their
/// rows land in `logits` in group order. `groups` must live until the task resumes.
inline pass_awaiter cached_pass(std::span<const cached_group> groups, index_t length,
                                std::vector<float>& logits, decode_stats& st) {
  return {{pass_kind::cached, nullptr, {}, length, &logits, &st, groups}};
}

// ----- Faults -----

/// A model call that failed or misbehaved, as a handle or driver reports it; the driver turns
/// it into a `decode_error` naming the request and step.
class model_fault : public std::runtime_error {
 public:
  model_fault(fault_source src, std::string op, index_t at_row, index_t at_column, status st,
              const std::string& message, std::exception_ptr original = {})
      : std::runtime_error(message),
        source(src),
        operation(std::move(op)),
        row(at_row),
        column(at_column),
        code(st),
        cause(std::move(original)) {}
  fault_source source;
  std::string operation;
  index_t row, column;
  status code;
  std::exception_ptr cause;
};

/// Calls `f()`; an exception from it becomes a `model_fault` of `source` in `operation`.
template <class F>
decltype(auto) guarded(fault_source source, const char* operation, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const model_fault&) {
    throw;
  } catch (const invalid_input& e) {
    throw model_fault(source, operation, e.row(), e.column(), e.code(), e.what(),
                      std::current_exception());
  } catch (const std::exception& e) {
    throw model_fault(source, operation, -1, -1, status::ok, e.what(), std::current_exception());
  } catch (...) {
    throw model_fault(source, operation, -1, -1, status::ok, "unknown exception",
                      std::current_exception());
  }
}

/// Throws the `model_fault` of a model whose `context_size()` is `got` after `operation`, where
/// it must be `want`.
[[noreturn]] inline void context_fault(fault_source source, const char* operation, index_t want,
                                       index_t got) {
  throw model_fault(source, operation, -1, -1, status::length_mismatch,
                    "context_size() is " + std::to_string(got) + " after " + operation +
                        ", must be " + std::to_string(want) + " (a model bug)");
}

/// Refuses a pass's logit rows (`rows` x `vocab`) with a NaN or +inf entry, or with no entry
/// above -inf (the model's bug, not the caller's input).
inline void check_rows(fault_source source, std::span<const float> rows, index_t vocab) {
  const auto V = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r * V < rows.size(); ++r) {
    bool any = false;
    for (std::size_t y = 0; y < V; ++y) {
      const float v = rows[r * V + y];
      if (std::isnan(v) || v == INFINITY)
        throw model_fault(source, "evaluate", static_cast<index_t>(r), static_cast<index_t>(y),
                          std::isnan(v) ? status::nan_value : status::inf_value,
                          std::isnan(v) ? "NaN logit" : "+inf logit");
      any = any || v > -INFINITY;
    }
    if (!any)
      throw model_fault(source, "evaluate", static_cast<index_t>(r), -1, status::no_mass,
                        "every logit of the row is -inf");
  }
}

/// Refuses a model whose `vocab_size()` changed since the loop started.
inline void check_vocab(fault_source source, index_t now, index_t at_start) {
  if (now != at_start)
    throw model_fault(source, "vocab_size", -1, -1, status::length_mismatch,
                      "vocab_size() is " + std::to_string(now) + ", was " +
                          std::to_string(at_start) + " when the loop started");
}

/// Refuses a prompt token outside [0, vocab) (`request` >= 0: named as prompts[row request]).
inline void check_prompt(std::span<const token_t> prompt, index_t vocab, index_t request = -1) {
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw_if_failed({status::token_out_of_range, request, static_cast<index_t>(i),
                       static_cast<double>(prompt[i])},
                      request >= 0 ? "prompts" : "prompt", "token outside [0, vocab_size)");
}

/// Refuses a stop-token list entry outside [0, vocab): `argument[column i]`, or
/// `argument[row request][column i]` when `request` >= 0.
inline void check_stop_tokens(std::span<const token_t> stops, index_t vocab,
                              const char* argument = "stop_tokens", index_t request = -1) {
  for (std::size_t i = 0; i < stops.size(); ++i)
    if (stops[i] < 0 || stops[i] >= vocab)
      throw_if_failed({status::token_out_of_range, request, static_cast<index_t>(i),
                       static_cast<double>(stops[i])},
                      argument, "a stop token must be in [0, vocab_size)");
}

/// Refuses a loop's `stop_token` option outside [0, vocab) other than no_token (-1: none).
inline void check_stop_token(token_t stop, index_t vocab) {
  if (stop != no_token && (stop < 0 || stop >= vocab))
    throw_if_failed({status::token_out_of_range, -1, -1, static_cast<double>(stop)}, "stop_token",
                    "a stop token must be in [0, vocab_size), or -1 for none");
}

/// Refuses the same object as a loop's target and draft model: each model keeps its own cache
/// of the request's tokens, which one object cannot do for both.
inline void require_distinct_models(const void* target, const void* draft) {
  if (target == draft)
    throw_if_failed({status::invalid_parameter, -1, -1, 0.0}, "draft",
                    "is the target model itself (one object): the two models need a cache each; "
                    "pass a second model (a copy of the target for self-drafting)");
}

/// At a request's end, a model (handle) holding more than `keep` tokens drops the rest: the
/// last step's accepted path may run past a stop token, and the request ends, as after a
/// fault, with its target (or only) model at its sequence but the last token (`keep` =
/// sequence - 1) and a draft model at most at all of it (`keep` = sequence).
template <class Handle>
void trim_cache(const Handle& m, index_t keep) {
  if (m.context_size() > keep) m.rollback(keep);
}

/// What `co_await start_request(...)` does at a request's start (see there).
template <class... Handles>
struct start_awaiter {
  publish_awaiter published;
  std::span<const token_t> prompt;
  std::tuple<Handles...> models;
  [[nodiscard]] bool await_ready() const noexcept { return false; }
  bool await_suspend(decode_task::handle_type h) noexcept { return published.await_suspend(h); }
  std::vector<token_t>& await_resume() {
    task_state& s = published.await_resume();
    std::apply([&](const Handles&... m) { (m.prefill(prompt), ...); }, models);
    s.prefilled = true;
    return s.seq;
  }
};

/// A request's start in the loops over session models: checks the prompt's tokens, the stop
/// token `stop` and the stop-token list `stops` against `vocab` now (refused before any model is
/// touched); `co_await` on the result publishes the request's sequence (the prompt; it lives in the
/// task's promise, which outlives the loop's locals when a fault unwinds them), prefills `models`
/// (handles) in turn and marks the request prefilled, giving the request's sequence
/// (`task_state::seq`: the prompt, then the committed output).
template <class... Handles>
start_awaiter<Handles...> start_request(std::span<const token_t> prompt, token_t stop,
                                        std::span<const token_t> stops, index_t vocab,
                                        std::vector<token_t>& result, decode_stats& st,
                                        const Handles&... models) {
  check_prompt(prompt, vocab);
  check_stop_token(stop, vocab);
  check_stop_tokens(stops, vocab);
  return {publish(prompt, result, st), prompt, std::tuple<Handles...>(models...)};
}

/// A single request's model as the handle a loop uses for everything but evaluation. Every
/// call is guarded (a failure names `source`) and checked: `prefill` leaves prompt - 1 tokens,
/// `commit` adds the path's nodes, `rollback(n)` leaves n.
template <class M>
struct solo {
  M* m;
  fault_source source = fault_source::target;
  [[nodiscard]] index_t vocab_size() const { return m->vocab_size(); }
  void prefill(std::span<const token_t> prompt) const {
    guarded(source, "prefill", [&] { m->prefill(prompt); });
    expect("prefill", static_cast<index_t>(prompt.size()) - 1);
  }
  void commit(std::span<const index_t> path) const {
    const index_t before = context_size();
    guarded(source, "commit", [&] { m->commit(path); });
    expect("commit", before + static_cast<index_t>(path.size()));
  }
  [[nodiscard]] index_t context_size() const {
    return guarded(source, "context_size", [&] { return static_cast<index_t>(m->context_size()); });
  }
  void rollback(index_t n) const {
    guarded(source, "rollback", [&] { m->rollback(n); });
    expect("rollback", n);
  }

 private:
  void expect(const char* operation, index_t want) const {
    const index_t got = context_size();
    if (got != want) context_fault(source, operation, want, got);
  }
};

/// One request of a batched model as the same handle.
template <class M>
struct member {
  M* m;
  index_t request;
  fault_source source = fault_source::target;
  [[nodiscard]] index_t vocab_size() const { return m->vocab_size(); }
  void prefill(std::span<const token_t> prompt) const {
    guarded(source, "prefill", [&] { m->prefill(request, prompt); });
    expect("prefill", static_cast<index_t>(prompt.size()) - 1);
  }
  void commit(std::span<const index_t> path) const {
    const index_t before = context_size();
    guarded(source, "commit", [&] { m->commit(request, path); });
    expect("commit", before + static_cast<index_t>(path.size()));
  }
  [[nodiscard]] index_t context_size() const {
    return guarded(source, "context_size",
                   [&] { return static_cast<index_t>(m->context_size(request)); });
  }
  void rollback(index_t n) const {
    guarded(source, "rollback", [&] { m->rollback(request, n); });
    expect("rollback", n);
  }

 private:
  void expect(const char* operation, index_t want) const {
    const index_t got = context_size();
    if (got != want) context_fault(source, operation, want, got);
  }
};

/// Stands in for the draft model of loops that have none.
struct no_draft {};

/// Brings one request's caches back to its committed tokens after a fault: the target (or only)
/// model to all of the sequence but its last token (the next step's root), the draft model to
/// at most the whole sequence (it may lag behind and catches up on its next pass); both drop
/// any pending evaluation. `request` < 0: single-request models. Returns false when that is
/// impossible (the request was never prefilled, a model holds fewer tokens than committed, or
/// its rollback fails too).
template <class Target, class Draft>
bool restore_caches(Target& target, Draft* draft, index_t request, const task_state& s) noexcept {
  if (!s.published) return true;  // the loop stopped before touching any model
  if (!s.has_cache) return true;
  if (!s.prefilled) return false;
  const auto n = static_cast<index_t>(s.seq.size());
  const auto bring_back = [&](auto& m, bool is_draft) {
    try {
      const auto context = [&]() -> index_t {
        if constexpr (requires { m.context_size(request); })
          if (request >= 0) return m.context_size(request);
        if constexpr (requires { m.context_size(); }) return m.context_size();
        return -1;
      };
      const auto rollback = [&](index_t k) {
        if constexpr (requires { m.rollback(request, k); })
          if (request >= 0) return m.rollback(request, k);
        if constexpr (requires { m.rollback(k); }) m.rollback(k);
      };
      const index_t ctx = context();
      const index_t want = is_draft ? std::min(ctx, n) : n - 1;
      if (ctx < want || want < 0) return false;
      rollback(want);
      return context() == want;
    } catch (...) {
      return false;
    }
  };
  bool ok = bring_back(target, false);
  if constexpr (!std::is_same_v<Draft, no_draft>)
    if (draft != nullptr) ok = bring_back(*draft, true) && ok;
  return ok;
}

/// The `decode_error` of a fault (`error`: a model_fault, invalid_input or any exception) in
/// `request` (-1: a batched call of several), whose state is `s`.
inline decode_error make_decode_error(std::exception_ptr error, index_t request, bool name_request,
                                      const task_state& s, bool consistent,
                                      std::vector<std::vector<token_t>> committed) {
  decode_error::details d;
  d.request = request;
  d.step = s.step();
  d.caches_consistent = consistent;
  std::string why;
  std::exception_ptr cause = error;
  try {
    std::rethrow_exception(error);
  } catch (const model_fault& f) {
    d.source = f.source;
    d.operation = f.operation;
    d.row = f.row;
    d.column = f.column;
    d.code = f.code;
    why = f.what();
    if (f.cause) cause = f.cause;
  } catch (const invalid_input& e) {
    d.row = e.row();
    d.column = e.column();
    d.code = e.code();
    why = e.what();
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "unknown exception";
  }
  // The cause's own "specula: " prefix (an invalid_input's) is said once, at the front.
  if (constexpr std::string_view prefix = "specula: "; why.starts_with(prefix))
    why.erase(0, prefix.size());
  std::string msg = "specula: decode fault";
  if (name_request)
    msg += request >= 0 ? " in request " + std::to_string(request) : " in a batched call";
  if (d.step >= 0) msg += " at step " + std::to_string(d.step);
  msg += ": ";
  if (d.source != fault_source::loop)
    msg += std::string(describe(d.source)) + " model " + d.operation + ": ";
  else if (!d.operation.empty())
    msg += d.operation + ": ";
  if (d.source != fault_source::loop) {
    if (d.row >= 0) msg += "row " + std::to_string(d.row) + ", ";
    if (d.column >= 0) msg += "column " + std::to_string(d.column) + ", ";
  }
  msg += why;
  if (s.published)
    msg += "; " + std::to_string(s.seq.size() - static_cast<std::size_t>(s.prompt_len)) +
           " tokens committed";
  msg += consistent ? ", caches at the committed tokens"
                    : ", caches NOT at the committed tokens (prefill again)";
  return decode_error(msg, std::move(d), cause, std::move(committed));
}

/// A loop asked for a pass its driver's model cannot serve (an internal error: the public
/// functions constrain their models so that this cannot happen).
[[noreturn]] inline void unservable_pass() {
  throw std::logic_error(
      "specula: a decoding loop asked for a forward pass its model cannot serve");
}

/// Serves one request's pass with an unbatched model; `vocab` is the vocabulary the loop
/// started with. The rows are checked (check_rows).
template <class M>
void serve_solo(M& m, const pass_request& rq, index_t vocab) {
  decode_stats& st = *rq.stats;
  const fault_source source =
      rq.kind == pass_kind::draft ? fault_source::draft : fault_source::target;
  const index_t V = m.vocab_size();
  check_vocab(source, V, vocab);
  if (rq.kind == pass_kind::sequences) {
    if constexpr (masked_model<M>) {
      const auto rows = static_cast<index_t>(rq.tokens.size());
      rq.logits->resize(static_cast<std::size_t>(rows * V));
      scoped_timer timer(st.forward_seconds);
      guarded(source, "evaluate", [&] {
        m.evaluate_sequences(rq.tokens, rq.length, batch_view<float>(rq.logits->data(), rows, V));
      });
      ++st.target_forwards;
      check_rows(source, *rq.logits, V);
      return;
    }
    unservable_pass();
  }
  if (rq.kind == pass_kind::cached) {
    if constexpr (dual_cache_model<M>) {
      std::vector<dual_cache_pass<typename M::dual_cache>> passes;
      const index_t rows = rq.append_cached(passes);
      rq.logits->resize(static_cast<std::size_t>(rows * V));
      scoped_timer timer(st.forward_seconds);
      guarded(source, "evaluate", [&] {
        m.evaluate_cached(std::span<const dual_cache_pass<typename M::dual_cache>>(passes),
                          batch_view<float>(rq.logits->data(), rows, V));
      });
      ++st.target_forwards;
      check_rows(source, *rq.logits, V);
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
      guarded(source, "evaluate", [&] { m.evaluate(*rq.tree, rows); });
      ++st.draft_forwards;
    } else {
      scoped_timer timer(st.forward_seconds);
      guarded(source, "evaluate", [&] { m.evaluate(*rq.tree, rows); });
      ++st.target_forwards;
    }
    check_rows(source, *rq.logits, V);
  }
}

/// Runs one task to its end: target passes on `target`, draft passes on `*draft`;
/// `control.cancel` is polled before each pass (a cancelled task ends with its committed
/// output, its caches brought back to it). On a fault the request's caches are brought back to
/// its committed tokens and `decode_error` is thrown.
template <class Target, class Draft = no_draft>
void run_solo(decode_task& task, Target& target, Draft* draft = nullptr,
              const request_control& control = {}) {
  const index_t V = target.vocab_size();
  const auto report = [&](request_status s) {
    if (control.status != nullptr) *control.status = s;
  };
  try {
    for (task.resume(); !task.done(); task.resume()) {
      if (control.cancel &&
          guarded(fault_source::loop, "cancel", [&] { return control.cancel(); })) {
        if (!restore_caches(target, draft, -1, task.state()))
          throw std::runtime_error(
              "cancelled, and its caches could not be brought back to the committed tokens");
        task.drop();
        report(request_status::cancelled);
        return;
      }
      const pass_request& rq = task.pending();
      if (rq.kind == pass_kind::draft) {
        if constexpr (std::is_same_v<Draft, no_draft>)
          unservable_pass();
        else
          serve_solo(*draft, rq, V);
      } else {
        serve_solo(target, rq, V);
      }
    }
  } catch (...) {
    const task_state& s = task.state();
    // Arguments refused before the loop touched a model: the caller's error, as it is.
    if (!s.published) throw;
    report(request_status::failed);
    const bool ok = restore_caches(target, draft, -1, s);
    throw make_decode_error(std::current_exception(), 0, false, s, ok, {s.committed()});
  }
  report(request_status::completed);
}

/// Drives a batch of tasks (run_batch): serves their passes in batched calls, checks rows, and
/// handles faults, cancellation and isolation (`batch_control`).
template <class Target, class Draft>
class batch_runner {
 public:
  batch_runner(std::span<decode_task> tasks, Target& target, Draft* draft,
               const batch_control& control)
      : tasks_(tasks),
        target_(target),
        draft_(draft),
        control_(control),
        vocab_(target.vocab_size()),
        dropped_(tasks.size()) {}

  void run() {
    for (std::size_t r = 0; r < tasks_.size(); ++r) resume(static_cast<index_t>(r));
    constexpr pass_kind order[] = {pass_kind::draft, pass_kind::target, pass_kind::sequences,
                                   pass_kind::cached};
    for (bool any = true; any;) {
      any = false;
      if (control_.cancel)
        for (std::size_t r = 0; r < tasks_.size(); ++r)
          if (!tasks_[r].done()) poll_cancel(static_cast<index_t>(r));
      for (const pass_kind kind : order) {
        waiting_.clear();
        for (std::size_t r = 0; r < tasks_.size(); ++r)
          if (!tasks_[r].done() && tasks_[r].pending().kind == kind)
            waiting_.push_back(static_cast<index_t>(r));
        if (waiting_.empty()) continue;
        any = true;
        serve(kind, waiting_);
        for (const index_t r : served_) resume(r);
      }
    }
  }

 private:
  /// Serves the passes of `waiting` (one kind) in one batched call; `served_` lists the tasks
  /// that got their rows. With isolation, a call that throws is retried request by request.
  void serve(pass_kind kind, std::span<const index_t> waiting) {
    served_.clear();
    try {
      serve_call(kind, waiting);
    } catch (const decode_error&) {
      throw;
    } catch (...) {
      if (!control_.isolate || waiting.size() == 1) {
        fault(waiting.size() == 1 ? waiting[0] : -1, std::current_exception());
        return;
      }
      const std::vector<index_t> each(waiting.begin(), waiting.end());
      for (const index_t r : each) {
        try {
          serve_call(kind, std::span<const index_t>(&r, 1));
        } catch (...) {
          fault(r, std::current_exception());
        }
      }
      return;
    }
  }

  /// One batched call for `waiting`; appends them to `served_` once their rows are in, then
  /// checks each request's rows (a bad row faults that request only).
  void serve_call(pass_kind kind, std::span<const index_t> waiting) {
    const fault_source source =
        kind == pass_kind::draft ? fault_source::draft : fault_source::target;
    if (kind == pass_kind::sequences) {
      if constexpr (masked_model<Target>)
        call(source, [&] { serve_sequences(target_, waiting); });
      else
        unservable_pass();
    } else if (kind == pass_kind::cached) {
      if constexpr (dual_cache_model<Target>)
        call(source, [&] { serve_cached(target_, waiting); });
      else
        unservable_pass();
    } else if (kind == pass_kind::target) {
      if constexpr (batched_model<Target>)
        call(source, [&] { serve_trees(target_, waiting, true); });
      else
        unservable_pass();
    } else {
      if constexpr (std::is_same_v<Draft, no_draft>)
        unservable_pass();
      else
        call(source, [&] { serve_trees(*draft_, waiting, false); });
    }
    for (const index_t r : waiting) {
      try {
        check_rows(source, *tasks_[static_cast<std::size_t>(r)].pending().logits, vocab_);
        served_.push_back(r);
      } catch (...) {
        fault(r, std::current_exception());
      }
    }
  }

  template <class F>
  void call(fault_source source, F&& f) {
    const index_t V = source == fault_source::draft ? draft_vocab() : target_.vocab_size();
    check_vocab(source, V, vocab_);
    guarded(source, "evaluate", std::forward<F>(f));
  }
  [[nodiscard]] index_t draft_vocab() const {
    if constexpr (std::is_same_v<Draft, no_draft>)
      return vocab_;
    else
      return draft_->vocab_size();
  }

  void resume(index_t r) {
    try {
      tasks_[static_cast<std::size_t>(r)].resume();
    } catch (...) {
      fault(r, std::current_exception());
      return;
    }
    if (tasks_[static_cast<std::size_t>(r)].done() && !control_.outcomes.empty())
      control_.outcomes[static_cast<std::size_t>(r)].status = request_status::completed;
  }

  /// Asks `control_.cancel` about request r and cancels it on true; an exception from the
  /// callback is a fault of request r (source loop, operation "cancel").
  void poll_cancel(index_t r) {
    bool cancelled = false;
    try {
      cancelled = guarded(fault_source::loop, "cancel", [&] { return control_.cancel(r); });
    } catch (...) {
      fault(r, std::current_exception());
      return;
    }
    if (cancelled) cancel(r);
  }

  /// Cancels request r; when its caches cannot be restored, that is a fault of the request.
  void cancel(index_t r) {
    decode_task& t = tasks_[static_cast<std::size_t>(r)];
    if (!restore_caches(target_, draft_, r, t.state())) {
      fault(r, std::make_exception_ptr(std::runtime_error(
                   "cancelled, and its caches could not be brought back to the committed tokens")));
      return;
    }
    drop(r);
    if (!control_.outcomes.empty())
      control_.outcomes[static_cast<std::size_t>(r)].status = request_status::cancelled;
  }

  /// A fault of request r (-1: a batched call of several requests, without isolation).
  void fault(index_t r, std::exception_ptr error) {
    if (r >= 0 && !tasks_[static_cast<std::size_t>(r)].state().published)
      std::rethrow_exception(error);  // arguments refused before the loop touched a model
    if (control_.isolate && r >= 0) {
      decode_task& t = tasks_[static_cast<std::size_t>(r)];
      const task_state& s = t.state();
      const bool ok = restore_caches(target_, draft_, r, s);
      std::vector<std::vector<token_t>> committed(1, s.committed());
      const decode_error e = make_decode_error(error, r, true, s, ok, std::move(committed));
      drop(r);
      if (!control_.outcomes.empty()) {
        auto& o = control_.outcomes[static_cast<std::size_t>(r)];
        o.status = request_status::failed;
        o.error = std::make_exception_ptr(e);
      }
      return;
    }
    // No isolation: every running request (and the faulty one, whose task has ended) goes back
    // to its committed tokens; the call throws.
    bool ok = true;
    std::vector<std::vector<token_t>> committed(tasks_.size());
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      const task_state& s = tasks_[i].state();
      committed[i] = dropped_[i] ? *dropped_[i] : s.committed();
      const bool running = !tasks_[i].done() || static_cast<index_t>(i) == r;
      if (!running || !s.published) continue;
      ok = restore_caches(target_, draft_, static_cast<index_t>(i), s) && ok;
      if (!control_.outcomes.empty()) control_.outcomes[i].status = request_status::failed;
    }
    static const task_state none{};
    const task_state& s = r >= 0 ? tasks_[static_cast<std::size_t>(r)].state() : none;
    decode_error e = make_decode_error(error, r, true, s, ok, std::move(committed));
    if (!control_.outcomes.empty() && r >= 0)
      control_.outcomes[static_cast<std::size_t>(r)].error = std::make_exception_ptr(e);
    throw e;
  }

  /// Serves, in one batched call, the tree passes of `waiting` on `m`.
  template <class M>
  void serve_trees(M& m, std::span<const index_t> waiting, bool is_target) {
    const index_t V = vocab_;
    trees_.clear();
    index_t total = 0;
    for (const index_t r : waiting) {
      trees_.push_back(*task(r).pending().tree);
      total += trees_.back().size();
    }
    rows_.resize(static_cast<std::size_t>(total * V));
    const auto t0 = std::chrono::steady_clock::now();
    m.evaluate(waiting, std::span<const token_tree>(trees_),
               batch_view<float>(rows_.data(), total, V));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    index_t row = 0;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      const pass_request& rq = task(waiting[i]).pending();
      const auto n = static_cast<std::size_t>(trees_[i].size() * V);
      rq.logits->assign(rows_.begin() + row * V,
                        rows_.begin() + row * V + static_cast<std::ptrdiff_t>(n));
      row += trees_[i].size();
      if (is_target) {
        rq.stats->forward_seconds += seconds;
        ++rq.stats->target_forwards;
      } else {
        ++rq.stats->draft_forwards;
      }
    }
  }

  /// Serves the sequence passes of `waiting` on `m`: one call per distinct sequence length.
  template <class M>
  void serve_sequences(const M& m, std::span<const index_t> waiting) {
    const index_t V = vocab_;
    std::vector<index_t> lengths;
    for (const index_t r : waiting) lengths.push_back(task(r).pending().length);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    for (const index_t length : lengths) {
      tokens_.clear();
      for (const index_t r : waiting) {
        const pass_request& rq = task(r).pending();
        if (rq.length == length) tokens_.insert(tokens_.end(), rq.tokens.begin(), rq.tokens.end());
      }
      const auto total = static_cast<index_t>(tokens_.size());
      rows_.resize(static_cast<std::size_t>(total * V));
      const auto t0 = std::chrono::steady_clock::now();
      m.evaluate_sequences(tokens_, length, batch_view<float>(rows_.data(), total, V));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::ptrdiff_t at = 0;
      for (const index_t r : waiting) {
        const pass_request& rq = task(r).pending();
        if (rq.length != length) continue;
        const auto n = static_cast<std::ptrdiff_t>(rq.tokens.size()) * V;
        rq.logits->assign(rows_.begin() + at, rows_.begin() + at + n);
        at += n;
        rq.stats->forward_seconds += seconds;
        ++rq.stats->target_forwards;
      }
    }
  }

  /// Serves the cached passes of `waiting` on `m` in one `evaluate_cached` call.
  template <class M>
  void serve_cached(const M& m, std::span<const index_t> waiting) {
    const index_t V = vocab_;
    std::vector<dual_cache_pass<typename M::dual_cache>> passes;
    std::vector<index_t> rows;  // per request
    index_t total = 0;
    for (const index_t r : waiting) {
      rows.push_back(task(r).pending().append_cached(passes));
      total += rows.back();
    }
    rows_.resize(static_cast<std::size_t>(total * V));
    const auto t0 = std::chrono::steady_clock::now();
    m.evaluate_cached(std::span<const dual_cache_pass<typename M::dual_cache>>(passes),
                      batch_view<float>(rows_.data(), total, V));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ptrdiff_t at = 0;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      const pass_request& rq = task(waiting[i]).pending();
      const auto n = static_cast<std::ptrdiff_t>(rows[i]) * V;
      rq.logits->assign(rows_.begin() + at, rows_.begin() + at + n);
      at += n;
      rq.stats->forward_seconds += seconds;
      ++rq.stats->target_forwards;
    }
  }

  decode_task& task(index_t r) { return tasks_[static_cast<std::size_t>(r)]; }

  /// Ends request r's task (cancelled or failed), keeping its committed tokens for a later
  /// decode_error.
  void drop(index_t r) {
    const auto i = static_cast<std::size_t>(r);
    dropped_[i] = tasks_[i].state().committed();
    tasks_[i].drop();
  }

  std::span<decode_task> tasks_;
  Target& target_;
  Draft* draft_;
  const batch_control& control_;
  index_t vocab_;
  std::vector<std::optional<std::vector<token_t>>> dropped_;
  std::vector<index_t> waiting_, served_;
  std::vector<token_tree> trees_;
  std::vector<token_t> tokens_;
  std::vector<float> rows_;
};

/// Runs every task to its end, batching their passes (see file comment). Task i is request i of
/// the batched models.
template <class Target, class Draft = no_draft>
void run_batch(std::span<decode_task> tasks, Target& target, Draft* draft = nullptr,
               const batch_control& control = {}) {
  batch_runner<Target, Draft>(tasks, target, draft, control).run();
}

/// Checks a batch call's per-request arguments: `prompts` fit the model's batch, one rng per
/// prompt, `stats` empty or one per prompt, and the control's spans empty or one per prompt.
/// No prompts (B = 0) is valid: the call is a no-op, as B = 0 is for the verifiers.
inline void check_batch_arguments(std::size_t prompts, index_t batch_size, std::size_t rngs,
                                  std::size_t stats, const batch_control& control = {}) {
  if (static_cast<index_t>(prompts) > batch_size)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(prompts)}, "prompts",
                    "more prompts than the model's batch_size()");
  if (rngs != prompts)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rngs)}, "rngs",
                    "one request_rng per prompt");
  if (stats != 0 && stats != prompts)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(stats)}, "stats",
                    "empty or one decode_stats per prompt");
  if (!control.limits.empty() && control.limits.size() != prompts)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(control.limits.size())},
                    "limits", "empty or one request_limits per prompt");
  if (!control.outcomes.empty() && control.outcomes.size() != prompts)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(control.outcomes.size())},
                    "outcomes", "empty or one request_outcome per prompt");
}

/// Checks each request's `control.limits` entry (row r): a token limit >= 1 (or < 0: the
/// options'), stop tokens in [0, vocab) (`vocab` > 0; the single one may also be `no_token` or
/// `request_limits::inherit_stop`).
inline void check_limits(const batch_control& control, index_t vocab) {
  for (std::size_t i = 0; i < control.limits.size(); ++i) {
    const request_limits& l = control.limits[i];
    const auto r = static_cast<index_t>(i);
    if (l.max_new_tokens == 0)
      throw_if_failed({status::invalid_parameter, r, -1, 0.0}, "limits.max_new_tokens",
                      "must be >= 1 (or < 0: the options' limit)");
    const token_t s = l.stop_token;
    if (s != request_limits::inherit_stop && s != no_token && (s < 0 || (vocab > 0 && s >= vocab)))
      throw_if_failed(
          {status::token_out_of_range, r, -1, static_cast<double>(s)}, "limits.stop_token",
          "must be in [0, vocab_size), no_token (none) or request_limits::inherit_stop");
    if (l.stop_tokens && vocab > 0)
      check_stop_tokens(*l.stop_tokens, vocab, "limits.stop_tokens", r);
  }
}

/// Request r's options: `options` with `control.limits[r]` applied (a loop without a token
/// limit or stop token refuses limits that set them).
template <class Options>
Options request_options(const Options& options, const batch_control& control, index_t r) {
  if (control.limits.empty()) return options;
  const request_limits& l = control.limits[static_cast<std::size_t>(r)];
  Options o = options;
  if constexpr (requires {
                  o.max_new_tokens;
                  o.stop_token;
                  o.stop_tokens;
                }) {
    if (l.max_new_tokens >= 0) o.max_new_tokens = l.max_new_tokens;
    if (l.stop_token != request_limits::inherit_stop) o.stop_token = l.stop_token;
    if (l.stop_tokens) o.stop_tokens = *l.stop_tokens;
  } else {
    if (l.max_new_tokens >= 0 || l.stop_token != request_limits::inherit_stop ||
        l.stop_tokens.has_value())
      throw_if_failed({status::invalid_parameter, r, -1, static_cast<double>(l.max_new_tokens)},
                      "limits", "this loop has no per-request token limit or stop token");
  }
  return o;
}

/// Runs one request: `make(stats)` creates its task (stats: `*stats` or a local), driven by
/// run_solo on `target` (and `*draft`) under `control`.
template <class Target, class Draft = no_draft, class MakeTask>
void decode_solo(Target& target, Draft* draft, decode_stats* stats, MakeTask&& make,
                 const request_control& control = {}) {
  if (control.status != nullptr) *control.status = request_status::not_run;
  decode_stats local;
  decode_task task = make(stats != nullptr ? *stats : local);
  run_solo(task, target, draft, control);
}

/// Runs a batch: `make(r, stats_r)` creates request r's task, with stats_r = `stats[r]` or a
/// local; the arguments are checked first (check_batch_arguments, every prompt non-empty, and
/// its tokens in [0, vocab) when `vocab` > 0).
template <class Target, class Draft = no_draft, class MakeTask>
void decode_batch(Target& target, Draft* draft, index_t batch_size,
                  std::span<const std::vector<token_t>> prompts, std::size_t rngs,
                  std::span<decode_stats> stats, MakeTask&& make, const batch_control& control = {},
                  index_t vocab = 0) {
  check_batch_arguments(prompts.size(), batch_size, rngs, stats.size(), control);
  check_limits(control, vocab);
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    if (prompts[r].empty())
      throw_if_failed({status::empty_input, static_cast<index_t>(r), -1, 0.0}, "prompts");
    if (vocab > 0) check_prompt(prompts[r], vocab, static_cast<index_t>(r));
  }
  for (request_outcome& o : control.outcomes) o = {};
  if (prompts.empty()) return;
  std::vector<decode_stats> local(stats.empty() ? prompts.size() : 0);
  std::vector<decode_task> tasks;
  tasks.reserve(prompts.size());
  for (std::size_t r = 0; r < prompts.size(); ++r)
    tasks.push_back(make(static_cast<index_t>(r), stats.empty() ? local[r] : stats[r]));
  run_batch(std::span<decode_task>(tasks), target, draft, control);
}

}  // namespace specula::detail
