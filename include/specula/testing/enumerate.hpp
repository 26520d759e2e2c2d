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
/// Each decision is an interval of the uniform u at its draw_id; decisions at different draw_ids
/// are independent, and a second decision at a draw_id already used in the same run sees the
/// same u (as philox_source does), so a verifier that reuses a draw is enumerated with the
/// correlation it has in production (enumerating_source).
/// So the computed law is the law of the verifier's own code (its acceptance probabilities, the
/// weights and totals it passes, the draw points it uses), in double precision, with no sampling
/// error.

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "specula/core/config.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"
#include "specula/sample/random_source.hpp"

namespace specula::testing {

namespace detail {

/// One outcome of a random decision: the value, and the interval [lo, hi) of the uniform u of
/// its draw point that leads there.
struct outcome_interval {
  index_t value = 0;
  double lo = 0.0;
  double hi = 0.0;
  friend bool operator==(const outcome_interval&, const outcome_interval&) = default;
};

struct decision {
  std::vector<outcome_interval> options;  // intersected with the draw's interval, non-empty
  double width = 1.0;                     // the draw's interval before the decision
  std::size_t choice = 0;
};

/// A draw point of one enumerated run: (stream, position, slot).
using draw_key = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>;

class explorer {
 public:
  /// Decides at draw point `at` among `options`, whose intervals partition (0, 1). A draw point
  /// already used in this run keeps its uniform: only the outcomes compatible with the earlier
  /// decisions at the same point remain, with their conditional probabilities.
  index_t decide(const draw_key& at, const std::vector<outcome_interval>& options) {
    auto [it, first_use] = draws_.try_emplace(at, 0.0, 1.0);
    const auto [cur_lo, cur_hi] = it->second;
    std::vector<outcome_interval> live;
    for (const auto& o : options) {
      const double lo = std::max(o.lo, cur_lo);
      const double hi = std::min(o.hi, cur_hi);
      if (hi > lo) live.push_back(outcome_interval{o.value, lo, hi});
    }
    if (live.empty())
      throw std::logic_error("specula::testing: decision with no outcome at draw (position " +
                             std::to_string(std::get<1>(at)) + ", slot " +
                             std::to_string(std::get<2>(at)) + ")");
    if (!first_use) ++reused_;
    const double width = cur_hi - cur_lo;
    if (depth_ < path_.size()) {
      decision& d = path_[depth_];
      if (d.options != live)
        throw std::logic_error(
            "specula::testing: the experiment is not deterministic given its random decisions "
            "(a replayed decision offered different outcomes)");
    } else {
      path_.push_back(decision{std::move(live), width, 0});
    }
    const decision& d = path_[depth_++];
    const outcome_interval& pick = d.options[d.choice];
    probability_ *= (pick.hi - pick.lo) / d.width;
    it->second = {pick.lo, pick.hi};
    return pick.value;
  }

  void start_run() {
    depth_ = 0;
    probability_ = 1.0;
    draws_.clear();
  }
  [[nodiscard]] double probability() const noexcept { return probability_; }
  /// Decisions so far (all runs) made at a draw point already used earlier in their run.
  [[nodiscard]] std::uint64_t reused_draws() const noexcept { return reused_; }

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
  std::map<draw_key, std::pair<double, double>> draws_;  // this run's interval per draw point
  std::uint64_t reused_ = 0;
};

}  // namespace detail

/// The outcomes of the production source's bernoulli(prob) as intervals of its uniform u:
/// emit(1, 0, c) when c = clamp(prob, 0, 1) > 0 (u < prob), then emit(0, c, 1) when c < 1.
template <class Emit>
SPECULA_HOST_DEVICE void bernoulli_intervals(double prob, Emit&& emit) {
  const double c = prob < 0.0 ? 0.0 : (prob > 1.0 ? 1.0 : prob);
  if (c > 0.0) emit(index_t{1}, 0.0, c);
  if (c < 1.0) emit(index_t{0}, c, 1.0);
}

/// The outcomes of the production source's bernoulli(prob) with their exact probabilities:
/// emit(1, c) when c = clamp(prob, 0, 1) > 0, then emit(0, 1 - c) when c < 1. Host and device
/// code (a device enumerator drives the same rules).
template <class Emit>
SPECULA_HOST_DEVICE void bernoulli_outcomes(double prob, Emit&& emit) {
  bernoulli_intervals(prob, [&](index_t v, double lo, double hi) { emit(v, hi - lo); });
}

/// The outcomes of the production source's categorical(n, w, total) as intervals of its uniform
/// u, in index order (see file comment): emit(i, lo, hi) per outcome, the intervals partitioning
/// (0, 1); (-1, 0, 1) when no weight is positive.
template <class WeightFn, class Emit>
SPECULA_HOST_DEVICE void categorical_intervals(index_t n, WeightFn&& w, double total, Emit&& emit) {
  index_t first_positive = -1;
  index_t last_positive = -1;
  double acc = 0.0;
  double previous = 0.0;  // clamp(c_{i-1} / total)
  index_t pending = -1;   // the last outcome found, emitted once the next one is known
  double pending_lo = 0.0;
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
      if (pending >= 0) emit(pending, pending_lo, previous);
      pending = i;
      pending_lo = previous;
    }
    previous = upto;
  }
  if (first_positive < 0) {
    emit(index_t{-1}, 0.0, 1.0);
    return;
  }
  // A non-positive total makes u * total <= 0 < the first partial sum.
  if (!(total > 0.0)) {
    emit(first_positive, 0.0, 1.0);
    return;
  }
  // Rounding can leave the partial sums short of 1: the scan then returns the last positive
  // index.
  if (previous < 1.0 && pending != last_positive) {
    if (pending >= 0) emit(pending, pending_lo, previous);
    pending = last_positive;
    pending_lo = previous;
  }
  emit(pending, pending_lo, 1.0);
}

/// The outcomes of the production source's categorical(n, w, total) with their exact
/// probabilities, in index order: emit(i, probability) per outcome; (-1, 1) when no weight is
/// positive.
template <class WeightFn, class Emit>
SPECULA_HOST_DEVICE void categorical_outcomes(index_t n, WeightFn&& w, double total, Emit&& emit) {
  categorical_intervals(n, w, total, [&](index_t v, double lo, double hi) { emit(v, hi - lo); });
}

/// A random source that enumerates every decision (see file comment). Created by
/// enumerate_outcomes; models specula::random_source.
///
/// A source stands for one `philox_source`, i.e. one request's stream in one step: each
/// draw_id is one uniform u. A second decision at a draw_id already used in the same run sees
/// the same u, exactly as in production: the source keeps the interval of u that the earlier
/// decisions at that point selected and enumerates only the outcomes compatible with it, with
/// their conditional probabilities. So a verifier that reuses a draw gets the (usually wrong)
/// law it has in production. `stream(k)` gives a source for another, independent stream (another
/// request, or another step) of the same run.
class enumerating_source {
 public:
  explicit enumerating_source(detail::explorer& e, std::uint32_t stream = 0) noexcept
      : explorer_(&e), stream_(stream) {}

  bool bernoulli(double prob, draw_id at) {
    std::vector<detail::outcome_interval> options;
    bernoulli_intervals(prob, [&](index_t v, double lo, double hi) {
      options.push_back(detail::outcome_interval{v, lo, hi});
    });
    return explorer_->decide(key(at), options) == 1;
  }

  template <class WeightFn>
  index_t categorical(index_t n, WeightFn&& w, double total, draw_id at) {
    std::vector<detail::outcome_interval> options;
    categorical_intervals(n, w, total, [&](index_t v, double lo, double hi) {
      options.push_back(detail::outcome_interval{v, lo, hi});
    });
    return explorer_->decide(key(at), options);
  }

  /// As above, with the total taken from a summary (the production source gives the same
  /// index for the same uniform either way).
  template <class WeightFn, tile_summary Summary>
  index_t categorical(index_t n, WeightFn&& w, const Summary& s, draw_id at) {
    return categorical(n, w, s.total, at);
  }

  /// A source for stream `k` of the same run: its draws are independent of this source's
  /// (stream 0 is the one enumerate_outcomes passes).
  [[nodiscard]] enumerating_source stream(std::uint32_t k) const noexcept {
    return enumerating_source(*explorer_, k);
  }

  /// Decisions made so far (all runs) at a draw point already used earlier in their run: 0 for
  /// a verifier that never reuses a draw.
  [[nodiscard]] std::uint64_t reused_draws() const noexcept { return explorer_->reused_draws(); }

 private:
  [[nodiscard]] detail::draw_key key(draw_id at) const noexcept {
    return {stream_, at.position, at.slot};
  }

  detail::explorer* explorer_;
  std::uint32_t stream_ = 0;
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
