// device_sjd_ops (device_resident_sjd.hpp): SJD's rows on the GPU.

#include "specula_example/device_resident_sjd.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "device_buffers.hpp"
#include "device_sjd.hpp"
#include "device_tree_verify.hpp"
#include "device_verify.hpp"
#include "specula/core/error.hpp"

namespace specula::example {

using device_detail::check_cuda;
using device_detail::device_array;
using specula::detail::sjd_children_job;

struct device_sjd_ops::state {
  const device_transformer* model;
  device_session session;
  index_t V;
  sjd_options options;
  index_t rows = 0;                      // nodes of the largest draft
  device_array<float> p, q_a, q_b;       // rows x V each
  float* q = nullptr;                    // the current draft's q rows (q_a or q_b)
  float* q_next = nullptr;               // the next draft's
  device_array<sampling_params> params;  // the target's
  device_array<std::byte> jobs;          // [rng][jobs]
  device_array<std::int32_t> drawn;      // [counts][tokens]
  std::vector<std::byte> upload;
  std::vector<std::int32_t> download;
  device_detail::device_tree_verify verifier;
  device_traffic own;

  explicit state(const device_transformer& m) : model(&m), session(m), V(m.vocab_size()) {}

  [[nodiscard]] cudaStream_t stream() const { return static_cast<cudaStream_t>(model->stream()); }
  [[nodiscard]] float* row(float* rows_ptr, index_t u) const {
    return rows_ptr + static_cast<std::size_t>(u) * static_cast<std::size_t>(V);
  }
};

device_sjd_ops::device_sjd_ops(const device_transformer& model)
    : s_(std::make_unique<state>(model)) {
  s_->params.ensure(1);
}
device_sjd_ops::device_sjd_ops(device_sjd_ops&&) noexcept = default;
device_sjd_ops& device_sjd_ops::operator=(device_sjd_ops&&) noexcept = default;
device_sjd_ops::~device_sjd_ops() = default;

index_t device_sjd_ops::vocab_size() const noexcept { return s_->V; }
void device_sjd_ops::prefill(std::span<const token_t> prompt) { s_->session.prefill(prompt); }
index_t device_sjd_ops::context_size() const noexcept { return s_->session.context_size(); }
void device_sjd_ops::rollback(index_t n) { s_->session.rollback(n); }
void device_sjd_ops::evaluate(const token_tree& tree, batch_view<float> logits) {
  s_->session.evaluate(tree, logits);
}
void device_sjd_ops::commit(std::span<const index_t> path) { s_->session.commit(path); }

void device_sjd_ops::start(index_t, const sjd_options& options) {
  state& s = *s_;
  detail::check_resident_sjd_options(options);
  s.options = options;
  s.rows = options.draft_budget() + 1;
  const auto n = static_cast<std::size_t>(s.rows) * static_cast<std::size_t>(s.V);
  s.p.ensure(n);
  s.q_a.ensure(n);
  s.q_b.ensure(n);
  s.q = s.q_a.ptr;
  s.q_next = s.q_b.ptr;
  s.verifier.reserve(s.rows);
  // Jobs per batch: at most one per node; child slots: at most the nodes.
  s.jobs.ensure(sizeof(request_rng) + static_cast<std::size_t>(s.rows) * sizeof(sjd_children_job));
  s.drawn.ensure(2 * static_cast<std::size_t>(s.rows) +
                 static_cast<std::size_t>(s.rows * std::max<index_t>(1, options.pd_width)));
  check_cuda(cudaMemcpyAsync(s.params.ptr, &options.target, sizeof(sampling_params),
                             cudaMemcpyHostToDevice, s.stream()),
             "cudaMemcpyAsync");
  s.own.bytes_to_device += sizeof(sampling_params);
}

token_t device_sjd_ops::init_child(specula::detail::sjd_draft&, index_t parent,
                                   const specula::detail::sjd_init_context&, double u) {
  state& s = *s_;
  const specula::detail::sjd_init_tokens range(s.options, s.V);
  const token_t x = range.token(u);
  if (s.options.init == sjd_init::one_hot_q)
    check_cuda(device_detail::fill_row(s.stream(), s.row(s.q_next, parent), s.V, x, x + 1, 1.0f),
               "fill_row");
  else
    check_cuda(device_detail::fill_row(s.stream(), s.row(s.q_next, parent), s.V, range.begin,
                                       range.end, range.uniform_probability()),
               "fill_row");
  return x;
}

void device_sjd_ops::move_q(specula::detail::sjd_draft&, index_t from, index_t to) {
  state& s = *s_;
  check_cuda(cudaMemcpyAsync(s.row(s.q, to), s.row(s.q, from),
                             static_cast<std::size_t>(s.V) * sizeof(float),
                             cudaMemcpyDeviceToDevice, s.stream()),
             "cudaMemcpyAsync");
}

void device_sjd_ops::target(const token_tree& tree) {
  state& s = *s_;
  if (tree.size() > s.rows)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(tree.size())}, "tree",
                    "more nodes than the window reserved by start()");
  const float* logits = s.model->evaluate_tree_device(s.session.cache(), tree);
  check_cuda(device_detail::probs(s.stream(), logits, tree.size(), s.V, s.params.ptr, s.p.ptr),
             "logits_to_probs_async");
}

index_t device_sjd_ops::verify_exact(const token_tree& tree, const request_rng& rng,
                                     std::vector<token_t>& out_tokens,
                                     std::vector<index_t>& out_nodes) {
  state& s = *s_;
  out_tokens.assign(static_cast<std::size_t>(tree.size()), no_token);
  const index_t k = s.verifier.run(s.stream(), tree, s.p.ptr, s.q, s.V, rng, out_tokens, s.own);
  detail::accepted_path(tree, out_tokens, k, out_nodes);
  return k;
}

void device_sjd_ops::draw(const specula::detail::sjd_draft&, specula::detail::sjd_draft&,
                          std::span<const sjd_children_job> jobs, std::span<token_t> tokens,
                          std::span<index_t> counts, const request_rng& rng) {
  state& s = *s_;
  if (jobs.empty()) return;
  const std::size_t bytes = sizeof(request_rng) + jobs.size_bytes();
  if (bytes > s.jobs.n || jobs.size() + tokens.size() > s.drawn.n)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(jobs.size())}, "jobs",
                    "more draw jobs than the window reserved by start()");
  s.upload.resize(bytes);
  std::memcpy(s.upload.data(), &rng, sizeof(rng));
  std::memcpy(s.upload.data() + sizeof(rng), jobs.data(), jobs.size_bytes());
  const cudaStream_t stream = s.stream();
  check_cuda(cudaMemcpyAsync(s.jobs.ptr, s.upload.data(), bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync");
  s.own.bytes_to_device += bytes;
  const auto* d_rng = reinterpret_cast<const request_rng*>(s.jobs.ptr);
  const auto* d_jobs = reinterpret_cast<const sjd_children_job*>(s.jobs.ptr + sizeof(rng));
  std::int32_t* d_counts = s.drawn.ptr;
  auto* d_tokens = reinterpret_cast<token_t*>(s.drawn.ptr + jobs.size());
  check_cuda(device_detail::sjd_children(stream, d_jobs, static_cast<int>(jobs.size()), s.p.ptr,
                                         s.q, s.q_next, s.V, d_rng, d_counts, d_tokens),
             "sjd_children");
  const std::size_t back = jobs.size() + tokens.size();
  s.download.resize(back);
  check_cuda(cudaMemcpyAsync(s.download.data(), s.drawn.ptr, back * sizeof(std::int32_t),
                             cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  s.own.bytes_to_host += back * sizeof(std::int32_t);
  for (std::size_t j = 0; j < jobs.size(); ++j) counts[j] = s.download[j];
  for (std::size_t t = 0; t < tokens.size(); ++t) tokens[t] = s.download[jobs.size() + t];
}

void device_sjd_ops::next_ready() noexcept { std::swap(s_->q, s_->q_next); }

device_traffic device_sjd_ops::traffic() const noexcept {
  device_traffic t = s_->own;
  t.evaluations += s_->model->traffic().evaluations;
  t.bytes_to_device += s_->model->traffic().bytes_to_device;
  t.bytes_to_host += s_->model->traffic().bytes_to_host;
  return t;
}

}  // namespace specula::example
