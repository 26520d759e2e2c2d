// K-candidate verification at one position and 64-node tree verification, against the
// streaming-read baseline (bench/stream_baseline.hpp; counters in bench/README.md).
//
// candidates/<proposal>/all_rejected/V:<V>/K:<K>
//   one position, K candidates drawn without replacement (or one-hot), every candidate with
//   p(c) = 0 so all are rejected: the worst case (K normaliser passes, then the residual scan).
//   Bytes that must be touched: the p and q rows once (8V); the recursion reads them K
//   times (the final sample walks the last pass's tile sums), so 1 / K of the stream rate is
//   the ceiling of this algorithm.
// candidates/checked/<proposal>/all_rejected/V:<V>/K:<K>
//   the same through verify_candidates_checked (check_level::reads): the rows are validated
//   as the passes read them, p(c) and q(c) as each step tests c (the same bytes).
// tree/<checked|unchecked>/<scenario>/V:<V>/B:<B>
//   the SJD-PAC tree (3-ary, 2 levels, first branch continued to 64 nodes) per request, float
//   rows, siblings without replacement; scenario first_path: p = q on the first path, so the
//   walk accepts the first child at every level down to the leaf and samples a bonus there
//   (bytes: 8 per accepted node plus the leaf's p row, 4V); reject_root: the three root
//   children have p = 0 (bytes: the root's p and q rows, 8V). Checked (check_level::reads)
//   validates the rows it reads and p(x), q(x) of the children it tests as it reads them (the
//   same bytes).

#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "specula/tree/builders.hpp"
#include "specula/verify/candidates.hpp"
#include "specula/verify/tree.hpp"
#include "stream_baseline.hpp"

using namespace specula;

namespace {

std::vector<float> skewed_row(index_t v, std::uint32_t id) { return bench::skewed_row(v, 3, id); }

/// p with the given tokens zeroed and renormalised.
std::vector<float> without_tokens(std::vector<float> p, const std::vector<token_t>& tokens) {
  double rest = 0;
  for (token_t t : tokens) p[static_cast<std::size_t>(t)] = 0.0f;
  for (float x : p) rest += x;
  for (float& x : p) x = static_cast<float>(x / rest);
  return p;
}

void candidates_case(benchmark::State& state, index_t vocab, index_t k, bool one_hot,
                     bool checked) {
  const auto q = skewed_row(vocab, 1);
  std::vector<token_t> cand;
  for (index_t j = 0; j < k; ++j) cand.push_back(static_cast<token_t>(j * 7 + 1));
  const auto p = without_tokens(skewed_row(vocab, 2), cand);
  std::vector<double> ws(static_cast<std::size_t>(candidates_workspace_size(k)));
  const row_view<const float> pr(p), qr(q);
  token_t sink = 0;
  auto call = [&] {
    philox_source src{request_rng{5, 0, 0}};
    candidates_result r;
    const row_view<const token_t> cands{cand.data(), k};
    if (checked && one_hot)
      r = verify_candidates_checked(exact_rule{}, request_rng{5, 0, 0}, pr, one_hot_candidates{},
                                    cands, row_view<double>(ws), 0);
    else if (checked)
      r = verify_candidates_checked(exact_rule{}, request_rng{5, 0, 0}, pr,
                                    without_replacement<float>{qr}, cands, row_view<double>(ws), 0);
    else if (one_hot)
      r = verify_candidates(exact_rule{}, src, pr, one_hot_candidates{}, cand.data(), k,
                            default_residual_floor, 0, ws.data());
    else
      r = verify_candidates(exact_rule{}, src, pr, without_replacement<float>{qr}, cand.data(), k,
                            default_residual_floor, 0, ws.data());
    sink ^= r.token;
  };
  bench::run_against_stream(state, (one_hot ? 4.0 : 8.0) * static_cast<double>(vocab), call);
  benchmark::DoNotOptimize(sink);
}

enum class tree_scenario { first_path, reject_root };

struct tree_fixture {
  index_t vocab, batch;
  std::vector<token_tree> trees;
  std::vector<float> p, q;
  std::vector<request_rng> rng;
  std::vector<token_t> out;
  std::vector<std::int32_t> n;
  index_t nodes = 0;

  tree_fixture(index_t v, index_t b, tree_scenario sc) : vocab(v), batch(b) {
    const auto shape = trees::sjd_pac(3, 2, 64);
    const auto base_q = skewed_row(v, 1);
    const auto base_p = skewed_row(v, 2);
    for (index_t r = 0; r < b; ++r) {
      token_tree t = shape;
      // Children tokens 1, 2, 3 under every parent (distinct siblings).
      for (index_t u = 0; u < t.size(); ++u) {
        token_t next = 1;
        for (index_t c : t.children(u)) t.set_token(c, next++);
      }
      const std::vector<token_t> root_children = {1, 2, 3};
      const auto rejecting = without_tokens(base_p, root_children);
      for (index_t u = 0; u < t.size(); ++u) {
        q.insert(q.end(), base_q.begin(), base_q.end());
        const bool root = u == 0;
        const auto& pu = sc == tree_scenario::reject_root && root ? rejecting : base_q;
        // first_path: p = q everywhere, so the first child is accepted with probability 1.
        const auto& row = sc == tree_scenario::first_path ? base_q : (root ? pu : base_p);
        p.insert(p.end(), row.begin(), row.end());
      }
      nodes += t.size();
      trees.push_back(std::move(t));
      rng.push_back(request_rng{8, static_cast<std::uint32_t>(r), 0});
    }
    out.resize(static_cast<std::size_t>(nodes));
    n.resize(static_cast<std::size_t>(b));
  }
  [[nodiscard]] tree_batch_input<float> input() const {
    return {vocab, trees, {p.data(), nodes, vocab}, {q.data(), nodes, vocab}, rng};
  }
  tree_batch_output output() { return {out, n, {}, {}}; }
  [[nodiscard]] double must_touch() const {
    double bytes = 0;
    for (index_t r = 0; r < batch; ++r) {
      const auto a = n[static_cast<std::size_t>(r)];
      bytes += 8.0 * a;
      // The walk ends at a leaf (bonus: its p row) or after a rejection (that node's p and q).
      const bool leaf = a == trees[static_cast<std::size_t>(r)].max_depth();
      bytes += (leaf ? 4.0 : 8.0) * static_cast<double>(vocab);
    }
    return bytes;
  }
};

void tree_case(benchmark::State& state, index_t vocab, index_t batch, tree_scenario sc,
               bool checked) {
  tree_fixture f(vocab, batch, sc);
  tree_workspace ws;
  const auto in = f.input();
  const auto out = f.output();
  auto call = [&] {
    if (checked)
      verify_tree(host::seq, in, out, ws);
    else
      verify_tree_unchecked(host::seq, in, out, ws);
  };
  call();
  bench::run_against_stream(state, f.must_touch(), call);
  double acc = 0;
  for (auto a : f.n) acc += a;
  state.counters["accepted_mean"] = acc / static_cast<double>(batch);
}

int register_all() {
  for (bool checked : {false, true})
    for (index_t v : {16384, 128256})
      for (bool one_hot : {false, true})
        for (index_t k = 1; k <= 4; ++k)
          benchmark::RegisterBenchmark(
              (std::string("candidates/") + (checked ? "checked/" : "") +
               (one_hot ? "one_hot" : "without_replacement") +
               "/all_rejected/V:" + std::to_string(v) + "/K:" + std::to_string(k))
                  .c_str(),
              [=](benchmark::State& s) { candidates_case(s, v, k, one_hot, checked); })
              ->Unit(benchmark::kMicrosecond);
  for (index_t v : {16384, 128256})
    for (index_t b : {1, 16})
      for (tree_scenario sc : {tree_scenario::first_path, tree_scenario::reject_root})
        for (bool checked : {false, true}) {
          if (checked && sc == tree_scenario::reject_root) continue;
          benchmark::RegisterBenchmark(
              (std::string("tree/") + (checked ? "checked/" : "unchecked/") +
               (sc == tree_scenario::first_path ? "first_path" : "reject_root") +
               "/V:" + std::to_string(v) + "/B:" + std::to_string(b))
                  .c_str(),
              [=](benchmark::State& s) { tree_case(s, v, b, sc, checked); })
              ->Unit(benchmark::kMicrosecond);
        }
  return 0;
}

const int registered = register_all();

}  // namespace
