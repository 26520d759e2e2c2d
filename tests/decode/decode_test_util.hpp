#pragma once

// Shared helpers of the decoding-loop tests.

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <specula/decode/speculative.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>
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

/// A deliberately wrong verifier: accepts every draft of a chain and emits the leaf's argmax, so
/// the output leans towards the draft model (the negative control of SD G-tests).
struct accept_all_verifier {
  void operator()(const tree_batch_input<float>& in, const tree_batch_output& out) const {
    const token_tree& t = in.trees[0];
    const index_t leaf = t.size() - 1;
    for (index_t i = 1; i < t.size(); ++i) out.output_tokens[i - 1] = t.token(i);
    out.output_tokens[leaf] = static_cast<token_t>(argmax_lowest(in.target_probs.row(leaf)));
    for (index_t i = 0; i < t.size(); ++i) out.accepted_nodes[i] = i;
    out.num_accepted[0] = static_cast<std::int32_t>(leaf);
  }
};

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

/// A toy masked model with a dual cache (`dual_cache_model`). A row is testing::toy_masked_model's
/// row with the seed mixed with a hash of the sequence the model's state comes from: the node's
/// own sequence for a whole-sequence evaluation (and a refresh), the last refresh's sequence for
/// a window row. So window rows go stale once the window changed since the refresh, like a
/// transformer's, and a loop that evaluated a node against another refresh than its stepwise
/// step's would see other rows. Misuse of the cache throws std::logic_error.
class toy_dual_cache_model {
 public:
  struct dual_cache {
    std::vector<token_t> tokens;  // the last refresh's sequence
    index_t begin = 0, end = 0;
  };

  toy_dual_cache_model(index_t vocab, std::uint64_t seed) : vocab_(vocab), seed_(seed) {}
  [[nodiscard]] index_t vocab_size() const noexcept { return vocab_; }
  [[nodiscard]] token_t mask_token() const noexcept { return static_cast<token_t>(vocab_ - 1); }

  void evaluate_sequences(std::span<const token_t> tokens, index_t length,
                          batch_view<float> logits) const {
    for (std::size_t at = 0; at < tokens.size(); at += static_cast<std::size_t>(length)) {
      const auto seq = tokens.subspan(at, static_cast<std::size_t>(length));
      rows(seq, seq, 0, length, logits.data + static_cast<index_t>(at) * logits.row_stride);
    }
  }

  void evaluate_cached(std::span<const dual_cache_pass<dual_cache>> passes,
                       batch_view<float> logits) const {
    index_t row = 0;
    for (const auto& p : passes) {
      const auto L = static_cast<std::size_t>(p.length);
      if (!p.refresh && (p.cache->tokens.size() != L || p.cache->begin != p.window_begin ||
                         p.cache->end != p.window_end))
        throw std::logic_error("toy_dual_cache_model: window pass without its refresh");
      for (index_t u = 0; u < p.nodes(); ++u) {
        const auto seq = p.tokens.subspan(static_cast<std::size_t>(u) * L, L);
        float* out = logits.data + row * logits.row_stride;
        if (p.refresh && u == 0) {
          rows(seq, seq, 0, p.length, out);
          p.cache->tokens.assign(seq.begin(), seq.end());
          p.cache->begin = p.window_begin;
          p.cache->end = p.window_end;
          row += p.length;
          continue;
        }
        for (index_t j = 0; j < p.length; ++j)
          if ((j < p.window_begin || j >= p.window_end) &&
              seq[static_cast<std::size_t>(j)] != p.cache->tokens[static_cast<std::size_t>(j)])
            throw std::logic_error("toy_dual_cache_model: a node changed outside the window");
        rows(seq, p.cache->tokens, p.window_begin, p.window_end, out);
        row += p.window_end - p.window_begin;
      }
    }
  }

 private:
  /// Rows [begin, end) of `seq` with the state of `source`.
  void rows(std::span<const token_t> seq, std::span<const token_t> source, index_t begin,
            index_t end, float* out) const {
    std::uint64_t h = seed_;
    for (const token_t t : source) h = (h ^ static_cast<std::uint64_t>(t + 1)) * 0x100000001b3ull;
    const auto L = static_cast<index_t>(seq.size());
    std::vector<float> all(static_cast<std::size_t>(L * vocab_));
    testing::toy_masked_model(vocab_, h).evaluate_sequences(
        seq, L, batch_view<float>(all.data(), L, vocab_));
    std::copy(all.begin() + begin * vocab_, all.begin() + end * vocab_, out);
  }

  index_t vocab_;
  std::uint64_t seed_;
};
static_assert(dual_cache_model<toy_dual_cache_model>);

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

/// One random stream per request: request i gets seed + 17 i, stream i.
inline std::vector<request_rng> rngs_for(std::size_t n, std::uint64_t seed) {
  std::vector<request_rng> r;
  for (std::size_t i = 0; i < n; ++i)
    r.push_back({seed + 17 * i, static_cast<std::uint32_t>(i), 0});
  return r;
}

/// Greedy speculative decoding (`opt`, greedy_tree_verifier) of every text prompt on the
/// `target` and `draft` sessions equals greedy decoding (greedy_reference) of the target on a
/// fresh session, `make_reference()`; adds to `*st`. `opt.mode` must be draft_mode::greedy.
template <session_model Target, session_model Draft, class MakeReference>
void check_greedy_sd_on_text(Target& target, Draft& draft, const speculative_options& opt,
                             MakeReference make_reference, decode_stats* st) {
  for (const auto& text : text_prompts()) {
    const auto prompt = bytes(text);
    INFO("prompt " << text);
    const auto sd = speculative_decode(target, draft, prompt, opt, request_rng{1, 0, 0},
                                       greedy_tree_verifier<>{}, st);
    auto reference = make_reference();
    CHECK(sd == greedy_reference(reference, prompt, opt.max_new_tokens));
  }
}

}  // namespace specula::decode_testing
