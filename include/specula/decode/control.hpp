#pragma once

/// @file
/// Faults and per-request control of the decoding loops (docs/decoding.md, "Faults").
///
/// - `decode_error`: what a decoding loop throws when a model call fails (an exception from
///   `evaluate`, `commit`, `rollback` or `prefill`), a model misbehaves (a non-finite or empty
///   logit row, a `commit` / `rollback` / `prefill` that leaves `context_size()` elsewhere than
///   it must, a changed `vocab_size()`), or the loop's own step fails. It names the request, its
///   step, the model and operation, the row and column where there is one, and carries every
///   request's committed tokens; the models' caches have been brought back to them.
/// - `batch_control`: what a batched call may add: per-request isolation (a faulty request is
///   dropped with its outcome and the others continue), cancellation between passes, and
///   per-request token limits and stop tokens; `request_outcome` reports how each request ended.
/// - `request_control`: what a single-request call may add: cancellation between passes.

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "specula/core/status.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// Which party of a decoding loop a fault came from.
enum class fault_source : std::uint8_t {
  target,  ///< the target model (or the only model of a loop without a draft)
  draft,   ///< the draft model
  loop,    ///< the loop itself (drafting, verification: e.g. a verifier that throws)
};

/// Name of a fault source ("target", "draft", "loop").
constexpr const char* describe(fault_source s) noexcept {
  switch (s) {
    case fault_source::target:
      return "target";
    case fault_source::draft:
      return "draft";
    case fault_source::loop:
      return "loop";
  }
  return "?";
}

/// A fault inside a decoding loop (see file comment). `what()` reads e.g.
/// `specula: decode fault in request 2 at step 5: target model evaluate: row 3, column 17: NaN
/// logit; 11 tokens committed, caches at the committed tokens`.
class decode_error : public std::runtime_error {
 public:
  struct details {
    index_t request = -1;  ///< the faulty request; -1: a batched call of several failed
    index_t step = -1;     ///< its step (0: the first; the prefill is step 0 too)
    fault_source source = fault_source::loop;
    std::string operation;     ///< "evaluate", "commit", "rollback", "prefill", "vocab_size", ...
    index_t row = -1;          ///< row of the request's pass (tree node, sequence position)
    index_t column = -1;       ///< column (token) of that row
    status code = status::ok;  ///< the specula status of the cause, when it has one
    bool caches_consistent = true;  ///< every model's cache is at its request's committed tokens
  };

  decode_error(const std::string& message, details d, std::exception_ptr cause,
               std::vector<std::vector<token_t>> committed)
      : std::runtime_error(message),
        details_(std::move(d)),
        cause_(std::move(cause)),
        committed_(std::move(committed)) {}

  [[nodiscard]] index_t request() const noexcept { return details_.request; }
  [[nodiscard]] index_t step() const noexcept { return details_.step; }
  [[nodiscard]] fault_source source() const noexcept { return details_.source; }
  [[nodiscard]] const std::string& operation() const noexcept { return details_.operation; }
  [[nodiscard]] index_t row() const noexcept { return details_.row; }
  [[nodiscard]] index_t column() const noexcept { return details_.column; }
  [[nodiscard]] status code() const noexcept { return details_.code; }
  /// False when a model could not be brought back to the committed tokens (its `rollback`
  /// failed too, or it holds fewer tokens than committed): prefill it again before reuse.
  [[nodiscard]] bool caches_consistent() const noexcept { return details_.caches_consistent; }
  /// The exception the fault started from (a model's own, or specula's `invalid_input`).
  [[nodiscard]] const std::exception_ptr& cause() const noexcept { return cause_; }
  /// committed()[r]: the tokens request r generated and committed before the fault (one entry
  /// for a single-request loop). The request's prompt followed by them is what its models hold.
  [[nodiscard]] const std::vector<std::vector<token_t>>& committed() const noexcept {
    return committed_;
  }

 private:
  details details_;
  std::exception_ptr cause_;
  std::vector<std::vector<token_t>> committed_;
};

/// How a request of a batched call ended.
enum class request_status : std::uint8_t {
  not_run,    ///< not started (the call failed first)
  completed,  ///< reached its token limit or emitted its stop token
  cancelled,  ///< cancelled through `batch_control::cancel`
  failed,     ///< dropped after a fault (isolation on); `request_outcome::error` says why
};

/// A request's outcome (see `batch_control::outcomes`).
struct request_outcome {
  request_status status = request_status::not_run;
  /// The `decode_error` of a failed request (rethrow it to inspect), else empty.
  std::exception_ptr error;
};

/// Per-request overrides of a batched call's options (`batch_control::limits`). Checked before
/// any model is touched; a bad entry is refused naming the request (`limits.max_new_tokens[row
/// r]`, `limits.stop_token[row r]`, `limits.stop_tokens[row r][column i]`).
struct request_limits {
  /// The request's token limit, >= 1; < 0 (the default): the options' (SSD has none).
  index_t max_new_tokens = -1;
  /// The request's stop token, in [0, vocab_size); `inherit_stop` (the default): the options';
  /// `no_token`: none.
  token_t stop_token = inherit_stop;
  /// The request's further stop tokens (the options' `stop_tokens`), each in [0, vocab_size);
  /// unset (the default): the options'; set, even to an empty list: replaces them.
  std::optional<std::vector<token_t>> stop_tokens;
  static constexpr token_t inherit_stop = -2;
};

/// What a batched decoding call may add to its options (see file comment). Default: no
/// isolation, no cancellation, the options' limits for every request, no outcomes reported.
///
/// Isolation is off by default: a batched call returns plain token vectors, and a caller that
/// does not look at `outcomes` would take a failed request's truncated output for a complete
/// one. With it off, the first fault throws `decode_error` (every request's committed tokens
/// inside, every cache at its committed tokens); with it on, the call returns, a failed
/// request's output holds its committed tokens and `outcomes[r]` its `decode_error`.
struct batch_control {
  /// A fault confined to one request drops that request (`request_status::failed`) and the
  /// others continue exactly as without it. A batched model call that throws is then retried
  /// request by request, to find the faulty ones.
  bool isolate = false;
  /// Polled for every running request before each of its forward passes: true cancels it
  /// (its caches are brought back to its committed tokens; `request_status::cancelled`). An
  /// exception from it is a fault of that request (`fault_source::loop`, operation "cancel").
  std::function<bool(index_t request)> cancel;
  /// Empty, or one per prompt.
  std::span<const request_limits> limits;
  /// Empty, or one per prompt: filled with each request's outcome.
  std::span<request_outcome> outcomes;
};

/// What a single-request decoding call may add (the last argument of `speculative_decode`,
/// `sjd_decode`, ...). Default: no cancellation.
struct request_control {
  /// Polled before each forward pass of the request (so between steps, and between a step's
  /// draft passes; the first poll comes after the prefill, before the first pass): true ends
  /// the call there — the models are brought back to the committed tokens and the call returns
  /// them (SSD: its sequence so far, the mask token where nothing was decoded). An exception
  /// from it is a fault (`decode_error`, `fault_source::loop`, operation "cancel").
  std::function<bool()> cancel;
  /// When set: how the call ended (`completed`, `cancelled`, or `failed` before a
  /// `decode_error` is thrown).
  request_status* status = nullptr;
};

}  // namespace specula
