// Device tree, K-candidate and sampling-without-replacement kernels against a device-to-device
// copy of the bytes they must touch.
//
// Names:
//   cuda_tree/<sjd_pac|eagle>/V:<V>/B:<B>   tree verification, fp32 rows, siblings drawn without
//                                           replacement; sjd_pac = trees::sjd_pac(3, 2, 64)
//                                           (64 nodes), eagle = a 60-node tree shaped like
//                                           EAGLE's static tree (10 root children, then
//                                           narrowing levels down to depth 5)
//   cuda_tree_greedy/<shape>/V:<V>/B:<B>    greedy tree verification of the same trees
//   cuda_candidates/K:<K>/V:<V>/B:<B>       K candidates at one position, without replacement
//   cuda_candidates/all_rejected/K:<K>/...  the same with p(c) = 0 at every candidate (all K
//                                           rejected: K normaliser passes, then the residual
//                                           sample; the host's candidates/.../all_rejected case)
//   cuda_sample_wor/k:<k>/V:<V>/B:<B>/S:<1|auto>  sampling k categories without replacement, one
//                                           CTA per row (S:1) or the automatic row split
// Counters as bench/cuda_bench_util.cuh: bytes is the floor each launch must touch — for trees
// and candidates, read off the warm-up's outcome: 8 bytes per child tested, plus both rows of a
// node (8V) only where a child was rejected there, or the residual is sampled, and the p row
// (4V) of a leaf's bonus token (tree_floor_bytes); greedy trees read the p row of every visited
// node (4V); for sampling, each row once (4V). Without a GPU every case is skipped with "no CUDA
// device".

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "specula/cuda/error.cuh"
#include "specula/cuda/sampling.cuh"
#include "specula/cuda/tree.cuh"
#include "specula/tree/builders.hpp"

using namespace specula;
namespace sc = specula::cuda;  // CUB brings a top-level ::cuda namespace

namespace {

using specula::bench::device_buffer;

using specula::bench::skewed_row;
using specula::bench::upload;

/// `rows` device rows, each a copy of `row` (uploaded once, replicated on the device so that
/// every row has its own memory).
struct replicated_rows {
  device_buffer buf;
  replicated_rows(const std::vector<float>& row, index_t rows)
      : buf(row.size() * sizeof(float) * static_cast<std::size_t>(rows)) {
    const std::size_t bytes = row.size() * sizeof(float);
    sc::throw_on_error(cudaMemcpy(buf.ptr, row.data(), bytes, cudaMemcpyHostToDevice), "upload");
    for (index_t r = 1; r < rows; ++r)
      sc::throw_on_error(
          cudaMemcpy(static_cast<char*>(buf.ptr) + bytes * static_cast<std::size_t>(r), buf.ptr,
                     bytes, cudaMemcpyDeviceToDevice),
          "replicate");
  }
};

token_tree eagle_like_tree() {
  // Level sizes: 10 root children; then the first nodes of each level get 6,5,4,3 / 4,3,3,2,2 /
  // 3,2,2,2 / 3,2,2,1 children: 1 + 10 + 18 + 14 + 9 + 8 = 60 nodes.
  std::vector<index_t> parents{-1};
  std::vector<index_t> level{0};
  const std::vector<std::vector<index_t>> fanout{
      {10}, {6, 5, 4, 3}, {4, 3, 3, 2, 2}, {3, 2, 2, 2}, {3, 2, 2, 1}};
  for (const auto& f : fanout) {
    std::vector<index_t> next;
    for (std::size_t j = 0; j < f.size() && j < level.size(); ++j)
      for (index_t c = 0; c < f[j]; ++c) {
        parents.push_back(level[j]);
        next.push_back(static_cast<index_t>(parents.size()) - 1);
      }
    level = next;
  }
  return token_tree(std::move(parents));
}

void skip_without_gpu(benchmark::State& state, bool& skip) {
  skip = sc::device_count() == 0;
  if (skip) state.SkipWithError("no CUDA device");
}

/// Bytes a sampled tree walk must touch at least, given its accepted path (`path`: local node
/// ids, root first, `accepted` + 1 of them): at each node of the path, a child accepted at once
/// costs its p(x) and q(x) (8 bytes); rejections before the accepted child need the node's p and
/// q rows (8V: the normalisers Z_k sum them); at the last node, a rejected set of children reads
/// both rows for the residual (8V) and a leaf reads p's row for the bonus token (4V). 8 bytes per
/// child tested come on top.
double tree_floor_bytes(const token_tree& tree, const index_t* path, index_t accepted,
                        index_t vocab) {
  const auto v = static_cast<double>(vocab);
  double bytes = 0;
  for (index_t i = 0; i <= accepted; ++i) {
    const index_t u = path[i];
    index_t tested = 0;
    bool found = false;
    for (index_t c = tree.first_child(u); c >= 0 && !found; c = tree.next_sibling(c)) {
      ++tested;
      found = i < accepted && c == path[i + 1];
    }
    bytes += 8.0 * static_cast<double>(tested);
    if (i < accepted) {
      if (tested > 1) bytes += 8.0 * v;  // rejections before the accepted child
    } else {
      bytes += tested > 0 ? 8.0 * v : 4.0 * v;  // residual, or bonus at a leaf
    }
  }
  return bytes;
}

void tree_case(benchmark::State& state, const token_tree& shape, index_t vocab, index_t batch,
               bool greedy) {
  bool skip = false;
  skip_without_gpu(state, skip);
  if (skip) return;
  const index_t nodes = shape.size();
  const index_t total = nodes * batch;
  // q: one skewed row; p: a mixture with another, so that walks stop at various depths.
  const auto q = skewed_row(vocab, 3);
  auto p = skewed_row(vocab, 4);
  for (std::size_t y = 0; y < p.size(); ++y) p[y] = 0.7f * q[y] + 0.3f * p[y];
  // Children: the most likely tokens of q, distinct among siblings.
  std::vector<index_t> order(static_cast<std::size_t>(vocab));
  for (index_t y = 0; y < vocab; ++y) order[static_cast<std::size_t>(y)] = y;
  std::partial_sort(order.begin(), order.begin() + 64, order.end(), [&](index_t a, index_t b) {
    return q[static_cast<std::size_t>(a)] > q[static_cast<std::size_t>(b)];
  });
  std::vector<token_t> tokens(static_cast<std::size_t>(nodes), no_token);
  for (index_t u = 0; u < nodes; ++u) {
    index_t c = 0;
    for (index_t k = shape.first_child(u); k >= 0; k = shape.next_sibling(k))
      tokens[static_cast<std::size_t>(k)] =
          static_cast<token_t>(order[static_cast<std::size_t>(c++)]);
  }
  token_tree tree = shape;
  tree.set_tokens(tokens);
  std::vector<token_tree> trees(static_cast<std::size_t>(batch), tree);
  const auto flat = sc::flatten_trees({trees.data(), batch});
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b)
    rng.push_back(request_rng{5, static_cast<std::uint32_t>(b), 0});
  device_buffer d_off(flat.node_offsets.size() * sizeof(index_t)),
      d_par(flat.parents.size() * sizeof(index_t)), d_tok(flat.tokens.size() * sizeof(token_t)),
      d_rng(rng.size() * sizeof(request_rng)),
      d_out(static_cast<std::size_t>(total) * sizeof(token_t)),
      d_n(static_cast<std::size_t>(batch) * sizeof(std::int32_t));
  upload(d_off, flat.node_offsets);
  upload(d_par, flat.parents);
  upload(d_tok, flat.tokens);
  upload(d_rng, rng);
  const replicated_rows d_p(p, total), d_q(q, total);
  const sc::tree_device_input<float> in{vocab,
                                        {d_off.as<index_t>(), batch + 1},
                                        {d_par.as<index_t>(), total},
                                        {d_tok.as<token_t>(), total},
                                        {d_p.buf.as<float>(), total, vocab},
                                        {d_q.buf.as<float>(), total, vocab},
                                        {d_rng.as<request_rng>(), batch}};
  const tree_batch_output out{
      {d_out.as<token_t>(), total}, {d_n.as<std::int32_t>(), batch}, {}, {}};
  const auto pol = sc::par_on(nullptr);
  auto launch = [&] {
    return greedy ? sc::verify_tree_greedy_async(pol, in, out)
                  : sc::verify_tree_async(pol, in, out);
  };
  // Warm-up with the accepted nodes recorded (the timed launches write no node ids), for the
  // floor below.
  device_buffer d_nodes(static_cast<std::size_t>(total) * sizeof(index_t));
  tree_batch_output traced = out;
  traced.accepted_nodes = {d_nodes.as<index_t>(), total};
  if (!specula::bench::warm_up(state, [&] {
        return greedy ? sc::verify_tree_greedy_async(pol, in, traced)
                      : sc::verify_tree_async(pol, in, traced);
      }))
    return;
  std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
  std::vector<index_t> path(static_cast<std::size_t>(total));
  sc::throw_on_error(cudaMemcpy(accepted.data(), d_n.ptr, accepted.size() * sizeof(std::int32_t),
                                cudaMemcpyDeviceToHost),
                     "download");
  sc::throw_on_error(
      cudaMemcpy(path.data(), d_nodes.ptr, path.size() * sizeof(index_t), cudaMemcpyDeviceToHost),
      "download");
  double bytes = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t a = accepted[static_cast<std::size_t>(b)];
    bytes += greedy ? (a + 1.0) * 4.0 * static_cast<double>(vocab)
                    : tree_floor_bytes(tree, path.data() + b * nodes, a, vocab);
  }
  state.counters["mean_accepted"] = [&] {
    double s = 0;
    for (auto a : accepted) s += a;
    return s / static_cast<double>(batch);
  }();
  specula::bench::time_against_copy(state, bytes, launch);
}

void candidates_case(benchmark::State& state, index_t k, index_t vocab, index_t batch,
                     bool all_rejected = false) {
  bool skip = false;
  skip_without_gpu(state, skip);
  if (skip) return;
  const auto q = skewed_row(vocab, 3);
  auto p = skewed_row(vocab, 4);
  std::vector<index_t> offsets{0};
  std::vector<token_t> cand;
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t j = 0; j < k; ++j)
      cand.push_back(static_cast<token_t>(all_rejected ? j * 7 + 1 : j));
    offsets.push_back(offsets.back() + k);
    rng.push_back(request_rng{6, static_cast<std::uint32_t>(b), 0});
  }
  if (all_rejected) {  // p(c) = 0 for every candidate, then renormalised (bench_tree.cpp's case)
    double rest = 0;
    for (index_t j = 0; j < k; ++j) p[static_cast<std::size_t>(j * 7 + 1)] = 0.0f;
    for (const float x : p) rest += x;
    for (float& x : p) x = static_cast<float>(x / rest);
  }
  device_buffer d_off(offsets.size() * sizeof(index_t)), d_c(cand.size() * sizeof(token_t) + 4),
      d_rng(rng.size() * sizeof(request_rng)),
      d_tok(static_cast<std::size_t>(batch) * sizeof(token_t)),
      d_acc(static_cast<std::size_t>(batch) * sizeof(std::int32_t));
  upload(d_off, offsets);
  upload(d_c, cand);
  upload(d_rng, rng);
  const replicated_rows d_p(p, batch), d_q(q, batch);
  const sc::candidates_device_input<float> in{vocab,
                                              {d_off.as<index_t>(), batch + 1},
                                              {d_c.as<token_t>(), batch * k},
                                              {d_p.buf.as<float>(), batch, vocab},
                                              {d_q.buf.as<float>(), batch, vocab},
                                              {d_rng.as<request_rng>(), batch},
                                              0};
  const sc::candidates_device_output out{
      {d_tok.as<token_t>(), batch}, {d_acc.as<std::int32_t>(), batch}, {}};
  const auto pol = sc::par_on(nullptr);
  auto launch = [&] { return sc::verify_candidates_async(pol, in, out); };
  if (!specula::bench::warm_up(state, launch)) return;
  // Floor: the first candidate accepted reads its p(x) and q(x) only; a rejection needs both
  // rows (Z_k), and so does the residual after K rejections (8V); 8 bytes per candidate tested.
  std::vector<std::int32_t> accepted(static_cast<std::size_t>(batch));
  sc::throw_on_error(cudaMemcpy(accepted.data(), d_acc.ptr, accepted.size() * sizeof(std::int32_t),
                                cudaMemcpyDeviceToHost),
                     "download");
  double bytes = 0;
  for (const std::int32_t j : accepted)
    bytes += j == 0
                 ? 8.0
                 : 8.0 * static_cast<double>(j < 0 ? k : j + 1) + 8.0 * static_cast<double>(vocab);
  state.counters["mean_accepted_index"] = [&] {
    double s = 0;
    for (auto j : accepted) s += j;
    return s / static_cast<double>(batch);
  }();
  specula::bench::time_against_copy(state, bytes, launch);
}

void wor_case(benchmark::State& state, index_t k, index_t vocab, index_t batch, bool split) {
  bool skip = false;
  skip_without_gpu(state, skip);
  if (skip) return;
  const replicated_rows d_w(skewed_row(vocab, 8), batch);
  std::vector<request_rng> rng;
  for (index_t b = 0; b < batch; ++b)
    rng.push_back(request_rng{9, static_cast<std::uint32_t>(b), 0});
  device_buffer d_rng(rng.size() * sizeof(request_rng)),
      d_tok(static_cast<std::size_t>(batch * k) * sizeof(token_t)),
      d_cnt(static_cast<std::size_t>(batch) * sizeof(std::int32_t)),
      ws(sc::sample_without_replacement_workspace_bytes(batch, k));
  upload(d_rng, rng);
  const auto pol =
      sc::par_on(nullptr)
          .with_workspace(ws.ptr, sc::sample_without_replacement_workspace_bytes(batch, k))
          .with_row_split(split ? 0 : 1);
  auto launch = [&] {
    return sc::sample_without_replacement_async(
        pol, batch_view<const float>{d_w.buf.as<float>(), batch, vocab}, k,
        {d_rng.as<request_rng>(), batch}, 0, {d_tok.as<token_t>(), batch * k},
        {d_cnt.as<std::int32_t>(), batch});
  };
  if (!specula::bench::warm_up(state, launch)) return;
  const double bytes = 4.0 * static_cast<double>(vocab) * static_cast<double>(batch);
  specula::bench::time_against_copy(state, bytes, launch);
}

int register_all() {
  const token_tree sjd = trees::sjd_pac(3, 2, 64);
  const token_tree eagle = eagle_like_tree();
  for (bool greedy : {false, true}) {
    const std::string kind = greedy ? "cuda_tree_greedy/" : "cuda_tree/";
    for (index_t b : {1, 16}) {
      specula::bench::add_case(kind + "sjd_pac/V:16384/B:" + std::to_string(b),
                               [=](benchmark::State& s) { tree_case(s, sjd, 16384, b, greedy); });
      specula::bench::add_case(
          kind + "eagle/V:128256/B:" + std::to_string(b),
          [=](benchmark::State& s) { tree_case(s, eagle, 128256, b, greedy); });
    }
  }
  for (index_t k : {1, 2, 3, 4})
    for (index_t b : {1, 16, 64})
      specula::bench::add_case(
          "cuda_candidates/K:" + std::to_string(k) + "/V:128256/B:" + std::to_string(b),
          [=](benchmark::State& s) { candidates_case(s, k, 128256, b); });
  for (index_t k : {1, 2, 4})
    for (index_t b : {1, 16})
      specula::bench::add_case(
          "cuda_candidates/all_rejected/K:" + std::to_string(k) +
              "/V:128256/B:" + std::to_string(b),
          [=](benchmark::State& s) { candidates_case(s, k, 128256, b, true); });
  for (index_t b : {1, 4, 16, 64})
    for (bool split : {false, true})
      specula::bench::add_case(
          "cuda_sample_wor/k:4/V:128256/B:" + std::to_string(b) + "/S:" + (split ? "auto" : "1"),
          [=](benchmark::State& s) { wor_case(s, 4, 128256, b, split); });
  return 0;
}

const int registered = register_all();

}  // namespace
