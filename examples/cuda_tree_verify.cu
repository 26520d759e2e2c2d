// Token-tree verification on the GPU: a 2x2 draft tree whose children were drawn from the draft
// model's rows without replacement, verified against the target's rows by
// specula::cuda::verify_tree_async. Without a GPU it says so and exits 0.

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "specula/cuda/tree.cuh"
#include "specula/tree/builders.hpp"

namespace sc = specula::cuda;

int main() {
  using namespace specula;
  if (sc::device_count() == 0) {
    std::puts("no CUDA device: nothing to run");
    return 0;
  }
  const index_t V = 4;
  // Root with children {0, 1}; node 1 (token 0) has {2, 3}; node 2 (token 1) has {0, 3}.
  token_tree tree = trees::full(2, 2);
  tree.set_tokens(std::vector<token_t>{-1, 0, 1, 2, 3, 0, 3});
  const auto flat = sc::flatten_trees({&tree, 1});
  // One target row p_u and one draft row q_u per node (same rows everywhere for brevity).
  std::vector<float> p, q;
  for (index_t u = 0; u < tree.size(); ++u) {
    p.insert(p.end(), {0.4f, 0.3f, 0.2f, 0.1f});
    q.insert(q.end(), {0.3f, 0.3f, 0.2f, 0.2f});
  }
  const request_rng rng{2026, 0, 0};

  // Device copies.
  auto copy = [](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    T* d = nullptr;
    sc::throw_on_error(cudaMalloc(&d, v.size() * sizeof(T)), "cudaMalloc");
    sc::throw_on_error(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                       "cudaMemcpy");
    return d;
  };
  const index_t n = tree.size();
  index_t* d_off = copy(flat.node_offsets);
  index_t* d_par = copy(flat.parents);
  token_t* d_tok = copy(flat.tokens);
  float* d_p = copy(p);
  float* d_q = copy(q);
  request_rng* d_rng = copy(std::vector<request_rng>{rng});
  token_t* d_out = copy(std::vector<token_t>(static_cast<std::size_t>(n)));
  std::int32_t* d_n = copy(std::vector<std::int32_t>(1));
  std::uint32_t* d_flags = copy(std::vector<std::uint32_t>(1));

  const sc::tree_device_input<float> in{V,           {d_off, 2},  {d_par, n}, {d_tok, n},
                                        {d_p, n, V}, {d_q, n, V}, {d_rng, 1}};
  const tree_batch_output out{{d_out, n}, {d_n, 1}, {}, {d_flags, 1}};
  sc::throw_on_error(sc::verify_tree_async(sc::par_on(nullptr), in, out), "verify_tree_async");
  sc::throw_on_error(cudaDeviceSynchronize(), "tree kernel");

  std::vector<token_t> tokens(static_cast<std::size_t>(n));
  std::int32_t accepted = 0;
  cudaMemcpy(tokens.data(), d_out, tokens.size() * sizeof(token_t), cudaMemcpyDeviceToHost);
  cudaMemcpy(&accepted, d_n, sizeof(accepted), cudaMemcpyDeviceToHost);
  std::printf("accepted %d drafts; emitted:", static_cast<int>(accepted));
  for (std::int32_t i = 0; i <= accepted; ++i)
    std::printf(" %d", tokens[static_cast<std::size_t>(i)]);
  std::puts("");
  for (void* ptr :
       {static_cast<void*>(d_off), static_cast<void*>(d_par), static_cast<void*>(d_tok),
        static_cast<void*>(d_p), static_cast<void*>(d_q), static_cast<void*>(d_rng),
        static_cast<void*>(d_out), static_cast<void*>(d_n), static_cast<void*>(d_flags)})
    cudaFree(ptr);
  return accepted >= 0 ? 0 : 1;
}
