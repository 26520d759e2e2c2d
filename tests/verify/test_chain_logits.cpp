// Chain verification from logits (verify/chain_logits.hpp) against logits_to_probs followed by
// verify_chain: the same outputs, bit for bit, for fp32/bf16/fp16 logits, dense and one-hot
// drafts, per-row and per-request parameters, CFG, and scalar and row-aware rules; its checks.

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "specula/core/float16.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/typical.hpp"
#include "specula/sample/transforms.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/chain_logits.hpp"

using namespace specula;

namespace {

/// A batch of requests with target (and draft) logits, drafted tokens sampled from the
/// transformed draft rows (or from a perturbed target row for one-hot drafts).
template <class T>
struct logits_problem {
  index_t vocab = 0;
  std::vector<index_t> offsets;
  std::vector<token_t> tokens;
  std::vector<T> target, target_uncond, draft;
  std::vector<sampling_params> target_params, draft_params;
  std::vector<request_rng> rng;
  bool dense = false;
  bool cfg = false;
  bool per_request = false;

  [[nodiscard]] index_t batch() const { return static_cast<index_t>(offsets.size()) - 1; }
  [[nodiscard]] index_t num_draft() const { return offsets.back(); }

  [[nodiscard]] chain_logits_input<T> input() const {
    const index_t v = vocab;
    const index_t rows = num_draft() + batch();
    return {v,
            offsets,
            tokens,
            {dense ? draft.data() : nullptr, dense ? num_draft() : 0, v},
            {},
            draft_params,
            {target.data(), rows, v},
            {cfg ? target_uncond.data() : nullptr, cfg ? rows : 0, v},
            target_params,
            rng,
            per_request};
  }
};

sampling_params random_params(std::mt19937& g, index_t vocab) {
  std::uniform_int_distribution<int> pick(0, 5);
  sampling_params sp;
  sp.temperature = std::array<float, 3>{1.0f, 0.8f, 1.4f}[static_cast<std::size_t>(pick(g) % 3)];
  sp.top_k = std::array<index_t, 4>{0, 1, 5, vocab - 1}[static_cast<std::size_t>(pick(g) % 4)];
  sp.top_p =
      std::array<float, 4>{1.0f, 0.9f, 0.5f, 0.99999994f}[static_cast<std::size_t>(pick(g) % 4)];
  sp.min_p = std::array<float, 3>{0.0f, 0.05f, 0.2f}[static_cast<std::size_t>(pick(g) % 3)];
  sp.cfg_scale = 1.5f;
  return sp;
}

/// One draft token sampled from a probability row (inverse CDF with mt19937).
token_t sample_from(std::mt19937& g, const std::vector<float>& q) {
  double total = 0.0;
  for (const float x : q) total += x;
  std::uniform_real_distribution<double> u(0.0, total);
  const double target = u(g);
  double acc = 0.0;
  token_t last = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i] <= 0.0f) continue;
    acc += q[i];
    last = static_cast<token_t>(i);
    if (acc >= target) return last;
  }
  return last;
}

template <class T>
logits_problem<T> make_problem(std::uint32_t seed, index_t vocab, bool dense, bool cfg,
                               bool per_request) {
  std::mt19937 g(seed);
  logits_problem<T> pb;
  pb.vocab = vocab;
  pb.dense = dense;
  pb.cfg = cfg;
  pb.per_request = per_request;
  const std::vector<index_t> lengths = {3, 0, 5, 1, 4};
  pb.offsets = {0};
  for (const index_t l : lengths) pb.offsets.push_back(pb.offsets.back() + l);
  const index_t batch = pb.batch();
  const index_t rows = pb.num_draft() + batch;
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::normal_distribution<float> noise(0.0f, 0.7f);
  std::vector<float> target_f(static_cast<std::size_t>(rows * vocab));
  for (float& x : target_f) x = normal(g);
  for (const float x : target_f) pb.target.push_back(from_float<T>(x));
  if (cfg)
    for (index_t i = 0; i < rows * vocab; ++i) pb.target_uncond.push_back(from_float<T>(normal(g)));
  const index_t param_rows_t = per_request ? batch : rows;
  const index_t param_rows_d = per_request ? batch : pb.num_draft();
  for (index_t r = 0; r < param_rows_t; ++r) pb.target_params.push_back(random_params(g, vocab));
  for (index_t r = 0; r < param_rows_d; ++r) pb.draft_params.push_back(random_params(g, vocab));
  if (!dense) pb.draft_params.clear();
  for (index_t b = 0; b < batch; ++b) {
    pb.rng.push_back({seed, static_cast<std::uint32_t>(b), 3});
    for (index_t i = 0; i < lengths[static_cast<std::size_t>(b)]; ++i) {
      const index_t trow = pb.offsets[static_cast<std::size_t>(b)] + b + i;
      // The draft's logits: the target's plus noise.
      std::vector<float> d(static_cast<std::size_t>(vocab));
      for (index_t y = 0; y < vocab; ++y)
        d[static_cast<std::size_t>(y)] =
            target_f[static_cast<std::size_t>(trow * vocab + y)] + noise(g);
      std::vector<T> dt;
      for (const float x : d) dt.push_back(from_float<T>(x));
      pb.draft.insert(pb.draft.end(), dt.begin(), dt.end());
      // The drafted token: sampled from the draft's transformed row (dense), or from its
      // plain softmax (one-hot drafts).
      const index_t drow = pb.offsets[static_cast<std::size_t>(b)] + i;
      sampling_params sp;
      if (dense) sp = pb.draft_params[static_cast<std::size_t>(per_request ? b : drow)];
      std::vector<float> q(static_cast<std::size_t>(vocab));
      const std::vector<sampling_params> one = {sp};
      logits_to_probs<T>(batch_view<const T>{dt.data(), 1, vocab}, {}, one,
                         batch_view<float>{q.data(), 1, vocab});
      pb.tokens.push_back(sample_from(g, q));
    }
  }
  return pb;
}

/// Per-row parameters expanded from per-request ones.
std::vector<sampling_params> per_row(const std::vector<sampling_params>& params,
                                     const std::vector<index_t>& offsets, bool per_request,
                                     bool target) {
  if (!per_request || params.size() <= 1) return params;
  std::vector<sampling_params> out;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
    const index_t n = offsets[b + 1] - offsets[b] + (target ? 1 : 0);
    for (index_t i = 0; i < n; ++i) out.push_back(params[b]);
  }
  return out;
}

struct chain_result {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> accepted_count;
  std::vector<std::uint8_t> accepted;
  std::vector<std::uint32_t> flags;
  bool operator==(const chain_result&) const = default;

  chain_result(index_t num_draft, index_t batch)
      : tokens(static_cast<std::size_t>(num_draft + batch), 99),
        accepted_count(static_cast<std::size_t>(batch), -7),
        accepted(static_cast<std::size_t>(num_draft), 9),
        flags(static_cast<std::size_t>(batch), 77u) {}
  chain_batch_output output() { return {tokens, accepted_count, accepted, flags}; }
};

/// logits_to_probs on every row, then verify_chain.
template <class T, class Rule>
chain_result unfused(const logits_problem<T>& pb, const Rule& rule) {
  const index_t v = pb.vocab;
  const index_t rows = pb.num_draft() + pb.batch();
  const auto in = pb.input();
  std::vector<float> p(static_cast<std::size_t>(rows * v));
  const auto tp = per_row(pb.target_params, pb.offsets, pb.per_request, true);
  logits_to_probs<T>(host::seq, in.target_logits, in.target_uncond, tp,
                     batch_view<float>{p.data(), rows, v});
  std::vector<float> q(static_cast<std::size_t>(pb.num_draft() * v));
  if (pb.dense) {
    const auto dp = per_row(pb.draft_params, pb.offsets, pb.per_request, false);
    logits_to_probs<T>(host::seq, in.draft_logits, {}, dp,
                       batch_view<float>{q.data(), pb.num_draft(), v});
  }
  chain_result r(pb.num_draft(), pb.batch());
  const chain_batch_input<float> probs_in{
      v,
      pb.offsets,
      pb.tokens,
      {pb.dense ? q.data() : nullptr, pb.dense ? pb.num_draft() : 0, v},
      {p.data(), rows, v},
      pb.rng};
  verify_chain(host::seq, probs_in, r.output(), {}, rule);
  return r;
}

template <class T, class Rule, class Policy>
chain_result fused(const logits_problem<T>& pb, const Rule& rule, const Policy& policy) {
  chain_result r(pb.num_draft(), pb.batch());
  verify_chain_from_logits(policy, pb.input(), r.output(), {}, rule);
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("chain verification from logits equals logits_to_probs then verify_chain",
                   "[verify][law]", float, bfloat16, half) {
  std::uint32_t seed = 1;
  int rejections = 0;
  int bonuses = 0;
  for (const index_t vocab : {index_t{40}, index_t{3000}})
    for (const bool dense : {false, true})
      for (const bool cfg : {false, true})
        for (const bool per_request : {false, true})
          for (int rep = 0; rep < 3; ++rep) {
            const auto pb = make_problem<TestType>(seed++, vocab, dense, cfg, per_request);
            INFO("vocab " << vocab << " dense " << dense << " cfg " << cfg << " per_request "
                          << per_request << " rep " << rep);
            const auto want = unfused(pb, exact_rule{});
            REQUIRE(fused(pb, exact_rule{}, host::seq) == want);
            REQUIRE(fused(pb, exact_rule{}, host::par) == want);
            const relaxed_rule relaxed{2.0, resampling::optimal};
            REQUIRE(fused(pb, relaxed, host::seq) == unfused(pb, relaxed));
            const auto typical = typical_rule::make(0.3, 0.09);
            REQUIRE(fused(pb, typical, host::seq) == unfused(pb, typical));
            for (std::size_t b = 0; b < want.flags.size(); ++b) {
              bonuses += (want.flags[b] & chain_bonus) != 0u ? 1 : 0;
              const index_t len = pb.offsets[b + 1] - pb.offsets[b];
              rejections += want.accepted_count[b] < len ? 1 : 0;
            }
          }
  // The cases cover both endings.
  CHECK(rejections > 20);
  CHECK(bonuses > 20);
}

TEST_CASE("chain verification from logits rejects bad input", "[verify][bad_input]") {
  auto pb = make_problem<float>(5, 50, true, false, false);
  const auto run = [&] {
    chain_result r(pb.num_draft(), pb.batch());
    verify_chain_from_logits(host::seq, pb.input(), r.output());
  };
  REQUIRE_NOTHROW(run());
  const index_t v = pb.vocab;
  if (pb.batch() > 1) {  // requests sharing a random stream: named, both of them
    const request_rng saved = pb.rng[1];
    pb.rng[1] = pb.rng[0];
    CHECK_THROWS_WITH(run(), Catch::Contains("rng[row 1]: random stream shared") &&
                                 Catch::Contains("requests 0 and 1"));
    pb.rng[1] = saved;
  }
  {
    auto saved = pb.target[static_cast<std::size_t>(4 * v + 7)];
    pb.target[static_cast<std::size_t>(4 * v + 7)] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(run(), Catch::Contains("target_logits[row 4][column 7]: NaN entry"));
    pb.target[static_cast<std::size_t>(4 * v + 7)] = saved;
  }
  {
    auto saved = pb.draft[static_cast<std::size_t>(2 * v + 1)];
    pb.draft[static_cast<std::size_t>(2 * v + 1)] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(run(), Catch::Contains("draft_logits[row 2][column 1]: infinite entry"));
    pb.draft[static_cast<std::size_t>(2 * v + 1)] = saved;
  }
  {
    auto saved = pb.target_params[3];
    pb.target_params[3].top_p = 0.0f;
    CHECK_THROWS_WITH(run(), Catch::Contains("target_params.top_p[row 3]"));
    pb.target_params[3] = saved;
  }
  {
    auto saved = pb.draft_params;
    pb.draft_params.pop_back();
    CHECK_THROWS_WITH(run(), Catch::Contains("draft_params") && Catch::Contains("needs 1 entry"));
    pb.draft_params = saved;
  }
  {
    auto saved = pb.rng;
    pb.rng.pop_back();
    CHECK_THROWS_WITH(run(), Catch::Contains("rng"));
    pb.rng = saved;
  }
  {
    auto saved = pb.tokens[0];
    pb.tokens[0] = static_cast<token_t>(v);
    CHECK_THROWS_WITH(run(), Catch::Contains("draft_tokens") && Catch::Contains("out of range"));
    pb.tokens[0] = saved;
  }
  {
    auto in = pb.input();
    in.target_logits.rows -= 1;
    chain_result r(pb.num_draft(), pb.batch());
    CHECK_THROWS_WITH(verify_chain_from_logits(host::seq, in, r.output()),
                      Catch::Contains("target_logits"));
    in = pb.input();
    in.draft_logits.cols = v - 1;
    CHECK_THROWS_WITH(verify_chain_from_logits(host::seq, in, r.output()),
                      Catch::Contains("draft_logits"));
    in = pb.input();
    auto out = r.output();
    out.num_accepted.size -= 1;
    CHECK_THROWS_WITH(verify_chain_from_logits(host::seq, in, out),
                      Catch::Contains("num_accepted"));
  }
  {
    // A drafted token outside the draft row's top-1: probability 0 after the transform.
    pb.draft_params.assign(pb.draft_params.size(), sampling_params{});
    pb.draft_params[0].top_k = 1;
    std::size_t argmax = 0;
    for (index_t y = 0; y < v; ++y)
      if (pb.draft[static_cast<std::size_t>(y)] > pb.draft[argmax])
        argmax = static_cast<std::size_t>(y);
    pb.tokens[0] = static_cast<token_t>((argmax + 1) % static_cast<std::size_t>(v));
    CHECK_THROWS_WITH(run(), Catch::Contains("draft_logits[row 0][column") &&
                                 Catch::Contains("zero proposal probability"));
  }
}

namespace {

/// The requests `keep` of a problem, in order, with their rows, parameters and streams.
template <class T>
logits_problem<T> subset(const logits_problem<T>& pb, const std::vector<index_t>& keep) {
  logits_problem<T> s;
  s.vocab = pb.vocab;
  s.dense = pb.dense;
  s.cfg = pb.cfg;
  s.per_request = pb.per_request;
  s.offsets = {0};
  const auto v = static_cast<std::size_t>(pb.vocab);
  const auto copy_rows = [v](const std::vector<T>& from, index_t first, index_t n,
                             std::vector<T>& to) {
    if (from.empty()) return;
    const auto at = [&](index_t row) {
      return from.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(row) * v);
    };
    to.insert(to.end(), at(first), at(first + n));
  };
  for (const index_t b : keep) {
    const auto ub = static_cast<std::size_t>(b);
    const index_t d0 = pb.offsets[ub], len = pb.offsets[ub + 1] - d0;
    s.offsets.push_back(s.offsets.back() + len);
    s.tokens.insert(s.tokens.end(), pb.tokens.begin() + d0, pb.tokens.begin() + d0 + len);
    copy_rows(pb.target, d0 + b, len + 1, s.target);
    copy_rows(pb.target_uncond, d0 + b, len + 1, s.target_uncond);
    copy_rows(pb.draft, d0, len, s.draft);
    if (pb.per_request) {
      s.target_params.push_back(pb.target_params[ub]);
      if (!pb.draft_params.empty()) s.draft_params.push_back(pb.draft_params[ub]);
    } else {
      for (index_t i = 0; i <= len; ++i)
        s.target_params.push_back(pb.target_params[static_cast<std::size_t>(d0 + b + i)]);
      if (!pb.draft_params.empty())
        for (index_t i = 0; i < len; ++i)
          s.draft_params.push_back(pb.draft_params[static_cast<std::size_t>(d0 + i)]);
    }
    s.rng.push_back(pb.rng[ub]);
  }
  return s;
}

/// The arg-max (lowest on ties) of target row `row` after the CFG mix with `scale`:
/// uncond + scale (cond - uncond), each operation rounded to float on its own (volatile: never
/// contracted), written here apart from the library's cfg_mix_op.
template <class T>
token_t mixed_argmax(const logits_problem<T>& pb, index_t row, float scale) {
  const auto v = static_cast<std::size_t>(pb.vocab);
  token_t best = 0;
  float best_x = -std::numeric_limits<float>::infinity();
  for (std::size_t y = 0; y < v; ++y) {
    const float c = to_float(pb.target[static_cast<std::size_t>(row) * v + y]);
    float x = c;
    if (pb.cfg) {
      const float u = to_float(pb.target_uncond[static_cast<std::size_t>(row) * v + y]);
      const volatile float diff = c - u;
      const volatile float scaled = scale * diff;
      x = u + scaled;
    }
    if (x > best_x) {
      best_x = x;
      best = static_cast<token_t>(y);
    }
  }
  return best;
}

}  // namespace

TEMPLATE_TEST_CASE("greedy and sampled requests in one verify_chain_from_logits call",
                   "[verify][law]", float, bfloat16) {
  // Requests 0, 1 and 3 greedy (1 has no drafts); 2 and 4 sampled. Request 0 drafts the
  // arg-max everywhere (all accepted, bonus), request 3's draft is not the arg-max (rejected).
  const std::vector<std::uint8_t> mask = {1, 1, 0, 1, 0};
  std::uint32_t seed = 40;
  for (const index_t vocab : {index_t{40}, index_t{3000}})
    for (const bool dense : {false, true})
      for (const bool cfg : {false, true})
        for (const bool per_request : {false, true}) {
          auto pb = make_problem<TestType>(seed++, vocab, dense, cfg, per_request);
          INFO("vocab " << vocab << " dense " << dense << " cfg " << cfg << " per_request "
                        << per_request);
          const auto row_scale = [&](index_t b, index_t row) {
            return pb.target_params[static_cast<std::size_t>(per_request ? b : row)].cfg_scale;
          };
          for (const index_t b : {index_t{0}, index_t{3}}) {
            const auto ub = static_cast<std::size_t>(b);
            for (index_t i = pb.offsets[ub]; i < pb.offsets[ub + 1]; ++i) {
              const token_t best = mixed_argmax(pb, i + b, row_scale(b, i + b));
              pb.tokens[static_cast<std::size_t>(i)] =
                  b == 0 ? best : static_cast<token_t>((best + 1) % vocab);
            }
          }
          // A greedy request may share a sampled request's stream: it makes no draw.
          pb.rng[1] = pb.rng[2];
          auto in = pb.input();
          in.is_greedy = mask;
          chain_result mixed(pb.num_draft(), pb.batch());
          verify_chain_from_logits(host::par, in, mixed.output());

          // Greedy requests: the hand-written greedy rule on the mixed logits.
          for (const index_t b : {index_t{0}, index_t{1}, index_t{3}}) {
            const auto ub = static_cast<std::size_t>(b);
            const index_t d0 = pb.offsets[ub], len = pb.offsets[ub + 1] - d0;
            index_t n = 0;
            while (n < len && pb.tokens[static_cast<std::size_t>(d0 + n)] ==
                                  mixed_argmax(pb, d0 + b + n, row_scale(b, d0 + b + n)))
              ++n;
            CHECK(mixed.accepted_count[ub] == n);
            CHECK(mixed.tokens[static_cast<std::size_t>(d0 + b + n)] ==
                  mixed_argmax(pb, d0 + b + n, row_scale(b, d0 + b + n)));
            for (index_t i = 0; i < n; ++i)
              CHECK(mixed.tokens[static_cast<std::size_t>(d0 + b + i)] ==
                    pb.tokens[static_cast<std::size_t>(d0 + i)]);
            CHECK(mixed.flags[ub] == (chain_valid | (n == len ? chain_bonus : 0u)));
          }
          CHECK(mixed.accepted_count[0] == pb.offsets[1]);  // all of request 0's drafts
          CHECK(mixed.accepted_count[3] == 0);

          // Sampled requests: bit for bit the call without the greedy ones.
          const auto alone = subset(pb, {2, 4});
          chain_result solo(alone.num_draft(), alone.batch());
          verify_chain_from_logits(host::seq, alone.input(), solo.output());
          for (std::size_t k = 0; k < 2; ++k) {
            const index_t b = k == 0 ? 2 : 4;
            const auto ub = static_cast<std::size_t>(b);
            const index_t d0 = pb.offsets[ub], len = pb.offsets[ub + 1] - d0;
            const index_t s0 = alone.offsets[k];
            CHECK(mixed.accepted_count[ub] == solo.accepted_count[k]);
            CHECK(mixed.flags[ub] == solo.flags[k]);
            for (index_t i = 0; i <= len; ++i)
              CHECK(mixed.tokens[static_cast<std::size_t>(d0 + b + i)] ==
                    solo.tokens[static_cast<std::size_t>(s0 + static_cast<index_t>(k) + i)]);
            for (index_t i = 0; i < len; ++i)
              CHECK(mixed.accepted[static_cast<std::size_t>(d0 + i)] ==
                    solo.accepted[static_cast<std::size_t>(s0 + i)]);
          }
        }
}

TEST_CASE("verify_chain_from_logits: is_greedy bad input", "[verify][bad_input]") {
  const auto pb = make_problem<float>(7, 30, true, false, false);
  chain_result r(pb.num_draft(), pb.batch());
  auto in = pb.input();
  const std::vector<std::uint8_t> short_mask(static_cast<std::size_t>(pb.batch() - 1), 1);
  in.is_greedy = short_mask;
  CHECK_THROWS_WITH(verify_chain_from_logits(host::seq, in, r.output()),
                    Catch::Contains("is_greedy") && Catch::Contains("length mismatch"));
  // Sampled requests still may not share a stream.
  auto shared = pb;
  shared.rng[2] = shared.rng[4];
  in = shared.input();
  const std::vector<std::uint8_t> mask = {1, 0, 0, 0, 0};
  in.is_greedy = mask;
  CHECK_THROWS_WITH(verify_chain_from_logits(host::seq, in, r.output()),
                    Catch::Contains("random stream shared") && Catch::Contains("requests 2 and 4"));
}
