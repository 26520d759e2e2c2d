#pragma once

/// @file
/// Host execution policies, in the style of Thrust's `thrust::seq` / `thrust::par`.
///
/// Algorithms take a policy as their first argument; the host policies run the per-request loop
/// on the calling thread (`host::seq`) or split it over a few threads (`host::par`). The CUDA
/// backend (specula/cuda) adds device policies that the same algorithm names accept.

#include <algorithm>
#include <concepts>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

#include "specula/core/types.hpp"

namespace specula::host {

/// Runs the per-request loop on the calling thread.
struct sequential_policy {};

/// Splits the per-request loop into contiguous chunks over `threads` threads (0: one per
/// hardware thread), giving each thread at least `min_requests_per_thread` requests. Threads are
/// started per call, so this pays only when a call has enough work (see docs/PERFORMANCE.md).
struct parallel_policy {
  unsigned threads = 0;
  index_t min_requests_per_thread = 1;

  /// The same policy with a different thread count.
  [[nodiscard]] constexpr parallel_policy with_threads(unsigned n) const noexcept {
    parallel_policy p = *this;
    p.threads = n;
    return p;
  }
};

inline constexpr sequential_policy seq{};
inline constexpr parallel_policy par{};

/// A host execution policy.
template <class P>
concept policy = std::same_as<std::remove_cvref_t<P>, sequential_policy> ||
    std::same_as<std::remove_cvref_t<P>, parallel_policy>;

/// Calls `f(i)` for every i in [0, n) under `pol`. With `par`, the first exception thrown by any
/// chunk is rethrown on the calling thread after all chunks finish.
template <class F>
void for_each_index(sequential_policy, index_t n, F&& f) {
  for (index_t i = 0; i < n; ++i) f(i);
}

template <class F>
void for_each_index(const parallel_policy& pol, index_t n, F&& f) {
  const index_t hw =
      std::max<index_t>(1, static_cast<index_t>(std::thread::hardware_concurrency()));
  const index_t wanted = pol.threads == 0 ? hw : static_cast<index_t>(pol.threads);
  const index_t per = std::max<index_t>(1, pol.min_requests_per_thread);
  const index_t chunks = std::max<index_t>(1, std::min(wanted, (n + per - 1) / per));
  if (chunks <= 1) {
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(chunks));
  auto run_chunk = [&](index_t c) {
    const index_t begin = n * c / chunks;
    const index_t end = n * (c + 1) / chunks;
    try {
      for (index_t i = begin; i < end; ++i) f(i);
    } catch (...) {
      errors[static_cast<std::size_t>(c)] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(chunks - 1));
  for (index_t c = 1; c < chunks; ++c) workers.emplace_back(run_chunk, c);
  run_chunk(0);
  for (auto& t : workers) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace specula::host
