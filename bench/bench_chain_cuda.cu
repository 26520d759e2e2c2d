// Device chain verification against a device-to-device copy of the same bytes.
//
// Names: cuda_chain/<scenario>/V:<V>/n:<n>/B:<B> (fp32 rows, dense q), scenarios as on the host
// (bench/bench_chain.cpp): accept_all (p = q, bonus row sampled) and reject_mid (rejection at
// n/2, residual sampled). Counters: bytes (must touch: 8 bytes per accepted draft plus 4V for
// a bonus row or 8V for a residual, per request), copy_GBps (cudaMemcpyAsync device to device
// of bytes/2 bytes, counting its reads and writes, timed with CUDA events in the same process,
// L2 flushed before every timed launch), frac_of_copy (1: the copy's bandwidth).
// cuda_chain_split/reject_mid/V:128256/n:8/B:<B>/S:<1|auto>: one CTA per request against the
// automatic row split (several CTAs sum the stopping row; the crossover measurement).
// cuda_chain_<fused|unfused>/<bf16|f32>/V/n/B: verification from logits (top-k 50, top-p 0.9,
// rejection at n/2), fused (verify_chain_from_logits_async) or logits_to_probs_async followed by
// verify_chain_async; bytes = the logit rows up to the rejection read once plus one q row.
// Timing: CUDA events around each launch, reported with manual time. Without a GPU every case
// is skipped with "no CUDA device".

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_bench_util.cuh"
#include "specula/cuda/chain.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/fused.cuh"

using namespace specula;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

using specula::bench::device_buffer;

using specula::bench::skewed_row;
using specula::bench::upload;

void chain_case(benchmark::State& state, index_t vocab, index_t n, index_t batch, bool reject,
                int split = 1) {
  if (sc::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  // Host data: a skewed row used for every q row; p = q, or p with token 0 removed at n/2.
  const std::vector<float> row = skewed_row(vocab, 7);
  std::vector<float> zero_row = row;
  zero_row[0] = 0.0f;
  double rest = 0;
  for (float x : zero_row) rest += x;
  for (float& x : zero_row) x = static_cast<float>(x / rest);

  std::vector<index_t> offsets{0};
  std::vector<token_t> tokens;
  std::vector<float> q, p;
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b) {
    offsets.push_back(offsets.back() + n);
    for (index_t i = 0; i < n; ++i) {
      tokens.push_back(0);
      q.insert(q.end(), row.begin(), row.end());
      const auto& pi = reject && i == n / 2 ? zero_row : row;
      p.insert(p.end(), pi.begin(), pi.end());
    }
    p.insert(p.end(), row.begin(), row.end());
    rng.push_back(request_rng{11, static_cast<std::uint32_t>(b), 0});
  }
  const index_t nd = batch * n;
  device_buffer d_off(offsets.size() * sizeof(index_t)), d_tok(tokens.size() * sizeof(token_t)),
      d_q(q.size() * sizeof(float)), d_p(p.size() * sizeof(float)),
      d_rng(rng.size() * sizeof(request_rng)),
      d_out(static_cast<std::size_t>(nd + batch) * sizeof(token_t)),
      d_n(static_cast<std::size_t>(batch) * sizeof(std::int32_t));
  upload(d_off, offsets);
  upload(d_tok, tokens);
  upload(d_q, q);
  upload(d_p, p);
  upload(d_rng, rng);
  const chain_batch_input<float> in{vocab,
                                    {d_off.as<index_t>(), batch + 1},
                                    {d_tok.as<token_t>(), nd},
                                    {d_q.as<float>(), nd, vocab},
                                    {d_p.as<float>(), nd + batch, vocab},
                                    {d_rng.as<request_rng>(), batch}};
  const chain_batch_output out{
      {d_out.as<token_t>(), nd + batch}, {d_n.as<std::int32_t>(), batch}, {}, {}};
  device_buffer ws(sc::chain_workspace_bytes(batch, vocab));
  const auto pol = sc::par_on(nullptr)
                       .with_workspace(ws.ptr, sc::chain_workspace_bytes(batch, vocab))
                       .with_row_split(split);
  auto launch = [&] { return sc::verify_chain_async(pol, in, out); };
  if (!specula::bench::warm_up(state, launch)) return;
  std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
  cudaMemcpy(accepted.data(), d_n.ptr, accepted.size() * sizeof(std::int32_t),
             cudaMemcpyDeviceToHost);
  double bytes = 0;
  for (auto a : accepted) bytes += 8.0 * a + (a == n ? 4.0 : 8.0) * static_cast<double>(vocab);

  specula::bench::time_against_copy(state, bytes, launch);
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(x);
  else
    return x;
}

/// Fused (logits -> verify) or unfused (logits_to_probs, then verify) chain verification from
/// logits of type T with top-k 50 and top-p 0.9, rejection at n/2 (the residual is sampled).
template <class T>
void fused_case(benchmark::State& state, index_t vocab, index_t n, index_t batch, bool fused) {
  if (sc::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  // q: the skewed row; logits: 2 log q (so the target sharpens the draft).
  const std::vector<float> q = skewed_row(vocab, 7);
  std::vector<T> logit_row(static_cast<std::size_t>(vocab));
  for (index_t y = 0; y < vocab; ++y)
    logit_row[static_cast<std::size_t>(y)] =
        from_float<T>(2.0f * std::log(q[static_cast<std::size_t>(y)] + 1e-30f));
  const index_t nd = batch * n, rows = nd + batch;
  std::vector<index_t> offsets{0};
  std::vector<token_t> tokens;
  std::vector<request_rng> rng;
  // Drafts: the arg-max token (kept by top-k/top-p, so accepted) except a low-probability token
  // at n/2 (filtered out: p(x) = 0, so rejected and the residual is sampled).
  token_t top = 0;
  for (index_t y = 0; y < vocab; ++y)
    if (static_cast<float>(logit_row[static_cast<std::size_t>(y)]) >
        static_cast<float>(logit_row[static_cast<std::size_t>(top)]))
      top = static_cast<token_t>(y);
  for (index_t b = 0; b < batch; ++b) {
    offsets.push_back(offsets.back() + n);
    for (index_t i = 0; i < n; ++i) tokens.push_back(i == n / 2 ? (top == 0 ? 1 : 0) : top);
    rng.push_back(request_rng{11, static_cast<std::uint32_t>(b), 0});
  }
  std::vector<T> logits;
  logits.reserve(static_cast<std::size_t>(rows * vocab));
  for (index_t r = 0; r < rows; ++r)
    logits.insert(logits.end(), logit_row.begin(), logit_row.end());
  std::vector<float> qs;
  qs.reserve(static_cast<std::size_t>(nd * vocab));
  for (index_t r = 0; r < nd; ++r) qs.insert(qs.end(), q.begin(), q.end());
  const sampling_params params{1.0f, 50, 0.9f, 0.0f, 1.0f};
  device_buffer d_off(offsets.size() * sizeof(index_t)), d_tok(tokens.size() * sizeof(token_t)),
      d_q(qs.size() * sizeof(float)), d_l(logits.size() * sizeof(T)),
      d_rng(rng.size() * sizeof(request_rng)), d_par(sizeof(sampling_params)),
      d_out(static_cast<std::size_t>(rows) * sizeof(token_t)),
      d_n(static_cast<std::size_t>(batch) * sizeof(std::int32_t)),
      d_probs(fused ? 1 : static_cast<std::size_t>(rows * vocab) * sizeof(float)),
      ws(sc::fused_chain_workspace_bytes(rows));
  upload(d_off, offsets);
  upload(d_tok, tokens);
  upload(d_q, qs);
  upload(d_l, logits);
  upload(d_rng, rng);
  upload(d_par, std::vector<sampling_params>{params});
  const batch_view<const T> lg{d_l.as<T>(), rows, vocab};
  const row_view<const sampling_params> par{d_par.as<sampling_params>(), 1};
  const chain_batch_output out{
      {d_out.as<token_t>(), rows}, {d_n.as<std::int32_t>(), batch}, {}, {}};
  const sc::fused_chain_input<T> fin{vocab,
                                     {d_off.as<index_t>(), batch + 1},
                                     {d_tok.as<token_t>(), nd},
                                     {d_q.as<float>(), nd, vocab},
                                     lg,
                                     {},
                                     par,
                                     {d_rng.as<request_rng>(), batch}};
  const chain_batch_input<float> uin{vocab,
                                     {d_off.as<index_t>(), batch + 1},
                                     {d_tok.as<token_t>(), nd},
                                     {d_q.as<float>(), nd, vocab},
                                     {d_probs.as<float>(), rows, vocab},
                                     {d_rng.as<request_rng>(), batch}};
  const auto pol =
      sc::par_on(nullptr).with_workspace(ws.ptr, sc::fused_chain_workspace_bytes(rows));
  auto launch = [&]() -> cudaError_t {
    if (fused) return sc::verify_chain_from_logits_async(pol, fin, out);
    if (const cudaError_t e =
            sc::logits_to_probs_async<T>(pol, lg, {}, par, {d_probs.as<float>(), rows, vocab});
        e != cudaSuccess)
      return e;
    return sc::verify_chain_async(pol, uin, out);
  };
  if (!specula::bench::warm_up(state, launch)) return;
  // Floor: every logit row read once (its normalisers need all of it) plus the q row at the
  // rejected position.
  const double bytes = static_cast<double>(batch) *
                       (static_cast<double>(n / 2 + 1) * static_cast<double>(vocab) * sizeof(T) +
                        4.0 * static_cast<double>(vocab));
  specula::bench::time_against_copy(state, bytes, launch);
}

int register_all() {
  using specula::bench::add_case;
  for (index_t b : {1, 2, 4, 8, 16, 32, 64})
    for (int split : {1, 0})
      add_case("cuda_chain_split/reject_mid/V:128256/n:8/B:" + std::to_string(b) +
                   "/S:" + (split == 1 ? std::string("1") : std::string("auto")),
               [=](benchmark::State& s) { chain_case(s, 128256, 8, b, true, split); });
  for (index_t v : {32000, 128256})
    for (index_t n : {1, 5, 8})
      for (index_t b : {1, 8, 32, 64})
        for (bool fused : {true, false}) {
          const std::string tail =
              "/V:" + std::to_string(v) + "/n:" + std::to_string(n) + "/B:" + std::to_string(b);
          const std::string kind = fused ? "cuda_chain_fused/" : "cuda_chain_unfused/";
          add_case(kind + "bf16" + tail,
                   [=](benchmark::State& s) { fused_case<__nv_bfloat16>(s, v, n, b, fused); });
          add_case(kind + "f32" + tail,
                   [=](benchmark::State& s) { fused_case<float>(s, v, n, b, fused); });
        }
  for (index_t v : {32000, 128256})
    for (index_t n : {1, 5, 8})
      for (index_t b : {1, 8, 32, 64})
        for (bool reject : {false, true})
          add_case("cuda_chain/" + std::string(reject ? "reject_mid" : "accept_all") + "/V:" +
                       std::to_string(v) + "/n:" + std::to_string(n) + "/B:" + std::to_string(b),
                   [=](benchmark::State& s) { chain_case(s, v, n, b, reject); });
  return 0;
}

const int registered = register_all();

}  // namespace
