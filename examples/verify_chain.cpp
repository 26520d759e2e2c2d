// Speculative decoding of a toy bigram "language model" with specula's batched chain verifier.
//
// The target model is a random bigram table (next-token row depends on the last token); the
// draft model mixes it with noise. For a batch of requests, each step drafts up to L tokens per
// request from the draft model, verifies all requests in one verify_chain call and appends what
// was accepted plus the correction or bonus token. Prints acceptance statistics and compares
// the measured acceptance rate with 1 - TV(p, q) averaged uniformly over contexts (the
// per-context acceptance probability; the measured rate weights contexts by how often they occur).
//
// Usage: specula_example_verify_chain [--vocab V] [--draft-length L] [--batch B]
//                                     [--tokens N] [--mix M] [--seed S]

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "specula/specula.hpp"

using namespace specula;

namespace {

struct options {
  index_t vocab = 512;
  index_t draft_length = 4;
  index_t batch = 8;
  index_t tokens = 256;
  double mix = 0.3;
  std::uint64_t seed = 2024;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--vocab")
      o.vocab = std::atoll(next());
    else if (a == "--draft-length")
      o.draft_length = std::atoll(next());
    else if (a == "--batch")
      o.batch = std::atoll(next());
    else if (a == "--tokens")
      o.tokens = std::atoll(next());
    else if (a == "--mix")
      o.mix = std::atof(next());
    else if (a == "--seed")
      o.seed = std::strtoull(next(), nullptr, 10);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.vocab < 2 || o.draft_length < 0 || o.batch < 1 || o.tokens < 1 || o.mix < 0 || o.mix > 1) {
    std::fprintf(stderr, "invalid options\n");
    std::exit(2);
  }
  return o;
}

/// A bigram table: rows[last * V + next], each row a distribution (float).
std::vector<float> bigram_table(index_t vocab, std::uint64_t seed, float sharpness) {
  std::vector<float> rows(static_cast<std::size_t>(vocab * vocab));
  for (index_t a = 0; a < vocab; ++a) {
    double sum = 0;
    for (index_t b = 0; b < vocab; ++b) {
      const double u = uniform_at(request_rng{seed, static_cast<std::uint32_t>(a), 0},
                                  draw_id{static_cast<std::uint32_t>(b), 0});
      const double w = std::exp(sharpness * std::log(u));  // u^sharpness: peaked rows
      rows[static_cast<std::size_t>(a * vocab + b)] = static_cast<float>(w);
      sum += w;
    }
    for (index_t b = 0; b < vocab; ++b)
      rows[static_cast<std::size_t>(a * vocab + b)] /= static_cast<float>(sum);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const index_t V = o.vocab, L = o.draft_length, B = o.batch;

  const auto target = bigram_table(V, o.seed, 8.0f);
  auto draft = bigram_table(V, o.seed + 1, 8.0f);
  for (std::size_t i = 0; i < draft.size(); ++i)
    draft[i] = static_cast<float>((1.0 - o.mix) * target[i] + o.mix * draft[i]);

  // Theoretical per-token acceptance: E over rows of 1 - TV(p, q) (uniform over last tokens).
  double accept_theory = 0;
  for (index_t a = 0; a < V; ++a) {
    double tv = 0;
    for (index_t b = 0; b < V; ++b)
      tv += std::abs(target[static_cast<std::size_t>(a * V + b)] -
                     draft[static_cast<std::size_t>(a * V + b)]);
    accept_theory += 1.0 - 0.5 * tv;
  }
  accept_theory /= static_cast<double>(V);

  std::vector<std::vector<token_t>> seqs(static_cast<std::size_t>(B), std::vector<token_t>{0});
  std::vector<std::uint64_t> histogram(static_cast<std::size_t>(L + 1), 0);
  std::uint64_t steps = 0, tested = 0, accepted_total = 0;

  // Workspace reused across steps: no allocation in the loop once sized.
  std::vector<index_t> offsets;
  std::vector<token_t> tokens, out;
  std::vector<float> q_rows, p_rows;
  std::vector<request_rng> rng;
  std::vector<std::int32_t> n_acc;
  std::vector<std::uint32_t> flags;

  for (std::uint32_t step = 0;; ++step) {
    offsets.assign(1, 0);
    tokens.clear();
    q_rows.clear();
    p_rows.clear();
    rng.clear();
    std::vector<index_t> active;
    for (index_t b = 0; b < B; ++b) {
      auto& s = seqs[static_cast<std::size_t>(b)];
      const index_t missing = o.tokens + 1 - static_cast<index_t>(s.size());
      if (missing <= 0) continue;
      active.push_back(b);
      const index_t len = std::min(L, missing - 1);
      token_t last = s.back();
      const request_rng draft_rng{fold_in(o.seed, 1), static_cast<std::uint32_t>(b), step};
      for (index_t i = 0; i < len; ++i) {
        const row_view<const float> q(&draft[static_cast<std::size_t>(last * V)], V);
        const auto x = static_cast<token_t>(
            sample_inverse_cdf(q, uniform_at(draft_rng, {static_cast<std::uint32_t>(i), 0})));
        q_rows.insert(q_rows.end(), q.begin(), q.end());
        p_rows.insert(p_rows.end(), &target[static_cast<std::size_t>(last * V)],
                      &target[static_cast<std::size_t>((last + 1) * V)]);
        tokens.push_back(x);
        last = x;
      }
      p_rows.insert(p_rows.end(), &target[static_cast<std::size_t>(last * V)],
                    &target[static_cast<std::size_t>((last + 1) * V)]);
      offsets.push_back(offsets.back() + len);
      rng.push_back(request_rng{o.seed, static_cast<std::uint32_t>(b), step});
    }
    if (active.empty()) break;
    const auto nb = static_cast<index_t>(active.size());
    const index_t nd = offsets.back();
    out.assign(static_cast<std::size_t>(nd + nb), no_token);
    n_acc.assign(static_cast<std::size_t>(nb), 0);
    flags.assign(static_cast<std::size_t>(nb), 0);
    chain_batch_input<float> in{
        V, offsets, tokens, {q_rows.data(), nd, V}, {p_rows.data(), nd + nb, V}, rng};
    verify_chain(host::seq, in, chain_batch_output{out, n_acc, {}, flags});
    ++steps;
    for (index_t k = 0; k < nb; ++k) {
      const auto sk = static_cast<std::size_t>(k);
      auto& s = seqs[static_cast<std::size_t>(active[sk])];
      const index_t start = offsets[sk] + k;
      for (index_t i = 0; i <= n_acc[sk]; ++i)
        s.push_back(out[static_cast<std::size_t>(start + i)]);
      ++histogram[static_cast<std::size_t>(n_acc[sk])];
      // Drafts actually tested: the accepted ones, plus the rejected one if any.
      const index_t len = offsets[sk + 1] - offsets[sk];
      tested += static_cast<std::uint64_t>(n_acc[sk] + (n_acc[sk] < len ? 1 : 0));
      accepted_total += static_cast<std::uint64_t>(n_acc[sk]);
    }
  }

  std::uint64_t request_steps = 0;
  for (auto h : histogram) request_steps += h;
  const double generated = static_cast<double>(B * o.tokens);
  std::printf("specula %s: speculative decoding of a bigram toy model\n", SPECULA_VERSION_STRING);
  std::printf("vocab %lld, draft length %lld, batch %lld, %lld tokens per request, mix %.2f\n",
              static_cast<long long>(V), static_cast<long long>(L), static_cast<long long>(B),
              static_cast<long long>(o.tokens), o.mix);
  std::printf("batched verify calls: %llu; request-steps: %llu\n",
              static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(request_steps));
  std::printf("tokens per request-step: %.3f (1.000 without speculation)\n",
              generated / static_cast<double>(request_steps));
  std::printf("draft acceptance rate: %.4f measured; mean of 1 - TV(p, q) over contexts: %.4f\n",
              static_cast<double>(accepted_total) / static_cast<double>(tested), accept_theory);
  std::printf("accepted drafts per step:\n");
  for (index_t k = 0; k <= L; ++k)
    std::printf("  %2lld: %6.2f%%\n", static_cast<long long>(k),
                100.0 * static_cast<double>(histogram[static_cast<std::size_t>(k)]) /
                    static_cast<double>(request_steps));
  return 0;
}
