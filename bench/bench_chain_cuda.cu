// Device chain verification against a device-to-device copy of the same bytes.
//
// Names: cuda_chain/<scenario>/V:<V>/n:<n>/B:<B> (fp32 rows, dense q), scenarios as on the host
// (bench/bench_chain.cpp): accept_all (p = q, bonus row sampled) and reject_mid (rejection at
// n/2, residual sampled). Counters: bytes (must touch: 8 bytes per accepted draft plus 4V for
// a bonus row or 8V for a residual, per request), copy_GBps (cudaMemcpyAsync device to device
// of the same number of bytes, timed with CUDA events in the same process), frac_of_copy.
// Timing: CUDA events around each launch, reported with manual time. Without a GPU every case
// is skipped with "no CUDA device".

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "specula/cuda/chain.cuh"
#include "specula/cuda/error.cuh"

using namespace specula;

namespace {

using specula::bench::device_buffer;

template <class T>
void upload(const device_buffer& d, const std::vector<T>& v) {
  cuda::throw_on_error(cudaMemcpy(d.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                       "cudaMemcpy");
}

void chain_case(benchmark::State& state, index_t vocab, index_t n, index_t batch, bool reject) {
  if (cuda::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  // Host data: a skewed row used for every q row; p = q, or p with token 0 removed at n/2.
  std::vector<float> row(static_cast<std::size_t>(vocab));
  double sum = 0;
  for (index_t y = 0; y < vocab; ++y) {
    const double u = uniform_at(request_rng{7, 0, 0}, draw_id{static_cast<std::uint32_t>(y), 0});
    row[static_cast<std::size_t>(y)] = static_cast<float>(u * u * u);
    sum += u * u * u;
  }
  for (float& x : row) x = static_cast<float>(x / sum);
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
  const auto pol = cuda::par_on(nullptr);
  cuda::verify_chain(pol, in, out);
  cuda::throw_on_error(cudaDeviceSynchronize(), "warm-up");
  std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
  cudaMemcpy(accepted.data(), d_n.ptr, accepted.size() * sizeof(std::int32_t),
             cudaMemcpyDeviceToHost);
  double bytes = 0;
  for (auto a : accepted) bytes += 8.0 * a + (a == n ? 4.0 : 8.0) * static_cast<double>(vocab);

  // Copy baseline of the same bytes (counting the bytes the copy reads).
  specula::bench::time_against_copy(state, bytes, static_cast<std::size_t>(bytes), 1.0,
                                    [&] { (void)cuda::verify_chain_async(pol, in, out); });
}

int register_all() {
  for (index_t v : {32000, 128256})
    for (index_t n : {1, 5, 8})
      for (index_t b : {1, 8, 32, 64})
        for (bool reject : {false, true})
          benchmark::RegisterBenchmark(
              ("cuda_chain/" + std::string(reject ? "reject_mid" : "accept_all") +
               "/V:" + std::to_string(v) + "/n:" + std::to_string(n) + "/B:" + std::to_string(b))
                  .c_str(),
              [=](benchmark::State& s) { chain_case(s, v, n, b, reject); })
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
  return 0;
}

const int registered = register_all();

}  // namespace
