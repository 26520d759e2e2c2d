// Peer benchmark: specula's device chain verification against FlashInfer's
// chain_speculative_sampling kernel (flashinfer::sampling::ChainSpeculativeSampling, the
// header-only kernel bundled in the flashinfer-python wheel, fetched at configure time: see
// bench/peers/CMakeLists.txt), and specula's logits transforms + sampling against FlashInfer's
// top_k_top_p_sampling_from_probs (TopKTopPSamplingFromProb), on the same device buffers in the
// same process. docs/PERFORMANCE.md ("FlashInfer peer benchmark") lists the semantic
// differences.
//
// Names (manual time = specula's time per call; both implementations' times as counters):
//   peer_chain/<accept|reject>/V:<V>/n:<n>/B:<B>
//       padded layout (FlashInfer's: q [B, n, V], p [B, n + 1, V], drafts [B, n]), fp32.
//       accept: p = q, every draft accepted, the bonus token sampled from p's row n;
//       reject: the drafted token's p is 0 at position 0, so the first draft is rejected and the
//       residual max(p - q, 0) sampled. B in {1, 8, 32, 128}, n in {4, 8},
//       V in {32000, 128256, 151936}.
//   peer_topk_topp/V:<V>/B:<B>
//       one token per row from probability rows under top-k 50 and top-p 0.9: FlashInfer's
//       TopKTopPSamplingFromProb against specula's logits_to_probs_async (on log p, so its
//       softmax gives p back) followed by sample_without_replacement_async with k = 1.
//   peer_law/<specula|flashinfer>
//       law check: 200 000 requests, V = 16, n = 2, drafts drawn from q; the first emitted
//       token must follow p_1 exactly (G-test p-value as the counter law_p; a value below 1e-6
//       is a failure and stops the case with an error).
// Counters: specula_us, flashinfer_us (median of the interleaved launches), speedup
// (flashinfer_us / specula_us), bytes (the floor: 8 bytes per tested draft plus 4V for a bonus
// row or 8V for a residual, per request; 4V per row for sampling), copy_GBps (device-to-device
// copy of bytes/2, reads + writes), specula_frac_of_floor and flashinfer_frac_of_floor (floor
// time at the copy's bandwidth / the implementation's time; 1 = at the floor).
// Timing: the two implementations alternate launch by launch, each launch timed with CUDA events
// after an L2 flush, medians reported. Without a GPU every case is skipped with "no CUDA device".

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <flashinfer/sampling.cuh>
#include <span>
#include <string>
#include <vector>

#include "../cuda_bench_util.cuh"
#include "specula/cuda/chain.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/transforms.cuh"
#include "specula/testing/goodness_of_fit.hpp"

using namespace specula;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

using specula::bench::device_buffer;
using specula::bench::skewed_row;
using specula::bench::upload;

/// Medians of two implementations timed launch by launch, alternately, L2 flushed before each.
struct pair_timing {
  double a_us = 0, b_us = 0;
  cudaError_t status = cudaSuccess;
};

template <class LaunchA, class LaunchB>
pair_timing time_interleaved(int rounds, LaunchA&& a, LaunchB&& b) {
  specula::bench::l2_flusher l2;
  std::vector<float> ta, tb;
  pair_timing r;
  for (int i = 0; i < rounds && r.status == cudaSuccess; ++i) {
    for (int which = 0; which < 2 && r.status == cudaSuccess; ++which) {
      // Alternate which goes first, so neither always follows the other's launch.
      const bool first_a = (i + which) % 2 == 0;
      if ((r.status = l2.flush()) != cudaSuccess) break;
      const float ms =
          first_a ? specula::bench::time_ms(a, r.status) : specula::bench::time_ms(b, r.status);
      (first_a ? ta : tb).push_back(ms);
    }
  }
  auto median = [](std::vector<float> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[v.size() / 2]) * 1e3;
  };
  r.a_us = median(ta);
  r.b_us = median(tb);
  return r;
}

/// Bandwidth (reads + writes, GB/s) of a device-to-device copy of `bytes`/2 bytes, best of 10,
/// L2 flushed before each.
double copy_gbps(double bytes, cudaError_t& status) {
  const auto n = static_cast<std::size_t>(std::max(bytes / 2, 1.0));
  device_buffer src(n), dst(n);
  specula::bench::l2_flusher l2;
  auto copy = [&] {
    return cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToDevice, nullptr);
  };
  float best = 1e30f;
  for (int r = 0; r < 10 && status == cudaSuccess; ++r) {
    if ((status = l2.flush()) != cudaSuccess) break;
    best = std::min(best, specula::bench::time_ms(copy, status));
  }
  return 2.0 * static_cast<double>(n) / (best * 1e-3) / 1e9;
}

/// The benchmark loop of a peer case: specula's and FlashInfer's launches interleaved (25 pairs
/// per iteration), manual time = specula's median, and the counters of the file comment against
/// a floor of `bytes`.
template <class Specula, class FlashInfer>
void compare(benchmark::State& state, double bytes, Specula&& specula_launch,
             FlashInfer&& fi_launch) {
  cudaError_t status = cudaSuccess;
  const double gbps = copy_gbps(bytes, status);
  if (status != cudaSuccess) {
    state.SkipWithError((std::string("copy baseline: ") + cudaGetErrorName(status)).c_str());
    return;
  }
  pair_timing t;
  for (auto _ : state) {
    t = time_interleaved(25, specula_launch, fi_launch);
    if (t.status != cudaSuccess) {
      state.SkipWithError((std::string("launch failed: ") + cudaGetErrorName(t.status)).c_str());
      return;
    }
    state.SetIterationTime(t.a_us * 1e-6);
  }
  const double floor_us = bytes / (gbps * 1e9) * 1e6;
  state.counters["specula_us"] = t.a_us;
  state.counters["flashinfer_us"] = t.b_us;
  state.counters["speedup"] = t.b_us / t.a_us;
  state.counters["bytes"] = bytes;
  state.counters["copy_GBps"] = gbps;
  state.counters["specula_frac_of_floor"] = floor_us / t.a_us;
  state.counters["flashinfer_frac_of_floor"] = floor_us / t.b_us;
}

/// FlashInfer's chain verification on specula's padded buffers. Its counters accumulate
/// (output_accepted_token_num += ...), so callers that read them reset them first.
cudaError_t flashinfer_chain(const padded_chain_input<float>& in, token_t* out, std::int32_t* acc,
                             std::int32_t* emitted, std::uint64_t seed, std::uint64_t offset) {
  return flashinfer::sampling::ChainSpeculativeSampling<float, std::int32_t>(
      const_cast<float*>(in.draft_probs.data), const_cast<token_t*>(in.draft_tokens.data),
      const_cast<float*>(in.target_probs.data), out, acc, emitted,
      static_cast<std::uint32_t>(in.batch_size), static_cast<std::uint32_t>(in.max_draft),
      static_cast<std::uint32_t>(in.vocab_size), /*deterministic=*/true, nullptr, seed, nullptr,
      offset, nullptr);
}

/// The padded inputs of one scenario in device memory.
struct chain_buffers {
  device_buffer tokens, q, p, rng, out, n, fi_out, fi_acc, fi_emitted;
  padded_chain_input<float> in;
  padded_chain_output out_view;
  chain_buffers(index_t vocab, index_t n_draft, index_t batch, const std::vector<token_t>& drafts,
                const std::vector<float>& q_rows, const std::vector<float>& p_rows,
                const std::vector<request_rng>& streams)
      : tokens(drafts.size() * sizeof(token_t)),
        q(q_rows.size() * sizeof(float)),
        p(p_rows.size() * sizeof(float)),
        rng(streams.size() * sizeof(request_rng)),
        out(static_cast<std::size_t>(batch * (n_draft + 1)) * sizeof(token_t)),
        n(static_cast<std::size_t>(batch) * sizeof(std::int32_t)),
        fi_out(static_cast<std::size_t>(batch * (n_draft + 1)) * sizeof(token_t)),
        fi_acc(static_cast<std::size_t>(batch) * sizeof(std::int32_t)),
        fi_emitted(static_cast<std::size_t>(batch) * sizeof(std::int32_t)) {
    upload(tokens, drafts);
    upload(q, q_rows);
    upload(p, p_rows);
    upload(rng, streams);
    in = padded_chain_input<float>{vocab,
                                   batch,
                                   n_draft,
                                   {tokens.as<const token_t>(), batch * n_draft},
                                   {},
                                   {q.as<const float>(), batch * n_draft, vocab},
                                   {p.as<const float>(), batch * (n_draft + 1), vocab},
                                   {rng.as<const request_rng>(), batch}};
    out_view = padded_chain_output{
        {out.as<token_t>(), batch * (n_draft + 1)}, {this->n.as<std::int32_t>(), batch}, {}, {}};
  }
};

void chain_case(benchmark::State& state, index_t vocab, index_t n, index_t batch, bool reject) {
  if (sc::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  // q: one skewed row for every position; p = q, or (reject) q with the drafted token removed at
  // position 0. The drafted token is q's most likely one.
  const std::vector<float> row = skewed_row(vocab, 7);
  const auto top = static_cast<token_t>(std::max_element(row.begin(), row.end()) - row.begin());
  std::vector<float> removed = row;
  removed[static_cast<std::size_t>(top)] = 0.0f;
  double rest = 0;
  for (float x : removed) rest += x;
  for (float& x : removed) x = static_cast<float>(x / rest);
  std::vector<token_t> drafts;
  std::vector<float> q, p;
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t i = 0; i < n; ++i) {
      drafts.push_back(top);
      q.insert(q.end(), row.begin(), row.end());
    }
    for (index_t i = 0; i <= n; ++i) {
      const auto& pi = reject && i == 0 ? removed : row;
      p.insert(p.end(), pi.begin(), pi.end());
    }
    rng.push_back(request_rng{11, static_cast<std::uint32_t>(b), 0});
  }
  chain_buffers d(vocab, n, batch, drafts, q, p, rng);
  // specula with its workspace (B x ceil(V / 256) doubles, allocated once, as an engine would):
  // the split path runs a row on several CTAs when the batch leaves SMs idle.
  const std::size_t ws_bytes = sc::chain_workspace_bytes(batch, vocab);
  device_buffer ws(ws_bytes);
  const auto pol = sc::par_on(nullptr).with_workspace(ws.ptr, ws_bytes);
  auto specula_launch = [&] { return sc::verify_chain_async(pol, d.in, d.out_view); };
  auto fi_launch = [&] {
    return flashinfer_chain(d.in, d.fi_out.as<token_t>(), d.fi_acc.as<std::int32_t>(),
                            d.fi_emitted.as<std::int32_t>(), 11, 0);
  };
  if (!specula::bench::warm_up(state, specula_launch) || !specula::bench::warm_up(state, fi_launch))
    return;
  // Floor per request: p(x), q(x) of each tested draft, then the bonus row (4V) or both rows of
  // the rejected position (8V).
  const double v = static_cast<double>(vocab);
  const double bytes = static_cast<double>(batch) *
                       (reject ? 8.0 + 8.0 * v : 8.0 * static_cast<double>(n) + 4.0 * v);
  compare(state, bytes, specula_launch, fi_launch);
}

/// Inverse-CDF draw from a row (test data: the drafts of the law check).
token_t draw(const std::vector<double>& row, double u) {
  double acc = 0;
  for (std::size_t y = 0; y < row.size(); ++y) {
    acc += row[y];
    if (u < acc) return static_cast<token_t>(y);
  }
  return static_cast<token_t>(row.size() - 1);
}

/// Law check: the first emitted token of a 2-draft chain, over `batch` requests with their own
/// random streams (specula: request_rng{seed, b, 0}; FlashInfer: Philox subsequence b), must
/// follow p_1 exactly, whatever q is.
void law_case(benchmark::State& state, bool flashinfer_impl) {
  if (sc::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  constexpr index_t vocab = 16, n = 2, batch = 200000;
  std::vector<std::vector<double>> qd, pd;
  for (index_t i = 0; i <= n; ++i) {
    std::vector<double> a(vocab), b(vocab);
    double sa = 0, sb = 0;
    for (index_t y = 0; y < vocab; ++y) {
      const double ua = 0.05 + uniform_at(request_rng{100 + static_cast<std::uint64_t>(i), 0, 0},
                                          draw_id{static_cast<std::uint32_t>(y), 0});
      const double ub = 0.05 + uniform_at(request_rng{200 + static_cast<std::uint64_t>(i), 0, 0},
                                          draw_id{static_cast<std::uint32_t>(y), 0});
      a[static_cast<std::size_t>(y)] = ua * ua;
      b[static_cast<std::size_t>(y)] = ub * ub * ub;
      sa += ua * ua;
      sb += ub * ub * ub;
    }
    for (auto& x : a) x /= sa;
    for (auto& x : b) x /= sb;
    // Rows rounded to float: the law is that of the float rows the kernels read.
    for (auto& x : a) x = static_cast<double>(static_cast<float>(x));
    for (auto& x : b) x = static_cast<double>(static_cast<float>(x));
    qd.push_back(a);
    pd.push_back(b);
  }
  std::vector<token_t> drafts;
  std::vector<float> q, p;
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t i = 0; i < n; ++i) {
      const double u = uniform_at(request_rng{300, static_cast<std::uint32_t>(b), 0},
                                  draw_id{static_cast<std::uint32_t>(i), 0});
      drafts.push_back(draw(qd[static_cast<std::size_t>(i)], u));
    }
    rng.push_back(request_rng{17, static_cast<std::uint32_t>(b), 0});
  }
  // Every request reads the same rows, replicated (both layouts need B x L rows).
  for (index_t b = 0; b < batch; ++b) {
    for (index_t i = 0; i < n; ++i)
      for (double x : qd[static_cast<std::size_t>(i)]) q.push_back(static_cast<float>(x));
    for (index_t i = 0; i <= n; ++i)
      for (double x : pd[static_cast<std::size_t>(i)]) p.push_back(static_cast<float>(x));
  }
  chain_buffers d(vocab, n, batch, drafts, q, p, rng);
  cudaError_t status = cudaSuccess;
  token_t* out = flashinfer_impl ? d.fi_out.as<token_t>() : d.out.as<token_t>();
  auto launch = [&]() -> cudaError_t {
    if (!flashinfer_impl) return sc::verify_chain_async(sc::par_on(nullptr), d.in, d.out_view);
    // FlashInfer's counters accumulate: zeroed first.
    cudaError_t e = cudaMemsetAsync(d.fi_acc.ptr, 0, static_cast<std::size_t>(batch) * 4, nullptr);
    if (e == cudaSuccess)
      e = cudaMemsetAsync(d.fi_emitted.ptr, 0, static_cast<std::size_t>(batch) * 4, nullptr);
    return e != cudaSuccess ? e
                            : flashinfer_chain(d.in, out, d.fi_acc.as<std::int32_t>(),
                                               d.fi_emitted.as<std::int32_t>(), 17, 0);
  };
  for (auto _ : state) {
    const float ms = specula::bench::time_ms(launch, status);
    if (status != cudaSuccess) {
      state.SkipWithError((std::string("launch failed: ") + cudaGetErrorName(status)).c_str());
      return;
    }
    state.SetIterationTime(ms * 1e-3);
  }
  std::vector<token_t> tokens(static_cast<std::size_t>(batch * (n + 1)));
  sc::throw_on_error(
      cudaMemcpy(tokens.data(), out, tokens.size() * sizeof(token_t), cudaMemcpyDeviceToHost),
      "download");
  std::vector<std::uint64_t> counts(vocab, 0);
  std::uint64_t bad = 0;
  for (index_t b = 0; b < batch; ++b) {
    const token_t x = tokens[static_cast<std::size_t>(b * (n + 1))];
    if (x < 0 || x >= vocab)
      ++bad;
    else
      ++counts[static_cast<std::size_t>(x)];
  }
  // The law of the float row the kernels read, renormalised in double (rounding each entry to
  // float moves the sum off 1 by up to about 1e-7; the G-test wants a law that sums to 1).
  std::vector<double> law = pd[0];
  double law_sum = 0;
  for (double x : law) law_sum += x;
  for (double& x : law) x /= law_sum;
  const auto g = specula::testing::g_test(counts, law);
  state.counters["law_p"] = g.p_value;
  state.counters["law_G"] = g.statistic;
  state.counters["out_of_range"] = static_cast<double>(bad);
  if (bad > 0 || g.p_value < 1e-6)
    state.SkipWithError(("law check failed: G = " + std::to_string(g.statistic) +
                         ", p = " + std::to_string(g.p_value) + ", " + std::to_string(bad) +
                         " tokens out of range")
                            .c_str());
}

/// One token per probability row under top-k 50 and top-p 0.9.
void topk_topp_case(benchmark::State& state, index_t vocab, index_t batch) {
  if (sc::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::vector<float> row = skewed_row(vocab, 5);
  std::vector<float> probs, logits;
  for (index_t b = 0; b < batch; ++b) {
    probs.insert(probs.end(), row.begin(), row.end());
    for (float x : row) logits.push_back(std::log(x));
  }
  const sampling_params params{1.0f, 50, 0.9f, 0.0f, 1.0f};
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b)
    rng.push_back(request_rng{21, static_cast<std::uint32_t>(b), 0});
  device_buffer d_probs(probs.size() * sizeof(float)), d_logits(logits.size() * sizeof(float)),
      d_specula_probs(probs.size() * sizeof(float)), d_params(sizeof(sampling_params)),
      d_rng(rng.size() * sizeof(request_rng)),
      d_tok(static_cast<std::size_t>(batch) * sizeof(token_t)),
      d_cnt(static_cast<std::size_t>(batch) * sizeof(std::int32_t)),
      d_fi_tok(static_cast<std::size_t>(batch) * sizeof(std::int32_t)),
      d_fi_valid(static_cast<std::size_t>(batch) * sizeof(bool)),
      ws(sc::sample_without_replacement_workspace_bytes(batch, 1));
  upload(d_probs, probs);
  upload(d_logits, logits);
  upload(d_params, std::vector<sampling_params>{params});
  upload(d_rng, rng);
  const auto pol = sc::par_on(nullptr).with_workspace(
      ws.ptr, sc::sample_without_replacement_workspace_bytes(batch, 1));
  const batch_view<float> sp{d_specula_probs.as<float>(), batch, vocab};
  auto specula_launch = [&]() -> cudaError_t {
    if (const cudaError_t e =
            sc::logits_to_probs_async<float>(pol, {d_logits.as<const float>(), batch, vocab}, {},
                                             {d_params.as<const sampling_params>(), 1}, sp);
        e != cudaSuccess)
      return e;
    return sc::sample_without_replacement_async(pol, batch_view<const float>{sp.data, batch, vocab},
                                                1, {d_rng.as<const request_rng>(), batch}, 0,
                                                {d_tok.as<token_t>(), batch},
                                                {d_cnt.as<std::int32_t>(), batch});
  };
  auto fi_launch = [&] {
    return flashinfer::sampling::TopKTopPSamplingFromProb<float, std::int32_t>(
        d_probs.as<float>(), nullptr, nullptr, d_fi_tok.as<std::int32_t>(), d_fi_valid.as<bool>(),
        nullptr, static_cast<std::uint32_t>(batch), 50, 0.9f, static_cast<std::uint32_t>(vocab),
        /*deterministic=*/true, nullptr, 21, nullptr, 0, nullptr);
  };
  if (!specula::bench::warm_up(state, specula_launch) || !specula::bench::warm_up(state, fi_launch))
    return;
  const double bytes = 4.0 * static_cast<double>(vocab) * static_cast<double>(batch);
  compare(state, bytes, specula_launch, fi_launch);
}

int register_all() {
  using specula::bench::add_case;
  add_case("peer_law/specula", [](benchmark::State& s) { law_case(s, false); });
  add_case("peer_law/flashinfer", [](benchmark::State& s) { law_case(s, true); });
  for (bool reject : {false, true})
    for (index_t v : {32000, 128256, 151936})
      for (index_t n : {4, 8})
        for (index_t b : {1, 8, 32, 128})
          add_case(std::string("peer_chain/") + (reject ? "reject" : "accept") + "/V:" +
                       std::to_string(v) + "/n:" + std::to_string(n) + "/B:" + std::to_string(b),
                   [=](benchmark::State& s) { chain_case(s, v, n, b, reject); });
  for (index_t v : {32000, 128256, 151936})
    for (index_t b : {1, 32, 128})
      add_case("peer_topk_topp/V:" + std::to_string(v) + "/B:" + std::to_string(b),
               [=](benchmark::State& s) { topk_topp_case(s, v, b); });
  return 0;
}

const int registered = register_all();

}  // namespace
