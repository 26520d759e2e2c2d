#pragma once

// Shared helpers of the decoding-loop tests.

#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <specula/decode/speculative.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/verify/tree.hpp>

namespace specula::decode_testing {

/// Greedy decoding one token per forward pass: the reference that greedy speculative loops
/// (greedy SD, Jacobi, multi-block) must reproduce exactly.
template <session_model Model>
std::vector<token_t> greedy_reference(Model& m, std::span<const token_t> prompt, index_t n) {
  m.prefill(prompt);
  const index_t V = m.vocab_size();
  std::vector<float> row(static_cast<std::size_t>(V));
  std::vector<token_t> out;
  token_t last = prompt.back();
  for (index_t i = 0; i < n; ++i) {
    const token_tree one(std::vector<index_t>{-1}, std::vector<token_t>{last});
    m.evaluate(one, batch_view<float>(row.data(), 1, V));
    const std::vector<index_t> root{0};
    m.commit(root);
    last = static_cast<token_t>(argmax_lowest(row_view<const float>(row.data(), V)));
    out.push_back(last);
  }
  return out;
}

/// Accepts every child on the first path and emits the leaf's argmax: biased.
struct first_path_verifier {
  void operator()(const tree_batch_input<float>& in, const tree_batch_output& out) const {
    const token_tree& t = in.trees[0];
    index_t u = 0, k = 0;
    out.accepted_nodes[0] = 0;
    while (t.first_child(u) >= 0) {
      u = t.first_child(u);
      out.output_tokens[k] = t.token(u);
      out.accepted_nodes[++k] = u;
    }
    out.output_tokens[k] = static_cast<token_t>(argmax_lowest(in.target_probs.row(u)));
    out.num_accepted[0] = static_cast<std::int32_t>(k);
  }
};

/// The G-test of a lossless loop's generations against the sequence law (p > 1e-4, nothing
/// impossible), with its accounting: `tokens` generated and drafts accepted (compression > 1).
inline void check_sequence_law(const std::vector<std::uint64_t>& counts,
                               const std::vector<double>& law, const decode_stats& st,
                               index_t tokens) {
  const auto g = specula::testing::g_test(counts, law);
  INFO(g << ", step compression " << st.step_compression());
  CHECK(g.impossible_observations == 0);
  CHECK(g.p_value > 1e-4);
  CHECK(st.tokens == tokens);
  CHECK(st.step_compression() > 1.0);
}

/// Code-like prompts for the shipped byte-level text models.
inline const std::vector<std::string>& text_prompts() {
  static const std::vector<std::string> p{"import os\n",         "def __init__(self",
                                          "    return ",         "class ",
                                          "for i in range(",     "# Copyright ",
                                          "if __name__ == ",     "        raise ValueError(",
                                          "    def test_",       "from collections import ",
                                          "        self.assert", "\"\"\"Return the "};
  return p;
}

inline std::vector<token_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace specula::decode_testing
