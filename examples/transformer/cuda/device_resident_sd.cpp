// device_sd_ops (device_resident_sd.hpp): the loop's steps on the GPU.

#include "specula_example/device_resident_sd.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "device_buffers.hpp"
#include "device_kernels.hpp"
#include "device_tree_verify.hpp"
#include "device_verify.hpp"
#include "specula/core/error.hpp"

namespace specula::example {

namespace {

using device_detail::device_array;
const auto check = device_detail::check_cuda;

/// The draft stream of a step's draws, uploaded once per step.
struct step_inputs {
  request_rng rng;
};

}  // namespace

struct device_sd_ops::state {
  const device_transformer* target_model;
  const device_transformer* draft_model;
  device_session target, draft;
  index_t V;
  device_array<float> q, p;              // nodes x V
  device_array<sampling_params> params;  // [0] target, [1] draft
  device_array<step_inputs> draft_inputs;
  device_array<token_t> drafted;
  device_array<std::int32_t> counts;  // the draw count
  device_array<float> row_max;        // draft_p_min: the largest entry of the drawn q row
  float draft_p_min = 0.0f;
  index_t max_row = -1;  // the q row whose largest entry max_value holds (-1: none)
  float max_value = 0.0f;
  device_detail::device_tree_verify verifier;
  cudaEvent_t drafted_rows = nullptr;  // the draft stream's q rows, awaited by the target's
  std::optional<scheduled_relaxed_rule> relaxed;  // Cool-SD's rule (unset: exact)
  request_rng draft_rng{};
  bool draft_rng_valid = false;
  std::vector<index_t> path;
  device_traffic own;

  state(const device_transformer& t, const device_transformer& d)
      : target_model(&t), draft_model(&d), target(t), draft(d), V(t.vocab_size()) {
    check(cudaEventCreateWithFlags(&drafted_rows, cudaEventDisableTiming), "cudaEventCreate");
  }
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() { cudaEventDestroy(drafted_rows); }

  [[nodiscard]] cudaStream_t target_stream() const {
    return static_cast<cudaStream_t>(target_model->stream());
  }
  [[nodiscard]] cudaStream_t draft_stream() const {
    return static_cast<cudaStream_t>(draft_model->stream());
  }
  [[nodiscard]] float* row(device_array<float>& rows, index_t u) const {
    return rows.ptr + static_cast<std::size_t>(u) * static_cast<std::size_t>(V);
  }
};

device_sd_ops::device_sd_ops(const device_transformer& target, const device_transformer& draft)
    : s_(std::make_unique<state>(target, draft)) {
  require_parameter(draft.vocab_size() == target.vocab_size(), "draft",
                    static_cast<double>(draft.vocab_size()),
                    "the draft model's vocabulary must equal the target's");
  s_->params.ensure(2);
  s_->draft_inputs.ensure(1);
  s_->counts.ensure(1);
  s_->drafted.ensure(1);
  s_->row_max.ensure(1);
}

device_sd_ops::device_sd_ops(device_sd_ops&&) noexcept = default;
device_sd_ops& device_sd_ops::operator=(device_sd_ops&&) noexcept = default;
device_sd_ops::~device_sd_ops() = default;

void device_sd_ops::start(std::span<const token_t> prompt, const resident_sd_options& options) {
  state& s = *s_;
  const sampling_params params[2] = {options.target, options.draft};
  check(cudaMemcpy(s.params.ptr, params, sizeof(params), cudaMemcpyHostToDevice), "cudaMemcpy");
  s.own.bytes_to_device += sizeof(params);
  if (options.relaxed)
    require_parameter(options.relaxed->schedule.kind != schedule_kind::custom, "relaxed",
                      static_cast<double>(options.relaxed->schedule.kind),
                      "a custom schedule's values are host memory: not on the device");
  s.relaxed = options.relaxed;
  // Every row of a step stays in place until its verification: room for the largest tree.
  const auto rows = static_cast<std::size_t>(options.draft_tree ? options.draft_tree->size()
                                                                : options.draft_length + 1);
  s.q.ensure(rows * static_cast<std::size_t>(s.V));
  s.p.ensure(rows * static_cast<std::size_t>(s.V));
  s.verifier.reserve(static_cast<index_t>(rows));
  s.drafted.ensure(static_cast<std::size_t>(
      std::max<index_t>(1, options.draft_tree ? options.draft_tree->max_width() : 1)));
  s.draft_rng_valid = false;
  s.draft_p_min = options.draft_p_min;
  s.max_row = -1;
  s.target.prefill(prompt);
  if (options.draft_length > 0 || options.draft_tree) s.draft.prefill(prompt);  // else unused
}

index_t device_sd_ops::draft_context() const noexcept { return s_->draft.context_size(); }

void device_sd_ops::draft_pass(const token_tree& tree, index_t commit, index_t first,
                               index_t q_first) {
  state& s = *s_;
  if ((q_first + tree.size() - first) * s.V > static_cast<index_t>(s.q.n))
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(q_first)}, "q_first",
                    "beyond the rows reserved by start()");
  const float* logits = s.draft_model->evaluate_tree_device(s.draft.cache(), tree);
  if (commit == tree.size()) {
    s.draft.cache().commit_all();
  } else if (commit > 0) {
    s.path.resize(static_cast<std::size_t>(commit));
    for (index_t k = 0; k < commit; ++k) s.path[static_cast<std::size_t>(k)] = k;
    s.draft.commit(s.path);
  }
  check(device_detail::probs(s.draft_stream(), logits + first * s.V, tree.size() - first, s.V,
                             s.params.ptr + 1, s.row(s.q, q_first)),
        "logits_to_probs_async");
  check(cudaEventRecord(s.drafted_rows, s.draft_stream()), "cudaEventRecord");
}

index_t device_sd_ops::sample(index_t u, index_t k, const request_rng& rng,
                              std::span<token_t> out) {
  state& s = *s_;
  const cudaStream_t stream = s.draft_stream();
  if (k < 1 || k > static_cast<index_t>(s.drafted.n) || static_cast<index_t>(out.size()) < k)
    throw_if_failed({status::invalid_parameter, u, -1, static_cast<double>(k)}, "k",
                    "outside [1, the draft tree's widest fan]");
  if (!s.draft_rng_valid || !(s.draft_rng == rng)) {
    const step_inputs in{rng};
    check(cudaMemcpyAsync(s.draft_inputs.ptr, &in, sizeof(in), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    s.own.bytes_to_device += sizeof(in);
    s.draft_rng = rng;
    s.draft_rng_valid = true;
  }
  check(device_detail::sample(stream, s.row(s.q, u), s.V, &s.draft_inputs.ptr->rng,
                              static_cast<std::uint32_t>(u), k, s.drafted.ptr, s.counts.ptr),
        "sample_without_replacement_async");
  check(cudaMemcpyAsync(out.data(), s.drafted.ptr, static_cast<std::size_t>(k) * sizeof(token_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  if (s.draft_p_min > 0.0f) enqueue_row_max(u);  // draft_max(u) follows: the same round trip
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  s.own.bytes_to_host += static_cast<std::size_t>(k) * sizeof(token_t);
  index_t got = 0;
  while (got < k && out[static_cast<std::size_t>(got)] >= 0) ++got;
  return got;
}

void device_sd_ops::enqueue_row_max(index_t u) {
  state& s = *s_;
  const cudaStream_t stream = s.draft_stream();
  check(device_detail::row_max(stream, s.row(s.q, u), 1, static_cast<int>(s.V), s.row_max.ptr),
        "row_max");
  check(cudaMemcpyAsync(&s.max_value, s.row_max.ptr, sizeof(float), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  s.own.bytes_to_host += sizeof(float);
  s.max_row = u;
}

float device_sd_ops::draft_max(index_t u) {
  state& s = *s_;
  if (s.max_row != u) {
    enqueue_row_max(u);
    check(cudaStreamSynchronize(s.draft_stream()), "cudaStreamSynchronize");
  }
  s.max_row = -1;  // the next draft pass rewrites the rows
  return s.max_value;
}

void device_sd_ops::target(const token_tree& tree) {
  state& s = *s_;
  const float* logits = s.target_model->evaluate_tree_device(s.target.cache(), tree);
  check(device_detail::probs(s.target_stream(), logits, tree.size(), s.V, s.params.ptr, s.p.ptr),
        "logits_to_probs_async");
}

index_t device_sd_ops::verify(const token_tree& tree, const request_rng& rng,
                              std::span<token_t> out) {
  state& s = *s_;
  const cudaStream_t stream = s.target_stream();
  // The draft's q rows (its stream) before the target's stream reads or completes them.
  check(cudaStreamWaitEvent(stream, s.drafted_rows, 0), "cudaStreamWaitEvent");
  return s.verifier.run(stream, tree, s.p.ptr, s.q.ptr, s.V, rng, out, s.own,
                        s.relaxed ? &*s.relaxed : nullptr);
}

void device_sd_ops::commit_target(std::span<const index_t> path) { s_->target.commit(path); }

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
