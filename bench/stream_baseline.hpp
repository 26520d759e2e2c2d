#pragma once
// The streaming-read baseline shared by the benchmarks: a plain read of N bytes in the same
// process, so results read as a fraction of the memory-bandwidth floor.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"

namespace specula::bench {

/// Streaming read of `n` floats (sum with 8 independent accumulators so the loop vectorises and
/// is bound by memory, not by the add latency).
inline float stream_sum(const float* data, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += data[i + static_cast<std::size_t>(k)];
  for (; i < n; ++i) acc[0] += data[i];
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

/// `units` per call times calls per second of `call`: the best of five timed runs of at least
/// 20 ms each.
template <class Call>
double best_rate(double units, Call&& call) {
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    std::size_t iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto t1 = t0;
    do {
      call();
      ++iters;
      t1 = std::chrono::steady_clock::now();
    } while (t1 - t0 < std::chrono::milliseconds(20));
    const double s = std::chrono::duration<double>(t1 - t0).count();
    best = std::max(best, static_cast<double>(iters) * units / s);
  }
  return best;
}

/// `units` over the fastest single call of `call` among `calls` calls (after one warm-up call):
/// on a machine shared with other jobs, the rate of a call that no other job interrupted, the
/// counterpart of a benchmark's fastest iteration.
template <class Call>
double fastest_rate(double units, int calls, Call&& call) {
  call();
  double best = 1e30;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return units / best;
}

/// Bytes per second of the fastest of `calls` single stream_sum passes over a buffer of
/// `bytes` bytes.
inline double stream_fastest_bytes_per_second(std::size_t bytes, int calls = 50) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<float> buf(n, 1.0f);
  return fastest_rate(static_cast<double>(n * sizeof(float)), calls,
                      [&] { benchmark::DoNotOptimize(stream_sum(buf.data(), n)); });
}

/// Bytes per second of stream_sum over a buffer of `bytes` bytes (best of five timed runs of at
/// least 20 ms each).
inline double stream_bytes_per_second(std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<float> buf(n, 1.0f);
  benchmark::DoNotOptimize(stream_sum(buf.data(), n));  // warm
  return best_rate(static_cast<double>(n * sizeof(float)),
                   [&] { benchmark::DoNotOptimize(stream_sum(buf.data(), n)); });
}

/// Times `call` in the benchmark loop and reports bytes, the streaming baseline for the same
/// bytes, and the fraction of it achieved (wall time).
template <class Call>
void run_against_stream(benchmark::State& state, double bytes, Call&& call) {
  call();
  const double stream = stream_bytes_per_second(static_cast<std::size_t>(bytes));
  std::int64_t iters = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
    ++iters;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * iters);
  state.counters["bytes"] = bytes;
  state.counters["stream_GBps"] = stream / 1e9;
  state.counters["frac_of_stream"] =
      secs > 0 ? (bytes * static_cast<double>(iters) / secs) / stream : 0.0;
}

/// A probability row of length v with weights u^3 (u uniform from Philox stream (seed, id)):
/// skewed like a model's row, deterministic, cheap to make.
inline std::vector<float> skewed_row(index_t v, std::uint32_t seed, std::uint32_t id) {
  std::vector<float> row(static_cast<std::size_t>(v));
  double sum = 0;
  for (index_t y = 0; y < v; ++y) {
    const double u =
        uniform_at(request_rng{seed, id, 0}, draw_id{static_cast<std::uint32_t>(y), 0});
    row[static_cast<std::size_t>(y)] = static_cast<float>(u * u * u);
    sum += u * u * u;
  }
  for (float& x : row) x = static_cast<float>(x / sum);
  return row;
}

/// rows x v logits, normal with standard deviation 3 (Philox stream (seed, row), Box-Muller).
inline std::vector<float> normal_logits(index_t rows, index_t v, std::uint64_t seed = 17) {
  std::vector<float> out(static_cast<std::size_t>(rows * v));
  for (index_t r = 0; r < rows; ++r)
    for (index_t y = 0; y < v; ++y) {
      const request_rng rng{seed, static_cast<std::uint32_t>(r), 0};
      const double u1 = uniform_at(rng, draw_id{static_cast<std::uint32_t>(y), 0});
      const double u2 = uniform_at(rng, draw_id{static_cast<std::uint32_t>(y), 1});
      out[static_cast<std::size_t>(r * v + y)] = static_cast<float>(
          3.0 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  return out;
}

}  // namespace specula::bench
