// Host logits -> probabilities (sample/transforms.hpp): softmax alone against top-k, top-p,
// min-p and the full pipeline, by selection (the library) and by sorting (the previous
// implementation, kept as specula::testing::reference_logits_to_probs), in the same process.
//
// Names: transforms/<case>/<impl>/V:<V>/B:<B>
//   case    softmax (no filter), top_k (k = 50), top_p (0.9), min_p (0.05),
//           full (temperature 0.8, top-k 1000, top-p 0.95, min-p 0.02)
//   impl    select: logits_to_probs(host::seq, ...) over the B rows (fp32)
//           select_bf16: the same over bf16 logits (the probabilities are fp32)
//           sort: the previous in-place pipeline (top-k by nth_element on a copy, top-p by
//           sorting a copy), per row, on a copy of the row (it overwrites its input)
//   V       32000, 128256, 256000; B: 1 or 16 rows
// Logits: normal with standard deviation 3 (Philox, Box-Muller), a different row per b.
//
// Counters (besides bench/stream_baseline.hpp's bytes, stream_GBps, frac_of_stream; bytes are
// the logits read once plus the fp32 probabilities written once):
//   call_us       median of 7 (3 for sort) timed calls, interleaved with ...
//   softmax_us    ... the median of as many timed softmax-only calls on the same rows
//                 (logits_to_probs with default parameters), run in turn with them; both in
//                 CPU time of the thread (the machine the numbers were taken on is shared)
//   over_softmax  call_us / softmax_us: the cost of the case in units of softmax alone
//
// chain_logits/<fused|unfused>/V:<V>/B:<B>: chain verification from logits, B requests of L = 8
// drafts with dense draft logits (target logits: the draft's plus normal noise of standard
// deviation 0.5, so that about half the drafts are accepted), top-k 50 and top-p 0.9 on both:
//   fused      verify_chain_from_logits (each row transformed when the verifier first reads it)
//   unfused    logits_to_probs on every draft and target row, then verify_chain (checked)
// Counters: call_us (median CPU time of 7 calls, interleaved with the other variant's),
// accepted_mean.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "specula/core/float16.hpp"
#include "specula/core/rng.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/testing/reference_transforms.hpp"
#include "specula/verify/chain_logits.hpp"
#include "stream_baseline.hpp"

using namespace specula;

namespace {

enum class filter { softmax, top_k, top_p, min_p, full };
enum class impl { select, select_bf16, sort };

const char* name_of(filter f) {
  switch (f) {
    case filter::softmax:
      return "softmax";
    case filter::top_k:
      return "top_k";
    case filter::top_p:
      return "top_p";
    case filter::min_p:
      return "min_p";
    case filter::full:
      return "full";
  }
  return "";
}

const char* name_of(impl i) {
  switch (i) {
    case impl::select:
      return "select";
    case impl::select_bf16:
      return "select_bf16";
    case impl::sort:
      return "sort";
  }
  return "";
}

sampling_params params_of(filter f) {
  sampling_params sp;
  switch (f) {
    case filter::softmax:
      break;
    case filter::top_k:
      sp.top_k = 50;
      break;
    case filter::top_p:
      sp.top_p = 0.9f;
      break;
    case filter::min_p:
      sp.min_p = 0.05f;
      break;
    case filter::full:
      sp.temperature = 0.8f;
      sp.top_k = 1000;
      sp.top_p = 0.95f;
      sp.min_p = 0.02f;
      break;
  }
  return sp;
}

/// Microseconds of CPU time of the calling thread (time spent descheduled on a busy machine does
/// not count).
double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) * 1e-3;
}

template <class Call>
double time_us(Call&& call) {
  const double t0 = thread_cpu_us();
  call();
  benchmark::ClobberMemory();
  return thread_cpu_us() - t0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void transforms_case(benchmark::State& state, filter f, impl which, index_t v, index_t rows) {
  const std::vector<float> logits = bench::normal_logits(rows, v);
  std::vector<bfloat16> logits_bf16;
  for (const float x : logits) logits_bf16.push_back(from_float<bfloat16>(x));
  std::vector<float> probs(logits.size()), work(static_cast<std::size_t>(v)),
      scratch(static_cast<std::size_t>(v));
  const std::vector<sampling_params> params = {params_of(f)};
  const std::vector<sampling_params> plain = {sampling_params{}};
  const batch_view<float> out{probs.data(), rows, v};
  const batch_view<const float> in{logits.data(), rows, v};

  auto call = [&] {
    switch (which) {
      case impl::select:
        logits_to_probs<float>(host::seq, in, {}, params, out);
        break;
      case impl::select_bf16:
        logits_to_probs<bfloat16>(
            host::seq, batch_view<const bfloat16>{logits_bf16.data(), rows, v}, {}, params, out);
        break;
      case impl::sort:
        for (index_t r = 0; r < rows; ++r) {
          const auto row = logits.begin() + r * v;
          std::copy(row, row + v, work.begin());
          testing::reference_logits_to_probs(
              params[0], work, {},
              std::span<float>(probs.data() + r * v, static_cast<std::size_t>(v)), scratch);
        }
        break;
    }
    benchmark::DoNotOptimize(probs.data());
  };
  auto softmax_only = [&] { logits_to_probs<float>(host::seq, in, {}, plain, out); };

  const double in_bytes = which == impl::select_bf16 ? 2.0 : 4.0;
  const double bytes = (in_bytes + 4.0) * static_cast<double>(v) * static_cast<double>(rows);
  bench::run_against_stream(state, bytes, call);

  std::vector<double> call_us, softmax_us;
  const int reps = which == impl::sort ? 3 : 7;
  for (int k = 0; k < reps; ++k) {
    call_us.push_back(time_us(call));
    softmax_us.push_back(time_us(softmax_only));
  }
  state.counters["call_us"] = median(call_us);
  state.counters["softmax_us"] = median(softmax_us);
  state.counters["over_softmax"] = median(call_us) / median(softmax_us);
}

void chain_logits_case(benchmark::State& state, bool fused, index_t v, index_t batch) {
  constexpr index_t length = 8;
  const index_t drafts = batch * length;
  const std::vector<float> draft = bench::normal_logits(drafts, v);
  const std::vector<float> noise = bench::normal_logits(drafts + batch, v);
  std::vector<float> target(static_cast<std::size_t>((drafts + batch) * v));
  std::vector<index_t> offsets = {0};
  std::vector<token_t> tokens;
  for (index_t b = 0; b < batch; ++b) {
    offsets.push_back(offsets.back() + length);
    for (index_t i = 0; i <= length; ++i) {
      const index_t row = b * (length + 1) + i;
      for (index_t y = 0; y < v; ++y) {
        const auto at = static_cast<std::size_t>(row * v + y);
        const float base = i < length ? draft[static_cast<std::size_t>((b * length + i) * v + y)]
                                      : noise[at] * 3.0f;
        target[at] = base + (i < length ? 0.5f / 3.0f * noise[at] : 0.0f);
      }
    }
    for (index_t i = 0; i < length; ++i) {  // the draft's arg max: kept by top-k and top-p
      const float* row = draft.data() + (b * length + i) * v;
      tokens.push_back(static_cast<token_t>(std::max_element(row, row + v) - row));
    }
  }
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b)
    rng.push_back(request_rng{3, static_cast<std::uint32_t>(b), 0});
  sampling_params sp;
  sp.top_k = 50;
  sp.top_p = 0.9f;
  const std::vector<sampling_params> params = {sp};
  std::vector<token_t> out(static_cast<std::size_t>(drafts + batch));
  std::vector<std::int32_t> num(static_cast<std::size_t>(batch));
  std::vector<float> q_probs(draft.size()), p_probs(target.size());
  const chain_batch_output o{out, num, {}, {}};
  const chain_logits_input<float> in{v,
                                     offsets,
                                     tokens,
                                     {draft.data(), drafts, v},
                                     {},
                                     params,
                                     {target.data(), drafts + batch, v},
                                     {},
                                     params,
                                     rng};
  auto run_fused = [&] { verify_chain_from_logits(host::seq, in, o); };
  auto run_unfused = [&] {
    logits_to_probs<float>(host::seq, {draft.data(), drafts, v}, {}, params,
                           {q_probs.data(), drafts, v});
    logits_to_probs<float>(host::seq, {target.data(), drafts + batch, v}, {}, params,
                           {p_probs.data(), drafts + batch, v});
    verify_chain(host::seq,
                 chain_batch_input<float>{v,
                                          offsets,
                                          tokens,
                                          {q_probs.data(), drafts, v},
                                          {p_probs.data(), drafts + batch, v},
                                          rng},
                 o);
  };
  for (auto _ : state) fused ? run_fused() : run_unfused();
  std::vector<double> call_us;
  for (int k = 0; k < 7; ++k) {
    call_us.push_back(
        time_us(fused ? std::function<void()>(run_fused) : std::function<void()>(run_unfused)));
    (void)time_us(fused ? std::function<void()>(run_unfused) : std::function<void()>(run_fused));
  }
  state.counters["call_us"] = median(call_us);
  double acc = 0;
  for (auto a : num) acc += a;
  state.counters["accepted_mean"] = acc / static_cast<double>(batch);
}

int register_all() {
  for (const index_t v : {32000, 128256})
    for (const index_t rows : {1, 16})
      for (const bool fused : {true, false})
        benchmark::RegisterBenchmark(
            (std::string("chain_logits/") + (fused ? "fused" : "unfused") +
             "/V:" + std::to_string(v) + "/B:" + std::to_string(rows))
                .c_str(),
            [=](benchmark::State& s) { chain_logits_case(s, fused, v, rows); })
            ->Unit(benchmark::kMicrosecond);
  for (const index_t v : {32000, 128256, 256000})
    for (const index_t rows : {1, 16})
      for (const filter f :
           {filter::softmax, filter::top_k, filter::top_p, filter::min_p, filter::full})
        for (const impl which : {impl::select, impl::select_bf16, impl::sort}) {
          if (which == impl::select_bf16 && f != filter::full && f != filter::softmax) continue;
          benchmark::RegisterBenchmark(
              (std::string("transforms/") + name_of(f) + "/" + name_of(which) +
               "/V:" + std::to_string(v) + "/B:" + std::to_string(rows))
                  .c_str(),
              [=](benchmark::State& s) { transforms_case(s, f, which, v, rows); })
              ->Unit(benchmark::kMicrosecond);
        }
  return 0;
}

const int registered = register_all();

}  // namespace
