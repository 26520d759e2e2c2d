// Launch checks of the device entry points. They run on the host before any CUDA call, so the
// cases tagged [host] here run without a GPU: every bad argument must return
// cudaErrorInvalidValue (a launch that slipped through would return another error here, such
// as cudaErrorNoDevice). Pointers are host addresses that are never dereferenced. The cases
// that need the device (host data behind a rule, offsets outside the arrays) are [device].
// The entry points' instantiations are those of the device test files (kernel_instances.cuh):
// this file compiles no kernel but the fused path's per-request one.

#include <array>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_buffer.cuh"
#include "kernel_instances.cuh"  // the entry points below are compiled in the device test files
#include "specula/cuda/chain.cuh"
#include "specula/cuda/fused.cuh"
#include "specula/cuda/rules.cuh"
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/tree.cuh"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/testing/toy_models.hpp"

using namespace specula;
using cuda_test::device_vector;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

constexpr index_t V = 8;
constexpr cudaError_t invalid = cudaErrorInvalidValue;

/// Host memory standing in for device arrays (never read: every launch below is refused).
struct fake_arrays {
  alignas(64) std::array<std::byte, 4096> bytes{};
  template <class T>
  T* at(std::size_t offset = 0) {
    return reinterpret_cast<T*>(bytes.data() + offset);
  }
};

/// A consistent flattened batch of B = 2 requests with 3 drafts (target rows 5).
struct flat_case {
  fake_arrays m;
  chain_batch_input<float> in;
  chain_batch_output out;
  flat_case() {
    in = chain_batch_input<float>{V,
                                  {m.at<const index_t>(), 3},
                                  {m.at<const token_t>(), 3},
                                  {m.at<const float>(), 3, V},
                                  {m.at<const float>(), 5, V},
                                  {m.at<const request_rng>(), 2}};
    out = chain_batch_output{
        {m.at<token_t>(), 5}, {m.at<std::int32_t>(), 2}, {m.at<std::uint8_t>(), 3}, {}};
  }
};

}  // namespace

TEST_CASE("chain launch checks refuse inconsistent arguments before any CUDA call",
          "[cuda][bad_input][host]") {
  flat_case c;
  REQUIRE(sc::detail::check_flattened(c.in, c.out, true) == cudaSuccess);
  const auto pol = sc::par_on(nullptr);
  auto expect_refused = [&](const chain_batch_input<float>& in, const chain_batch_output& out) {
    CHECK(sc::detail::check_flattened(in, out, true) == invalid);
    CHECK(sc::verify_chain_async(pol, in, out) == invalid);
  };
  auto in = c.in;
  in.target_probs.cols = V - 1;  // rows shorter than vocab_size
  expect_refused(in, c.out);
  in = c.in;
  in.target_probs.row_stride = V - 1;  // rows overlapping
  expect_refused(in, c.out);
  in = c.in;
  in.target_probs.data = nullptr;
  expect_refused(in, c.out);
  in = c.in;
  in.draft_probs.cols = V + 1;  // q rows of another length
  expect_refused(in, c.out);
  in = c.in;
  in.target_probs.rows = 4;  // fewer target rows than drafts + B
  expect_refused(in, c.out);
  in = c.in;
  in.rng.size = 1;  // no random stream for request 1
  expect_refused(in, c.out);
  in = c.in;
  in.draft_offsets = index_view(nullptr, 3);  // offsets without data
  expect_refused(in, c.out);
  in = c.in;
  in.draft_tokens.data = nullptr;
  expect_refused(in, c.out);
  auto out = c.out;
  out.output_tokens.size = 4;  // output shorter than drafts + B
  expect_refused(c.in, out);
  out = c.out;
  out.accepted.data = nullptr;  // a non-empty array without data
  expect_refused(c.in, out);
  out = c.out;
  out.flags = {nullptr, 2};
  expect_refused(c.in, out);
  // Caller-supplied bonus tokens (host-only so far), sampled and greedy.
  in = c.in;
  in.bonus_tokens = row_view<const token_t>(c.in.draft_tokens.data, 2);
  expect_refused(in, c.out);
  CHECK(sc::verify_chain_greedy_async(pol, in, c.out) == invalid);
  // Per-request greedy flags: one per request (accepted by the checks), or refused when short
  // or without data.
  const std::array<std::uint8_t, 2> flags2{1, 0};
  in = c.in;
  in.is_greedy = row_view<const std::uint8_t>(flags2.data(), 2);
  CHECK(sc::detail::check_flattened(in, c.out, true) == cudaSuccess);
  in.is_greedy = row_view<const std::uint8_t>(flags2.data(), 1);
  expect_refused(in, c.out);
  in.is_greedy = row_view<const std::uint8_t>(nullptr, 2);
  expect_refused(in, c.out);
  // A vocabulary beyond the kernels' limit, and no vocabulary.
  in = c.in;
  in.vocab_size = sc::chain_max_vocab + 1;
  CHECK(sc::verify_chain_async(pol, in, c.out) == invalid);
  in.vocab_size = 0;
  CHECK(sc::verify_chain_async(pol, in, c.out) == invalid);
  // Greedy verification: the same extents (no q rows or streams needed).
  in = c.in;
  in.target_probs.cols = V - 1;
  CHECK(sc::verify_chain_greedy_async(pol, in, c.out) == invalid);
  in = c.in;
  in.rng = {};
  in.draft_probs = {};
  CHECK(sc::detail::check_flattened(in, c.out, false) == cudaSuccess);
  // B = 0 is a no-op, whatever else the arguments hold.
  in = c.in;
  in.draft_offsets = index_view(nullptr, 1);
  CHECK(sc::verify_chain_async(pol, in, chain_batch_output{}) == cudaSuccess);
}

TEST_CASE("chain launch checks: the split path's workspace must be aligned for doubles",
          "[cuda][bad_input][host]") {
  flat_case c;
  const auto pol = sc::par_on(nullptr).with_workspace(c.m.at<void>(4), 1024).with_row_split(2);
  CHECK(sc::verify_chain_async(pol, c.in, c.out) == invalid);
}

TEST_CASE("padded chain launch checks refuse inconsistent arguments", "[cuda][bad_input][host]") {
  fake_arrays m;
  const index_t B = 2, L = 3;
  const padded_chain_input<float> in{V,
                                     B,
                                     L,
                                     {m.at<const token_t>(), B * L},
                                     {},
                                     {m.at<const float>(), B * L, V},
                                     {m.at<const float>(), B * (L + 1), V},
                                     {m.at<const request_rng>(), B}};
  const padded_chain_output out{{m.at<token_t>(), B * (L + 1)}, {m.at<std::int32_t>(), B}, {}, {}};
  REQUIRE(sc::detail::check_padded(in, out) == cudaSuccess);
  const auto pol = sc::par_on(nullptr);
  auto bad = in;
  bad.draft_tokens.size = B * L - 1;  // shorter than B x L
  CHECK(sc::verify_chain_async(pol, bad, out) == invalid);
  bad = in;
  bad.draft_lengths = index_view(nullptr, B);  // lengths without data
  CHECK(sc::verify_chain_async(pol, bad, out) == invalid);
  bad = in;
  bad.draft_lengths = index_view(m.at<const std::int32_t>(), B - 1);  // too few lengths
  CHECK(sc::verify_chain_async(pol, bad, out) == invalid);
  bad = in;
  bad.target_probs.row_stride = 1;
  CHECK(sc::verify_chain_async(pol, bad, out) == invalid);
  auto bad_out = out;
  bad_out.num_accepted.data = nullptr;
  CHECK(sc::verify_chain_async(pol, in, bad_out) == invalid);
  // The split path (both layouts) stores doubles in the workspace: it must be aligned for them.
  CHECK(sc::verify_chain_async(
            pol.with_workspace(m.at<void>(4), sc::chain_workspace_bytes(B, V)).with_row_split(2),
            in, out) == invalid);
}

TEST_CASE("rules whose data the kernels read are checked before launching",
          "[cuda][bad_input][host]") {
  flat_case c;
  const auto pol = sc::par_on(nullptr);
  // per_request: fewer rules than requests, or no data.
  const std::vector<relaxed_rule> one(1);
  CHECK(sc::verify_chain_async(pol, c.in, c.out, {}, per_request<relaxed_rule>{{one.data(), 1}}) ==
        invalid);
  CHECK(sc::verify_chain_async(pol, c.in, c.out, {}, per_request<relaxed_rule>{{nullptr, 2}}) ==
        invalid);
  // LANTERN: a table for another vocabulary, or none.
  std::vector<token_t> ids;
  for (index_t t = 0; t < V + 1; ++t)
    for (index_t j = 0; j < 2; ++j) ids.push_back(static_cast<token_t>((t + j + 1) % (V + 1)));
  const neighbour_table other(ids, V + 1, 2);
  CHECK(sc::verify_chain_async(pol, c.in, c.out, {}, lantern_rule::make_relative(other, 0.5)) ==
        invalid);
  CHECK(sc::detail::check_rule(lantern_rule{}, V, 2) == invalid);
  // A custom schedule without values.
  scheduled_relaxed_rule custom{relaxation_schedule{}, resampling::optimal};
  custom.schedule.kind = schedule_kind::custom;
  custom.schedule.count = 3;
  CHECK(sc::verify_chain_async(pol, c.in, c.out, {}, custom) == invalid);
  // Cool-SD's schedule with LANTERN++: both its table and its custom schedule are checked
  // (a table for another vocabulary, none, or a custom schedule without values is refused
  // without a CUDA call).
  std::vector<token_t> own_ids;  // this vocabulary: the neighbours of t are t + 1, t + 2 mod V
  for (index_t t = 0; t < V; ++t)
    for (index_t j = 0; j < 2; ++j) own_ids.push_back(static_cast<token_t>((t + j + 1) % V));
  const neighbour_table own(own_ids, V, 2);
  const auto uniform = relaxation_schedule::make_uniform(1.5);
  const scheduled_lantern_rule foreign{lantern_rule::make_relative(other, 0.5), uniform};
  CHECK(sc::detail::check_rule(foreign, V, 2) == invalid);
  CHECK(sc::verify_chain_async(pol, c.in, c.out, {}, foreign) == invalid);
  CHECK(sc::detail::check_rule(scheduled_lantern_rule{lantern_rule{}, uniform}, V, 2) == invalid);
  scheduled_lantern_rule no_values{lantern_rule::make_relative(own, 0.5), custom.schedule};
  CHECK(sc::detail::check_rule(no_values, V, 2) == invalid);
  CHECK(sc::verify_chain_async(pol, c.in, c.out, {}, no_values) == invalid);
  // A well-formed rule whose table is host memory: refused (cudaErrorInvalidValue with a GPU,
  // the pointer query's error without one), never launched.
  CHECK(sc::detail::check_rule(
            scheduled_lantern_rule{lantern_rule::make_relative(own, 0.5), uniform}, V, 2) !=
        cudaSuccess);
  // Rules without data need no check.
  CHECK(sc::detail::check_rule(relaxed_rule{1.5}, V, 2) == cudaSuccess);
  CHECK(sc::detail::check_rule(scheduled_relaxed_rule{relaxation_schedule::make_uniform(1.2)}, V,
                               2) == cudaSuccess);
}

TEST_CASE("fused launch checks reuse the flattened layout's", "[cuda][fused][bad_input][host]") {
  flat_case c;
  const std::vector<sampling_params> params(1);
  const sc::fused_chain_input<float> in{V,
                                        {c.m.at<const index_t>(), 3},
                                        c.in.draft_tokens,
                                        c.in.draft_probs,
                                        {c.m.at<const float>(), 5, V},
                                        {},
                                        {params.data(), 1},
                                        c.in.rng};
  const auto ws = sc::fused_chain_workspace_bytes(5);
  const auto pol = sc::par_on(nullptr).with_workspace(c.m.at<void>(), ws);
  auto expect_refused = [&](const sc::fused_chain_input<float>& bad, const chain_batch_output& out,
                            const sc::par_policy& p) {
    CHECK(sc::verify_chain_from_logits_async(p, bad, out) == invalid);
  };
  // Outputs the kernel writes by the flattened layout: too short, missing, without data.
  auto out = c.out;
  out.output_tokens.size = 4;
  expect_refused(in, out, pol);
  out = c.out;
  out.accepted = {nullptr, 3};
  expect_refused(in, out, pol);
  out = c.out;
  out.num_accepted.size = 1;
  expect_refused(in, out, pol);
  // q rows of another length, or fewer than the drafts; a logit stride below V.
  auto bad = in;
  bad.draft_probs.cols = V - 1;
  expect_refused(bad, c.out, pol);
  bad = in;
  bad.draft_probs.rows = 2;
  expect_refused(bad, c.out, pol);
  bad = in;
  bad.target_logits.row_stride = V - 1;
  expect_refused(bad, c.out, pol);
  // No target rows at all (an empty grid), fewer than drafts + B, uncond of another shape.
  bad = in;
  bad.target_logits.rows = 0;
  expect_refused(bad, c.out, pol);
  bad = in;
  bad.target_logits.rows = 4;
  expect_refused(bad, c.out, pol);
  bad = in;
  bad.uncond_logits = {c.m.at<const float>(), 5, V, V - 1};
  expect_refused(bad, c.out, pol);
  bad = in;
  bad.uncond_logits = {c.m.at<const float>(), 4, V};
  expect_refused(bad, c.out, pol);
  // params: neither 1 nor one per row, or without data.
  bad = in;
  bad.params = {params.data(), 2};
  expect_refused(bad, c.out, pol);
  bad = in;
  bad.params = {nullptr, 1};
  expect_refused(bad, c.out, pol);
  // Workspace: missing, short, misaligned.
  expect_refused(in, c.out, sc::par_on(nullptr));
  expect_refused(in, c.out, sc::par_on(nullptr).with_workspace(c.m.at<void>(), ws - 1));
  expect_refused(in, c.out, sc::par_on(nullptr).with_workspace(c.m.at<void>(4), ws));
  // int32 offsets (as chain_batch_input takes them) go through the same checks.
  auto in32 = in;
  in32.draft_offsets = index_view(c.m.at<const std::int32_t>(), 3);
  out = c.out;
  out.output_tokens.size = 4;
  expect_refused(in32, out, pol);
  in32.draft_offsets = index_view(nullptr, 3);
  expect_refused(in32, c.out, pol);
  // Greedy flags shorter than the batch, or without data.
  const std::array<std::uint8_t, 2> flags2{1, 0};
  bad = in;
  bad.is_greedy = row_view<const std::uint8_t>(flags2.data(), 1);
  expect_refused(bad, c.out, pol);
  bad.is_greedy = row_view<const std::uint8_t>(nullptr, 2);
  expect_refused(bad, c.out, pol);
  // A per_request rule array shorter than the batch.
  const std::vector<exact_rule> one(1);
  CHECK(sc::verify_chain_from_logits_async(pol, in, c.out, {},
                                           per_request<exact_rule>{{one.data(), 1}}) == invalid);
}

TEST_CASE("tree and candidate launch checks refuse inconsistent arguments",
          "[cuda][tree][bad_input][host]") {
  fake_arrays m;
  const sc::tree_device_input<float> in{V,
                                        {m.at<const index_t>(), 3},
                                        {m.at<const index_t>(), 6},
                                        {m.at<const token_t>(), 6},
                                        {m.at<const float>(), 6, V},
                                        {m.at<const float>(), 6, V},
                                        {m.at<const request_rng>(), 2}};
  const tree_batch_output out{{m.at<token_t>(), 6}, {m.at<std::int32_t>(), 2}, {}, {}};
  REQUIRE(sc::detail::check_tree_launch(in, out, 2, true).ok);
  const auto pol = sc::par_on(nullptr);
  auto expect_refused = [&](const sc::tree_device_input<float>& bad, const tree_batch_output& o) {
    CHECK(sc::verify_tree_async(pol, bad, o) == invalid);
  };
  auto bad = in;
  bad.target_probs.cols = V - 1;  // rows of another length
  expect_refused(bad, out);
  CHECK(sc::verify_tree_greedy_async(pol, bad, out) == invalid);
  bad = in;
  bad.target_probs.row_stride = 2;
  expect_refused(bad, out);
  bad = in;
  bad.draft_probs.cols = V + 1;
  expect_refused(bad, out);
  bad = in;
  bad.rng.size = 1;
  expect_refused(bad, out);
  bad = in;
  bad.node_offsets.data = nullptr;
  expect_refused(bad, out);
  bad = in;
  bad.vocab_size = 0;  // no vocabulary (with a batch: B = 0 would be a no-op)
  bad.target_probs.cols = 0;
  expect_refused(bad, out);
  auto bad_out = out;
  bad_out.num_accepted.size = 1;
  expect_refused(in, bad_out);
  CHECK(sc::verify_tree_greedy_async(pol, in, bad_out) == invalid);
  bad_out = out;
  bad_out.flags = {nullptr, 2};
  expect_refused(in, bad_out);
  // Rules: a per_request array shorter than the batch.
  const std::vector<relaxed_rule> one(1);
  CHECK(sc::verify_tree_async(pol, in, out, tree_options{},
                              per_request<relaxed_rule>{{one.data(), 1}}) == invalid);
  // An empty batch is a no-op.
  CHECK(sc::verify_tree_async(pol, sc::tree_device_input<float>{}, tree_batch_output{}) ==
        cudaSuccess);

  const sc::candidates_device_input<float> cin{V,
                                               {m.at<const index_t>(), 3},
                                               {m.at<const token_t>(), 4},
                                               {m.at<const float>(), 2, V},
                                               {m.at<const float>(), 2, V},
                                               {m.at<const request_rng>(), 2},
                                               0};
  const sc::candidates_device_output cout{
      {m.at<token_t>(), 2}, {m.at<std::int32_t>(), 2}, {m.at<std::uint32_t>(), 2}};
  auto cbad = cin;
  cbad.target_probs.rows = 1;  // one row per request
  CHECK(sc::verify_candidates_async(pol, cbad, cout) == invalid);
  cbad = cin;
  cbad.candidates.data = nullptr;
  CHECK(sc::verify_candidates_async(pol, cbad, cout) == invalid);
  cbad = cin;
  cbad.vocab_size = 0;
  CHECK(sc::verify_candidates_async(pol, cbad, cout) == invalid);
  auto cbad_out = cout;
  cbad_out.accepted.size = 1;
  CHECK(sc::verify_candidates_async(pol, cin, cbad_out) == invalid);
}

TEST_CASE(
    "sampling without replacement refuses null data, short strides and misaligned "
    "workspaces",
    "[cuda][sample][bad_input][host]") {
  fake_arrays m;
  const index_t rows = 2, k = 4;
  const batch_view<const float> w{m.at<const float>(), rows, V};
  const row_view<const request_rng> rng{m.at<const request_rng>(), rows};
  const row_view<token_t> tokens{m.at<token_t>(), rows * k};
  const row_view<std::int32_t> counts{m.at<std::int32_t>(), rows};
  const auto pol = sc::par_on(nullptr);
  CHECK(sc::sample_without_replacement_async(pol, batch_view<const float>{nullptr, rows, V}, k, rng,
                                             0, tokens, counts) == invalid);
  CHECK(sc::sample_without_replacement_async(pol, batch_view<const float>{w.data, rows, V, V - 1},
                                             k, rng, 0, tokens, counts) == invalid);
  CHECK(sc::sample_without_replacement_async(pol, w, k, {nullptr, rows}, 0, tokens, counts) ==
        invalid);
  CHECK(sc::sample_without_replacement_async(pol, w, k, rng, 0, {nullptr, rows * k}, counts) ==
        invalid);
  CHECK(sc::sample_without_replacement_async(pol, w, 0, rng, 0, tokens, counts) == invalid);
  CHECK(sc::sample_without_replacement_async(pol, w, sc::sample_max_k + 1, rng, 0, tokens,
                                             counts) == invalid);
  const auto ws = sc::sample_without_replacement_workspace_bytes(rows, k);
  CHECK(sc::sample_without_replacement_async(pol.with_workspace(m.at<void>(4), ws), w, k, rng, 0,
                                             tokens, counts) == invalid);
  // No rows: a no-op, as every other entry point's empty batch (no launch, so no CUDA error).
  CHECK(sc::sample_without_replacement_async(pol, batch_view<const float>{nullptr, 0, V}, k, {}, 0,
                                             {}, {}) == cudaSuccess);
}

TEST_CASE("row samplers refuse bad extents, null data and short arrays before any CUDA call",
          "[cuda][sample][bad_input][host]") {
  fake_arrays m;
  const index_t rows = 3;
  const batch_view<const float> probs{m.at<const float>(), rows, V};
  const batch_view<const float> logits{m.at<const float>(), rows, V};
  const row_view<const request_rng> rng{m.at<const request_rng>(), rows};
  const row_view<token_t> out{m.at<token_t>(), rows};
  const row_view<const sampling_params> params{m.at<const sampling_params>(), 1};
  const row_view<const std::uint8_t> greedy{m.at<const std::uint8_t>(), rows};
  const auto pol = sc::par_on(nullptr);
  const auto probs_refused = [&](batch_view<const float> p, row_view<const request_rng> r,
                                 row_view<token_t> o) {
    CHECK(sc::sample_from_probs_async<float>(pol, p, r, o) == invalid);
  };
  const auto logits_refused = [&](batch_view<const float> l, row_view<const sampling_params> sp,
                                  row_view<const request_rng> r, row_view<token_t> o,
                                  row_view<const std::uint8_t> g) {
    CHECK(sc::sample_from_logits_async<float>(pol, l, sp, r, o, g) == invalid);
  };
  // Rows: without data, of no entry, with a stride below the row length.
  probs_refused({nullptr, rows, V}, rng, out);
  probs_refused({probs.data, rows, 0}, rng, out);
  probs_refused({probs.data, rows, V, V - 1}, rng, out);
  logits_refused({nullptr, rows, V}, params, rng, out, {});
  logits_refused({logits.data, rows, 0}, params, rng, out, {});
  logits_refused({logits.data, rows, V, V - 1}, params, rng, out, {});
  // Streams and outputs: shorter than the batch, or without data.
  probs_refused(probs, {rng.data, rows - 1}, out);
  probs_refused(probs, {nullptr, rows}, out);
  probs_refused(probs, rng, {out.data, rows - 1});
  probs_refused(probs, rng, {nullptr, rows});
  logits_refused(logits, params, {rng.data, rows - 1}, out, {});
  logits_refused(logits, params, rng, {nullptr, rows}, {});
  // Parameters: neither 1 nor one per row, or without data; greedy flags short or without data.
  logits_refused(logits, {params.data, 2}, rng, out, {});
  logits_refused(logits, {nullptr, 1}, rng, out, {});
  logits_refused(logits, params, rng, out, {greedy.data, rows - 1});
  logits_refused(logits, params, rng, out, {nullptr, rows});
  // A batch beyond the grid.
  probs_refused({probs.data, index_t{1} << 31, V}, {rng.data, index_t{1} << 31},
                {out.data, index_t{1} << 31});
  // No rows: a no-op, whatever else the arguments hold.
  CHECK(sc::sample_from_probs_async<float>(pol, {nullptr, 0, V}, {}, {}) == cudaSuccess);
  CHECK(sc::sample_from_logits_async<float>(pol, {nullptr, 0, 0}, {}, {}, {}) == cudaSuccess);
}

TEST_CASE("rules pointing to host memory are refused on the device and to_device copies them",
          "[cuda][bad_input][device]") {
  if (!cuda_test::have_gpu("host-pointer checks")) return;
  const index_t vocab = 16;
  std::vector<token_t> ids;
  for (index_t t = 0; t < vocab; ++t)
    for (index_t j = 0; j < 2; ++j) ids.push_back(static_cast<token_t>((t + j + 1) % vocab));
  const neighbour_table table(ids, vocab, 2);
  const auto host_rule = lantern_rule::make_relative(table, 0.5);
  CHECK(sc::detail::check_rule(host_rule, vocab, 1) == invalid);
  const auto dev = sc::to_device(host_rule);
  CHECK(sc::detail::check_rule(dev.rule(), vocab, 1) == cudaSuccess);
  CHECK(sc::to_device(dev.rule()).rule().table.vocab == vocab);

  const std::vector<double> omegas{1.5, 1.2, 1.1};
  const scheduled_relaxed_rule custom{relaxation_schedule::make_custom(omegas.data(), 3)};
  CHECK(sc::detail::check_rule(custom, vocab, 1) == invalid);
  CHECK(sc::detail::check_rule(sc::to_device(custom).rule(), vocab, 1) == cudaSuccess);

  // Cool-SD's schedule with LANTERN++: the table and the ω values, both refused as host
  // memory, both copied by to_device.
  const scheduled_lantern_rule both{host_rule, relaxation_schedule::make_custom(omegas.data(), 3)};
  CHECK(sc::detail::check_rule(both, vocab, 1) == invalid);
  CHECK(sc::detail::check_rule(scheduled_lantern_rule{dev.rule(), both.schedule}, vocab, 1) ==
        invalid);
  const auto both_dev = sc::to_device(both);
  CHECK(sc::detail::check_rule(both_dev.rule(), vocab, 1) == cudaSuccess);
  CHECK(both_dev.rule().schedule.values != omegas.data());
  CHECK(sc::detail::check_rule(sc::to_device(both_dev.rule()).rule(), vocab, 1) == cudaSuccess);

  const std::vector<relaxed_rule> rules{relaxed_rule{1.0}, relaxed_rule{2.0}};
  const per_request<relaxed_rule> host_rules{{rules.data(), 2}};
  CHECK(sc::detail::check_rule(host_rules, vocab, 2) == invalid);
  const auto dev_rules = sc::to_device(host_rules);
  CHECK(sc::detail::check_rule(dev_rules.rule(), vocab, 2) == cudaSuccess);
  // Re-copying a device_rule's rule: its array is device memory, read by cudaMemcpy.
  CHECK(sc::detail::check_rule(sc::to_device(dev_rules.rule()).rule(), vocab, 2) == cudaSuccess);
  const std::vector<scheduled_lantern_rule> boths(2, both);
  CHECK(sc::detail::check_rule(
            sc::to_device(per_request<scheduled_lantern_rule>{{boths.data(), 2}}).rule(), vocab,
            2) == cudaSuccess);
}

TEST_CASE("requests whose offsets point outside the arrays get -1 in their output slots",
          "[cuda][bad_input][device]") {
  if (!cuda_test::have_gpu("stale-output checks")) return;
  const index_t vocab = 16;
  // Request 0: 1 draft; request 1: offsets running past the drafts (offset 1 -> 40).
  const std::vector<index_t> offsets{0, 1, 40};
  std::vector<float> rows(static_cast<std::size_t>(4 * vocab), 1.0f / vocab);
  device_vector<index_t> off(offsets);
  device_vector<token_t> tok(std::vector<token_t>{3, 4});
  device_vector<float> p(rows), q(rows);
  device_vector<request_rng> rng(std::vector<request_rng>(2, request_rng{1, 2, 3}));
  device_vector<token_t> out(std::vector<token_t>(4, 77));
  device_vector<std::int32_t> n(std::vector<std::int32_t>(2, 5));
  device_vector<std::uint32_t> fl(std::vector<std::uint32_t>(2, 0));
  const chain_batch_input<float> in{
      vocab, off.cview(), {tok.ptr, 2}, {q.ptr, 2, vocab}, {p.ptr, 4, vocab}, rng.cview()};
  const chain_batch_output o{out.view(), n.view(), {}, fl.view()};
  for (bool greedy : {false, true}) {
    out.assign(std::vector<token_t>(4, 77));
    sc::throw_on_error(greedy ? sc::verify_chain_greedy_async(sc::par_on(nullptr), in, o)
                              : sc::verify_chain_async(sc::par_on(nullptr), in, o),
                       "chain");
    sc::throw_on_error(cudaDeviceSynchronize(), "chain kernel");
    const auto t = out.to_host();
    INFO("greedy " << greedy);
    CHECK(fl.to_host()[1] == chain_invalid_input);
    CHECK(n.to_host()[1] == 0);
    CHECK(t[2] == no_token);  // request 1's slots in the array: draft_offsets[1] + 1, and on
    CHECK(t[3] == no_token);
  }
}
