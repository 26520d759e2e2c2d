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
using specula::detail::window_row;

struct device_sjd_ops::state {
  const device_transformer* model;
  device_session session;
  index_t V;
  sjd_options options;
  index_t rows = 0;                      // nodes of the largest draft
  bool grow = false;                     // proposal drafts: the rows grow with the tree
  device_array<float> p, q_a, q_b;       // rows x V each
  float* q = nullptr;                    // the current draft's q rows (q_a or q_b)
  float* q_next = nullptr;               // the next draft's
  device_array<sampling_params> params;  // the target's
  device_array<std::byte> jobs;          // [rng][jobs]
  device_array<std::int32_t> drawn;      // [counts][tokens]
  // Multi-block's stochastic window: rows set without a draw, the context's token counts (of
  // its first `counted` tokens), new context tokens, the leaf's window row during verification.
  device_array<window_row> window_rows;
  device_array<std::int32_t> context_counts;
  device_array<token_t> context_tokens;
  device_array<float> kept;
  std::size_t counted = 0;
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
  s.grow = false;
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
  if (tree.size() > s.rows && s.grow) {  // allocations synchronise: no pending work
    s.rows = tree.size();
    s.p.ensure(static_cast<std::size_t>(s.rows) * static_cast<std::size_t>(s.V));
    s.verifier.reserve(s.rows);
  }
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
  draw(jobs, tokens, counts, rng);
}

void device_sjd_ops::draw(std::span<const sjd_children_job> jobs, std::span<token_t> tokens,
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

void device_sjd_ops::start(index_t, const multiblock_options& options) {
  state& s = *s_;
  s.rows = detail::window_capacity(options);
  s.grow = false;
  const auto rows = static_cast<std::size_t>(s.rows);
  const auto V = static_cast<std::size_t>(s.V);
  s.p.ensure(rows * V);
  s.q_a.ensure(rows * V);
  s.q_b.ensure(rows * V);
  s.q = s.q_a.ptr;
  s.q_next = s.q_b.ptr;
  s.verifier.reserve(s.rows);
  s.jobs.ensure(sizeof(request_rng) + rows * sizeof(sjd_children_job));  // one job per position
  s.drawn.ensure(2 * rows);
  s.window_rows.ensure(rows);
  s.context_counts.ensure(V);
  s.kept.ensure(V);
  s.counted = 0;
  check_cuda(cudaMemsetAsync(s.context_counts.ptr, 0, V * sizeof(std::int32_t), s.stream()),
             "cudaMemsetAsync");
  check_cuda(cudaMemcpyAsync(s.params.ptr, &options.target, sizeof(sampling_params),
                             cudaMemcpyHostToDevice, s.stream()),
             "cudaMemcpyAsync");
  s.own.bytes_to_device += sizeof(sampling_params);
}

void device_sjd_ops::start(index_t, const speculative_options& options) {
  state& s = *s_;
  s.grow = true;
  check_cuda(cudaMemcpyAsync(s.params.ptr, &options.target, sizeof(sampling_params),
                             cudaMemcpyHostToDevice, s.stream()),
             "cudaMemcpyAsync");
  s.own.bytes_to_device += sizeof(sampling_params);
}

index_t device_sjd_ops::verify_drafts_exact(const token_tree& tree, const request_rng& rng,
                                            std::vector<token_t>& out_tokens,
                                            std::vector<index_t>& out_nodes) {
  state& s = *s_;
  out_tokens.assign(static_cast<std::size_t>(tree.size()), no_token);
  // No q rows: the drafts are deterministic (one-hot proposals).
  const index_t k = s.verifier.run(s.stream(), tree, s.p.ptr, nullptr, s.V, rng, out_tokens, s.own);
  detail::accepted_path(tree, out_tokens, k, out_nodes);
  return k;
}

index_t device_sjd_ops::verify_window_exact(const token_tree& tree, const request_rng& rng,
                                            std::vector<token_t>& out_tokens,
                                            std::vector<index_t>& out_nodes) {
  state& s = *s_;
  // The verifier gives the leaf its p row as q row in place; the window's row is kept aside.
  float* leaf = s.row(s.q, tree.size() - 1);
  const std::size_t row_bytes = static_cast<std::size_t>(s.V) * sizeof(float);
  check_cuda(cudaMemcpyAsync(s.kept.ptr, leaf, row_bytes, cudaMemcpyDeviceToDevice, s.stream()),
             "cudaMemcpyAsync");
  const index_t k = verify_exact(tree, rng, out_tokens, out_nodes);
  check_cuda(cudaMemcpyAsync(leaf, s.kept.ptr, row_bytes, cudaMemcpyDeviceToDevice, s.stream()),
             "cudaMemcpyAsync");
  return k;
}

void device_sjd_ops::write_rows(bool next, std::span<const window_row> rows,
                                std::span<const token_t> context) {
  state& s = *s_;
  if (rows.empty()) return;
  bool law = false;
  for (const window_row& r : rows) {
    detail::check_window_row(r, s.rows, context.size());
    law = law || r.from == window_row::context_law;
  }
  const cudaStream_t stream = s.stream();
  if (law && s.counted < context.size()) {  // count the tokens committed since the last law
    const std::size_t fresh = context.size() - s.counted;
    s.context_tokens.ensure(fresh);
    check_cuda(cudaMemcpyAsync(s.context_tokens.ptr, context.data() + s.counted,
                               fresh * sizeof(token_t), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
    s.own.bytes_to_device += fresh * sizeof(token_t);
    check_cuda(device_detail::count_tokens(stream, s.context_tokens.ptr, static_cast<int>(fresh),
                                           s.V, s.context_counts.ptr),
               "count_tokens");
    s.counted = context.size();
  }
  s.window_rows.ensure(rows.size());
  check_cuda(cudaMemcpyAsync(s.window_rows.ptr, rows.data(), rows.size_bytes(),
                             cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync");
  s.own.bytes_to_device += rows.size_bytes();
  check_cuda(device_detail::window_rows(stream, s.window_rows.ptr, static_cast<int>(rows.size()),
                                        s.q, next ? s.q_next : s.q, s.context_counts.ptr, s.V),
             "window_rows");
}

device_traffic device_sjd_ops::traffic() const noexcept {
  device_traffic t = s_->own;
  t.evaluations += s_->model->traffic().evaluations;
  t.bytes_to_device += s_->model->traffic().bytes_to_device;
  t.bytes_to_host += s_->model->traffic().bytes_to_host;
  return t;
}

}  // namespace specula::example
