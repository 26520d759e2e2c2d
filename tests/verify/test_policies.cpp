// Batched verifiers give the same outputs under every host policy: seq, par (the persistent
// pool), a caller's executor and a separate thread_pool; errors are the sequential ones.

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "specula/testing/toy_models.hpp"
#include "specula/tree/builders.hpp"
#include "specula/verify/chain.hpp"
#include "specula/verify/greedy.hpp"
#include "specula/verify/tree.hpp"

using namespace specula;

namespace {

/// Runs each task of a bulk call on a thread of its own; counts tasks.
struct counting_executor {
  std::atomic<int> tasks{0};
  void bulk(index_t n, host::bulk_task task) {
    std::vector<std::thread> threads;
    for (index_t i = 0; i < n; ++i)
      threads.emplace_back([this, task, i] {
        ++tasks;
        task(i);
      });
    for (auto& t : threads) t.join();
  }
};

std::vector<float> probability_rows(index_t rows, index_t vocab, std::uint64_t seed,
                                    double sparsity) {
  std::vector<float> out;
  for (index_t r = 0; r < rows; ++r) {
    const auto row =
        testing::random_probability_row(vocab, seed, static_cast<std::uint32_t>(r), sparsity);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

/// A ragged chain batch: drafts with positive q, rows near each other so chains are partly
/// accepted.
struct chain_case {
  index_t vocab = 24;
  std::vector<index_t> offsets{0};
  std::vector<token_t> tokens;
  std::vector<float> q, p;
  std::vector<request_rng> rng;

  explicit chain_case(index_t batch) {
    for (index_t b = 0; b < batch; ++b) offsets.push_back(offsets.back() + b % 7);
    const index_t drafts = offsets.back();
    q = probability_rows(drafts, vocab, 3, 0.0);
    p = probability_rows(drafts + batch, vocab, 4, 0.0);
    for (std::size_t i = 0; i < p.size() && i < q.size(); ++i) p[i] = 0.8f * q[i] + 0.2f * p[i];
    for (index_t i = 0; i < drafts; ++i) tokens.push_back(static_cast<token_t>((i * 5) % vocab));
    for (index_t b = 0; b < batch; ++b)
      rng.push_back(request_rng{99, static_cast<std::uint32_t>(b), 2});
  }
  [[nodiscard]] index_t batch() const { return static_cast<index_t>(rng.size()); }
  [[nodiscard]] chain_batch_input<float> input() const {
    const index_t drafts = offsets.back();
    return {vocab, offsets, tokens, {q.data(), drafts, vocab}, {p.data(), drafts + batch(), vocab},
            rng};
  }
};

struct policy_result {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> accepted;
  std::vector<std::uint32_t> flags;
  bool operator==(const policy_result&) const = default;
};

template <class Policy>
policy_result run_chain(const Policy& pol, const chain_case& c, bool checked, bool greedy) {
  policy_result r{std::vector<token_t>(c.tokens.size() + c.rng.size()),
                  std::vector<std::int32_t>(c.rng.size()),
                  std::vector<std::uint32_t>(c.rng.size())};
  const chain_batch_output out{r.tokens, r.accepted, {}, r.flags};
  if (greedy)
    verify_chain_greedy(pol, c.input(), out);
  else if (checked)
    verify_chain(pol, c.input(), out);
  else
    verify_chain_unchecked(pol, c.input(), out);
  return r;
}

/// B small trees (binary, two levels) with one-hot drafts.
struct tree_case {
  index_t vocab = 6;
  std::vector<token_tree> trees;
  std::vector<float> p;
  std::vector<request_rng> rng;

  explicit tree_case(index_t batch) {
    for (index_t b = 0; b < batch; ++b) {
      trees.push_back(trees::from_parents({-1, 0, 0, 1, 1, 2, 2},
                                          {0, static_cast<token_t>(b % 6), 5, 1, 2, 3, 4}));
      rng.push_back(request_rng{7, static_cast<std::uint32_t>(b), 1});
    }
    p = probability_rows(7 * batch, vocab, 5, 0.0);
  }
  [[nodiscard]] tree_batch_input<float> input() const {
    tree_batch_input<float> in;
    in.vocab_size = vocab;
    in.trees = trees;
    in.target_probs = {p.data(), static_cast<index_t>(trees.size()) * 7, vocab};
    in.rng = rng;
    return in;
  }
};

template <class Policy>
policy_result run_tree(const Policy& pol, const tree_case& c) {
  policy_result r{std::vector<token_t>(c.trees.size() * 7),
                  std::vector<std::int32_t>(c.trees.size()),
                  std::vector<std::uint32_t>(c.trees.size())};
  tree_workspace ws;
  verify_tree(pol, c.input(), tree_batch_output{r.tokens, r.accepted, {}, r.flags}, ws);
  return r;
}

}  // namespace

TEST_CASE("verifiers give the same output under seq, par and a caller's executor",
          "[verify][backend]") {
  host::thread_pool pool(3);
  for (const index_t batch : {1, 2, 5, 40}) {
    INFO("B = " << batch);
    const chain_case c(batch);
    for (const bool checked : {false, true})
      for (const bool greedy : {false, true}) {
        const policy_result ref = run_chain(host::seq, c, checked, greedy);
        counting_executor ex;
        CHECK(run_chain(host::par, c, checked, greedy) == ref);
        CHECK(run_chain(host::par.with_threads(2), c, checked, greedy) == ref);
        CHECK(run_chain(host::par.with_serial_below_ns(0), c, checked, greedy) == ref);
        CHECK(run_chain(host::on(pool), c, checked, greedy) == ref);
        CHECK(run_chain(host::on(ex), c, checked, greedy) == ref);
        CHECK((ex.tasks.load() > 0) == (batch > 1));  // the executor did the work
      }
    const tree_case t(batch);
    const policy_result ref = run_tree(host::seq, t);
    counting_executor ex;
    CHECK(run_tree(host::par, t) == ref);
    CHECK(run_tree(host::par.with_serial_below_ns(0), t) == ref);
    CHECK(run_tree(host::on(pool), t) == ref);
    CHECK(run_tree(host::on(ex), t) == ref);
    // The executor did the work (with check_level::reads, a single request runs no row scans).
    CHECK((ex.tasks.load() > 0) == (batch > 1));
  }
}

TEST_CASE("validation errors under an executor are the sequential ones", "[verify][backend]") {
  chain_case c(40);
  // Two bad target rows: the first in row order is reported whatever the policy.
  c.p[static_cast<std::size_t>(30 * c.vocab + 2)] = -1.0f;
  c.p[static_cast<std::size_t>(90 * c.vocab + 1)] = -1.0f;
  std::string seq_message;
  try {
    run_chain(host::seq, c, true, false);
  } catch (const invalid_input& e) {
    seq_message = e.what();
  }
  REQUIRE_THAT(seq_message, Catch::Contains("target_probs[row 30]"));
  host::thread_pool pool(4);
  counting_executor ex;
  CHECK_THROWS_WITH(run_chain(host::par, c, true, false), seq_message);
  CHECK_THROWS_WITH(run_chain(host::par.with_serial_below_ns(0), c, true, false), seq_message);
  CHECK_THROWS_WITH(run_chain(host::on(pool), c, true, false), seq_message);
  CHECK_THROWS_WITH(run_chain(host::on(ex), c, true, false), seq_message);
  CHECK(ex.tasks.load() > 0);
}
