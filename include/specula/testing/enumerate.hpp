#pragma once

/// @file
/// Exact output laws by enumerating a verifier's randomness.
///
/// A verifier written against the `random_source` interface (specula/sample/random_source.hpp)
/// makes only two kinds of random decisions. `enumerate_outcomes` runs the verifier once per
/// possible sequence of decisions, replaying the decisions of earlier runs depth-first, and
/// weights each run by the exact probability that the production source (`philox_source`, with
/// a uniform u in (0, 1)) would make those decisions:
///   - bernoulli(prob): true with probability clamp(prob, 0, 1) (the measure of u < prob);
///   - categorical(n, w, total): index i with the measure of u for which the inverse-CDF scan
///     stops at i, i.e. clamp(c_i / total) - clamp(c_{i-1} / total) over the partial sums c of
///     the positive weights, with the remainder going to the last positive index, as the scan
///     does.
/// So the computed law is the law of the verifier's own code (its acceptance probabilities, the
/// weights and totals it passes), in double precision, with no sampling error.

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/sample/random_source.hpp"

namespace specula::testing {

namespace detail {

struct decision {
  std::vector<std::pair<index_t, double>> options;  // (value, probability), probability > 0
  std::size_t choice = 0;
};

class explorer {
 public:
  index_t decide(std::vector<std::pair<index_t, double>> options) {
    if (options.empty()) throw std::logic_error("specula::testing: decision with no outcome");
    if (depth_ < path_.size()) {
      decision& d = path_[depth_];
      if (d.options != options)
        throw std::logic_error(
            "specula::testing: the experiment is not deterministic given its random decisions "
            "(a replayed decision offered different outcomes)");
      ++depth_;
      probability_ *= d.options[d.choice].second;
      return d.options[d.choice].first;
    }
    path_.push_back(decision{std::move(options), 0});
    ++depth_;
    probability_ *= path_.back().options[0].second;
    return path_.back().options[0].first;
  }

  void start_run() {
    depth_ = 0;
    probability_ = 1.0;
  }
  [[nodiscard]] double probability() const noexcept { return probability_; }

  /// Moves to the next unexplored path; false when all have been explored.
  bool advance() {
    if (depth_ != path_.size())
      throw std::logic_error(
          "specula::testing: the experiment made fewer random decisions on replay");
    while (!path_.empty() && path_.back().choice + 1 >= path_.back().options.size())
      path_.pop_back();
    if (path_.empty()) return false;
    ++path_.back().choice;
    return true;
  }

 private:
  std::vector<decision> path_;
  std::size_t depth_ = 0;
  double probability_ = 1.0;
};

}  // namespace detail

/// The outcomes of the production source's bernoulli(prob) with their exact probabilities:
/// emit(1, c) when c = clamp(prob, 0, 1) > 0, then emit(0, 1 - c) when c < 1. Host and device
/// code (a device enumerator drives the same rules).
template <class Emit>
SPECULA_HOST_DEVICE void bernoulli_outcomes(double prob, Emit&& emit) {
  const double c = prob < 0.0 ? 0.0 : (prob > 1.0 ? 1.0 : prob);
  if (c > 0.0) emit(index_t{1}, c);
  if (c < 1.0) emit(index_t{0}, 1.0 - c);
}

/// The outcomes of the production source's categorical(n, w, total) with their exact
/// probabilities, in index order (see file comment): emit(i, probability) per outcome; (-1, 1)
/// when no weight is positive.
template <class WeightFn, class Emit>
SPECULA_HOST_DEVICE void categorical_outcomes(index_t n, WeightFn&& w, double total, Emit&& emit) {
  index_t first_positive = -1;
  index_t last_positive = -1;
  double acc = 0.0;
  double previous = 0.0;  // clamp(c_{i-1} / total)
  index_t pending = -1;   // the last outcome found, emitted once the next one is known
  double pending_p = 0.0;
  for (index_t i = 0; i < n; ++i) {
    const double wi = w(i);
    if (!(wi > 0.0)) continue;
    if (first_positive < 0) first_positive = i;
    last_positive = i;
    if (!(total > 0.0)) continue;
    acc += wi;
    double upto = acc / total;
    upto = upto < 0.0 ? 0.0 : (upto > 1.0 ? 1.0 : upto);
    if (upto > previous) {
      if (pending >= 0) emit(pending, pending_p);
      pending = i;
      pending_p = upto - previous;
    }
    previous = upto;
  }
  if (first_positive < 0) {
    emit(index_t{-1}, 1.0);
    return;
  }
  // A non-positive total makes u * total <= 0 < the first partial sum.
  if (!(total > 0.0)) {
    emit(first_positive, 1.0);
    return;
  }
  // Rounding can leave the partial sums short of 1: the scan then returns the last positive
  // index.
  if (previous < 1.0) {
    if (pending == last_positive) {
      pending_p += 1.0 - previous;
    } else {
      if (pending >= 0) emit(pending, pending_p);
      pending = last_positive;
      pending_p = 1.0 - previous;
    }
  }
  emit(pending, pending_p);
}

/// A random source that enumerates every decision (see file comment). Created by
/// enumerate_outcomes; models specula::random_source.
class enumerating_source {
 public:
  explicit enumerating_source(detail::explorer& e) noexcept : explorer_(&e) {}

  bool bernoulli(double prob, draw_id /*at*/) {
    std::vector<std::pair<index_t, double>> options;
    bernoulli_outcomes(prob, [&](index_t v, double p) { options.emplace_back(v, p); });
    return explorer_->decide(std::move(options)) == 1;
  }

  template <class WeightFn>
  index_t categorical(index_t n, WeightFn&& w, double total, draw_id /*at*/) {
    std::vector<std::pair<index_t, double>> options;
    categorical_outcomes(n, w, total, [&](index_t v, double p) { options.emplace_back(v, p); });
    return explorer_->decide(std::move(options));
  }

  /// As above, with the total taken from a summary (the production source gives the same
  /// index for the same uniform either way).
  template <class WeightFn, tile_summary Summary>
  index_t categorical(index_t n, WeightFn&& w, const Summary& s, draw_id at) {
    return categorical(n, w, s.total, at);
  }

 private:
  detail::explorer* explorer_;
};

static_assert(specula::random_source<enumerating_source>);

/// Runs `experiment(enumerating_source&) -> Outcome` along every path of random decisions and
/// returns each outcome's exact probability. Throws std::length_error after `max_paths` paths.
template <class Outcome, class Experiment>
std::map<Outcome, double> enumerate_outcomes(Experiment&& experiment,
                                             std::uint64_t max_paths = 50'000'000) {
  std::map<Outcome, double> law;
  detail::explorer e;
  std::uint64_t paths = 0;
  do {
    if (++paths > max_paths)
      throw std::length_error("specula::testing::enumerate_outcomes: too many paths");
    e.start_run();
    enumerating_source src(e);
    Outcome o = experiment(src);
    law[o] += e.probability();
  } while (e.advance());
  return law;
}

/// Exact law of a single-token experiment over [0, vocab): element y is P(output == y). Outputs
/// outside [0, vocab) (e.g. -1 for "no token") are summed into the returned `invalid_mass`.
struct token_law {
  std::vector<double> probability;
  double invalid_mass = 0.0;
};

template <class Experiment>
token_law enumerate_token_law(index_t vocab, Experiment&& experiment) {
  token_law law{std::vector<double>(static_cast<std::size_t>(vocab), 0.0), 0.0};
  for (const auto& [token, prob] : enumerate_outcomes<index_t>(experiment)) {
    if (token >= 0 && token < vocab)
      law.probability[static_cast<std::size_t>(token)] += prob;
    else
      law.invalid_mass += prob;
  }
  return law;
}

}  // namespace specula::testing
