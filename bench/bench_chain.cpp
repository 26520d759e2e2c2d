// Host chain verification against a streaming read of the same bytes.
//
// Every case reports:
//   bytes          bytes the call must touch (see below), per call
//   bytes_per_second (Google Benchmark's rate of `bytes`)
//   stream_GBps    a plain streaming read (sum of floats) of a buffer of exactly `bytes` bytes,
//                  timed in the same process just before the case
//   frac_of_stream achieved bytes/s divided by stream bytes/s: 1.0 means the call runs at the
//                  memory-bandwidth floor for the data it must read
//
// Bytes a call must touch:
//   unchecked: per accepted draft, p(x) and q(x) (8 bytes); at the stopping position of each
//              request either the p and q rows (residual, 8V bytes) or the bonus row p_{L+1}
//              (4V bytes); plus the tokens and outputs (small);
//   checked:   (check_level::reads, the default) the same bytes: the rows are validated as
//              they are read, and p(x), q(x) of each draft the verifier tests just before it
//              uses them.
//
// Scenarios (fix the outcome so bytes are deterministic):
//   accept_all  p = q at every drafted position: every draft is accepted, a bonus is sampled;
//   reject_mid  the draft at position L/2 has p(x) = 0: rejection there, residual sample.
//
// Policies (B > 1 only for all but seq):
//   seq      host::seq
//   par      host::par: the process-wide persistent pool (default_pool), caller included
//   on_pool  host::on(pool) with a host::thread_pool of one thread per hardware thread, built
//            once: the bring-your-own-executor path
//   spawn    host::on(spawn) with an executor that starts its threads per call (one per hardware
//            thread, at most one per task) and joins them: what host::par did before the pool
//   omp      host::on(omp) with an executor over an OpenMP parallel for (builds with OpenMP)
//
// Names: chain/<checked|unchecked>/<policy>/<scenario>/V:<V>/L:<L>/B:<B>;
// chain_policies/<checked|unchecked>/<scenario>/V:<V>/L:<L>/B:<B>: seq, par, on_pool and spawn
// called in turn in every iteration (31), counters <policy>_us (median per call) and
// <policy>_over_seq; chain_mixed_greedy/<checked|unchecked>/seq/<scenario>/V:<V>/L:4/B:16: every
// other request verified greedily in the same call (is_greedy); smoke/chain (tiny case for
// ctest) and stream_read/bytes:<n> (the baseline alone).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#if defined(SPECULA_BENCH_HAVE_OPENMP)
#include <omp.h>
#endif

#include "specula/verify/chain.hpp"
#include "stream_baseline.hpp"

using namespace specula;

namespace {

enum class scenario { accept_all, reject_mid };

enum class policy_kind { seq, par, on_pool, spawn, omp };

/// Starts its threads per call, like host::par before the persistent pool: min(hardware
/// threads, n) threads, each running a contiguous range of the tasks, the caller the first.
struct spawning_executor {
  void bulk(index_t n, host::bulk_task task) {
    const index_t hw = std::max<index_t>(1, std::thread::hardware_concurrency());
    const index_t chunks = std::min(hw, n);
    auto run = [&](index_t c) {
      for (index_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) task(i);
    };
    std::vector<std::thread> threads;
    for (index_t c = 1; c < chunks; ++c) threads.emplace_back(run, c);
    run(0);
    for (auto& t : threads) t.join();
  }
  [[nodiscard]] static index_t concurrency() {
    return std::max<index_t>(1, std::thread::hardware_concurrency());
  }
};

#if defined(SPECULA_BENCH_HAVE_OPENMP)
/// The tasks of a call as one OpenMP parallel for.
struct omp_executor {
  static void bulk(index_t n, host::bulk_task task) {
#pragma omp parallel for schedule(static)
    for (index_t i = 0; i < n; ++i) task(i);
  }
  [[nodiscard]] static index_t concurrency() { return omp_get_max_threads(); }
};
#endif

host::thread_pool& bench_pool() {
  static host::thread_pool pool;
  return pool;
}

/// Calls f(policy) with the policy object of `kind`.
template <class F>
void with_policy(policy_kind kind, F&& f) {
  static spawning_executor spawn;
  switch (kind) {
    case policy_kind::seq:
      f(host::seq);
      break;
    case policy_kind::par:
      f(host::par);
      break;
    case policy_kind::on_pool:
      f(host::on(bench_pool()));
      break;
    case policy_kind::spawn:
      f(host::on(spawn));
      break;
    case policy_kind::omp:
#if defined(SPECULA_BENCH_HAVE_OPENMP)
    {
      static omp_executor omp;
      f(host::on(omp));
    }
#endif
    break;
  }
}

const char* name_of(policy_kind kind) {
  switch (kind) {
    case policy_kind::seq:
      return "seq";
    case policy_kind::par:
      return "par";
    case policy_kind::on_pool:
      return "on_pool";
    case policy_kind::spawn:
      return "spawn";
    case policy_kind::omp:
      return "omp";
  }
  return "?";
}

/// One batch of B requests with L drafts each over vocabulary V, in the flattened layout.
struct chain_fixture {
  index_t vocab, length, batch;
  std::vector<index_t> offsets;
  std::vector<token_t> tokens;
  std::vector<float> draft;
  std::vector<float> target;
  std::vector<request_rng> rng;
  std::vector<token_t> out;
  std::vector<std::int32_t> num_accepted;
  std::vector<std::uint32_t> flags;

  chain_fixture(index_t v, index_t l, index_t b, scenario sc) : vocab(v), length(l), batch(b) {
    // A few distinct rows, copied into place (generation of GB-sized random data would
    // dominate the run).
    constexpr int pool = 4;
    std::vector<std::vector<float>> rows(pool, std::vector<float>(static_cast<std::size_t>(v)));
    for (int k = 0; k < pool; ++k) {
      double sum = 0;
      for (index_t y = 0; y < v; ++y) {
        const double u = uniform_at(request_rng{7, static_cast<std::uint32_t>(k), 0},
                                    draw_id{static_cast<std::uint32_t>(y), 0});
        rows[static_cast<std::size_t>(k)][static_cast<std::size_t>(y)] =
            static_cast<float>(u * u * u);
        sum += u * u * u;
      }
      for (float& x : rows[static_cast<std::size_t>(k)]) x = static_cast<float>(x / sum);
    }
    // Row 3 with token 0 zeroed: the "p(x) = 0" row for reject_mid.
    auto zero_row = rows[0];
    double rest = 0;
    for (std::size_t y = 1; y < zero_row.size(); ++y) rest += zero_row[y];
    zero_row[0] = 0.0f;
    for (std::size_t y = 1; y < zero_row.size(); ++y)
      zero_row[y] = static_cast<float>(zero_row[y] / rest);

    const auto sz = static_cast<std::size_t>(v);
    draft.resize(static_cast<std::size_t>(b * l) * sz);
    target.resize(static_cast<std::size_t>(b * (l + 1)) * sz);
    offsets.push_back(0);
    for (index_t r = 0; r < b; ++r) {
      offsets.push_back(offsets.back() + l);
      for (index_t i = 0; i < l; ++i) {
        const auto& q = rows[static_cast<std::size_t>((r + i) % pool)];
        std::copy(q.begin(), q.end(), draft.begin() + (r * l + i) * v);
        const bool reject_here = sc == scenario::reject_mid && i == l / 2;
        const auto& p = reject_here ? zero_row : q;
        std::copy(p.begin(), p.end(), target.begin() + (r * (l + 1) + i) * v);
        tokens.push_back(0);  // token 0 has positive q in every pool row
      }
      const auto& bonus = rows[static_cast<std::size_t>((r + 1) % pool)];
      std::copy(bonus.begin(), bonus.end(), target.begin() + (r * (l + 1) + l) * v);
      rng.push_back(request_rng{11, static_cast<std::uint32_t>(r), 0});
    }
    out.resize(static_cast<std::size_t>(b * (l + 1)));
    num_accepted.resize(static_cast<std::size_t>(b));
    flags.resize(static_cast<std::size_t>(b));
  }

  [[nodiscard]] chain_batch_input<float> input() const {
    return {vocab,
            offsets,
            tokens,
            {draft.data(), batch * length, vocab},
            {target.data(), batch * (length + 1), vocab},
            rng};
  }
  chain_batch_output output() { return {out, num_accepted, {}, flags}; }

  /// Bytes a call must touch, from the outcome of one call (checked or not: check_level::reads
  /// validates what the verifier reads as it reads it).
  [[nodiscard]] double bytes() const {
    double bytes = 0;
    for (index_t r = 0; r < batch; ++r) {
      const auto n = num_accepted[static_cast<std::size_t>(r)];
      bytes += 8.0 * n;
      bytes += (n == length ? 4.0 : 8.0) * static_cast<double>(vocab);
      bytes += 4.0 * static_cast<double>(length) * 2 + 16;  // tokens, outputs, rng
    }
    return bytes;
  }
};

struct case_spec {
  index_t vocab, length, batch;
  scenario sc;
  bool checked;
  policy_kind policy;
};

std::unique_ptr<chain_fixture> current;
case_spec current_spec{};

chain_fixture& fixture_for(const case_spec& c) {
  if (!current || current_spec.vocab != c.vocab || current_spec.length != c.length ||
      current_spec.batch != c.batch || current_spec.sc != c.sc) {
    current.reset();
    current = std::make_unique<chain_fixture>(c.vocab, c.length, c.batch, c.sc);
    current_spec = c;
  }
  return *current;
}

void run_case(benchmark::State& state, case_spec c) {
  chain_fixture& f = fixture_for(c);
  const auto in = f.input();
  const auto out = f.output();
  auto call = [&] {
    with_policy(c.policy, [&](const auto& pol) {
      if (c.checked)
        verify_chain(pol, in, out);
      else
        verify_chain_unchecked(pol, in, out);
    });
  };
  call();
  const double bytes = f.bytes();
  bench::run_against_stream(state, bytes, call);
  state.counters["accepted_mean"] =
      static_cast<double>(std::accumulate(f.num_accepted.begin(), f.num_accepted.end(), 0)) /
      static_cast<double>(c.batch);
}

/// Greedy and sampled requests in one call (chain_batch_input::is_greedy, vLLM's mask): every
/// other request greedy, on the calling thread. Bytes: a sampled request's as in run_case; a
/// greedy one reads its target rows through the argmax up to its stopping position ((accepted
/// + 1) rows of 4V bytes), and a checked call validates all its L + 1 target rows in full.
void mixed_greedy_case(benchmark::State& state, case_spec c) {
  chain_fixture& f = fixture_for(c);
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(c.batch));
  for (std::size_t r = 0; r < mask.size(); ++r) mask[r] = static_cast<std::uint8_t>(r % 2);
  auto in = f.input();
  in.is_greedy = mask;
  const auto out = f.output();
  auto call = [&] {
    if (c.checked)
      verify_chain(host::seq, in, out);
    else
      verify_chain_unchecked(host::seq, in, out);
  };
  call();
  const auto V = static_cast<double>(c.vocab);
  double bytes = 0;
  for (index_t r = 0; r < c.batch; ++r) {
    const auto n = f.num_accepted[static_cast<std::size_t>(r)];
    bytes += 4.0 * static_cast<double>(c.length) * 2 + 16;  // tokens, outputs, rng
    if (mask[static_cast<std::size_t>(r)] != 0) {
      bytes += 4.0 * V * static_cast<double>(c.checked ? c.length + 1 : n + 1);
      continue;
    }
    bytes += 8.0 * n + (n == c.length ? 4.0 : 8.0) * V;
  }
  bench::run_against_stream(state, bytes, call);
  state.counters["accepted_mean"] =
      static_cast<double>(std::accumulate(f.num_accepted.begin(), f.num_accepted.end(), 0)) /
      static_cast<double>(c.batch);
}

/// Side by side: each iteration calls seq, par, on_pool and spawn once each, in turn, so that
/// the four see the same machine load; reports the median time per call of each (µs) and the
/// ratios to seq. (The OpenMP executor is left out: libgomp's threads spin after a region and
/// would slow the calls that follow it.)
void interleaved_case(benchmark::State& state, case_spec c) {
  chain_fixture& f = fixture_for(c);
  const auto in = f.input();
  const auto out = f.output();
  const std::vector<policy_kind> kinds{policy_kind::seq, policy_kind::par, policy_kind::on_pool,
                                       policy_kind::spawn};
  std::vector<std::vector<double>> samples(kinds.size());
  auto call = [&](policy_kind k) {
    with_policy(k, [&](const auto& pol) {
      if (c.checked)
        verify_chain(pol, in, out);
      else
        verify_chain_unchecked(pol, in, out);
    });
  };
  for (const auto k : kinds) call(k);  // warm-up: starts the pools
  for (auto _ : state) {
    double total = 0.0;
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      call(kinds[k]);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      samples[k].push_back(s);
      total += s;
    }
    state.SetIterationTime(total);
  }
  std::vector<double> median(kinds.size());
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    auto& v = samples[k];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    median[k] = v[v.size() / 2];
    state.counters[std::string(name_of(kinds[k])) + "_us"] = 1e6 * median[k];
  }
  for (std::size_t k = 1; k < kinds.size(); ++k)
    state.counters[std::string(name_of(kinds[k])) + "_over_seq"] = median[k] / median[0];
}

void stream_case(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  for (auto _ : state) benchmark::DoNotOptimize(bench::stream_sum(buf.data(), n));
  state.SetBytesProcessed(static_cast<std::int64_t>(n * sizeof(float)) * state.iterations());
}

std::string name_of(const case_spec& c) {
  return std::string("chain/") + (c.checked ? "checked/" : "unchecked/") + name_of(c.policy) + "/" +
         (c.sc == scenario::accept_all ? "accept_all" : "reject_mid") +
         "/V:" + std::to_string(c.vocab) + "/L:" + std::to_string(c.length) +
         "/B:" + std::to_string(c.batch);
}

int register_all() {
  benchmark::RegisterBenchmark("smoke/chain/V:1024/L:4/B:2", run_case,
                               case_spec{1024, 4, 2, scenario::reject_mid, true, policy_kind::seq});
  std::vector<policy_kind> policies{policy_kind::seq, policy_kind::par, policy_kind::on_pool,
                                    policy_kind::spawn};
#if defined(SPECULA_BENCH_HAVE_OPENMP)
  policies.push_back(policy_kind::omp);
#endif
  for (index_t v : {16384, 32000, 128256})
    for (index_t l : {1, 4, 8, 64})
      for (index_t b : {1, 16, 64})
        for (scenario sc : {scenario::accept_all, scenario::reject_mid})
          for (bool checked : {false, true})
            for (policy_kind pk : policies) {
              if (pk != policy_kind::seq && b == 1) continue;  // nothing to split
              // Checked residual cases: on the calling thread only.
              if (checked && sc == scenario::reject_mid && pk != policy_kind::seq) continue;
              // B = 64: the scaling cases, unchecked, short and medium chains, V <= 32000.
              if (b == 64 && (checked || v > 32000 || l > 8 || l == 4)) continue;
              const case_spec c{v, l, b, sc, checked, pk};
              benchmark::RegisterBenchmark(name_of(c).c_str(), run_case, c)
                  ->Unit(benchmark::kMicrosecond);
            }
  // Side-by-side policy comparisons (see interleaved_case).
  for (index_t v : {16384, 32000, 128256})
    for (index_t l : {1, 8})
      for (index_t b : {4, 16, 64})
        for (scenario sc : {scenario::accept_all, scenario::reject_mid})
          for (bool checked : {false, true}) {
            if (checked && sc == scenario::reject_mid) continue;
            if (v == 128256 && b == 64) continue;
            const case_spec c{v, l, b, sc, checked, policy_kind::seq};
            const std::string name =
                std::string("chain_policies/") + (checked ? "checked/" : "unchecked/") +
                (sc == scenario::accept_all ? "accept_all" : "reject_mid") +
                "/V:" + std::to_string(v) + "/L:" + std::to_string(l) + "/B:" + std::to_string(b);
            benchmark::RegisterBenchmark(name.c_str(), interleaved_case, c)
                ->Iterations(31)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
          }
  // Greedy and sampled requests in one call, beside chain/<...>/seq/<scenario>/V/L:4/B:16.
  for (index_t v : {32000, 128256})
    for (scenario sc : {scenario::accept_all, scenario::reject_mid})
      for (bool checked : {false, true}) {
        const case_spec c{v, 4, 16, sc, checked, policy_kind::seq};
        const std::string name = std::string("chain_mixed_greedy/") +
                                 (checked ? "checked/" : "unchecked/") + "seq/" +
                                 (sc == scenario::accept_all ? "accept_all" : "reject_mid") +
                                 "/V:" + std::to_string(v) + "/L:4/B:16";
        benchmark::RegisterBenchmark(name.c_str(), mixed_greedy_case, c)
            ->Unit(benchmark::kMicrosecond);
      }
  // The checked entry points' shared-stream check alone (distinct streams: the whole scan),
  // to set against the checked calls above at the same B.
  for (index_t b : {16, 64, 256, 1024, 4096})
    benchmark::RegisterBenchmark(
        ("streams/find_shared_stream/B:" + std::to_string(b)).c_str(),
        [](benchmark::State& state, index_t batch) {
          std::vector<request_rng> rng;
          for (index_t r = 0; r < batch; ++r)
            rng.push_back(request_rng{11, static_cast<std::uint32_t>(r), 0});
          for (auto _ : state) {
            auto pair = detail::find_shared_stream(rng);
            benchmark::DoNotOptimize(pair);
          }
        },
        b)
        ->Unit(benchmark::kMicrosecond);
  for (std::int64_t bytes :
       {std::int64_t{1} << 16, std::int64_t{1} << 20, std::int64_t{1} << 24, std::int64_t{1} << 28})
    benchmark::RegisterBenchmark(("stream_read/bytes:" + std::to_string(bytes)).c_str(),
                                 stream_case)
        ->Arg(bytes)
        ->Unit(benchmark::kMicrosecond);
  return 0;
}

const int registered = register_all();

}  // namespace
