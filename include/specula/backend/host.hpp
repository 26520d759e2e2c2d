#pragma once

/// @file
/// Host execution policies, in the style of Thrust's `thrust::seq` / `thrust::par`.
///
/// Algorithms take a policy as their first argument and run their per-request loop (the loop over
/// requests, or over rows when validating) under it:
///
/// - `host::seq` runs it on the calling thread;
/// - `host::par` runs it on `default_pool()`, a process-wide pool of persistent threads started
///   on first use (no threads are started per call), the calling thread taking part;
/// - `host::on(ex)` runs it on the caller's own executor `ex` (an engine's thread pool): any
///   object with `ex.bulk(n, task)` that runs `task(0..n-1)` and returns when all have finished
///   (the `executor` concept).
///
/// Requests are handed out in contiguous blocks claimed at run time, so a thread that joins late
/// finds less (or nothing) left instead of holding up the call: a small batch ends up on the
/// calling thread alone when waking another does not pay. Every policy gives the same outputs
/// (each request's result depends on its inputs and its own random stream only). The CUDA
/// backend (specula/cuda) adds device policies that the same algorithm names accept.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

#include "specula/backend/thread_pool.hpp"
#include "specula/core/error.hpp"
#include "specula/core/types.hpp"

namespace specula::host {

/// An executor: `ex.bulk(n, task)` calls `task(i)` once for every i in [0, n), on any threads
/// (the calling one included), and returns once every call has returned. Tasks never throw. It
/// must not return early: the tasks refer to the caller's stack. An executor may also provide
/// `ex.concurrency()`, the number of threads it can run tasks on, which caps the number of tasks
/// a call submits (without it, one task per block of `min_requests_per_task` requests).
template <class E>
concept executor = requires(E& ex, index_t n, bulk_task task) {
  ex.bulk(n, task);
};

/// Runs the per-request loop on the calling thread.
struct sequential_policy {};

/// Runs the per-request loop on `default_pool()` with at most `threads` threads (0: all of the
/// pool's, one per hardware thread, caller included), at least `min_requests_per_thread`
/// requests per thread, and on the calling thread alone when the call is too small to split
/// (`serial_below_ns`).
struct parallel_policy {
  unsigned threads = 0;
  index_t min_requests_per_thread = 1;
  /// The calling thread runs the first block of requests alone and keeps the whole call when
  /// the rest would take less than this at the same pace (waking a worker costs a few to tens
  /// of microseconds); 0 always splits.
  std::int64_t serial_below_ns = 50'000;

  /// The same policy with a different thread limit.
  [[nodiscard]] constexpr parallel_policy with_threads(unsigned n) const noexcept {
    parallel_policy p = *this;
    p.threads = n;
    return p;
  }

  /// The same policy with a different threshold for keeping a call on the calling thread.
  [[nodiscard]] constexpr parallel_policy with_serial_below_ns(std::int64_t ns) const noexcept {
    parallel_policy p = *this;
    p.serial_below_ns = ns;
    return p;
  }
};

/// Runs the per-request loop on the caller's executor (see `executor` and `on`).
template <executor E>
struct executor_policy {
  E* ex = nullptr;
  /// Each submitted task is meant for at least this many requests (>= 1).
  index_t min_requests_per_task = 1;

  /// The same policy with a different minimum number of requests per task.
  [[nodiscard]] constexpr executor_policy with_min_requests_per_task(index_t n) const noexcept {
    executor_policy p = *this;
    p.min_requests_per_task = n;
    return p;
  }
};

/// The policy that runs on `ex`, which must outlive the calls made with it:
/// `verify_chain(host::on(engine_pool), in, out)`.
template <executor E>
[[nodiscard]] constexpr executor_policy<E> on(E& ex) noexcept {
  return executor_policy<E>{&ex};
}

inline constexpr sequential_policy seq{};
inline constexpr parallel_policy par{};

namespace detail {

template <class P>
struct is_executor_policy : std::false_type {};
template <class E>
struct is_executor_policy<executor_policy<E>> : std::true_type {};

}  // namespace detail

/// A host execution policy.
template <class P>
concept policy = std::same_as<std::remove_cvref_t<P>, sequential_policy> ||
    std::same_as<std::remove_cvref_t<P>, parallel_policy> ||
    detail::is_executor_policy<std::remove_cvref_t<P>>::value;

/// Whether `P` may run several requests at the same time (per-thread scratch space is then
/// needed per request).
template <class P>
inline constexpr bool is_concurrent_policy =
    policy<P> && !std::same_as<std::remove_cvref_t<P>, sequential_policy>;

namespace detail {

/// Hardware threads, at least 1 (queried once: the query reads a system file on Linux).
inline index_t hardware_threads() {
  static const index_t n =
      std::max<index_t>(1, static_cast<index_t>(std::thread::hardware_concurrency()));
  return n;
}

/// Runs f(0..n-1) through `submit(tasks, task)`, which must call task(0..tasks-1) and return
/// when all have returned. Every task claims blocks of indices until none is left. An exception
/// from f(i) ends i's block; blocks after the lowest failing index are skipped, blocks before it
/// still run, and the exception of the lowest failing index is rethrown here, as under `seq`.
///
/// With `serial_below_ns` > 0 the calling thread first runs block 0 alone and times it; when
/// the remaining blocks at that pace would take less than `serial_below_ns`, it runs them too
/// and `submit` is not called (splitting would cost more than it saves).
template <class F, class Submit>
void run_blocks(index_t n, index_t tasks, F& f, Submit&& submit, std::int64_t serial_below_ns = 0) {
  const index_t block = std::max<index_t>(1, n / (16 * tasks));
  const index_t blocks = (n + block - 1) / block;
  std::atomic<index_t> next{0};
  std::atomic<index_t> lowest_failure{n};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto run_block = [&](index_t k) noexcept {
    const index_t begin = k * block;
    const index_t end = std::min(n, begin + block);
    for (index_t i = begin; i < end; ++i) {
      try {
        f(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (i < lowest_failure.load(std::memory_order_relaxed)) {
          lowest_failure.store(i, std::memory_order_relaxed);
          error = std::current_exception();
        }
        return;
      }
    }
  };
  auto body = [&](index_t) noexcept {
    for (;;) {
      const index_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= blocks || k * block > lowest_failure.load(std::memory_order_relaxed)) return;
      run_block(k);
    }
  };
  bool split = true;
  if (serial_below_ns > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    run_block(next.fetch_add(1, std::memory_order_relaxed));
    const auto first =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    split = !error && static_cast<double>(first) * static_cast<double>(blocks - 1) >=
                          static_cast<double>(serial_below_ns);
  }
  if (split)
    submit(std::min(tasks, blocks), bulk_task(body));
  else
    body(0);
  if (error) std::rethrow_exception(error);
}

}  // namespace detail

/// Calls `f(i)` for every i in [0, n) under `pol`. If calls throw, the exception of the lowest
/// failing index is rethrown on the calling thread once every running call has finished
/// (indices above it may be skipped).
template <class F>
void for_each_index(sequential_policy, index_t n, F&& f) {
  for (index_t i = 0; i < n; ++i) f(i);
}

template <class F>
void for_each_index(const parallel_policy& pol, index_t n, F&& f) {
  const index_t wanted =
      pol.threads == 0 ? detail::hardware_threads() : static_cast<index_t>(pol.threads);
  const index_t per = std::max<index_t>(1, pol.min_requests_per_thread);
  const index_t tasks = std::min(wanted, (n + per - 1) / per);
  if (tasks <= 1) {
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
  detail::run_blocks(
      n, tasks, f, [](index_t t, bulk_task task) { default_pool().bulk(t, task); },
      pol.serial_below_ns);
}

template <class E, class F>
void for_each_index(const executor_policy<E>& pol, index_t n, F&& f) {
  require_parameter(pol.ex != nullptr, "policy.ex", 0.0,
                    "an executor_policy needs an executor (make it with host::on(executor))");
  const index_t per = std::max<index_t>(1, pol.min_requests_per_task);
  index_t tasks = (n + per - 1) / per;
  if constexpr (requires { pol.ex->concurrency(); })
    tasks = std::min(tasks, std::max<index_t>(1, static_cast<index_t>(pol.ex->concurrency())));
  if (tasks <= 1) {
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
  detail::run_blocks(n, tasks, f, [&](index_t t, bulk_task task) { pol.ex->bulk(t, task); });
}

}  // namespace specula::host
