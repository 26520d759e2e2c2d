// Load: many long requests through the batched decoding loops on a toy model whose evaluation is
// one row copy per node (testing::toy_markov_session, V = 32), so the loops' own overhead —
// drafting, verification, bookkeeping, the batch driver — is what is measured.
//
// decode_load/<sd|sjd_pac>/<batched|serial>/B:<B>/N:<N>
//   batched: one speculative_decode_batch / sjd_decode_batch call over B requests of N tokens
//            (session_batch of B toy sessions);
//   serial:  the same B requests one after the other with the single-request loop.
//   sd: draft-model SD with 4 sampled drafts (the draft another toy Markov model);
//   sjd_pac: SJD with Adaptive Continuation and Proactive Drafting (L = 16, K = 3, D = 1).
// Counters: tokens_per_s; peak_rss_mb (the process's peak resident set so far, getrusage);
// state_kb_per_request (each request's model caches after the run: committed tokens).
//
// The full load (B = N = 1024) is decode_load/.../B:1024/N:1024; the smoke filter runs none of
// these (bench.smoke stays cheap).

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstdint>
#include <vector>

#include <specula/decode/batch.hpp>
#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/testing/toy_models.hpp>

using namespace specula;
using specula::testing::toy_markov_session;

namespace {

constexpr index_t vocab = 32;

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::vector<std::vector<token_t>> load_prompts(index_t B) {
  std::vector<std::vector<token_t>> p;
  for (index_t r = 0; r < B; ++r)
    p.push_back({static_cast<token_t>(r % vocab), static_cast<token_t>((7 * r + 3) % vocab)});
  return p;
}
std::vector<request_rng> load_rngs(index_t B) {
  std::vector<request_rng> r;
  for (index_t i = 0; i < B; ++i) r.push_back({11, static_cast<std::uint32_t>(i), 0});
  return r;
}

speculative_options sd_options(index_t n) {
  speculative_options o;
  o.draft_length = 4;
  o.max_new_tokens = n;
  return o;
}
sjd_options pac_options(index_t n) {
  sjd_options o;
  o.window = 16;
  o.max_new_tokens = n;
  o.adaptive_continuation = true;
  o.proactive_drafting = true;
  o.pd_width = 3;
  o.pd_depth = 1;
  return o;
}

void bm_load(benchmark::State& state, bool sd, bool batched) {
  const auto B = static_cast<index_t>(state.range(0));
  const auto N = static_cast<index_t>(state.range(1));
  const toy_markov_session target(vocab, 1), draft(vocab, 2);
  const auto prompts = load_prompts(B);
  const auto rngs = load_rngs(B);
  std::int64_t tokens = 0;
  double state_bytes = 0.0;
  for (auto _ : state) {
    session_batch<toy_markov_session> tb(std::vector<toy_markov_session>(B, target));
    session_batch<toy_markov_session> db(std::vector<toy_markov_session>(B, draft));
    if (batched) {
      const auto out = sd ? speculative_decode_batch(tb, db, prompts, sd_options(N), rngs)
                          : sjd_decode_batch(tb, prompts, pac_options(N), rngs);
      for (const auto& o : out) tokens += static_cast<std::int64_t>(o.size());
    } else {
      for (index_t r = 0; r < B; ++r) {
        const auto i = static_cast<std::size_t>(r);
        const auto out = sd ? speculative_decode(tb.session(r), db.session(r), prompts[i],
                                                 sd_options(N), rngs[i])
                            : sjd_decode(tb.session(r), prompts[i], pac_options(N), rngs[i]);
        tokens += static_cast<std::int64_t>(out.size());
      }
    }
    state_bytes = 0.0;
    for (index_t r = 0; r < B; ++r)
      state_bytes += static_cast<double>(tb.session(r).capacity_bytes() +
                                         (sd ? db.session(r).capacity_bytes() : 0));
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["peak_rss_mb"] = peak_rss_mb();
  state.counters["state_kb_per_request"] = state_bytes / 1024.0 / static_cast<double>(B);
}

void load_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "N"})->Args({64, 256})->Args({1024, 1024});
  b->Unit(benchmark::kMillisecond)->Iterations(1);
}

}  // namespace

BENCHMARK_CAPTURE(bm_load, sd_batched, true, true)
    ->Name("decode_load/sd/batched")
    ->Apply(load_args);
BENCHMARK_CAPTURE(bm_load, sd_serial, true, false)->Name("decode_load/sd/serial")->Apply(load_args);
BENCHMARK_CAPTURE(bm_load, sjd_pac_batched, false, true)
    ->Name("decode_load/sjd_pac/batched")
    ->Apply(load_args);
BENCHMARK_CAPTURE(bm_load, sjd_pac_serial, false, false)
    ->Name("decode_load/sjd_pac/serial")
    ->Apply(load_args);
