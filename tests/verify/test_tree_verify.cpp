// Token-tree verification: exact sequence law by enumeration, G-test through the batched API
// with a negative control, equivalence with chain verification, batch invariance, bad input,
// and greedy verification against greedy decoding.

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "chain_test_util.hpp"
#include "specula/rules/exact.hpp"
#include "specula/sample/without_replacement.hpp"
#include "specula/testing/catch2.hpp"
#include "specula/testing/enumerate.hpp"
#include "specula/testing/goodness_of_fit.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

using namespace specula;
using specula::test::unnormalised_without_replacement;

namespace {

/// A drafted tree for one decoding step: shape, tokens, and each node's context.
struct drafted_tree {
  std::vector<index_t> parents{-1};
  std::vector<token_t> tokens{no_token};
  std::vector<std::vector<token_t>> context;  // committed sequence + path tokens, per node
};

/// Drafts a tree below `seq`: every node on the first path (or every node, if `full`) up to
/// `depth` gets up to `width` children drawn without replacement from the draft model's row at
/// that node, through `draw(row, k, out) -> count`.
template <class Draw>
drafted_tree draft_tree(const testing::toy_ar_model& draft, const std::vector<token_t>& seq,
                        index_t depth, index_t width, bool full, Draw&& draw) {
  drafted_tree t;
  t.context.push_back(seq);
  std::vector<index_t> frontier{0};
  for (index_t d = 0; d < depth; ++d) {
    std::vector<index_t> next;
    for (index_t u : frontier) {
      const auto q = draft.row(t.context[static_cast<std::size_t>(u)]);
      std::vector<token_t> cand(static_cast<std::size_t>(width));
      const index_t n = draw(q, width, cand.data(), static_cast<std::uint32_t>(d));
      for (index_t j = 0; j < n; ++j) {
        t.parents.push_back(u);
        t.tokens.push_back(cand[static_cast<std::size_t>(j)]);
        auto ctx = t.context[static_cast<std::size_t>(u)];
        ctx.push_back(cand[static_cast<std::size_t>(j)]);
        t.context.push_back(ctx);
        if (full || j == 0) next.push_back(static_cast<index_t>(t.parents.size()) - 1);
      }
    }
    frontier = next;
  }
  return t;
}

/// Depth of the tree to draft when `missing` tokens remain (the emitted path must fit).
index_t depth_for(index_t missing, index_t depth) { return std::min(depth, missing - 1); }

}  // namespace

TEST_CASE("exact sequence law of tree verification on a toy model", "[verify][tree][law]") {
  for (bool full : {false, true}) {
    for (std::uint64_t seed : {5u, 17u}) {
      const testing::toy_ar_model target(3, 3, seed, 0.3);
      const auto draft = testing::toy_ar_model::perturbed(target, 0.7, seed + 9, 0.4);
      auto experiment = [&](auto& run) -> index_t {
        std::vector<token_t> seq;
        // One stream per step, as the decoding loops give each step its own request_rng.
        for (std::uint32_t step = 0; static_cast<index_t>(seq.size()) < target.horizon(); ++step) {
          auto src = run.stream(step);
          const index_t missing = target.horizon() - static_cast<index_t>(seq.size());
          auto draw = [&](std::span<const double> q, index_t k, token_t* out, std::uint32_t d) {
            auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
            return sample_without_replacement_sequential(src, 3, qw, k, 100 + d, 0, out);
          };
          const auto dt = draft_tree(draft, seq, depth_for(missing, 2), 2, full, draw);
          const token_tree tree(dt.parents, dt.tokens);
          auto target_row = [&](index_t u) {
            const auto r = target.row(dt.context[static_cast<std::size_t>(u)]);
            return row_view<const double>(r.data(), 3);
          };
          auto proposal = [&](index_t u) {
            const auto r = draft.row(dt.context[static_cast<std::size_t>(u)]);
            return without_replacement<double>{row_view<const double>(r.data(), 3)};
          };
          std::vector<token_t> out(static_cast<std::size_t>(tree.size()));
          std::vector<double> z(static_cast<std::size_t>(candidates_workspace_size(2)));
          std::vector<token_t> cand(2);
          std::vector<index_t> children(2);
          const auto r = verify_tree_request(
              exact_rule{}, src, tree.view(), target_row, proposal, 0.0, out.data(), nullptr,
              tree_request_workspace{z.data(), cand.data(), children.data()});
          REQUIRE((r.flags & chain_valid) != 0);
          for (index_t i = 0; i <= r.num_accepted; ++i)
            seq.push_back(out[static_cast<std::size_t>(i)]);
        }
        return target.sequence_index(seq);
      };
      const auto got = testing::enumerate_token_law(target.num_sequences(), experiment);
      INFO("full " << full << " seed " << seed);
      CHECK(got.invalid_mass == 0.0);
      CHECK(testing::max_abs_difference(got.probability, target.sequence_law()) < 1e-12);
    }
  }
}

namespace {

/// Runs `runs` generations of the toy model with depth-3 trees (3 siblings per level along the
/// first path), verifying each step with `verify(tree, target rows, draft rows, rng, out)`.
template <class Verify>
std::vector<std::uint64_t> tree_sequence_counts(const testing::toy_ar_model& target,
                                                const testing::toy_ar_model& draft,
                                                std::uint64_t runs, std::uint64_t seed,
                                                Verify&& verify) {
  const index_t vocab = target.vocab_size();
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(target.num_sequences()), 0);
  for (std::uint64_t run = 0; run < runs; ++run) {
    std::vector<token_t> seq;
    for (std::uint32_t step = 0; static_cast<index_t>(seq.size()) < target.horizon(); ++step) {
      const index_t missing = target.horizon() - static_cast<index_t>(seq.size());
      const request_rng draft_rng{fold_in(seed, 1), static_cast<std::uint32_t>(run), step};
      auto draw = [&](std::span<const double> q, index_t k, token_t* out, std::uint32_t d) {
        auto qw = [&](index_t y) { return q[static_cast<std::size_t>(y)]; };
        double keys[8];
        return sample_without_replacement_keys(vocab, qw, k, draft_rng, d, out, keys);
      };
      const auto dt = draft_tree(draft, seq, depth_for(missing, 3), 3, false, draw);
      std::vector<float> p_rows, q_rows;
      for (const auto& ctx : dt.context) {
        const auto p = target.row(ctx);
        const auto q = draft.row(ctx);
        p_rows.insert(p_rows.end(), p.begin(), p.end());
        q_rows.insert(q_rows.end(), q.begin(), q.end());
      }
      const token_tree tree(dt.parents, dt.tokens);
      std::vector<token_t> out(static_cast<std::size_t>(tree.size()));
      const index_t n =
          verify(tree, p_rows, q_rows,
                 request_rng{fold_in(seed, 2), static_cast<std::uint32_t>(run), step}, out);
      for (index_t i = 0; i <= n; ++i) seq.push_back(out[static_cast<std::size_t>(i)]);
    }
    ++counts[static_cast<std::size_t>(target.sequence_index(seq))];
  }
  return counts;
}

}  // namespace

TEST_CASE("G-test: depth-3 tree verification through the batched API reproduces the law",
          "[verify][tree][stats]") {
  const testing::toy_ar_model target(5, 4, 303, 0.3);
  const auto draft = testing::toy_ar_model::perturbed(target, 0.6, 404, 0.3);
  const auto law = target.sequence_law();
  tree_workspace ws;
  auto batched = [&](const token_tree& tree, std::vector<float>& p, std::vector<float>& q,
                     request_rng rng, std::vector<token_t>& out) -> index_t {
    std::vector<std::int32_t> n(1);
    const tree_batch_input<float> in{
        5, {&tree, 1}, {p.data(), tree.size(), 5}, {q.data(), tree.size(), 5}, {&rng, 1}};
    verify_tree(host::seq, in, tree_batch_output{out, n, {}, {}}, ws);
    return n[0];
  };
  const auto counts = tree_sequence_counts(target, draft, 300'000, 1, batched);
  SPECULA_REQUIRE_FITS(counts, law, 1e-4);

  SECTION("negative control: q^(k) not renormalised fails the same test") {
    auto biased = [&](const token_tree& tree, std::vector<float>& p, std::vector<float>& q,
                      request_rng rng, std::vector<token_t>& out) -> index_t {
      philox_source src{rng};
      std::vector<double> z(16);
      std::vector<token_t> cand(8);
      std::vector<index_t> children(8);
      auto target_row = [&](index_t u) { return row_view<const float>(p.data() + u * 5, 5); };
      auto proposal = [&](index_t u) {
        return unnormalised_without_replacement<float>{row_view<const float>(q.data() + u * 5, 5)};
      };
      const auto r = verify_tree_request(
          exact_rule{}, src, tree.view(), target_row, proposal, default_residual_floor, out.data(),
          nullptr, tree_request_workspace{z.data(), cand.data(), children.data()});
      return r.num_accepted;
    };
    const auto bad = tree_sequence_counts(target, draft, 300'000, 1, biased);
    SPECULA_REQUIRE_MISFITS(bad, law, 1e-4);
  }
}

namespace {

struct random_tree_batch {
  index_t vocab;
  std::vector<token_tree> trees;
  std::vector<float> p, q;
  std::vector<request_rng> rng;
  index_t nodes = 0;

  random_tree_batch(index_t v, const std::vector<token_tree>& shapes, std::uint64_t seed)
      : vocab(v), trees(shapes) {
    std::uint32_t id = 0;
    for (std::size_t b = 0; b < trees.size(); ++b) {
      auto& t = trees[b];
      const index_t base_rows = static_cast<index_t>(p.size()) / v;
      for (index_t u = 0; u < t.size(); ++u) {
        const auto qd = testing::random_probability_row(v, seed, id++, 0.0);
        const auto pd = testing::random_probability_row(v, seed, id++, 0.0);
        for (index_t y = 0; y < v; ++y) {
          q.push_back(static_cast<float>(qd[static_cast<std::size_t>(y)]));
          p.push_back(static_cast<float>(0.6 * qd[static_cast<std::size_t>(y)] +
                                         0.4 * pd[static_cast<std::size_t>(y)]));
        }
      }
      // Children tokens: distinct per parent, drawn from the parent's q with exponential keys.
      for (index_t u = 0; u < t.size(); ++u) {
        const auto kids = t.children(u);
        if (kids.empty()) continue;
        const float* qr = q.data() + (base_rows + u) * v;
        auto qw = [&](index_t y) { return static_cast<double>(qr[y]); };
        std::vector<token_t> c(kids.size());
        std::vector<double> keys(kids.size());
        sample_without_replacement_keys(v, qw, static_cast<index_t>(kids.size()),
                                        request_rng{seed, id++, 0}, 0, c.data(), keys.data());
        for (std::size_t j = 0; j < kids.size(); ++j) t.set_token(kids[j], c[j]);
      }
      rng.push_back(request_rng{seed + 1, static_cast<std::uint32_t>(b), 0});
      nodes += t.size();
    }
  }
  [[nodiscard]] tree_batch_input<float> input(bool one_hot = false) const {
    return {vocab,
            trees,
            {p.data(), nodes, vocab},
            one_hot ? batch_view<const float>{} : batch_view<const float>{q.data(), nodes, vocab},
            rng};
  }
};

}  // namespace

TEST_CASE("a chain-shaped tree verifies exactly like verify_chain", "[verify][tree]") {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    random_tree_batch bt(40, {trees::chain(4), trees::chain(1), trees::chain(6)}, seed);
    std::vector<token_t> tout(static_cast<std::size_t>(bt.nodes));
    std::vector<std::int32_t> tn(3);
    verify_tree(host::seq, bt.input(), tree_batch_output{tout, tn, {}, {}});
    // The same data in the flattened chain layout.
    std::vector<index_t> offsets{0};
    std::vector<token_t> drafts;
    std::vector<float> q_rows;
    index_t base = 0;
    for (const auto& t : bt.trees) {
      for (index_t u = 1; u < t.size(); ++u) drafts.push_back(t.token(u));
      q_rows.insert(q_rows.end(), bt.q.begin() + base * 40,
                    bt.q.begin() + (base + t.size() - 1) * 40);
      offsets.push_back(offsets.back() + t.size() - 1);
      base += t.size();
    }
    std::vector<token_t> cout(static_cast<std::size_t>(bt.nodes));
    std::vector<std::int32_t> cn(3);
    const chain_batch_input<float> cin{
        40,    offsets, drafts, {q_rows.data(), offsets.back(), 40}, {bt.p.data(), bt.nodes, 40},
        bt.rng};
    verify_chain(host::seq, cin, chain_batch_output{cout, cn, {}, {}});
    CHECK(tn == cn);
    CHECK(tout == cout);
  }
}

TEST_CASE("tree verification: outputs, batch invariance and policies", "[verify][tree]") {
  const std::vector<token_tree> shapes = {trees::sjd_pac(3, 2, 20), trees::full(2, 3),
                                          trees::first_path_siblings(4, 3), trees::ssd_mix_order(5),
                                          token_tree{}};
  random_tree_batch bt(64, shapes, 77);
  std::vector<token_t> out(static_cast<std::size_t>(bt.nodes));
  std::vector<std::int32_t> n(shapes.size());
  std::vector<index_t> path(static_cast<std::size_t>(bt.nodes));
  std::vector<std::uint32_t> flags(shapes.size());
  verify_tree(host::seq, bt.input(), tree_batch_output{out, n, path, flags});
  index_t base = 0;
  for (std::size_t b = 0; b < shapes.size(); ++b) {
    const auto& t = bt.trees[b];
    const auto s = static_cast<std::size_t>(base);
    CHECK((flags[b] & chain_valid) != 0);
    CHECK(path[s] == 0);
    for (index_t i = 1; i <= n[b]; ++i) {
      const index_t node = path[s + static_cast<std::size_t>(i)];
      CHECK(t.parent(node) == path[s + static_cast<std::size_t>(i - 1)]);
      CHECK(out[s + static_cast<std::size_t>(i - 1)] == t.token(node));
    }
    const index_t last = path[s + static_cast<std::size_t>(n[b])];
    CHECK(((flags[b] & chain_bonus) != 0) == (t.num_children(last) == 0));
    for (index_t i = n[b] + 1; i < t.size(); ++i)
      CHECK(out[s + static_cast<std::size_t>(i)] == no_token);
    base += t.size();
  }
  // Parallel policy and a reused workspace give the same result.
  std::vector<token_t> out2(out.size());
  std::vector<std::int32_t> n2(n.size());
  tree_workspace ws;
  verify_tree(host::par.with_threads(3), bt.input(), tree_batch_output{out2, n2, {}, {}}, ws);
  verify_tree(host::par.with_threads(3), bt.input(), tree_batch_output{out2, n2, {}, {}}, ws);
  CHECK(out2 == out);
  CHECK(n2 == n);
  // Request 2 alone gives its output from the full batch.
  random_tree_batch one = bt;
  one.trees = {bt.trees[2]};
  index_t off = bt.trees[0].size() + bt.trees[1].size();
  one.p.assign(bt.p.begin() + off * 64, bt.p.begin() + (off + bt.trees[2].size()) * 64);
  one.q.assign(bt.q.begin() + off * 64, bt.q.begin() + (off + bt.trees[2].size()) * 64);
  one.rng = {bt.rng[2]};
  one.nodes = bt.trees[2].size();
  std::vector<token_t> out3(static_cast<std::size_t>(one.nodes));
  std::vector<std::int32_t> n3(1);
  verify_tree(host::seq, one.input(), tree_batch_output{out3, n3, {}, {}});
  CHECK(n3[0] == n[2]);
  CHECK(std::equal(out3.begin(), out3.end(), out.begin() + off));
}

TEST_CASE("tree verification refuses requests sharing a random stream",
          "[verify][tree][bad_input]") {
  random_tree_batch bt(8, {trees::full(2, 1), trees::full(2, 1)}, 3);
  std::vector<token_t> out(6);
  std::vector<std::int32_t> n(2);
  auto run = [&] { verify_tree(host::seq, bt.input(), tree_batch_output{out, n, {}, {}}); };
  REQUIRE_NOTHROW(run());
  bt.rng[1] = {bt.rng[0].seed, bt.rng[0].request_id, bt.rng[0].step + 1};
  CHECK_THROWS_WITH(run(), Catch::Contains("rng[row 1]: random stream shared") &&
                               Catch::Contains("requests 0 and 1"));
}

TEST_CASE("tree verification rejects bad input", "[verify][tree][bad_input]") {
  random_tree_batch bt(8, {trees::full(2, 1)}, 3);
  std::vector<token_t> out(3);
  std::vector<std::int32_t> n(1);
  auto run = [&] { verify_tree(host::seq, bt.input(), tree_batch_output{out, n, {}, {}}); };
  REQUIRE_NOTHROW(run());
  SECTION("duplicate siblings drawn without replacement") {
    bt.trees[0].set_token(2, bt.trees[0].token(1));
    CHECK_THROWS_WITH(run(), Catch::Contains("distinct"));
    tree_options o;
    o.sampling = sibling_sampling::with_replacement;
    CHECK_NOTHROW(verify_tree(host::seq, bt.input(), tree_batch_output{out, n, {}, {}}, o));
  }
  SECTION("child token out of range") {
    bt.trees[0].set_token(1, 8);
    CHECK_THROWS_WITH(run(),
                      Catch::Contains("trees[row 0][column 1]") && Catch::Contains("out of range"));
  }
  SECTION("unset child token") {
    bt.trees[0].set_token(2, no_token);
    CHECK_THROWS_AS(run(), invalid_input);
  }
  SECTION("child with zero probability in its parent's q row") {
    const token_t x = bt.trees[0].token(1);
    bt.q[static_cast<std::size_t>(x)] = 0.0f;
    bt.q[static_cast<std::size_t>((x + 1) % 8)] += 0.0f;  // row sum now below 1 by q(x)
    tree_options o;
    o.sum_tolerance = 0.9;
    CHECK_THROWS_WITH(verify_tree(host::seq, bt.input(), tree_batch_output{out, n, {}, {}}, o),
                      Catch::Contains("draft_probs[row 0][column " + std::to_string(x) + "]"));
  }
  SECTION("row count must match the node count") {
    auto in = bt.input();
    in.target_probs.rows = 2;
    CHECK_THROWS_WITH(verify_tree(host::seq, in, tree_batch_output{out, n, {}, {}}),
                      Catch::Contains("target_probs"));
  }
  SECTION("no requests (B = 0) is a no-op") {
    auto in = bt.input();
    in.trees.size = 0;
    const tree_batch_output empty{{}, {}, {}, {}};
    REQUIRE_NOTHROW(verify_tree(host::seq, in, empty));
    REQUIRE_NOTHROW(verify_tree_greedy(host::seq, in, empty));
    tree_workspace ws;
    REQUIRE_NOTHROW(verify_tree_unchecked(host::seq, in, empty, ws));
  }
  SECTION("output too short") {
    std::vector<token_t> short_out(2);
    CHECK_THROWS_WITH(verify_tree(host::seq, bt.input(), tree_batch_output{short_out, n, {}, {}}),
                      Catch::Contains("output_tokens"));
  }
}

TEST_CASE("checked tree calls check p(x) and q(x) of the children they test (every child at full)",
          "[verify][tree][bad_input]") {
  // p_u(c) and q_u(c) are read when the walk tests child c of node u. With p = q in every row the
  // exact rule accepts the first child it tests with probability min(1, p/q) = 1, so the walk
  // tests the first child of each node down the first path and nothing else ("first_path"); with
  // p_root(c) = 0 at every root child as well, it tests every root child, rejects each, and
  // samples the root's residual ("reject_root"). A bad entry (-1e-9, within the row-sum
  // tolerance, so only the pointwise check can see it) is refused with its row and column at
  // check_level::full wherever it is, and at check_level::reads exactly when the walk tests that
  // child; elsewhere the call gives the clean input's outputs. On one thread and on several.
  // p(c) = +Inf and q(c) = 0 (its mass moved to a token that is no child of u) leave the rows
  // unread at a tested child (accepted: min(1, p/q) = 1), so only the pointwise check sees them.
  // Siblings drawn with and without replacement.
  for (const auto sampling :
       {sibling_sampling::without_replacement, sibling_sampling::with_replacement})
    for (const bool reject_root : {false, true}) {
      random_tree_batch bt(16, {trees::full(2, 2), trees::full(3, 1), trees::full(2, 2)}, 5);
      bt.p = bt.q;
      index_t base = 0;
      for (const token_tree& t : bt.trees) {
        if (reject_root) {
          float* root = bt.p.data() + base * bt.vocab;
          for (index_t c : t.children(0)) root[t.token(c)] = 0.0f;
          double rest = 0;
          for (index_t y = 0; y < bt.vocab; ++y) rest += root[y];
          for (index_t y = 0; y < bt.vocab; ++y) root[y] = static_cast<float>(root[y] / rest);
        }
        base += t.size();
      }
      std::vector<token_t> out(static_cast<std::size_t>(bt.nodes));
      std::vector<std::int32_t> n(3);
      const auto call = [&](auto policy, check_level level) {
        tree_options o;
        o.check = level;
        o.sampling = sampling;
        verify_tree(policy, bt.input(), tree_batch_output{out, n, {}, {}}, o);
      };
      std::vector<std::vector<token_t>> clean_out(2);
      std::vector<std::vector<std::int32_t>> clean_n(2);
      for (const check_level level : {check_level::reads, check_level::full}) {
        REQUIRE_NOTHROW(call(host::par.with_threads(2), level));
        REQUIRE_NOTHROW(call(host::seq, level));
        clean_out[level == check_level::full] = out;
        clean_n[level == check_level::full] = n;
      }
      for (std::size_t b = 0; b < bt.trees.size(); ++b)  // the walks described above
        CHECK(clean_n[0][b] == (reject_root ? 0 : bt.trees[b].max_depth()));
      base = 0;
      for (const token_tree& t : bt.trees) {
        for (index_t node = 1; node < t.size(); ++node) {
          const index_t u = t.parent(node);
          // Tested: every root child (reject_root), or a node of the first path (first_path).
          bool on_first_path = true;
          for (index_t a = node; a > 0; a = t.parent(a))
            on_first_path = on_first_path && t.first_child(t.parent(a)) == a;
          const bool tested = reject_root ? u == 0 : on_first_path;
          const index_t row = base + u;
          const auto at = static_cast<std::size_t>(row * bt.vocab + t.token(node));
          const std::string where =
              "[row " + std::to_string(row) + "][column " + std::to_string(t.token(node)) + "]";
          // A token that is no child of u, to take q(c)'s mass.
          const auto kids = t.children(u);
          token_t spare = 0;
          while (
              std::any_of(kids.begin(), kids.end(), [&](index_t c) { return t.token(c) == spare; }))
            ++spare;
          const auto spare_at = static_cast<std::size_t>(row * bt.vocab + spare);
          for (const int corruption : {0, 1, 2, 3}) {
            const bool in_q = corruption >= 2;
            auto& rows = in_q ? bt.q : bt.p;
            const std::vector<float> saved = rows;
            const float bad[] = {-1e-9f, std::numeric_limits<float>::infinity(), -1e-9f, 0.0f};
            if (corruption == 3) rows[spare_at] += rows[at];
            rows[at] = bad[corruption];
            const std::string what = (in_q ? "draft_probs" : "target_probs") + where;
            INFO((sampling == sibling_sampling::with_replacement ? "with" : "without")
                 << " replacement, " << (reject_root ? "reject_root" : "first_path") << ", node "
                 << node << " of tree at row " << base << (in_q ? ", q" : ", p") << " = "
                 << bad[corruption]);
            CHECK_THROWS_WITH(call(host::seq, check_level::full), Catch::Contains(what));
            CHECK_THROWS_WITH(call(host::par.with_threads(2), check_level::full),
                              Catch::Contains(what));
            if (tested) {
              CHECK_THROWS_WITH(call(host::seq, check_level::reads), Catch::Contains(what));
              CHECK_THROWS_WITH(call(host::par.with_threads(2), check_level::reads),
                                Catch::Contains(what));
            } else {
              for (const bool par : {false, true}) {
                if (par)
                  CHECK_NOTHROW(call(host::par.with_threads(2), check_level::reads));
                else
                  CHECK_NOTHROW(call(host::seq, check_level::reads));
                CHECK(out == clean_out[0]);
                CHECK(n == clean_n[0]);
              }
            }
            rows = saved;
          }
        }
        base += t.size();
      }
    }
}

TEST_CASE("greedy tree and chain verification reproduce greedy decoding", "[verify][tree]") {
  // Target and draft toy models; greedy decoding of the target is the reference.
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const testing::toy_ar_model target(6, 5, seed, 0.2);
    const auto draft = testing::toy_ar_model::perturbed(target, 0.5, seed + 50, 0.2);
    auto argmax = [](std::span<const double> r) {
      return static_cast<token_t>(std::max_element(r.begin(), r.end()) - r.begin());
    };
    std::vector<token_t> reference;
    while (static_cast<index_t>(reference.size()) < target.horizon())
      reference.push_back(argmax(target.row(reference)));

    for (bool use_tree : {true, false}) {
      std::vector<token_t> seq;
      while (static_cast<index_t>(seq.size()) < target.horizon()) {
        const index_t missing = target.horizon() - static_cast<index_t>(seq.size());
        // Tree: the draft's top-2 at every first-path node; chain: the draft's top-1.
        auto draw = [&](std::span<const double> q, index_t k, token_t* out, std::uint32_t) {
          std::vector<token_t> order(q.size());
          for (std::size_t i = 0; i < q.size(); ++i) order[i] = static_cast<token_t>(i);
          std::stable_sort(order.begin(), order.end(), [&](token_t a, token_t b) {
            return q[static_cast<std::size_t>(a)] > q[static_cast<std::size_t>(b)];
          });
          const index_t n = std::min<index_t>(k, static_cast<index_t>(q.size()));
          std::copy_n(order.begin(), n, out);
          return n;
        };
        const auto dt =
            draft_tree(draft, seq, depth_for(missing, 3), use_tree ? 2 : 1, false, draw);
        std::vector<double> rows;
        for (const auto& ctx : dt.context) {
          const auto p = target.row(ctx);
          rows.insert(rows.end(), p.begin(), p.end());
        }
        const token_tree tree(dt.parents, dt.tokens);
        std::vector<token_t> out(static_cast<std::size_t>(tree.size()));
        std::vector<std::int32_t> n(1);
        if (use_tree) {
          const request_rng rng{};
          const tree_batch_input<double> in{
              6, {&tree, 1}, {rows.data(), tree.size(), 6}, {}, {&rng, 1}};
          verify_tree_greedy(host::seq, in, tree_batch_output{out, n, {}, {}});
        } else {
          std::vector<index_t> offsets{0, tree.size() - 1};
          std::vector<token_t> drafts(dt.tokens.begin() + 1, dt.tokens.end());
          const request_rng rng{};
          const chain_batch_input<double> in{
              6, offsets, drafts, {}, {rows.data(), tree.size(), 6}, {&rng, 1}};
          verify_chain_greedy(host::seq, in, chain_batch_output{out, n, {}, {}});
        }
        for (index_t i = 0; i <= n[0]; ++i) seq.push_back(out[static_cast<std::size_t>(i)]);
      }
      INFO("seed " << seed << " tree " << use_tree);
      CHECK(seq == reference);
    }
  }
}

TEST_CASE("greedy ties resolve to the lowest token id and NaN rows are rejected",
          "[verify][tree]") {
  const std::vector<float> tied = {0.1f, 0.4f, 0.4f, 0.1f};
  CHECK(argmax_lowest(row_view<const float>(tied)) == 1);
  // A tree whose children are 2 then 1: the tie picks token 1, the second child.
  const token_tree t(std::vector<index_t>{-1, 0, 0}, std::vector<token_t>{no_token, 2, 1});
  std::vector<float> rows = {0.1f,  0.4f,  0.4f, 0.1f, 0.25f, 0.25f,
                             0.25f, 0.25f, 0.0f, 0.0f, 0.0f,  1.0f};
  const request_rng rng{};
  std::vector<token_t> out(3);
  std::vector<std::int32_t> n(1);
  std::vector<index_t> path(3);
  const tree_batch_input<float> in{4, {&t, 1}, {rows.data(), 3, 4}, {}, {&rng, 1}};
  verify_tree_greedy(host::seq, in, tree_batch_output{out, n, path, {}});
  CHECK(n[0] == 1);
  CHECK(path[1] == 2);
  CHECK(out[0] == 1);
  CHECK(out[1] == 3);  // bonus: argmax of node 2's row
  rows[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(verify_tree_greedy(host::seq, in, tree_batch_output{out, n, path, {}}),
                    Catch::Contains("target_probs[row 1][column 1]: NaN"));
}
