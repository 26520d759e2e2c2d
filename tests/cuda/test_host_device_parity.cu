// The host+device core (Philox, the exact rule, the per-request chain algorithm) compiled by
// nvcc and run on the GPU gives the host backend's results bit for bit. Skips without a GPU.

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "specula/cuda/error.cuh"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain.hpp"

using namespace specula;

namespace {

__global__ void philox_kernel(request_rng rng, std::uint32_t n, double* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = uniform_at(rng, draw_id{i, 3});
}

__global__ void chain_kernel(chain_batch_input<float> in, chain_batch_output out,
                             double residual_floor) {
  const index_t b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= in.draft_offsets.size - 1) return;
  const auto s = detail::flattened_segment(in.draft_offsets, b);
  const auto r = detail::run_segment(exact_rule{}, in.rng[b], s, in.draft_tokens.data,
                                     in.draft_probs, in.target_probs, residual_floor,
                                     out.output_tokens.data, out.accepted.data);
  out.num_accepted[b] = r.num_accepted;
  out.flags[b] = r.flags;
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  cuda::throw_on_error(cudaMalloc(&p, v.size() * sizeof(T) + 1), "cudaMalloc");
  cuda::throw_on_error(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                       "cudaMemcpy");
  return p;
}

template <class T>
std::vector<T> to_host(const T* p, std::size_t n) {
  std::vector<T> v(n);
  cuda::throw_on_error(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost),
                       "cudaMemcpy");
  return v;
}

bool have_gpu() {
  if (cuda::device_count() > 0) return true;
  WARN("no CUDA device: device parity checks skipped (compile-only)");
  return false;
}

}  // namespace

TEST_CASE("Philox uniforms on the device equal the host's", "[cuda][device]") {
  if (!have_gpu()) return;
  const request_rng rng{0x1234567890ull, 5, 9};
  const std::uint32_t n = 4096;
  double* d = nullptr;
  cuda::throw_on_error(cudaMalloc(&d, n * sizeof(double)), "cudaMalloc");
  philox_kernel<<<(n + 255) / 256, 256>>>(rng, n, d);
  cuda::throw_on_error(cudaDeviceSynchronize(), "philox_kernel");
  const auto got = to_host(d, n);
  cudaFree(d);
  for (std::uint32_t i = 0; i < n; ++i) REQUIRE(got[i] == uniform_at(rng, draw_id{i, 3}));
}

TEST_CASE("per-request chain verification on the device equals the host backend",
          "[cuda][device]") {
  if (!have_gpu()) return;
  const index_t vocab = 257, batch = 64;
  std::vector<index_t> offsets = {0};
  std::vector<token_t> tokens;
  std::vector<float> draft, target;
  std::vector<request_rng> rng;
  std::uint32_t id = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t len = b % 6;
    offsets.push_back(offsets.back() + len);
    for (index_t i = 0; i <= len; ++i) {
      const auto p = testing::random_probability_row(vocab, 17, id++, 0.2);
      target.insert(target.end(), p.begin(), p.end());
      if (i == len) break;
      const auto q = testing::random_probability_row(vocab, 17, id++, 0.2);
      draft.insert(draft.end(), q.begin(), q.end());
      token_t x = 0;
      for (index_t y = 0; y < vocab; ++y)
        if (q[static_cast<std::size_t>(y)] > q[static_cast<std::size_t>(x)])
          x = static_cast<token_t>(y);
      tokens.push_back(x);
    }
    rng.push_back(request_rng{42, static_cast<std::uint32_t>(b), 1});
  }
  const index_t nd = offsets.back();
  chain_batch_input<float> host_in{
      vocab, offsets, tokens, {draft.data(), nd, vocab}, {target.data(), nd + batch, vocab}, rng};
  std::vector<token_t> out(static_cast<std::size_t>(nd + batch));
  std::vector<std::int32_t> n(static_cast<std::size_t>(batch));
  std::vector<std::uint8_t> acc(static_cast<std::size_t>(nd));
  std::vector<std::uint32_t> flags(static_cast<std::size_t>(batch));
  verify_chain(host::seq, host_in, chain_batch_output{out, n, acc, flags});

  auto* d_off = to_device(offsets);
  auto* d_tok = to_device(tokens);
  auto* d_draft = to_device(draft);
  auto* d_target = to_device(target);
  auto* d_rng = to_device(rng);
  auto* d_out = to_device(std::vector<token_t>(out.size()));
  auto* d_n = to_device(std::vector<std::int32_t>(n.size()));
  auto* d_acc = to_device(std::vector<std::uint8_t>(acc.size()));
  auto* d_flags = to_device(std::vector<std::uint32_t>(flags.size()));
  chain_batch_input<float> dev_in{vocab,
                                  {d_off, batch + 1},
                                  {d_tok, nd},
                                  {d_draft, nd, vocab},
                                  {d_target, nd + batch, vocab},
                                  {d_rng, batch}};
  chain_batch_output dev_out{{d_out, nd + batch}, {d_n, batch}, {d_acc, nd}, {d_flags, batch}};
  chain_kernel<<<1, 64>>>(dev_in, dev_out, default_residual_floor);
  cuda::throw_on_error(cudaDeviceSynchronize(), "chain_kernel");
  CHECK(to_host(d_out, out.size()) == out);
  CHECK(to_host(d_n, n.size()) == n);
  CHECK(to_host(d_acc, acc.size()) == acc);
  CHECK(to_host(d_flags, flags.size()) == flags);
  for (void* p :
       {static_cast<void*>(d_off), static_cast<void*>(d_tok), static_cast<void*>(d_draft),
        static_cast<void*>(d_target), static_cast<void*>(d_rng), static_cast<void*>(d_out),
        static_cast<void*>(d_n), static_cast<void*>(d_acc), static_cast<void*>(d_flags)})
    cudaFree(p);
}
