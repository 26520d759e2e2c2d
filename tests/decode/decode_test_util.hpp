#pragma once

// Shared helpers of the decoding-loop tests.

#include <span>
#include <string>
#include <vector>

#include <specula/decode/speculative.hpp>

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
