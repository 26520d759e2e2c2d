#pragma once

/// @file
/// Device-resident data of rules. The device entry points copy a rule object by value into the
/// kernel, but rules that point to tables — LANTERN's neighbour table, a custom relaxation
/// schedule's ω values (scheduled_relaxed_rule, and scheduled_lantern_rule, which has both),
/// the array of a per_request rule — need that data in device memory.
/// `to_device(rule)` makes a device_rule: an owning device copy of the data and the rule
/// pointing to it (`rule()`), for as long as the device_rule lives. Entry points refuse rules
/// whose data is plain host memory (detail::check_rule in launch_checks.cuh).
///
/// @code
///   const neighbour_table table(embeddings, 8);
///   const auto lantern = specula::cuda::to_device(lantern_rule::make_relative(table, 0.5));
///   specula::cuda::verify_chain_async(pol, in, out, {}, lantern.rule());
/// @endcode

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/cuda/config.cuh"
#include "specula/cuda/error.cuh"
#include "specula/rules/lantern.hpp"
#include "specula/rules/relaxed.hpp"
#include "specula/rules/rule.hpp"

SPECULA_CUDA_NAMESPACE_BEGIN

namespace detail {

/// An owning device array (cudaMalloc / cudaFree), filled from host or device memory.
template <class T>
class device_array {
 public:
  device_array() = default;
  device_array(const T* source, index_t n) : size_(n) {
    if (n <= 0) return;
    const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
    throw_on_error(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes), "cudaMalloc (rule data)");
    // cudaMemcpyDefault: the source may be host memory or (re-copying a device_rule's rule)
    // device memory.
    if (const cudaError_t e = cudaMemcpy(ptr_, source, bytes, cudaMemcpyDefault);
        e != cudaSuccess) {
      (void)cudaFree(ptr_);
      ptr_ = nullptr;
      throw_on_error(e, "cudaMemcpy (rule data)");
    }
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  device_array(device_array&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      if (ptr_ != nullptr) (void)cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~device_array() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  [[nodiscard]] const T* data() const noexcept { return ptr_; }
  [[nodiscard]] index_t size() const noexcept { return size_; }

 private:
  T* ptr_ = nullptr;
  index_t size_ = 0;
};

}  // namespace detail

/// A rule whose data lives in device memory (see file comment). The primary template serves
/// rules without pointers (exact, relaxed, typical, schedules other than custom): it only holds
/// the rule.
template <class Rule>
class device_rule {
 public:
  explicit device_rule(const Rule& r) : rule_(r) {}
  [[nodiscard]] const Rule& rule() const noexcept { return rule_; }

 private:
  Rule rule_;
};

/// LANTERN / LANTERN++: the neighbour table (its ids, and its id-sorted rows and ranks when
/// the view has them) copied to the device.
template <>
class device_rule<lantern_rule> {
 public:
  explicit device_rule(const lantern_rule& r)
      : ids_(r.table.ids, r.table.ids == nullptr ? 0 : r.table.vocab * r.table.k),
        sorted_(r.table.sorted, r.table.sorted == nullptr ? 0 : r.table.vocab * r.table.k),
        rank_(r.table.rank,
              r.table.sorted == nullptr || r.table.rank == nullptr ? 0 : r.table.vocab * r.table.k),
        rule_(r) {
    rule_.table.ids = ids_.data();
    rule_.table.sorted =
        r.table.sorted == nullptr || r.table.rank == nullptr ? nullptr : sorted_.data();
    rule_.table.rank = rule_.table.sorted == nullptr ? nullptr : rank_.data();
  }
  [[nodiscard]] const lantern_rule& rule() const noexcept { return rule_; }

 private:
  detail::device_array<token_t> ids_;
  detail::device_array<token_t> sorted_;
  detail::device_array<std::uint16_t> rank_;
  lantern_rule rule_;
};

namespace detail {

/// A relaxation schedule whose custom ω values (if any) are copied to the device.
class device_schedule {
 public:
  explicit device_schedule(const relaxation_schedule& s)
      : values_(s.values, s.kind == schedule_kind::custom && s.values != nullptr ? s.count : 0),
        schedule_(s) {
    if (s.kind == schedule_kind::custom) schedule_.values = values_.data();
  }
  [[nodiscard]] const relaxation_schedule& schedule() const noexcept { return schedule_; }

 private:
  device_array<double> values_;
  relaxation_schedule schedule_;
};

}  // namespace detail

/// A scheduled relaxed rule: a custom schedule's ω values copied to the device.
template <>
class device_rule<scheduled_relaxed_rule> {
 public:
  explicit device_rule(const scheduled_relaxed_rule& r) : schedule_(r.schedule), rule_(r) {
    rule_.schedule = schedule_.schedule();
  }
  [[nodiscard]] const scheduled_relaxed_rule& rule() const noexcept { return rule_; }

 private:
  detail::device_schedule schedule_;
  scheduled_relaxed_rule rule_;
};

/// Cool-SD's schedule composed with LANTERN++: the LANTERN rule's neighbour table and a custom
/// schedule's ω values, both copied to the device.
template <>
class device_rule<scheduled_lantern_rule> {
 public:
  explicit device_rule(const scheduled_lantern_rule& r)
      : lantern_(r.rule), schedule_(r.schedule), rule_{lantern_.rule(), schedule_.schedule()} {}
  [[nodiscard]] const scheduled_lantern_rule& rule() const noexcept { return rule_; }

 private:
  device_rule<lantern_rule> lantern_;
  detail::device_schedule schedule_;
  scheduled_lantern_rule rule_;
};

/// per_request: every rule's data copied to the device (each an element of device_rule<Rule>),
/// then the array of the rules pointing to it. The array itself may be host or device memory
/// (re-copying a device_rule's rule): it is read through cudaMemcpyDefault, never dereferenced.
template <class Rule>
class device_rule<per_request<Rule>> {
 public:
  explicit device_rule(const per_request<Rule>& r) {
    std::vector<Rule> sources(static_cast<std::size_t>(r.rules.size > 0 ? r.rules.size : 0));
    if (!sources.empty())
      throw_on_error(cudaMemcpy(sources.data(), r.rules.data, sources.size() * sizeof(Rule),
                                cudaMemcpyDefault),
                     "cudaMemcpy (per_request rules)");
    std::vector<Rule> copies;
    owned_.reserve(sources.size());
    for (const Rule& source : sources) {
      owned_.emplace_back(source);
      copies.push_back(owned_.back().rule());
    }
    rules_ = detail::device_array<Rule>(copies.data(), static_cast<index_t>(copies.size()));
    rule_ = per_request<Rule>{{rules_.data(), rules_.size()}};
  }
  [[nodiscard]] const per_request<Rule>& rule() const noexcept { return rule_; }

 private:
  std::vector<device_rule<Rule>> owned_;
  detail::device_array<Rule> rules_;
  per_request<Rule> rule_{};
};

/// A device_rule of `rule` (see file comment). `rule`'s host data must outlive only this call.
template <class Rule>
[[nodiscard]] device_rule<Rule> to_device(const Rule& rule) {
  return device_rule<Rule>(rule);
}

SPECULA_CUDA_NAMESPACE_END
