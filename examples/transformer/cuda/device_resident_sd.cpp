// device_sd_ops (device_resident_sd.hpp): the loop's steps on the GPU.

#include "specula_example/device_resident_sd.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "device_verify.hpp"
#include "specula/core/error.hpp"
#include "specula/tree/builders.hpp"

namespace specula::example {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(e)}, what,
                    cudaGetErrorString(e));
}

template <class T>
struct device_array {
  T* ptr = nullptr;
  std::size_t n = 0;
  void ensure(std::size_t count) {
    if (count <= n) return;
    cudaFree(ptr);  // synchronises: no pending work reads the old array
    ptr = nullptr;
    void* p = nullptr;
    check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
    ptr = static_cast<T*>(p);
    n = count;
  }
  device_array() = default;
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(ptr); }
};

/// The small per-step inputs of sampling and verification, uploaded as one block.
struct step_inputs {
  request_rng rng;
  index_t offsets[2];
};

}  // namespace

struct device_sd_ops::state {
  const device_transformer* target_model;
  const device_transformer* draft_model;
  device_session target, draft;
  index_t V;
  device_array<float> q, p;              // nodes x V
  device_array<sampling_params> params;  // [0] target, [1] draft
  device_array<step_inputs> draft_inputs, verify_inputs;
  device_array<index_t> parents, accepted_nodes;
  device_array<token_t> tokens, out_tokens, drafted;
  device_array<std::int32_t> counts;  // [0] draw count, [1] accepted
  device_array<std::uint32_t> flags;
  request_rng draft_rng{};
  bool draft_rng_valid = false;
  device_traffic own;

  state(const device_transformer& t, const device_transformer& d)
      : target_model(&t), draft_model(&d), target(t), draft(d), V(t.vocab_size()) {}

  [[nodiscard]] cudaStream_t target_stream() const {
    return static_cast<cudaStream_t>(target_model->stream());
  }
  [[nodiscard]] cudaStream_t draft_stream() const {
    return static_cast<cudaStream_t>(draft_model->stream());
  }
};

device_sd_ops::device_sd_ops(const device_transformer& target, const device_transformer& draft)
    : s_(std::make_unique<state>(target, draft)) {
  require_parameter(draft.vocab_size() == target.vocab_size(), "draft",
                    static_cast<double>(draft.vocab_size()),
                    "the draft model's vocabulary must equal the target's");
  s_->params.ensure(2);
  s_->draft_inputs.ensure(1);
  s_->verify_inputs.ensure(1);
  s_->counts.ensure(2);
  s_->flags.ensure(1);
  s_->drafted.ensure(1);
}

device_sd_ops::device_sd_ops(device_sd_ops&&) noexcept = default;
device_sd_ops& device_sd_ops::operator=(device_sd_ops&&) noexcept = default;
device_sd_ops::~device_sd_ops() = default;

void device_sd_ops::start(std::span<const token_t> prompt, const resident_sd_options& options) {
  state& s = *s_;
  const sampling_params params[2] = {options.target, options.draft};
  check(cudaMemcpy(s.params.ptr, params, sizeof(params), cudaMemcpyHostToDevice), "cudaMemcpy");
  s.own.bytes_to_device += sizeof(params);
  const auto rows = static_cast<std::size_t>(options.draft_length + 1);
  s.q.ensure(rows * static_cast<std::size_t>(s.V));
  s.p.ensure(rows * static_cast<std::size_t>(s.V));
  s.parents.ensure(rows);
  s.tokens.ensure(rows);
  s.out_tokens.ensure(rows);
  s.accepted_nodes.ensure(rows);
  s.draft_rng_valid = false;
  s.target.prefill(prompt);
  s.draft.prefill(prompt);
}

index_t device_sd_ops::draft_context() const noexcept { return s_->draft.context_size(); }

token_t device_sd_ops::draft(std::span<const token_t> tokens, index_t i, const request_rng& rng) {
  state& s = *s_;
  const cudaStream_t stream = s.draft_stream();
  const token_tree chain = trees::chain(tokens);
  const float* logits = s.draft_model->evaluate_tree_device(s.draft.cache(), chain);
  s.draft.cache().commit_all();
  float* q = s.q.ptr + static_cast<std::size_t>(i) * static_cast<std::size_t>(s.V);
  check(
      device_detail::probs(stream, logits + (chain.size() - 1) * s.V, 1, s.V, s.params.ptr + 1, q),
      "logits_to_probs_async");
  if (!s.draft_rng_valid || !(s.draft_rng == rng)) {
    const step_inputs in{rng, {0, 0}};
    check(cudaMemcpyAsync(s.draft_inputs.ptr, &in, sizeof(in), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    s.own.bytes_to_device += sizeof(in);
    s.draft_rng = rng;
    s.draft_rng_valid = true;
  }
  check(device_detail::sample_one(stream, q, s.V, &s.draft_inputs.ptr->rng,
                                  static_cast<std::uint32_t>(i), s.drafted.ptr, s.counts.ptr),
        "sample_without_replacement_async");
  token_t t = no_token;
  check(cudaMemcpyAsync(&t, s.drafted.ptr, sizeof(t), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  s.own.bytes_to_host += sizeof(t);
  if (t < 0) throw_if_failed({status::no_mass, i, -1, 0.0}, "draft", "the draft row has no mass");
  return t;
}

void device_sd_ops::target(std::span<const token_t> tokens) {
  state& s = *s_;
  const token_tree chain = trees::chain(tokens);
  const float* logits = s.target_model->evaluate_tree_device(s.target.cache(), chain);
  check(device_detail::probs(s.target_stream(), logits, chain.size(), s.V, s.params.ptr, s.p.ptr),
        "logits_to_probs_async");
}

index_t device_sd_ops::verify(std::span<const token_t> chain_tokens, const request_rng& rng,
                              std::span<token_t> out) {
  state& s = *s_;
  const cudaStream_t stream = s.target_stream();
  const auto nodes = static_cast<index_t>(chain_tokens.size());
  const auto V = static_cast<std::size_t>(s.V);
  // The leaf has no children: its q row is any valid row (the host loop's choice: p).
  check(cudaMemcpyAsync(s.q.ptr + static_cast<std::size_t>(nodes - 1) * V,
                        s.p.ptr + static_cast<std::size_t>(nodes - 1) * V, V * sizeof(float),
                        cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync");
  const step_inputs in{rng, {0, nodes}};
  std::vector<index_t> parents(static_cast<std::size_t>(nodes));
  for (index_t k = 0; k < nodes; ++k) parents[static_cast<std::size_t>(k)] = k - 1;
  check(cudaMemcpyAsync(s.verify_inputs.ptr, &in, sizeof(in), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(s.parents.ptr, parents.data(), parents.size() * sizeof(index_t),
                        cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(s.tokens.ptr, chain_tokens.data(), chain_tokens.size_bytes(),
                        cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  s.own.bytes_to_device +=
      sizeof(in) + parents.size() * sizeof(index_t) + chain_tokens.size_bytes();
  check(device_detail::verify_tree(stream, s.V, s.verify_inputs.ptr->offsets, s.parents.ptr,
                                   s.tokens.ptr, nodes, s.p.ptr, s.q.ptr, &s.verify_inputs.ptr->rng,
                                   s.out_tokens.ptr, s.counts.ptr + 1, s.accepted_nodes.ptr,
                                   s.flags.ptr),
        "verify_tree_async");
  std::int32_t accepted = 0;
  check(cudaMemcpyAsync(&accepted, s.counts.ptr + 1, sizeof(accepted), cudaMemcpyDeviceToHost,
                        stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(out.data(), s.out_tokens.ptr,
                        static_cast<std::size_t>(nodes) * sizeof(token_t), cudaMemcpyDeviceToHost,
                        stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  s.own.bytes_to_host += sizeof(accepted) + static_cast<std::size_t>(nodes) * sizeof(token_t);
  if (accepted < 0 || accepted >= nodes || out[static_cast<std::size_t>(accepted)] < 0)
    throw_if_failed({status::no_mass, -1, -1, static_cast<double>(accepted)}, "verify",
                    "the device verifier emitted no token (a row without mass)");
  return accepted;
}

void device_sd_ops::commit_target(index_t accepted) {
  std::vector<index_t> path(static_cast<std::size_t>(accepted + 1));
  for (index_t k = 0; k <= accepted; ++k) path[static_cast<std::size_t>(k)] = k;
  s_->target.commit(path);
}

void device_sd_ops::rollback_draft(index_t n) { s_->draft.rollback(n); }

device_traffic device_sd_ops::traffic() const noexcept {
  device_traffic t = s_->own;
  for (const device_transformer* m : {s_->target_model, s_->draft_model}) {
    t.evaluations += m->traffic().evaluations;
    t.bytes_to_device += m->traffic().bytes_to_device;
    t.bytes_to_host += m->traffic().bytes_to_host;
  }
  return t;
}

}  // namespace specula::example
