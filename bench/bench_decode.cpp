// Decoding loops end to end on the shipped text models, batched against one request at a time:
// B requests (different prompts and seeds) of 32 new tokens each.
//
// decode/<method>/<batched|serial>/B:<B>
//   batched: one *_decode_batch call on a transformer_batch (the requests' passes shared);
//   serial:  B single-request calls on one transformer_session.
//   <method>: sjd_pac (SJD-PAC, L = 16, K = 3, D = 1) or sd (draft-model SD, 4 drafts; the
//   draft model's passes are counted too).
// Bytes a run must touch: every fp32 weight of the model once per forward pass the run makes
// (the decode floor of a memory-bound model), summed over target and draft passes. Counters:
// tokens_per_s (generated tokens per second), passes (forward passes per run).

#include <benchmark/benchmark.h>

#if defined(SPECULA_BENCH_HAVE_TRANSFORMER)

#include <filesystem>
#include <string>
#include <vector>

#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula_example/sessions.hpp>

#include "stream_baseline.hpp"

using namespace specula;
using namespace specula::example;

namespace {

const transformer& model(const char* name) {
  static const transformer target =
      transformer::load(std::filesystem::path(SPECULA_MODELS_DIR) / "text-target.safetensors");
  static const transformer draft =
      transformer::load(std::filesystem::path(SPECULA_MODELS_DIR) / "text-draft.safetensors");
  return std::string(name) == "draft" ? draft : target;
}

std::vector<std::vector<token_t>> prompts(index_t n) {
  static const char* texts[] = {"import os\n",     "def __init__(self",        "    return ",
                                "class ",          "for i in range(",          "# Copyright ",
                                "if __name__ == ", "        raise ValueError("};
  std::vector<std::vector<token_t>> p;
  for (index_t i = 0; i < n; ++i) {
    const std::string s = texts[i % 8];
    p.emplace_back(s.begin(), s.end());
  }
  return p;
}

std::vector<request_rng> rngs(index_t n) {
  std::vector<request_rng> r;
  for (index_t i = 0; i < n; ++i) r.push_back({7, static_cast<std::uint32_t>(i), 0});
  return r;
}

constexpr index_t new_tokens = 32;

void bm_decode(benchmark::State& state, bool sd, bool batched) {
  const auto B = static_cast<index_t>(state.range(0));
  const transformer& target_model = model("target");
  const transformer& draft_model = model("draft");
  const auto p = prompts(B);
  const auto r = rngs(B);
  sjd_options so = sjd_options::sjd_pac(16, 3, 1);
  so.max_new_tokens = new_tokens;
  speculative_options po;
  po.draft_length = 4;
  po.max_new_tokens = new_tokens;
  transformer_batch target_batch(target_model, B), draft_batch(draft_model, B);
  transformer_session target(target_model), draft(draft_model);
  std::vector<decode_stats> st(static_cast<std::size_t>(B));
  index_t target_passes = 0, draft_passes = 0;
  const auto run = [&] {
    for (auto& s : st) s = {};
    if (batched) {
      if (sd)
        benchmark::DoNotOptimize(
            speculative_decode_batch(target_batch, draft_batch, p, po, r, tree_verifier<>{}, st));
      else
        benchmark::DoNotOptimize(sjd_decode_batch(target_batch, p, so, r, {}, st));
    } else {
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (sd)
          benchmark::DoNotOptimize(
              speculative_decode(target, draft, p[i], po, r[i], tree_verifier<>{}, &st[i]));
        else
          benchmark::DoNotOptimize(sjd_decode(target, p[i], so, r[i], {}, &st[i]));
      }
    }
    // Passes the run made: shared passes count once when batched.
    target_passes = draft_passes = 0;
    for (const auto& s : st) {
      target_passes =
          batched ? std::max(target_passes, s.target_forwards) : target_passes + s.target_forwards;
      draft_passes =
          batched ? std::max(draft_passes, s.draft_forwards) : draft_passes + s.draft_forwards;
    }
  };
  run();
  const double bytes =
      4.0 * (static_cast<double>(target_model.weights().parameters() * target_passes) +
             static_cast<double>(draft_model.weights().parameters() * draft_passes));
  bench::run_against_stream(state, bytes, run);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(B * new_tokens) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["passes"] = static_cast<double>(target_passes + draft_passes);
}

void register_all() {
  for (const bool sd : {false, true})
    for (const bool batched : {true, false}) {
      const std::string name =
          std::string("decode/") + (sd ? "sd/" : "sjd_pac/") + (batched ? "batched" : "serial");
      benchmark::RegisterBenchmark(
          name.c_str(), [sd, batched](benchmark::State& s) { bm_decode(s, sd, batched); })
          ->ArgNames({"B"})
          ->Arg(1)
          ->Arg(4)
          ->Arg(16)
          ->Unit(benchmark::kMillisecond);
    }
}

const int registered = (register_all(), 0);

}  // namespace

#endif  // SPECULA_BENCH_HAVE_TRANSFORMER
