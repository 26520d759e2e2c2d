// SJD and SJD-PAC (each combination of Adaptive Continuation and Proactive Drafting, every
// window initialisation, trees wide enough that side candidates are often accepted): the output
// law is the target's (G-tests on toy models with known laws, 10^6 generations each), while
// biased variants fail the same test (a biased verifier, AC with the wrong q row, the authors'
// code's longest-sibling choice and residual-drawn siblings, a prior misreporting its row); the
// window is a fixed budget of drafted nodes; bad input is rejected.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include <specula/decode/sjd.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/sjd_variants.hpp>
#include <specula/testing/toy_models.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;
using specula::testing::toy_model_session;

namespace {

template <class Verifier = tree_verifier<>>
std::vector<std::uint64_t> sjd_counts(const toy_ar_model& model, const sjd_options& opt,
                                      std::uint32_t runs, std::uint64_t seed, decode_stats* stats,
                                      const Verifier& v = {},
                                      detail::sjd_fault fault = detail::sjd_fault::none) {
  toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(model.num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    std::vector<token_t> out;
    detail::decode_solo(s, static_cast<detail::no_draft*>(nullptr), stats, [&](decode_stats& st) {
      return detail::sjd_task(detail::solo<toy_model_session>{&s}, prompt, opt,
                              request_rng{seed, r, 0}, v, st, out, fault);
    });
    REQUIRE(static_cast<index_t>(out.size()) == model.horizon());
    ++counts[static_cast<std::size_t>(model.sequence_index(out))];
  }
  return counts;
}

}  // namespace

TEST_CASE("SJD and SJD-PAC sample the target's sequence law (G-tests)", "[decode][stats]") {
  // V = 4 and 5 positions (1024 sequences) with a window of 3 (shorter than the sequence, so
  // windows are refilled from stale rows); the toy rows are sparse, so residuals and
  // without-replacement exclusions are exercised. PD uses K = 2 candidates at depth 1, or at
  // depths 1..D for D = 2, 3: then siblings are also drawn from the stale row
  // row(1, 2, 2) = (1 - 1.4e-7, 0, 1.4e-7, 0), nearly one-hot in float (reachable only as a
  // depth-2 stale row), which the tree verifier once renormalised by 1 - removed mass:
  // these variants failed with p ~ 1e-14.
  const toy_ar_model model(4, 5, 77, 0.3);
  const auto law = model.sequence_law();
  struct variant {
    const char* name;
    bool ac, pd;
    sjd_init init;
    index_t depth = 1;
  };
  for (const variant v :
       {variant{"SJD", false, false, sjd_init::one_hot_q},
        variant{"SJD+PD", false, true, sjd_init::uniform_q},
        variant{"SJD+AC", true, false, sjd_init::uniform_q},
        variant{"SJD+PD+AC", true, true, sjd_init::one_hot_q},
        variant{"SJD+AC, horizontal repeat", true, false, sjd_init::horizontal_repeat},
        variant{"SJD+PD, horizontal sample", false, true, sjd_init::horizontal_sample},
        variant{"SJD+PD, D = 2", false, true, sjd_init::one_hot_q, 2},
        variant{"SJD+PD+AC, D = 2", true, true, sjd_init::uniform_q, 2},
        variant{"SJD+PD, D = 3", false, true, sjd_init::uniform_q, 3},
        variant{"SJD+PD+AC, D = 3", true, true, sjd_init::one_hot_q, 3}}) {
    sjd_options opt;
    // The window is a budget of drafted nodes: the tree (2 + ... + 2^D nodes) and a chain
    // that takes the first path to depth 3.
    opt.window = v.pd ? (2 << v.depth) - 2 + 3 - v.depth : 3;
    opt.max_new_tokens = 5;
    opt.adaptive_continuation = v.ac;
    opt.proactive_drafting = v.pd;
    opt.pd_width = 2;
    opt.pd_depth = v.depth;
    opt.init = v.init;
    decode_stats st;
    INFO(v.name);
    decode_testing::check_sequence_law(sjd_counts(model, opt, 1'000'000, 31, &st), law, st,
                                       5'000'000);
  }
}

TEST_CASE("a biased verifier fails the SJD G-test", "[decode][stats]") {
  const toy_ar_model model(4, 5, 77, 0.3);
  sjd_options opt = sjd_options::sjd_pac(4, 2, 1);
  opt.max_new_tokens = 5;
  const auto counts =
      sjd_counts(model, opt, 200'000, 32, nullptr, decode_testing::first_path_verifier{});
  CHECK(specula::testing::g_test(counts, model.sequence_law()).p_value < 1e-6);
}

TEST_CASE("SJD-PAC after accepted side candidates samples the target's law (G-tests)",
          "[decode][stats]") {
  // Proactive Drafting trees as wide as the vocabulary (K = V = 3) or nearly (K = 2, V = 3 and
  // 4), so that a side candidate is often accepted: the next draft then takes the stale rows
  // below the side node's subtree from the main path (and AC keeps main-path tokens there).
  // With D = 2 the chain below an accepted side node at depth 1 ends at depth 2 and meets the
  // main path, where AC must compare the old main-path token with the row it was drawn from.
  struct variant {
    const char* name;
    index_t vocab, width, depth;
    bool ac;
    double sparsity = 0.2;
    bool full_tree = true;
  };
  for (const variant v :
       {variant{"V = 3, K = 3, D = 1, AC", 3, 3, 1, true},
        variant{"V = 3, K = 3, D = 1", 3, 3, 1, false},
        variant{"V = 3, K = 2, D = 2, AC", 3, 2, 2, true},
        variant{"V = 4, K = 2, D = 2, AC", 4, 2, 2, true},
        variant{"V = 4, K = 2, D = 2, AC, dense rows", 4, 2, 2, true, 0.0},
        variant{"V = 3, K = 3, D = 2", 3, 3, 2, false},
        variant{"V = 3, K = 2, D = 2, first path only, AC", 3, 2, 2, true, 0.2, false}}) {
    const toy_ar_model model(v.vocab, 6, 91, v.sparsity);
    // The tree (K + ... + K^D nodes) and a chain taking the first path to depth 4.
    index_t tree_nodes = 0;
    for (index_t d = 1, level = 1; d <= v.depth; ++d)
      tree_nodes += v.full_tree ? (level *= v.width) : v.width;
    sjd_options opt = sjd_options::sjd_pac(tree_nodes + 4 - v.depth, v.width, v.depth);
    opt.adaptive_continuation = v.ac;
    opt.pd_full_tree = v.full_tree;
    opt.max_new_tokens = 6;
    decode_stats st;
    INFO(v.name);
    decode_testing::check_sequence_law(sjd_counts(model, opt, 1'000'000, 33, &st),
                                       model.sequence_law(), st, 6'000'000);
  }
}

namespace {

// The model and options of the negative controls: dense rows (no kept token with zero
// probability, which the checked verifier would reject), V = 4, 5 positions, K = 2 candidates
// at depths 1 and 2, the main path reaching depth 4.
const toy_ar_model& control_model() {
  static const toy_ar_model model(4, 5, 91, 0.0);
  return model;
}

sjd_options control_options() {
  sjd_options opt = sjd_options::sjd_pac(8, 2, 2);  // 6 tree nodes and 2 in the chain
  opt.max_new_tokens = 5;
  return opt;
}

}  // namespace

TEST_CASE("AC with the wrong q row where a side chain meets the main path fails the G-test",
          "[decode][stats]") {
  // Negative control of the test above: AC takes q_old from the side chain's last node instead
  // of the old main-path token's parent (p ~ 1e-218 at 2 10^5 generations when written).
  const auto counts = sjd_counts(control_model(), control_options(), 200'000, 33, nullptr,
                                 tree_verifier<>{}, detail::sjd_fault::junction_q_of_chain);
  const auto g = specula::testing::g_test(counts, control_model().sequence_law());
  INFO(g);
  CHECK(g.p_value < 1e-6);
}

TEST_CASE("the authors' code's deviations from the tree rule fail the G-test", "[decode][stats]") {
  // (a) keeping the accepted sibling with the longest accepted path (every sibling tested, as
  // the authors' code does) instead of the first accepted one; (b) the first path's extra
  // siblings drawn from the AC residual but verified as draws from the stale row, as the
  // authors' code does. The rule written out with the first accepted sibling passes (positive
  // control of (a)). When written: (a) p ~ 1e-9, (b) p ~ 1e-235 at 2 10^5 generations.
  const auto law = control_model().sequence_law();
  {
    decode_stats st;
    INFO("first accepted sibling (exact)");
    decode_testing::check_sequence_law(sjd_counts(control_model(), control_options(), 1'000'000, 34,
                                                  &st, testing::sibling_rule_verifier{false}),
                                       law, st, 5'000'000);
  }
  const auto longest =
      specula::testing::g_test(sjd_counts(control_model(), control_options(), 400'000, 34, nullptr,
                                          testing::sibling_rule_verifier{true}),
                               law);
  INFO("longest accepted sibling path: " << longest);
  CHECK(longest.p_value < 1e-6);
  const auto residual =
      specula::testing::g_test(sjd_counts(control_model(), control_options(), 200'000, 34, nullptr,
                                          tree_verifier<>{}, detail::sjd_fault::residual_siblings),
                               law);
  INFO("siblings from the AC residual: " << residual);
  CHECK(residual.p_value < 1e-6);
}

namespace {

/// A session model of unbounded length whose row after a sequence is a random row (from a hash
/// of the sequence), recording for every forward pass the number of nodes at each depth of the
/// evaluated tree.
struct shape_recording_session {
  index_t vocab = 4;
  std::vector<token_t> context, pending;
  std::vector<index_t> pending_parent;
  std::vector<std::vector<index_t>> passes;
  std::vector<token_t> first_window;  ///< the first pass's drafted tokens (a chain)

  [[nodiscard]] index_t vocab_size() const { return vocab; }
  [[nodiscard]] index_t context_size() const { return static_cast<index_t>(context.size()); }
  void prefill(std::span<const token_t> prompt) {
    context.assign(prompt.begin(), prompt.end() - 1);
    pending.clear();
  }
  void rollback(index_t n) { context.resize(static_cast<std::size_t>(n)); }
  void evaluate(const token_tree& t, batch_view<float> logits) {
    std::vector<index_t> per_depth(static_cast<std::size_t>(t.max_depth()) + 1, 0);
    for (index_t u = 0; u < t.size(); ++u) {
      ++per_depth[static_cast<std::size_t>(t.depth(u))];
      std::uint64_t h = 1469598103934665603ull;
      const auto mix = [&](token_t x) {
        h = (h ^ static_cast<std::uint64_t>(x + 1)) * 1099511628211ull;
      };
      for (const token_t x : context) mix(x);
      for (const index_t v : t.path_to(u)) mix(t.token(v));
      const auto row = specula::testing::random_probability_row(vocab, h, 0);
      for (index_t y = 0; y < vocab; ++y)
        logits.row(u)[y] = static_cast<float>(std::log(row[static_cast<std::size_t>(y)]));
    }
    passes.push_back(per_depth);
    if (first_window.empty())
      for (index_t u = 1; u < t.size(); ++u) first_window.push_back(t.token(u));
    pending.assign(t.tokens().begin(), t.tokens().end());
  }
  void commit(std::span<const index_t> path) {
    for (const index_t u : path) context.push_back(pending[static_cast<std::size_t>(u)]);
  }
};

}  // namespace

TEST_CASE("the SJD-PAC window is a fixed budget of drafted nodes", "[decode]") {
  // Random rows everywhere: many passes after a rejection (PD trees) and some without.
  struct variant {
    sjd_options opt;
    index_t nodes, levels, width;  // nodes per full pass (root included)
  };
  sjd_options paper_text = sjd_options::sjd_pac(64, 4, 3);  // K = 4, D = 3: 12 nodes
  paper_text.pd_full_tree = false;
  for (const variant& v : {variant{sjd_options::sjd_pac(), 64, 2, 4}, variant{paper_text, 65, 3, 4},
                           variant{sjd_options::sjd_pac(64, 4, 2), 65, 2, 4},
                           variant{sjd_options::sjd_pac(20, 3, 1), 21, 1, 3},
                           variant{sjd_options::sjd_pac(14, 2, 3), 15, 3, 2},
                           variant{sjd_options::sjd_pac(15, 2, 4, true), 15, 3, 2}}) {
    shape_recording_session s;
    sjd_options opt = v.opt;
    opt.max_new_tokens = 400;
    const auto out = sjd_decode(s, std::vector<token_t>{0}, opt, request_rng{3, 0, 0});
    CHECK(out.size() == 400);
    index_t trees = 0, full = 0;
    for (const auto& per_depth : s.passes) {
      index_t total = 0;
      for (const index_t n : per_depth) total += n;
      CHECK(total <= v.nodes);
      if (per_depth.size() < 2 || per_depth[1] == 1) continue;  // a chain
      ++trees;
      // Levels of the full tree (K^d nodes at depth d <= levels) while stale rows last, then
      // one node per depth; full passes (every level) fill the window exactly.
      bool in_tree = true;
      index_t tree_levels = 0;
      for (std::size_t d = 1, level = 1; d < per_depth.size(); ++d) {
        level = v.opt.pd_full_tree ? level * static_cast<std::size_t>(v.width)
                                   : static_cast<std::size_t>(v.width);
        in_tree = in_tree && static_cast<index_t>(d) <= v.levels &&
                  per_depth[d] == static_cast<index_t>(level);
        tree_levels += in_tree ? 1 : 0;
        if (!in_tree) CHECK(per_depth[d] == 1);
      }
      full += tree_levels == v.levels && total == v.nodes ? 1 : 0;
    }
    CHECK(trees > 10);
    CHECK(full > 10);
  }
  const auto paper = sjd_options::sjd_pac();
  CHECK(paper.draft_budget() == 63);
  CHECK(paper.pd_levels() == 2);
}

TEST_CASE("SJD with spatial priors and a token subset samples the target's law (G-tests)",
          "[decode][stats]") {
  // V = 4, 5 positions laid out as an image of rows of 2 or 3 tokens (from generated token 0 or
  // 1): the left neighbour and the token above are committed tokens or draft nodes, and the
  // sampling priors read the rows the committed ones were drawn from.
  const toy_ar_model model(4, 5, 77, 0.3);
  const auto law = model.sequence_law();
  struct variant {
    const char* name;
    sjd_init init;
    index_t width, first;
    bool ac, pd;
    index_t tokens_begin = 0, tokens_end = 0;
  };
  for (const variant& v :
       {variant{"uniform over tokens 1..3, AC", sjd_init::uniform_q, 0, 0, true, false, 1, 4},
        variant{"one-hot over tokens 0..2, PD", sjd_init::one_hot_q, 0, 0, false, true, 0, 3},
        variant{"horizontal repeat, rows of 2 from 1", sjd_init::horizontal_repeat, 2, 1, false,
                false},
        variant{"horizontal sample, rows of 3, AC", sjd_init::horizontal_sample, 3, 0, true, false},
        variant{"horizontal sample, no rows", sjd_init::horizontal_sample, 0, 0, false, false},
        variant{"horizontal argmax, rows of 2, PD", sjd_init::horizontal_argmax, 2, 0, false, true},
        variant{"vertical repeat, rows of 2, AC", sjd_init::vertical_repeat, 2, 0, true, false},
        variant{"vertical sample, rows of 2", sjd_init::vertical_sample, 2, 0, false, false},
        variant{"vertical sample, rows of 3 from 1, AC + PD", sjd_init::vertical_sample, 3, 1, true,
                true},
        variant{"vertical argmax, rows of 2, AC", sjd_init::vertical_argmax, 2, 0, true, false}}) {
    sjd_options opt;
    // Short windows, so that many positions are initialised (PD: a 2-node tree and a chain to
    // depth 2).
    opt.window = v.pd ? 3 : 2;
    opt.max_new_tokens = 5;
    opt.adaptive_continuation = v.ac;
    opt.proactive_drafting = v.pd;
    opt.pd_width = 2;
    opt.init = v.init;
    opt.image_width = v.width;
    opt.image_first = v.first;
    opt.init_tokens_begin = v.tokens_begin;
    opt.init_tokens_end = v.tokens_end;
    decode_stats st;
    INFO(v.name);
    decode_testing::check_sequence_law(sjd_counts(model, opt, 1'000'000, 35, &st), law, st,
                                       5'000'000);
  }
}

TEST_CASE("a spatial prior that misreports its row fails the G-test", "[decode][stats]") {
  // Negative control of the test above: vertical_sample draws from the row above but reports
  // the uniform row as q (p ~ 0 at 2 10^5 generations when written; with window 3 the prior
  // samples from a known row too rarely to be seen).
  const toy_ar_model model(4, 5, 77, 0.3);
  sjd_options opt;
  opt.window = 2;
  opt.max_new_tokens = 5;
  opt.init = sjd_init::vertical_sample;
  opt.image_width = 2;
  const auto g =
      specula::testing::g_test(sjd_counts(model, opt, 200'000, 35, nullptr, tree_verifier<>{},
                                          detail::sjd_fault::prior_misreports_row),
                               model.sequence_law());
  INFO(g);
  CHECK(g.p_value < 1e-6);
}

TEST_CASE("SJD initialises by the image layout and the token subset", "[decode]") {
  // The first window is all initialisation: check its tokens against the layout.
  struct variant {
    sjd_init init;
    index_t width;
  };
  for (const variant& v :
       {variant{sjd_init::horizontal_repeat, 3}, variant{sjd_init::vertical_repeat, 3},
        variant{sjd_init::uniform_q, 0}}) {
    shape_recording_session s;
    s.vocab = 8;
    sjd_options opt;
    opt.window = 12;
    opt.max_new_tokens = 13;
    opt.init = v.init;
    opt.image_width = v.width;
    opt.init_tokens_begin = 2;
    opt.init_tokens_end = 5;
    (void)sjd_decode(s, std::vector<token_t>{7}, opt, request_rng{4, 0, 0});
    REQUIRE(!s.first_window.empty());
    const auto& w = s.first_window;  // the chain's tokens, generated index 0, 1, ...
    REQUIRE(w.size() == 12);
    for (std::size_t i = 0; i < w.size(); ++i) {
      INFO("position " << i);
      CHECK((w[i] >= 2 && w[i] < 5));
      if (v.init == sjd_init::horizontal_repeat && i % 3 != 0) CHECK(w[i] == w[i - 1]);
      if (v.init == sjd_init::vertical_repeat && i >= 3) CHECK(w[i] == w[i - 3]);
    }
    if (v.init != sjd_init::uniform_q) {  // row starts (horizontal) / the first row (vertical)
      std::vector<token_t> random;        // are random: not all equal over many requests
      for (std::uint32_t r = 0; r < 40; ++r) {
        shape_recording_session t;
        t.vocab = 8;
        (void)sjd_decode(t, std::vector<token_t>{7}, opt, request_rng{4, r, 0});
        random.push_back(t.first_window[v.init == sjd_init::horizontal_repeat ? 3 : 1]);
      }
      CHECK(std::count(random.begin(), random.end(), random[0]) < 40);
    }
  }
}

TEST_CASE("SJD-PAC is reproducible per request seed", "[decode]") {
  const toy_ar_model model(4, 5, 78);
  toy_model_session s(model);
  const auto opt = sjd_options::sjd_pac(6, 3, 1);
  const std::vector<token_t> prompt{0};
  CHECK(sjd_decode(s, prompt, opt, request_rng{5, 1, 0}) ==
        sjd_decode(s, prompt, opt, request_rng{5, 1, 0}));
}

TEST_CASE("SJD rejects bad input", "[decode]") {
  const toy_ar_model model(3, 4, 1);
  toy_model_session s(model);
  const std::vector<token_t> prompt{0};
  const auto fails_with = [&](sjd_options o, const std::string& what) {
    CHECK_THROWS_WITH(sjd_decode(s, prompt, o, request_rng{}), Catch::Contains(what));
  };
  sjd_options o;
  o.window = 0;
  fails_with(o, "window");
  o = {};
  o.max_new_tokens = 0;
  fails_with(o, "max_new_tokens");
  o = {};
  o.pd_width = 0;
  fails_with(o, "pd_width");
  o = {};
  o.pd_depth = 0;
  fails_with(o, "pd_depth");
  o = sjd_options::sjd_pac(4, 60, 3);  // 60 + 3600 + 216000 candidate nodes
  fails_with(o, "pd_depth");
  o = sjd_options::sjd_pac(9, 3, 2);  // 3 + 9 candidate nodes in a budget of 9
  fails_with(o, "pd_depth");
  o = sjd_options::sjd_pac(12, 3, 3, true);  // the same tree counted the authors' way
  fails_with(o, "pd_depth");
  o = {};
  o.window = 1;
  o.count_root = true;  // no drafted node left
  fails_with(o, "window");
  CHECK_THROWS_WITH(sjd_decode(s, std::vector<token_t>{}, sjd_options{}, request_rng{}),
                    Catch::Contains("prompt"));
}
