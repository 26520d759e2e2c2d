#pragma once

/// @file
/// The bookkeeping of a key/value cache in *slot layout*, separated from where the rows live:
/// one array of slots per layer (keys and values), the committed context in slots [0, size()),
/// the last evaluation's pending nodes right after it, node i in slot size() + i. The device
/// forward pass (device_transformer.hpp) keeps its rows on the GPU through this class, and a
/// host stand-in (`host_slot_storage`) runs the same bookkeeping in CPU tests.
///
/// A storage models `slot_storage`:
/// - `reserve(slots, keep)`: room for `slots` slots, keeping the contents of slots [0, keep);
/// - `gather(at, from)`: slot at + k takes the contents of slot from[k], for k = 0, 1, ... in
///   this order (the caller guarantees from[k] >= at + k, so a slot is read before any write
///   reaches it and the moves can run in place).
///
/// Commit of an accepted path: pending node path[k] (slot size() + path[k]) moves to slot
/// size() + k — one gather. Rollback and dropping pending nodes move nothing. A dual cache's
/// refresh keeps the pending rows outside the window [begin, end) as the committed context:
/// another gather.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/types.hpp"
#include "specula_example/transformer.hpp"

namespace specula::example {

/// A slot array (see file comment).
template <class S>
concept slot_storage = requires(S& s, index_t n, std::span<const index_t> from) {
  s.reserve(n, n);
  s.gather(n, from);
};

/// Slot-layout cache bookkeeping over a storage (see file comment).
template <slot_storage Storage>
class slot_cache : public detail::cache_bookkeeping<slot_cache<Storage>> {
  using base = detail::cache_bookkeeping<slot_cache<Storage>>;
  using base::size_;

 public:
  /// Number of pending nodes (added by the last evaluation, not yet committed).
  [[nodiscard]] index_t pending() const noexcept { return static_cast<index_t>(pos_.size()); }
  [[nodiscard]] Storage& storage() noexcept { return storage_; }
  [[nodiscard]] const Storage& storage() const noexcept { return storage_; }
  /// Positions and ancestor mask of the pending nodes.
  [[nodiscard]] std::span<const index_t> pending_positions() const noexcept { return pos_; }
  [[nodiscard]] std::span<const std::uint64_t> pending_mask() const noexcept { return mask_; }

  /// Registers a block of pending nodes (replacing earlier ones) and reserves their slots;
  /// returns the first pending slot (= size()).
  index_t begin_pending(std::span<const index_t> positions, std::span<const std::uint64_t> mask) {
    pos_.assign(positions.begin(), positions.end());
    mask_.assign(mask.begin(), mask.end());
    storage_.reserve(size_ + pending(), size_);
    return size_;
  }

  /// Keeps the pending nodes `path` in order (the checks and errors of kv_cache::commit).
  void commit(std::span<const index_t> path) {
    detail::check_commit_path(size_, pos_, mask_, path);
    from_.resize(path.size());
    bool moves = false;  // a chain prefix (path[k] = k) is already in place
    for (std::size_t k = 0; k < path.size(); ++k) {
      from_[k] = size_ + path[k];
      moves = moves || path[k] != static_cast<index_t>(k);
    }
    if (moves) storage_.gather(size_, from_);
    size_ += static_cast<index_t>(path.size());
    drop_pending();
  }

  void drop_pending() noexcept {
    pos_.clear();
    mask_.clear();
  }

  /// With no committed context: the pending nodes outside [begin, end) become the committed
  /// context, in node order (a dual cache's refresh); the rest are dropped.
  void keep_pending_outside(index_t begin, index_t end) {
    const index_t n = pending();
    if (size_ != 0 || begin < 0 || begin > end || end > n)
      throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(begin)}, "window",
                      "must lie in the pending nodes of a cache without committed context");
    from_.clear();
    for (index_t i = 0; i < n; ++i)
      if (i < begin || i >= end) from_.push_back(i);
    if (!from_.empty()) storage_.gather(0, from_);
    size_ = static_cast<index_t>(from_.size());
    drop_pending();
  }

 private:
  Storage storage_;
  std::vector<index_t> pos_;
  std::vector<std::uint64_t> mask_;
  std::vector<index_t> from_;
};

/// The host stand-in of the device storage: `row_size` floats per slot in one vector.
struct host_slot_storage {
  index_t row_size = 1;
  std::vector<float> data;

  void reserve(index_t slots, index_t keep) {
    const auto need = static_cast<std::size_t>(slots * row_size);
    if (data.size() < need) data.resize(std::max(need, 2 * data.size()));
    (void)keep;  // resize keeps everything
  }
  void gather(index_t at, std::span<const index_t> from) {
    const auto r = static_cast<std::ptrdiff_t>(row_size);
    for (std::size_t k = 0; k < from.size(); ++k) {
      const auto dst = static_cast<std::ptrdiff_t>(at + static_cast<index_t>(k));
      if (from[k] < dst)
        throw_if_failed(
            {status::invalid_parameter, static_cast<index_t>(k), -1, static_cast<double>(from[k])},
            "from", "a gather source below its destination");
      std::copy_n(data.begin() + from[k] * r, r, data.begin() + dst * r);
    }
  }
  [[nodiscard]] std::span<float> slot(index_t s) {
    return std::span<float>(data).subspan(static_cast<std::size_t>(s * row_size),
                                          static_cast<std::size_t>(row_size));
  }
};

static_assert(slot_storage<host_slot_storage>);

}  // namespace specula::example
