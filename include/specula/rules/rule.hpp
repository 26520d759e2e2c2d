#pragma once

/// @file
/// The rule slot: how a verifier decides to accept a drafted token and what it resamples from.
///
/// A rule is a small copyable host+device function object with
///   - `accept_probability(p, q)`: the probability of accepting a drafted token x given
///     p = p(x) (target) and q = q(x) (proposal);
///   - `residual_weight(p, q)`: the unnormalised weight of token y in the distribution sampled
///     after a rejection, given p = p(y) and q = q(y).
/// Rules whose parameters vary along a draft (relaxation schedules) also provide `at(depth)`,
/// returning the rule in force at that depth; verifiers call `rule_at(rule, depth)`.

#include <concepts>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// An acceptance rule (see file comment).
template <class R>
concept acceptance_rule = std::copy_constructible<R> && requires(const R& r, double p, double q) {
  { r.accept_probability(p, q) } -> std::convertible_to<double>;
  { r.residual_weight(p, q) } -> std::convertible_to<double>;
};

/// The rule in force at `depth` along a draft: `rule.at(depth)` when the rule has a schedule,
/// the rule itself otherwise.
template <class R>
SPECULA_HOST_DEVICE constexpr auto rule_at(const R& rule, index_t depth) noexcept {
  if constexpr (requires { rule.at(depth); }) {
    return rule.at(depth);
  } else {
    (void)depth;
    return rule;
  }
}

}  // namespace specula
