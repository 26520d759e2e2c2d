#pragma once

/// @file
/// Non-owning views of probability/logit rows and batches of rows.
///
/// The views are trivially copyable aggregates of a pointer and extents, so the same object can be
/// passed to host code and to CUDA kernels. They never own memory and never check bounds in
/// `operator[]`; the checked entry points of the algorithms validate extents before any access.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// A contiguous 1-D view: `size` elements starting at `data`.
///
/// Used for one probability or logit row, and for any other contiguous per-request array
/// (draft tokens, offsets, outputs).
template <class T>
struct row_view {
  T* data = nullptr;
  index_t size = 0;

  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr row_view() noexcept = default;
  SPECULA_HOST_DEVICE constexpr row_view(T* d, index_t n) noexcept : data(d), size(n) {}

  /// A view of const elements converts implicitly from a view of mutable ones.
  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>) SPECULA_HOST_DEVICE
      constexpr row_view(row_view<U> other) noexcept  // NOLINT(google-explicit-constructor)
      : data(other.data), size(other.size) {}

  /// Views any contiguous container with `data()` and `size()` (std::vector, std::span, ...).
  template <class Container>
  requires(!std::is_same_v<std::remove_cvref_t<Container>, row_view> &&
           requires(Container & c) {
             { c.data() } -> std::convertible_to<T*>;
             c.size();
           }) constexpr row_view(Container& c) noexcept  // NOLINT(google-explicit-constructor)
      : data(c.data()), size(static_cast<index_t>(c.size())) {}

  SPECULA_HOST_DEVICE constexpr T& operator[](index_t i) const noexcept { return data[i]; }
  SPECULA_HOST_DEVICE constexpr T* begin() const noexcept { return data; }
  SPECULA_HOST_DEVICE constexpr T* end() const noexcept { return data + size; }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool empty() const noexcept { return size == 0; }

  /// Elements [offset, offset + count).
  SPECULA_HOST_DEVICE constexpr row_view subview(index_t offset, index_t count) const noexcept {
    return {data + offset, count};
  }
};

template <class Container>
row_view(Container&)
    -> row_view<std::remove_pointer_t<decltype(std::declval<Container&>().data())>>;

/// A batch of `rows` rows of `cols` elements each; row r starts at `data + r * row_stride`.
///
/// `row_stride` is in elements and must be at least `cols` for rows that do not overlap
/// (validation rejects a smaller stride unless there is at most one row).
template <class T>
struct batch_view {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t row_stride = 0;

  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr batch_view() noexcept = default;
  SPECULA_HOST_DEVICE constexpr batch_view(T* d, index_t r, index_t c) noexcept
      : data(d), rows(r), cols(c), row_stride(c) {}
  SPECULA_HOST_DEVICE constexpr batch_view(T* d, index_t r, index_t c, index_t stride) noexcept
      : data(d), rows(r), cols(c), row_stride(stride) {}

  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>) SPECULA_HOST_DEVICE
      constexpr batch_view(batch_view<U> other) noexcept  // NOLINT(google-explicit-constructor)
      : data(other.data), rows(other.rows), cols(other.cols), row_stride(other.row_stride) {}

  SPECULA_HOST_DEVICE constexpr row_view<T> row(index_t r) const noexcept {
    return {data + r * row_stride, cols};
  }
  SPECULA_HOST_DEVICE constexpr row_view<T> operator[](index_t r) const noexcept { return row(r); }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool empty() const noexcept {
    return rows == 0 || cols == 0;
  }
};

namespace detail {
/// The 64-bit integer type that is not std::int64_t (`long long` where int64_t is `long`, and
/// `long` where it is `long long` and `long` has 64 bits); `void` when there is none.
using other_int64 = std::conditional_t<
    std::is_same_v<std::int64_t, long long>,
    std::conditional_t<sizeof(long) == 8 && !std::is_same_v<long, long long>, long, void>,
    std::conditional_t<sizeof(long long) == 8, long long, void>>;
/// Element types an index_view reads.
template <class T>
inline constexpr bool index_element = std::is_same_v<T, std::int64_t> ||
                                      std::is_same_v<T, std::int32_t> ||
                                      (!std::is_void_v<other_int64> &&
                                       std::is_same_v<T, other_int64>);
/// A pointer type for other_int64 (a dummy when there is none).
using other_int64_ptr =
    std::conditional_t<std::is_void_v<other_int64>, const std::int64_t*, const other_int64*>;
}  // namespace detail

/// A read-only view of integer offsets or lengths stored as int64 or int32 (engines hold either:
/// vLLM's cu_num_draft_tokens is int32), read as index_t. Converts implicitly from row views and
/// contiguous containers of either type, and of the other 64-bit integer type of the platform
/// (`long long` where int64_t is `long`).
struct index_view {
  const std::int64_t* data64 = nullptr;
  const std::int32_t* data32 = nullptr;
  detail::other_int64_ptr data64_other = nullptr;  ///< the other 64-bit type's elements
  index_t size = 0;

  constexpr index_view() noexcept = default;
  SPECULA_HOST_DEVICE constexpr index_view(const std::int64_t* d, index_t n) noexcept
      : data64(d), size(n) {}
  SPECULA_HOST_DEVICE constexpr index_view(const std::int32_t* d, index_t n) noexcept
      : data32(d), size(n) {}
  template <class T>
  requires(!std::is_void_v<detail::other_int64> &&
           std::is_same_v<T, detail::other_int64>) SPECULA_HOST_DEVICE
      constexpr index_view(const T* d, index_t n) noexcept
      : data64_other(d), size(n) {}
  /// A size without data (for extent checks that read no element).
  SPECULA_HOST_DEVICE constexpr index_view(std::nullptr_t, index_t n) noexcept : size(n) {}
  template <class T>
  requires(detail::index_element<std::remove_const_t<T>>) SPECULA_HOST_DEVICE
      constexpr index_view(row_view<T> v) noexcept  // NOLINT
      : index_view(static_cast<const std::remove_const_t<T>*>(v.data), v.size) {}
  /// Any contiguous container of int64 or int32 (std::vector, std::span, ...).
  template <class Container>
  requires(!std::is_same_v<std::remove_cvref_t<Container>, index_view> &&
           requires(Container & c) {
             c.data();
             c.size();
           } &&
           detail::index_element<std::remove_cvref_t<
               decltype(*std::declval<Container&>()
                             .data())>>) constexpr index_view(Container& c) noexcept  // NOLINT
      : index_view(static_cast<const std::remove_cvref_t<decltype(*c.data())>*>(c.data()),
                   static_cast<index_t>(c.size())) {}

  /// Element i, widened to index_t.
  SPECULA_HOST_DEVICE constexpr index_t operator[](index_t i) const noexcept {
    if (data32 != nullptr) return static_cast<index_t>(data32[i]);
    if (data64_other != nullptr) return static_cast<index_t>(data64_other[i]);
    return static_cast<index_t>(data64[i]);
  }
  /// Whether elements are attached (false for a view made from a size alone).
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool has_data() const noexcept {
    return data64 != nullptr || data32 != nullptr || data64_other != nullptr;
  }
  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool empty() const noexcept { return size == 0; }
};

}  // namespace specula
