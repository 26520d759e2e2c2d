#pragma once

/// @file
/// Host-side checks the device entry points make before launching: extents, null data, row
/// strides, grid sizes, workspace alignment, and the host-visible parts of rules (per-request
/// rule arrays, neighbour tables, custom relaxation schedules). None of them reads device
/// memory; each returns cudaErrorInvalidValue for a problem, so an entry point returns without
/// launching (docs/cuda.md, "Launch checks").

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/rules/exact.hpp"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/rule.hpp"
#include "specula/rules/typical.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

namespace detail {

/// Largest grid x extent the entry points launch (one CTA per request or row).
inline constexpr index_t max_grid_x = std::numeric_limits<std::int32_t>::max();

/// Accumulates the checks of one launch: `ok` stays true while every check passes.
struct launch_check {
  bool ok = true;

  /// A condition that must hold.
  launch_check& require(bool condition) noexcept {
    ok = ok && condition;
    return *this;
  }
  /// An array of at least `needed` elements, with data when it has any.
  template <class T>
  launch_check& array(row_view<T> a, index_t needed) noexcept {
    return require(a.size >= needed && (needed <= 0 || a.data != nullptr));
  }
  /// Offsets or lengths (int32 or int64) of at least `needed` entries, with data when needed.
  launch_check& indices(index_view v, index_t needed) noexcept {
    return require(v.size >= needed && (needed <= 0 || v.has_data()));
  }
  /// Optional offsets or lengths: empty, or as indices().
  launch_check& optional_indices(index_view v, index_t needed) noexcept {
    return v.empty() ? *this : indices(v, needed);
  }
  /// An optional output array: empty, or as array().
  template <class T>
  launch_check& optional_array(row_view<T> a, index_t needed) noexcept {
    return require(a.empty() || (a.size >= needed && a.data != nullptr));
  }
  /// Rows of exactly `cols` entries, at least `rows` of them, with data and a stride of at least
  /// the row length when there is more than one row.
  template <class T>
  launch_check& rows(batch_view<T> v, index_t cols, index_t rows) noexcept {
    return require(v.cols == cols && v.rows >= rows && (v.rows == 0 || v.data != nullptr) &&
                   (v.rows <= 1 || v.row_stride >= cols));
  }
  /// Optional rows (0 rows: absent), otherwise as rows().
  template <class T>
  launch_check& optional_rows(batch_view<T> v, index_t cols, index_t rows) noexcept {
    return v.rows == 0 ? *this : this->rows(v, cols, rows);
  }
  /// A grid of `ctas` CTAs along x (at least one).
  launch_check& grid(index_t ctas) noexcept { return require(ctas >= 1 && ctas <= max_grid_x); }
  /// Caller workspace aligned for `alignment`-byte objects.
  launch_check& aligned(const void* p, std::size_t alignment) noexcept {
    return require(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
  }

  [[nodiscard]] cudaError_t status() const noexcept {
    return ok ? cudaSuccess : cudaErrorInvalidValue;
  }
};

/// Whether the device can read `p`: device, managed or registered (pinned) host memory; plain
/// pageable host memory is refused with cudaErrorInvalidValue. A failing query (no device, no
/// driver) returns its error, cleared from the runtime's last error.
inline cudaError_t check_device_pointer(const void* p) noexcept {
  if (p == nullptr) return cudaErrorInvalidValue;
  cudaPointerAttributes a{};
  if (const cudaError_t e = cudaPointerGetAttributes(&a, p); e != cudaSuccess) {
    (void)cudaGetLastError();
    return e;
  }
  return a.type == cudaMemoryTypeUnregistered ? cudaErrorInvalidValue : cudaSuccess;
}

/// Host-visible checks of a LANTERN rule over `vocab` tokens: a table of `vocab` rows of
/// 1 .. min(vocab − 1, lantern_max_neighbours) ids (with its sorted rows and ranks, when
/// present), in device memory (see device_rule in rules.cuh), and 1 <= rule.k <= table k.
inline cudaError_t check_lantern(const lantern_rule& rule, index_t vocab) noexcept {
  const neighbour_table_view& t = rule.table;
  if (t.ids == nullptr || t.vocab != vocab || t.k < 1 || t.k >= vocab ||
      t.k > lantern_max_neighbours || rule.k < 1 || rule.k > t.k ||
      (t.sorted == nullptr) != (t.rank == nullptr))
    return cudaErrorInvalidValue;
  if (const cudaError_t e = check_device_pointer(t.ids); e != cudaSuccess) return e;
  if (t.sorted == nullptr) return cudaSuccess;
  if (const cudaError_t e = check_device_pointer(t.sorted); e != cudaSuccess) return e;
  return check_device_pointer(t.rank);
}

/// Host-visible checks of a relaxation schedule: a custom schedule's ω values in device memory
/// (no CUDA call for the other kinds, which hold no pointer).
inline cudaError_t check_schedule(const relaxation_schedule& s) noexcept {
  if (s.kind != schedule_kind::custom || s.count == 0) return cudaSuccess;
  if (s.count < 0 || s.values == nullptr) return cudaErrorInvalidValue;
  return check_device_pointer(s.values);
}

/// Whether a rule type holds no pointer, so that a copy by value is all the kernels need.
/// Every rule type an entry point accepts is either listed here or has a branch in check_rule
/// (and a device_rule specialisation in rules.cuh); any other type is refused at compile time.
template <class Rule>
inline constexpr bool rule_without_data =
    std::is_same_v<Rule, exact_rule> || std::is_same_v<Rule, relaxed_rule> ||
    std::is_same_v<Rule, typical_rule>;

/// Host-visible checks of a rule's data for a batch of `batch` requests over `vocab` tokens,
/// sizes first (no CUDA call), then whether the data the kernels read is device memory:
///   - per_request: at least `batch` rules, in device memory (each rule's own data, being in
///     device memory, cannot be inspected from the host);
///   - lantern_rule: check_lantern;
///   - scheduled_relaxed_rule: check_schedule (a custom schedule's ω values);
///   - scheduled_lantern_rule: both, its LANTERN rule and its schedule.
template <class Rule>
cudaError_t check_rule(const Rule& rule, index_t vocab, index_t batch) noexcept {
  if constexpr (specula::detail::is_per_request<Rule>::value) {
    if (rule.rules.size < batch || rule.rules.data == nullptr) return cudaErrorInvalidValue;
    return check_device_pointer(rule.rules.data);
  } else if constexpr (std::is_same_v<Rule, lantern_rule>) {
    return check_lantern(rule, vocab);
  } else if constexpr (std::is_same_v<Rule, scheduled_relaxed_rule>) {
    return check_schedule(rule.schedule);
  } else if constexpr (std::is_same_v<Rule, scheduled_lantern_rule>) {
    // Sizes of both first, so a malformed rule is refused without a CUDA call.
    const relaxation_schedule& s = rule.schedule;
    if (s.kind == schedule_kind::custom && s.count != 0 && (s.count < 0 || s.values == nullptr))
      return cudaErrorInvalidValue;
    if (const cudaError_t e = check_lantern(rule.rule, vocab); e != cudaSuccess) return e;
    return check_schedule(s);
  } else {
    static_assert(rule_without_data<Rule>,
                  "a rule type the device entry points do not know: give it a branch in "
                  "detail::check_rule (launch_checks.cuh) and a device_rule specialisation "
                  "(rules.cuh) for any data it points to, or list it in rule_without_data");
    (void)rule;
    (void)vocab;
    (void)batch;
    return cudaSuccess;
  }
}

}  // namespace detail

SPECULA_CUDA_NAMESPACE_END
