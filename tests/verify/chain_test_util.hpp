#pragma once
// Shared helpers for the chain verification tests.

#include <cstdint>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/testing/toy_models.hpp"
#include "specula/verify/chain.hpp"

namespace specula::test {

/// Random (p, q) pair families used by the exact-law tests.
enum class pair_kind { dense, sparse, q_zero_off_support, equal, disjoint };

struct prob_pair {
  std::vector<double> p;
  std::vector<double> q;
};

inline prob_pair make_pair(pair_kind kind, index_t vocab, std::uint64_t seed) {
  using testing::random_probability_row;
  prob_pair r;
  switch (kind) {
    case pair_kind::dense:
      r.p = random_probability_row(vocab, seed, 0);
      r.q = random_probability_row(vocab, seed, 1);
      break;
    case pair_kind::sparse:
      r.p = random_probability_row(vocab, seed, 0, 0.5);
      r.q = random_probability_row(vocab, seed, 1, 0.5);
      break;
    case pair_kind::q_zero_off_support: {
      // q lives on a subset of p's support.
      r.p = random_probability_row(vocab, seed, 0);
      r.q = random_probability_row(vocab, seed, 1, 0.6);
      break;
    }
    case pair_kind::equal:
      r.p = random_probability_row(vocab, seed, 0, 0.3);
      r.q = r.p;
      break;
    case pair_kind::disjoint: {
      r.p.assign(static_cast<std::size_t>(vocab), 0.0);
      r.q.assign(static_cast<std::size_t>(vocab), 0.0);
      const auto a = random_probability_row(vocab, seed, 0);
      const auto b = random_probability_row(vocab, seed, 1);
      double sp = 0, sq = 0;
      for (index_t i = 0; i < vocab; ++i) {
        if (i % 2 == 0) {
          r.p[static_cast<std::size_t>(i)] = a[static_cast<std::size_t>(i)];
          sp += a[static_cast<std::size_t>(i)];
        } else {
          r.q[static_cast<std::size_t>(i)] = b[static_cast<std::size_t>(i)];
          sq += b[static_cast<std::size_t>(i)];
        }
      }
      for (auto& v : r.p) v /= sp;
      for (auto& v : r.q) v /= sq;
      break;
    }
  }
  return r;
}

/// Caller-allocated outputs of a flattened-layout chain call, filled with values no call writes
/// (so that untouched slots show).
struct flat_chain_outputs {
  std::vector<token_t> tokens;
  std::vector<std::int32_t> accepted_count;
  std::vector<std::uint8_t> accepted;
  std::vector<std::uint32_t> flags;
  flat_chain_outputs(index_t num_draft, index_t batch)
      : tokens(static_cast<std::size_t>(num_draft + batch), 12345),
        accepted_count(static_cast<std::size_t>(batch), -5),
        accepted(static_cast<std::size_t>(num_draft), 7),
        flags(static_cast<std::size_t>(batch), 0xff) {}
  chain_batch_output view() { return {tokens, accepted_count, accepted, flags}; }
};

/// A deliberately wrong rule: on rejection it resamples from p instead of [p - q]+.
struct resample_from_target_rule {
  [[nodiscard]] constexpr double accept_probability(double p, double q) const noexcept {
    return (q <= 0.0 || p >= q) ? 1.0 : p / q;
  }
  [[nodiscard]] constexpr double residual_weight(double p, double /*q*/) const noexcept {
    return p;
  }
};

/// A deliberately wrong rule: accepts with min(1, p/q) but forgets the max in the residual,
/// keeping |p - q| (a sign error that looks plausible).
struct absolute_residual_rule {
  [[nodiscard]] constexpr double accept_probability(double p, double q) const noexcept {
    return (q <= 0.0 || p >= q) ? 1.0 : p / q;
  }
  [[nodiscard]] constexpr double residual_weight(double p, double q) const noexcept {
    return p > q ? p - q : q - p;
  }
};

/// View of a double vector as a row.
inline row_view<const double> view(const std::vector<double>& v) {
  return {v.data(), static_cast<index_t>(v.size())};
}

/// A deliberately wrong candidate proposal: earlier candidates removed from q but q^(k) not
/// renormalised.
template <class T>
struct unnormalised_without_replacement {
  row_view<const T> q;
  [[nodiscard]] constexpr double prob(index_t x, bool earlier, token_t, double) const noexcept {
    return earlier ? 0.0 : static_cast<double>(q[x]);
  }
  [[nodiscard]] constexpr double mass(index_t x) const noexcept {
    return static_cast<double>(q[x]);
  }
};

}  // namespace specula::test
