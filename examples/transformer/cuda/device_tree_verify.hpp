#pragma once

// Verification of one token tree on the device for the resident ops (device_resident_*.cpp):
// specula::cuda::verify_tree_async (exact rule, siblings without replacement) over p and q rows
// already on the device. Sends the tree (parents, tokens) and the stream; receives the accepted
// count and the output tokens -- never a row.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "device_buffers.hpp"
#include "device_verify.hpp"
#include "specula/core/error.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula_example/device_transformer.hpp"

namespace specula::example::device_detail {

class device_tree_verify {
 public:
  /// Room for trees of up to `nodes` nodes (allocations synchronise: call before a step).
  void reserve(index_t nodes) {
    const auto n = static_cast<std::size_t>(nodes);
    inputs_.ensure(1);
    parents_.ensure(n);
    tokens_.ensure(n);
    out_tokens_.ensure(n);
    accepted_nodes_.ensure(n);
    counts_.ensure(1);
    flags_.ensure(1);
  }

  /// Verifies `tree` (node u's children drawn from q row u; q null: deterministic children,
  /// one-hot proposals) against the p rows on `stream` with the exact rule, or `relaxed` when
  /// given: the leaves' q rows (no children, no draw) first take their p rows; writes the output
  /// tokens to out[0 .. tree.size()) and returns the accepted count. Synchronises `stream`.
  index_t run(cudaStream_t stream, const token_tree& tree, const float* p, float* q, index_t V,
              const request_rng& rng, std::span<token_t> out, device_traffic& traffic,
              const scheduled_relaxed_rule* relaxed = nullptr) {
    const index_t nodes = tree.size();
    if (static_cast<std::size_t>(nodes) > parents_.n ||
        out.size() < static_cast<std::size_t>(nodes))
      throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(nodes)}, "tree",
                      "more nodes than reserved");
    const auto row = static_cast<std::size_t>(V);
    for (index_t a = 0; a < nodes && q != nullptr;) {  // one copy per run of leaves
      if (tree.num_children(a) != 0) {
        ++a;
        continue;
      }
      index_t b = a + 1;
      while (b < nodes && tree.num_children(b) == 0) ++b;
      check_cuda(cudaMemcpyAsync(q + static_cast<std::size_t>(a) * row,
                                 p + static_cast<std::size_t>(a) * row,
                                 static_cast<std::size_t>(b - a) * row * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync");
      a = b;
    }
    const inputs in{rng, {0, nodes}};
    host_parents_.resize(static_cast<std::size_t>(nodes));
    for (index_t u = 0; u < nodes; ++u) host_parents_[static_cast<std::size_t>(u)] = tree.parent(u);
    const auto tokens = tree.tokens();
    check_cuda(cudaMemcpyAsync(inputs_.ptr, &in, sizeof(in), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
    check_cuda(
        cudaMemcpyAsync(parents_.ptr, host_parents_.data(), host_parents_.size() * sizeof(index_t),
                        cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
    check_cuda(cudaMemcpyAsync(tokens_.ptr, tokens.data(), tokens.size_bytes(),
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
    traffic.bytes_to_device +=
        sizeof(in) + host_parents_.size() * sizeof(index_t) + tokens.size_bytes();
    check_cuda(verify_tree(stream, V, inputs_.ptr->offsets, parents_.ptr, tokens_.ptr, nodes, p, q,
                           &inputs_.ptr->rng, out_tokens_.ptr, counts_.ptr, accepted_nodes_.ptr,
                           flags_.ptr, relaxed),
               "verify_tree_async");
    std::int32_t accepted = 0;
    check_cuda(
        cudaMemcpyAsync(&accepted, counts_.ptr, sizeof(accepted), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
    check_cuda(cudaMemcpyAsync(out.data(), out_tokens_.ptr,
                               static_cast<std::size_t>(nodes) * sizeof(token_t),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    traffic.bytes_to_host += sizeof(accepted) + static_cast<std::size_t>(nodes) * sizeof(token_t);
    if (accepted < 0 || accepted >= nodes || out[static_cast<std::size_t>(accepted)] < 0)
      throw_if_failed({status::no_mass, -1, -1, static_cast<double>(accepted)}, "verify",
                      "the device verifier emitted no token (a row without mass)");
    return accepted;
  }

 private:
  struct inputs {
    request_rng rng;
    index_t offsets[2];
  };
  device_array<inputs> inputs_;
  device_array<index_t> parents_, accepted_nodes_;
  device_array<token_t> tokens_, out_tokens_;
  device_array<std::int32_t> counts_;
  device_array<std::uint32_t> flags_;
  std::vector<index_t> host_parents_;
};

}  // namespace specula::example::device_detail
