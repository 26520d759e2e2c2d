// Classifier-free guidance inside the decoding loops (specula/decode/cfg.hpp): on a toy
// class-conditional model whose guided law is known exactly, SJD-PAC, draft-model speculative
// decoding and stochastic multi-block decoding sample the law of the CFG-mixed logits after
// temperature and top-k (G-tests), greedy Jacobi decoding reproduces greedy decoding of the
// guided model, and the controls (an unconditional stream that is not the null-label one, a
// biased verifier) fail the same tests.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <stdexcept>
#include <vector>

#include <catch2/catch.hpp>

#include <specula/decode/cfg.hpp>
#include <specula/decode/jacobi.hpp>
#include <specula/decode/multiblock.hpp>
#include <specula/decode/sjd.hpp>
#include <specula/decode/speculative.hpp>
#include <specula/testing/goodness_of_fit.hpp>
#include <specula/testing/toy_models.hpp>

#include "decode_test_util.hpp"

using namespace specula;
using specula::testing::toy_ar_model;

namespace {

constexpr token_t label_token = 0;  // the class (first token of a conditional prompt)
constexpr token_t null_token = 1;   // the null label (first token of an unconditional prompt)

/// A class-conditional toy model with 2 B request slots: a sequence starting with
/// `label_token` follows `labelled`, one starting with `null_token` follows `null`; the row of
/// a node is the chosen toy model's row after the generated tokens (the label excluded), as
/// float log-probabilities. The label is read from the sequence itself (the committed context,
/// or a tree's root right after prefill), so an unconditional stream that is fed the class
/// label follows the conditional model.
class toy_labelled_batch {
 public:
  toy_labelled_batch(const toy_ar_model& labelled, const toy_ar_model& null, index_t batch)
      : labelled_(&labelled), null_(&null), slots_(static_cast<std::size_t>(batch)) {}

  [[nodiscard]] index_t vocab_size() const noexcept { return labelled_->vocab_size(); }
  [[nodiscard]] index_t batch_size() const noexcept { return static_cast<index_t>(slots_.size()); }

  void prefill(index_t r, std::span<const token_t> prompt) {
    slot(r).context.assign(prompt.begin(), prompt.end() - 1);
  }
  [[nodiscard]] index_t context_size(index_t r) const {
    return static_cast<index_t>(slots_.at(static_cast<std::size_t>(r)).context.size());
  }
  void rollback(index_t r, index_t n) { slot(r).context.resize(static_cast<std::size_t>(n)); }

  void evaluate(std::span<const index_t> requests, std::span<const token_tree> trees,
                batch_view<float> logits) {
    const index_t V = vocab_size();
    index_t row = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto& s = slot(requests[i]);
      const token_tree& t = trees[i];
      s.pending = t;
      for (index_t u = 0; u < t.size(); ++u, ++row) {
        std::vector<token_t> seq = s.context;
        for (const index_t k : t.path_to(u)) seq.push_back(t.token(k));
        const toy_ar_model& m = seq.front() == null_token ? *null_ : *labelled_;
        const std::span<const token_t> prefix(seq.data() + 1, seq.size() - 1);
        auto out = logits.row(row);
        if (static_cast<index_t>(prefix.size()) >= m.horizon()) {
          for (index_t y = 0; y < V; ++y) out[y] = 0.0f;
          continue;
        }
        const auto p = m.row(prefix);
        for (index_t y = 0; y < V; ++y)
          out[y] = static_cast<float>(std::log(p[static_cast<std::size_t>(y)]));
      }
    }
  }
  void commit(index_t r, std::span<const index_t> path) {
    auto& s = slot(r);
    for (const index_t u : path) s.context.push_back(s.pending.token(u));
  }

 private:
  struct request_slot {
    std::vector<token_t> context;
    token_tree pending;
  };
  request_slot& slot(index_t r) { return slots_.at(static_cast<std::size_t>(r)); }

  const toy_ar_model* labelled_;
  const toy_ar_model* null_;
  std::vector<request_slot> slots_;
};

static_assert(batched_session_model<toy_labelled_batch>);
static_assert(session_model<cfg_model<toy_labelled_batch>>);
static_assert(batched_session_model<cfg_model<toy_labelled_batch>>);

std::vector<token_t> null_prompt(std::span<const token_t> prompt) {
  std::vector<token_t> u(prompt.begin(), prompt.end());
  u.front() = null_token;
  return u;
}

/// The guided next-token row, in double from the models' float logits: c and u the log-rows,
/// l = (u + scale (c - u)) / temperature, the top_k largest kept (ties kept), softmax.
std::vector<double> guided_row(const toy_ar_model& labelled, const toy_ar_model& null,
                               std::span<const token_t> prefix, double scale, double temperature,
                               index_t top_k) {
  const index_t V = labelled.vocab_size();
  const auto c = labelled.row(prefix);
  const auto u = null.row(prefix);
  std::vector<double> l(static_cast<std::size_t>(V));
  for (std::size_t y = 0; y < l.size(); ++y) {
    const double cy = static_cast<float>(std::log(c[y]));
    const double uy = static_cast<float>(std::log(u[y]));
    l[y] = (uy + scale * (cy - uy)) / temperature;
  }
  double threshold = -INFINITY;
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    threshold = sorted[static_cast<std::size_t>(top_k - 1)];
  }
  const double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double sum = 0.0;
  for (std::size_t y = 0; y < l.size(); ++y)
    sum += p[y] = l[y] >= threshold ? std::exp(l[y] - m) : 0.0;
  for (double& v : p) v /= sum;
  return p;
}

/// The guided law of whole sequences (indexed like toy_ar_model::sequence_index).
std::vector<double> guided_law(const toy_ar_model& labelled, const toy_ar_model& null, double scale,
                               double temperature, index_t top_k) {
  const index_t V = labelled.vocab_size(), H = labelled.horizon();
  std::vector<double> law(static_cast<std::size_t>(labelled.num_sequences()));
  std::vector<token_t> seq(static_cast<std::size_t>(H));
  for (std::size_t s = 0; s < law.size(); ++s) {
    auto k = static_cast<index_t>(s);
    for (index_t t = H - 1; t >= 0; --t, k /= V)
      seq[static_cast<std::size_t>(t)] = static_cast<token_t>(k % V);
    double p = 1.0;
    for (index_t t = 0; t < H; ++t)
      p *= guided_row(
          labelled, null, std::span<const token_t>(seq).first(static_cast<std::size_t>(t)), scale,
          temperature, top_k)[static_cast<std::size_t>(seq[static_cast<std::size_t>(t)])];
    law[s] = p;
  }
  return law;
}

// V = 5, 4 positions (625 sequences); dense rows (log 0 would make the mix undefined).
const toy_ar_model& labelled_model() {
  static const toy_ar_model m(5, 4, 501, 0.0);
  return m;
}
const toy_ar_model& null_model() {
  static const toy_ar_model m(5, 4, 502, 0.0);
  return m;
}

constexpr float cfg_scale = 2.5f;
constexpr float temperature = 0.8f;
constexpr index_t top_k = 3;

sampling_params target_sampling() {
  sampling_params sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  return sp;
}

/// Sequence counts of `runs` guided decodings with `decode(model, prompt, rng, stats)`.
template <class Decode>
std::vector<std::uint64_t> guided_counts(
    std::uint32_t runs, std::uint64_t seed, decode_stats* st, const Decode& decode,
    cfg_model<toy_labelled_batch>::uncond_prompt_fn make_uncond = null_prompt) {
  toy_labelled_batch inner(labelled_model(), null_model(), 2);
  cfg_model<toy_labelled_batch> guided(inner, cfg_scale, std::move(make_uncond));
  const std::vector<token_t> prompt{label_token};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(labelled_model().num_sequences()), 0);
  for (std::uint32_t r = 0; r < runs; ++r) {
    const std::vector<token_t> out = decode(guided, prompt, request_rng{seed, r, 0}, st);
    REQUIRE(static_cast<index_t>(out.size()) == labelled_model().horizon());
    ++counts[static_cast<std::size_t>(labelled_model().sequence_index(out))];
  }
  return counts;
}

sjd_options guided_sjd() {
  sjd_options opt = sjd_options::sjd_pac(5, 2, 1);
  opt.max_new_tokens = 4;
  opt.target = target_sampling();
  return opt;
}

}  // namespace

TEST_CASE("the guided law of the toy differs from both of its streams' laws", "[decode]") {
  // Otherwise the G-tests below could not tell a missing or wrong mix.
  const auto guided = guided_law(labelled_model(), null_model(), cfg_scale, temperature, top_k);
  const auto cond = guided_law(labelled_model(), null_model(), 1.0, temperature, top_k);
  const auto uncond = guided_law(labelled_model(), null_model(), 0.0, temperature, top_k);
  double tv_cond = 0.0, tv_uncond = 0.0, total = 0.0;
  for (std::size_t s = 0; s < guided.size(); ++s) {
    tv_cond += 0.5 * std::abs(guided[s] - cond[s]);
    tv_uncond += 0.5 * std::abs(guided[s] - uncond[s]);
    total += guided[s];
  }
  CHECK(total == Approx(1.0).epsilon(1e-12));
  CHECK(tv_cond > 0.05);
  CHECK(tv_uncond > 0.05);
}

TEST_CASE("decoding loops sample the CFG-mixed, top-k law through cfg_model (G-tests)",
          "[decode][stats]") {
  const auto law = guided_law(labelled_model(), null_model(), cfg_scale, temperature, top_k);
  SECTION("SJD-PAC") {
    decode_stats st;
    const auto counts =
        guided_counts(200'000, 61, &st, [](auto& m, auto prompt, auto rng, auto* s) {
          return sjd_decode(m, prompt, guided_sjd(), rng, {}, s);
        });
    decode_testing::check_sequence_law(counts, law, st, 800'000);
  }
  SECTION("speculative decoding with a guided draft") {
    // The draft is a second guided model over the null-label model only (a weaker guess).
    toy_labelled_batch draft_inner(null_model(), null_model(), 2);
    cfg_model<toy_labelled_batch> draft(draft_inner, 1.0f, null_prompt);
    speculative_options opt;
    opt.draft_length = 3;
    opt.max_new_tokens = 4;
    opt.target = target_sampling();
    decode_stats st;
    const auto counts =
        guided_counts(200'000, 62, &st, [&](auto& m, auto prompt, auto rng, auto* s) {
          return speculative_decode(m, draft, prompt, opt, rng, tree_verifier<>{}, s);
        });
    decode_testing::check_sequence_law(counts, law, st, 800'000);
  }
  SECTION("stochastic multi-block decoding") {
    multiblock_options opt;
    opt.block_size = 2;
    opt.max_blocks = 2;
    opt.spawn_ratio = 0.5;
    opt.recycling = false;  // recycled n-grams are verified greedily only
    opt.max_new_tokens = 4;
    opt.stochastic = true;
    opt.target = target_sampling();
    decode_stats st;
    const auto counts =
        guided_counts(200'000, 63, &st, [&](auto& m, auto prompt, auto rng, auto* s) {
          return multiblock_decode(m, prompt, opt, rng, {}, s);
        });
    const auto g = specula::testing::g_test(counts, law);
    INFO(g);
    CHECK(g.impossible_observations == 0);
    CHECK(g.p_value > 1e-4);
  }
}

TEST_CASE("an unconditional stream that is not the null-label one fails the CFG G-test",
          "[decode][stats]") {
  // Negative control: the "unconditional" prompt keeps the class label, so both streams follow
  // the conditional model and the mix is the conditional law.
  const auto law = guided_law(labelled_model(), null_model(), cfg_scale, temperature, top_k);
  const auto counts = guided_counts(
      100'000, 64, nullptr,
      [](auto& m, auto prompt, auto rng, auto* s) {
        return sjd_decode(m, prompt, guided_sjd(), rng, {}, s);
      },
      [](std::span<const token_t> p) { return std::vector<token_t>(p.begin(), p.end()); });
  CHECK(specula::testing::g_test(counts, law).p_value < 1e-6);
}

TEST_CASE("a biased verifier fails the CFG G-test", "[decode][stats]") {
  const auto law = guided_law(labelled_model(), null_model(), cfg_scale, temperature, top_k);
  const auto counts =
      guided_counts(100'000, 65, nullptr, [](auto& m, auto prompt, auto rng, auto* s) {
        return sjd_decode(m, prompt, guided_sjd(), rng, decode_testing::first_path_verifier{}, s);
      });
  CHECK(specula::testing::g_test(counts, law).p_value < 1e-6);
}

TEST_CASE("greedy Jacobi decoding of a guided model equals greedy decoding of it", "[decode]") {
  toy_labelled_batch inner(labelled_model(), null_model(), 2);
  cfg_model<toy_labelled_batch> guided(inner, cfg_scale, null_prompt);
  const std::vector<token_t> prompt{label_token};
  const auto reference = decode_testing::greedy_reference(guided, prompt, 4);
  // The guided argmax path differs from the conditional one's (the mix matters here).
  toy_labelled_batch plain_inner(labelled_model(), null_model(), 2);
  cfg_model<toy_labelled_batch> plain(plain_inner, 1.0f, null_prompt);
  const auto conditional = decode_testing::greedy_reference(plain, prompt, 4);
  INFO("guided and conditional greedy paths");
  jacobi_options opt;
  opt.window = 3;
  opt.max_new_tokens = 4;
  decode_stats st;
  CHECK(jacobi_decode(guided, prompt, opt, request_rng{}, &st) == reference);
  CHECK(reference != conditional);
}

TEST_CASE("cfg_model batches both streams and keeps them aligned", "[decode]") {
  toy_labelled_batch inner(labelled_model(), null_model(), 4);
  cfg_model<toy_labelled_batch> guided(inner, cfg_scale, null_prompt);
  REQUIRE(guided.batch_size() == 2);
  const std::vector<token_t> prompt{label_token, 3};
  guided.prefill(1, prompt);
  CHECK(guided.context_size(1) == 1);
  CHECK(inner.context_size(3) == 1);  // the twin of request 1
  // One node after the prompt: the mixed row is the guided row after token 3.
  const token_tree root(std::vector<index_t>{-1}, std::vector<token_t>{3});
  std::vector<float> row(5);
  const index_t r = 1;
  guided.evaluate(std::span<const index_t>(&r, 1), std::span<const token_tree>(&root, 1),
                  batch_view<float>(row.data(), 1, 5));
  const std::vector<token_t> prefix{3};
  const auto c = labelled_model().row(prefix);
  const auto u = null_model().row(prefix);
  for (std::size_t y = 0; y < 5; ++y) {
    const float cy = static_cast<float>(std::log(c[y])), uy = static_cast<float>(std::log(u[y]));
    CHECK(row[y] == cfg_mix_op{cfg_scale}(cy, uy));
  }
  const std::vector<index_t> path{0};
  guided.commit(1, path);
  CHECK(inner.context_size(1 + 2) == 2);
  guided.rollback(1, 1);
  CHECK(inner.context_size(3) == 1);
}

TEST_CASE("cfg_model rejects bad arguments", "[decode][bad_input]") {
  toy_labelled_batch odd(labelled_model(), null_model(), 3);
  CHECK_THROWS_AS(cfg_model<toy_labelled_batch>(odd, 2.0f, null_prompt), invalid_input);
  toy_labelled_batch inner(labelled_model(), null_model(), 2);
  CHECK_THROWS_AS(cfg_model<toy_labelled_batch>(inner, NAN, null_prompt), invalid_input);
  CHECK_THROWS_AS(cfg_model<toy_labelled_batch>(inner, INFINITY, null_prompt), invalid_input);
  CHECK_THROWS_AS(cfg_model<toy_labelled_batch>(inner, 2.0f, nullptr), invalid_input);
  cfg_model<toy_labelled_batch> guided(inner, 2.0f, null_prompt);
  CHECK_THROWS_AS(guided.prefill(std::vector<token_t>{}), invalid_input);
  CHECK_THROWS_AS(guided.prefill(1, std::vector<token_t>{label_token}), invalid_input);
  cfg_model<toy_labelled_batch> empty_uncond(
      inner, 2.0f, [](std::span<const token_t>) { return std::vector<token_t>{}; });
  CHECK_THROWS_AS(empty_uncond.prefill(std::vector<token_t>{label_token}), invalid_input);
  guided.prefill(std::vector<token_t>{label_token, 2, 3});
  CHECK_THROWS_AS(guided.rollback(1), invalid_input);  // into the prompt
  const token_tree root(std::vector<index_t>{-1}, std::vector<token_t>{3});
  std::vector<float> row(4);
  CHECK_THROWS_AS(guided.evaluate(root, batch_view<float>(row.data(), 1, 4)), invalid_input);
}
