// Batched sampling (sample/sampling.hpp) against the streaming-read baseline, in the same
// process.
//
// Names: sampling/<case>/<impl>/V:<V>/B:<B>
//   case probs        sample_from_probs over B probability rows (fp32)
//        logits_plain sample_from_logits with default parameters (softmax only)
//        logits_full  sample_from_logits with temperature 0.8, top-k 1000, top-p 0.95, min-p 0.02
//        logits_greedy sample_from_logits with every row flagged greedy (argmax)
//   impl fused        the entry point named by the case
//        two_step     (logits cases) logits_to_probs into a B x V buffer, then sample_from_probs
//   V    32000, 128256; B: 1 or 16 rows
//
// Counters: bench/stream_baseline.hpp's bytes (the rows read once), stream_GBps and
// frac_of_stream (the call's bytes per second over a plain streaming read of as many bytes).

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "specula/backend/host.hpp"
#include "specula/core/rng.hpp"
#include "specula/sample/sampling.hpp"
#include "stream_baseline.hpp"

using namespace specula;

namespace {

enum class sample_case { probs, logits_plain, logits_full, logits_greedy };

const char* name_of(sample_case c) {
  switch (c) {
    case sample_case::probs:
      return "probs";
    case sample_case::logits_plain:
      return "logits_plain";
    case sample_case::logits_full:
      return "logits_full";
    case sample_case::logits_greedy:
      return "logits_greedy";
  }
  return "";
}

void sampling_case(benchmark::State& state, sample_case c, bool two_step, index_t v, index_t rows) {
  const std::vector<float> logits = bench::normal_logits(rows, v, 23);
  std::vector<float> probs(logits.size());
  sampling_params full;
  full.temperature = 0.8f;
  full.top_k = 1000;
  full.top_p = 0.95f;
  full.min_p = 0.02f;
  const std::vector<sampling_params> params{c == sample_case::logits_full ? full
                                                                          : sampling_params{}};
  const batch_view<const float> in{logits.data(), rows, v};
  const batch_view<float> out_probs{probs.data(), rows, v};
  logits_to_probs<float>(host::seq, in, {}, params, out_probs);  // the probs case's rows
  std::vector<request_rng> rng;
  for (index_t r = 0; r < rows; ++r) rng.push_back({5, static_cast<std::uint32_t>(r), 0});
  std::vector<token_t> tokens(static_cast<std::size_t>(rows));
  const std::vector<std::uint8_t> greedy(static_cast<std::size_t>(rows), 1);
  std::uint32_t step = 0;
  auto call = [&] {
    for (auto& g : rng) g.step = step;
    ++step;
    if (c == sample_case::probs) {
      sample_from_probs(host::seq, batch_view<const float>{probs.data(), rows, v}, rng, tokens);
    } else if (two_step) {
      logits_to_probs<float>(host::seq, in, {}, params, out_probs);
      sample_from_probs(host::seq, batch_view<const float>{probs.data(), rows, v}, rng, tokens);
    } else {
      sample_from_logits<float>(host::seq, in, params, rng, tokens,
                                c == sample_case::logits_greedy
                                    ? row_view<const std::uint8_t>(greedy.data(), rows)
                                    : row_view<const std::uint8_t>{});
    }
    benchmark::DoNotOptimize(tokens.data());
  };
  bench::run_against_stream(state, 4.0 * static_cast<double>(v * rows), call);
}

int register_sampling() {
  for (const index_t v : {32000, 128256})
    for (const index_t rows : {1, 16})
      for (const sample_case c : {sample_case::probs, sample_case::logits_plain,
                                  sample_case::logits_full, sample_case::logits_greedy})
        for (const bool two_step : {false, true}) {
          if (two_step && (c == sample_case::probs || c == sample_case::logits_greedy)) continue;
          benchmark::RegisterBenchmark(
              (std::string("sampling/") + name_of(c) + "/" + (two_step ? "two_step" : "fused") +
               "/V:" + std::to_string(v) + "/B:" + std::to_string(rows))
                  .c_str(),
              [=](benchmark::State& s) { sampling_case(s, c, two_step, v, rows); })
              ->Unit(benchmark::kMicrosecond);
        }
  return 0;
}

const int registered_sampling = register_sampling();

}  // namespace
