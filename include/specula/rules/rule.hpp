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
///
/// Row-aware rules (LANTERN++'s neighbour aggregation, typical acceptance) need the whole target
/// row and the drafted token before they can answer. They provide `bind(p_row, x)`, returning
/// a bound rule with `accept_probability(p(x), q(x))` and `residual_weight_at(y, p(y), q(y))`.
/// Verifiers call `bind_rule(rule, p_row, x)`, which wraps a scalar rule in the same interface,
/// so the chain verifier handles both kinds with one code path.

#include <concepts>
#include <type_traits>

#include "specula/core/config.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/core/validate.hpp"

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

namespace detail {

/// True for rules whose residual_weight(p, q) is exactly max(p - q, 0) (they declare
/// `static constexpr bool residual_is_positive_difference = true`).
template <class R>
inline constexpr bool residual_is_positive_difference = [] {
  if constexpr (requires { R::residual_is_positive_difference; })
    return static_cast<bool>(R::residual_is_positive_difference);
  else
    return false;
}();

/// A scalar rule seen through the bound-rule interface.
template <class R>
struct scalar_bound_rule {
  static constexpr bool residual_is_positive_difference =
      detail::residual_is_positive_difference<R>;
  R rule;
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double accept_probability(double p,
                                                                        double q) const noexcept {
    return static_cast<double>(rule.accept_probability(p, q));
  }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr double residual_weight_at(index_t /*y*/, double p,
                                                                        double q) const noexcept {
    return static_cast<double>(rule.residual_weight(p, q));
  }
};

}  // namespace detail

/// True for rules that need the target row and drafted token (they provide `bind`).
template <class R, class Row>
concept row_aware_rule = requires(const R& r, const Row& row, token_t x) {
  r.bind(row, x);
};

/// A rule the chain verifier accepts: a scalar acceptance_rule, or a row-aware rule (bound per
/// position), possibly through a schedule (`at(depth)`).
template <class R>
concept chain_rule = acceptance_rule<R> || requires(const R& r, const row_view<const float>& p,
                                                    const row_view<const double>& pd, token_t x) {
  r.bind(p, x);
  r.bind(pd, x);
};

/// The rule bound to target row `p` and drafted token `x` (see file comment).
template <class R, class Row>
SPECULA_HOST_DEVICE constexpr auto bind_rule(const R& rule, const Row& p, token_t x) noexcept {
  if constexpr (row_aware_rule<R, Row>) {
    return rule.bind(p, x);
  } else {
    (void)p;
    (void)x;
    return detail::scalar_bound_rule<R>{rule};
  }
}

/// bind_rule with the verifier's row passes: a rule whose binding makes a full-row reduction
/// (typical acceptance's entropy) and provides `bind(p_row, x, passes)` makes it through them (a
/// CTA-wide pass on the device, the same bits as the host's); every other rule binds as above.
template <class R, class Row, class Passes>
SPECULA_HOST_DEVICE constexpr auto bind_rule(const R& rule, const Row& p, token_t x,
                                             const Passes& passes) {
  if constexpr (requires { rule.bind(p, x, passes); })
    return rule.bind(p, x, passes);
  else
    return bind_rule(rule, p, x);
}

/// One rule per request of a batch (e.g. per-request relaxation parameters): request b uses
/// rules[b]. Accepted wherever a batched entry point takes a rule; checked entry points require
/// one rule per request.
template <class Rule>
struct per_request {
  row_view<const Rule> rules;
};

namespace detail {
template <class R>
struct is_per_request : std::false_type {};
template <class R>
struct is_per_request<per_request<R>> : std::true_type {
  using rule_type = R;
};

/// The rule type of a rule argument: R, or the rule of per_request<R>.
template <class R>
struct unwrap_per_request {
  using type = R;
};
template <class R>
struct unwrap_per_request<per_request<R>> {
  using type = R;
};

/// Checked entry points call this: a rule with parameters (ω, schedules, neighbour tables tied
/// to the vocabulary) checks them with its `validate(vocab)`; a per_request rule argument must
/// hold one rule per request, each checked. Throws invalid_input naming the field.
template <class Rule>
void validate_rule(const Rule& rule, index_t vocab, index_t batch) {
  if constexpr (is_per_request<Rule>::value) {
    require_size(rule.rules.size, batch, "rule", "per_request needs one rule per request");
    for (index_t b = 0; b < batch; ++b) validate_rule(rule.rules[b], vocab, batch);
  } else if constexpr (requires { rule.validate(vocab); }) {
    rule.validate(vocab);
  }
}

/// The rule of request b.
template <class R>
SPECULA_HOST_DEVICE constexpr const auto& request_rule(const R& rule, index_t b) noexcept {
  if constexpr (is_per_request<R>::value) {
    return rule.rules[b];
  } else {
    (void)b;
    return rule;
  }
}
}  // namespace detail

/// A rule argument of a batched chain entry point: a chain_rule, or per_request of one.
template <class R>
concept batch_chain_rule = chain_rule<R> ||
    (detail::is_per_request<R>::value&& chain_rule<typename detail::is_per_request<R>::rule_type>);

/// A rule argument of the CUDA tree entry points: an acceptance_rule (the device's K-candidate
/// recursion recomputes p^(k) pointwise, which needs the scalar form), or per_request of one.
/// The host tree entry points take any batch_chain_rule (row-aware rules included).
template <class R>
concept batch_tree_rule = acceptance_rule<R> ||
    (detail::is_per_request<R>::value&&
         acceptance_rule<typename detail::is_per_request<R>::rule_type>);

}  // namespace specula
