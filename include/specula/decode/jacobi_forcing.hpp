#pragma once

/// @file
/// Jacobi Forcing training helpers: the progressive noise schedule (Eq. 7), the choice of the
/// Jacobi-trajectory point that realises a scheduled noise level (§3.1, Appendix C), and the
/// packed training sequence with its position ids and noise-aware causal attention mask (§3.1
/// "Noise-aware Causal Attention", Fig. 2, Appendix C, Fig. 6).
///
/// Paper: Hu, Kou et al., "Fast and Accurate Causal Parallel Decoding using Jacobi Forcing"
/// (arXiv 2512.14681). A generation y of length N·n is split into N blocks of n tokens. For
/// block b (0-based here) a noisy view y_b^{t_b} is taken from the block's Jacobi trajectory,
/// with about ⌈t_b·n⌉ unconverged tokens, t_b from the schedule. The training sequence is
///
///     [prompt (P) | noisy 0 | clean 0 | noisy 1 | clean 1 | … | noisy N−1 | clean N−1]
///
/// (P + 2·N·n slots); a noisy block and its clean block share position ids
/// P + b·n .. P + b·n + n − 1. With the noise-conditioned mask (Fig. 2b, the one the paper trains
/// with) a single forward pass gives the student logits of Eq. 8 on the noisy blocks (each
/// conditioned on x and the earlier *noisy* blocks) and the teacher / AR logits on the clean
/// blocks (each conditioned on x and the earlier *clean* blocks).
///
/// Everything here is host code, exact integer arithmetic; malformed arguments throw
/// specula::invalid_input naming the argument. See docs/jacobi_forcing.md.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "specula/core/error.hpp"
#include "specula/core/numeric.hpp"
#include "specula/core/rng.hpp"
#include "specula/core/types.hpp"

namespace specula {

namespace detail {

inline constexpr index_t jf_index_max = std::numeric_limits<index_t>::max();

/// Validates the Eq. 7 window w (>= 1).
inline void jf_require_window(index_t window) {
  require_parameter(window >= 1, "window", static_cast<double>(window), "must be >= 1");
}

/// Validates the block size n (>= 1).
inline void jf_require_block_size(index_t block_size) {
  require_parameter(block_size >= 1, "block_size", static_cast<double>(block_size), "must be >= 1");
}

/// Validates that (w − 1)·n, the largest numerator of ⌈j·n / w⌉, fits in index_t.
inline void jf_require_product(index_t window, index_t block_size) {
  require_parameter(window - 1 <= jf_index_max / block_size, "window", static_cast<double>(window),
                    "(window - 1) * block_size must fit in index_t");
}

/// Sets bits [begin, end) of a bit-packed mask row.
inline void jf_set_bits(std::uint64_t* row, index_t begin, index_t end) noexcept {
  if (begin >= end) return;
  const index_t first = begin / 64;
  const index_t last = (end - 1) / 64;
  const std::uint64_t lo = ~std::uint64_t{0} << (begin % 64);
  const std::uint64_t hi = ~std::uint64_t{0} >> (63 - (end - 1) % 64);
  if (first == last) {
    row[first] |= lo & hi;
    return;
  }
  row[first] |= lo;
  for (index_t w = first + 1; w < last; ++w) row[w] = ~std::uint64_t{0};
  row[last] |= hi;
}

/// Points of a trajectory of one block (K points of n = fixed_point.size() tokens back to back).
/// Throws invalid_input ("fixed_point" empty, "trajectory" empty or not a multiple of n).
inline index_t jf_trajectory_points(std::span<const token_t> trajectory,
                                    std::span<const token_t> fixed_point) {
  const auto n = static_cast<index_t>(fixed_point.size());
  if (n == 0)
    throw_if_failed({status::empty_input, -1, -1, 0.0}, "fixed_point", "a block has >= 1 token");
  if (trajectory.empty())
    throw_if_failed({status::empty_input, -1, -1, 0.0}, "trajectory",
                    "a trajectory has >= 1 point");
  if (static_cast<index_t>(trajectory.size()) % n != 0)
    throw_if_failed(
        {status::length_mismatch, -1, -1, static_cast<double>(trajectory.size())}, "trajectory",
        ("expected a multiple of the block size " + std::to_string(n) + " tokens").c_str());
  return static_cast<index_t>(trajectory.size()) / n;
}

/// Throws length_mismatch for `argument` unless `actual == expected`.
inline void jf_require_length(std::size_t actual, index_t expected, const char* argument,
                              const char* what) {
  if (static_cast<index_t>(actual) == expected) return;
  throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(actual)}, argument,
                  ("expected " + std::to_string(expected) + " tokens (" + what + ")").c_str());
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Progressive noise schedule (Eq. 7)
// ---------------------------------------------------------------------------------------------

/// Index into W = {0, 1/w, …, (w−1)/w} of 0-based block `block` under Eq. 7: j = block mod w.
///
/// Eq. 7 writes t_i = W[i mod w] for the schedule {t_1, …, t_N}. This library numbers blocks
/// from 0 and uses j = b mod w, so the first block of every window (b = 0, w, 2w, …) is clean
/// (t = 0) and the ratio then rises by 1/w per block, as the text around Eq. 7 describes ("the
/// noise ratio linearly increases from 0 … within each window"). Reading Eq. 7 literally with
/// 1-based i shifts the cycle by one block; pass `block + 1` to get that reading.
/// Throws invalid_input ("block", "window") for block < 0 or window < 1.
[[nodiscard]] inline index_t progressive_noise_step(index_t block, index_t window) {
  require_parameter(block >= 0, "block", static_cast<double>(block), "must be >= 0");
  detail::jf_require_window(window);
  return block % window;
}

/// Noise ratio t_b = W[b mod w] = (b mod w) / w of 0-based block b (Eq. 7): the fraction of
/// the block's tokens that are noisy (not yet converged) in its packed noisy view. It lies in
/// [0, (w−1)/w]; Eq. 7 never reaches 1 (see docs/jacobi_forcing.md for the §4.3 remark).
/// Throws invalid_input ("block", "window").
[[nodiscard]] inline double progressive_noise_ratio(index_t block, index_t window) {
  return static_cast<double>(progressive_noise_step(block, window)) / static_cast<double>(window);
}

/// Target number of noisy tokens of 0-based block b of size n: ⌈t_b·n⌉ = ⌈(b mod w)·n / w⌉
/// (§3.1: the trajectory point "with several noisy tokens closest to ⌈t_i n⌉"), computed in
/// exact integer arithmetic. Throws invalid_input ("block", "block_size", "window").
[[nodiscard]] inline index_t progressive_noisy_count(index_t block, index_t block_size,
                                                     index_t window) {
  const index_t j = progressive_noise_step(block, window);
  detail::jf_require_block_size(block_size);
  detail::jf_require_product(window, block_size);
  const index_t num = j * block_size;  // <= (w − 1)·n, checked above
  return num / window + (num % window != 0 ? 1 : 0);
}

/// The noise ratios t_0 … t_{N−1} of Eq. 7 for N = num_blocks blocks (empty for N = 0).
/// Throws invalid_input ("num_blocks", "window").
[[nodiscard]] inline std::vector<double> progressive_noise_schedule(index_t num_blocks,
                                                                    index_t window) {
  require_parameter(num_blocks >= 0, "num_blocks", static_cast<double>(num_blocks), "must be >= 0");
  detail::jf_require_window(window);
  std::vector<double> t(static_cast<std::size_t>(num_blocks));
  for (index_t b = 0; b < num_blocks; ++b)
    t[static_cast<std::size_t>(b)] = progressive_noise_ratio(b, window);
  return t;
}

/// The target noisy-token counts ⌈t_b·n⌉ of Eq. 7 for N = num_blocks blocks of size n.
/// Throws invalid_input ("num_blocks", "block_size", "window").
[[nodiscard]] inline std::vector<index_t> progressive_noisy_counts(index_t num_blocks,
                                                                   index_t block_size,
                                                                   index_t window) {
  require_parameter(num_blocks >= 0, "num_blocks", static_cast<double>(num_blocks), "must be >= 0");
  detail::jf_require_block_size(block_size);
  detail::jf_require_window(window);
  detail::jf_require_product(window, block_size);
  std::vector<index_t> c(static_cast<std::size_t>(num_blocks));
  for (index_t b = 0; b < num_blocks; ++b)
    c[static_cast<std::size_t>(b)] = progressive_noisy_count(b, block_size, window);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Choosing the noisy view of a block from its Jacobi trajectory (§3.1, Appendix C)
// ---------------------------------------------------------------------------------------------

/// Number of unconverged ("noisy", footnote 2) tokens of a trajectory point: positions where
/// `point` differs from `fixed_point`. Throws invalid_input ("point", length mismatch).
[[nodiscard]] inline index_t count_unconverged(std::span<const token_t> point,
                                               std::span<const token_t> fixed_point) {
  detail::jf_require_length(point.size(), static_cast<index_t>(fixed_point.size()), "point",
                            "one per fixed-point token");
  index_t c = 0;
  for (std::size_t k = 0; k < point.size(); ++k) c += point[k] != fixed_point[k] ? 1 : 0;
  return c;
}

/// Index of the point of one block's Jacobi trajectory whose number of unconverged tokens is
/// closest to `target_noisy` (usually progressive_noisy_count()); ties go to the earliest point.
/// `trajectory` holds the K points y^(0), …, y^(K−1) of the block back to back (K·n tokens,
/// n = fixed_point.size()). Throws invalid_input ("fixed_point" empty, "trajectory" empty or
/// not a multiple of n, "target_noisy" outside [0, n]).
[[nodiscard]] inline index_t select_trajectory_point(std::span<const token_t> trajectory,
                                                     std::span<const token_t> fixed_point,
                                                     index_t target_noisy) {
  const index_t points = detail::jf_trajectory_points(trajectory, fixed_point);
  const auto n = static_cast<index_t>(fixed_point.size());
  require_parameter(target_noisy >= 0 && target_noisy <= n, "target_noisy",
                    static_cast<double>(target_noisy), "must be in [0, block size]");
  index_t best = 0;
  index_t best_gap = detail::jf_index_max;
  for (index_t k = 0; k < points; ++k) {
    const index_t c = count_unconverged(
        trajectory.subspan(static_cast<std::size_t>(k * n), static_cast<std::size_t>(n)),
        fixed_point);
    const index_t gap = c >= target_noisy ? c - target_noisy : target_noisy - c;
    if (gap < best_gap) {
      best_gap = gap;
      best = k;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Noise selection variants: the paper's text, the released data preparation, Table 4
// ---------------------------------------------------------------------------------------------

/// How the noise ratios run across a window of w blocks (Table 4).
enum class jacobi_noise_schedule : std::uint8_t {
  linear,   ///< rising across the window (Eq. 7, "linear progressive"; the paper trains with it)
  reverse,  ///< falling across the window ("reverse progressive", Table 4)
  random,   ///< each block takes a uniformly drawn point of the window's ratios (Table 4's
            ///< "random"; the released data preparation's `--strategy random`)
};

/// The ratios a window holds.
enum class jacobi_noise_end : std::uint8_t {
  eq7,       ///< W = {0, 1/w, …, (w−1)/w} (Eq. 7): the last block is never fully noisy
  released,  ///< linspace(t_min, t_max, w), as the released data preparation builds it: the
             ///< last block of a window reaches t_max (Table 4: t_min = 0, t_max = 1)
};

/// How the noise of a trajectory point is counted against the block's fixed point.
enum class jacobi_noise_count : std::uint8_t {
  mismatches,  ///< positions that differ from the fixed point (footnote 2; count_unconverged)
  suffix,      ///< n − (first position that differs), i.e. everything from the first
               ///< unconverged token on (the released data preparation)
};

/// Which trajectory point realises a scheduled ratio t.
enum class jacobi_noise_match : std::uint8_t {
  ceil_count,     ///< noisy count closest to ⌈t·n⌉ (§3.1), ties to the earliest point
  nearest_ratio,  ///< noisy count / n closest to t (released: argmin |ratio − t|), ties to the
                  ///< earliest point
};

/// The noise-selection convention: `paper()` (the defaults) follows the text (Eq. 7, footnote 2,
/// §3.1), `released()` the authors' data preparation (progressive strategy over
/// linspace(0, 1, w), suffix count, nearest fraction). The options can be mixed freely.
struct jacobi_noise_options {
  jacobi_noise_schedule schedule = jacobi_noise_schedule::linear;
  jacobi_noise_end end = jacobi_noise_end::eq7;
  double t_min = 0.0;  ///< first ratio of a window (end = released)
  double t_max = 1.0;  ///< last ratio of a window (end = released)
  jacobi_noise_count count = jacobi_noise_count::mismatches;
  jacobi_noise_match match = jacobi_noise_match::ceil_count;
  std::uint64_t seed = 0;  ///< schedule = random: block b draws from the stream {seed, 0, b}

  [[nodiscard]] static jacobi_noise_options paper() { return {}; }
  [[nodiscard]] static jacobi_noise_options released() {
    jacobi_noise_options o;
    o.end = jacobi_noise_end::released;
    o.count = jacobi_noise_count::suffix;
    o.match = jacobi_noise_match::nearest_ratio;
    return o;
  }

  /// Throws invalid_input ("options.t_min", "options.t_max") unless 0 <= t_min <= t_max <= 1.
  void validate() const {
    require_parameter(detail::is_finite(t_min) && t_min >= 0.0 && t_min <= 1.0, "options.t_min",
                      t_min, "must be in [0, 1]");
    require_parameter(detail::is_finite(t_max) && t_max >= t_min && t_max <= 1.0, "options.t_max",
                      t_max, "must be in [t_min, 1]");
  }
};

/// A block's scheduled noise: the ratio t_b and the count ⌈t_b·n⌉ (exact integer arithmetic for
/// rational ratios j/w and, with the default end points, j/(w − 1)).
struct jacobi_noise_target {
  index_t step = 0;    ///< the window point j the block uses, in [0, w)
  double ratio = 0.0;  ///< t_b
  index_t count = 0;   ///< ⌈t_b·n⌉, in [0, n]
};

/// The scheduled noise of 0-based block `block` of size n under `options` (window w). Throws
/// invalid_input ("block", "block_size", "window", "options.t_min", "options.t_max").
[[nodiscard]] inline jacobi_noise_target jacobi_noise_for(index_t block, index_t block_size,
                                                          index_t window,
                                                          const jacobi_noise_options& options) {
  index_t j = progressive_noise_step(block, window);
  detail::jf_require_block_size(block_size);
  detail::jf_require_product(window, block_size);
  options.validate();
  if (options.schedule == jacobi_noise_schedule::reverse) j = window - 1 - j;
  if (options.schedule == jacobi_noise_schedule::random) {
    const double u =
        uniform_at(request_rng{options.seed, 0, static_cast<std::uint32_t>(block)}, draw_id{0, 0});
    j = static_cast<index_t>(u * static_cast<double>(window));
    if (j >= window) j = window - 1;
  }
  const auto ceil_div = [](index_t num, index_t den) { return num / den + (num % den != 0); };
  jacobi_noise_target t;
  t.step = j;
  if (options.end == jacobi_noise_end::eq7) {
    t.ratio = static_cast<double>(j) / static_cast<double>(window);
    t.count = ceil_div(j * block_size, window);
    return t;
  }
  // numpy.linspace(t_min, t_max, w): t_min + j·step with step = (t_max − t_min)/(w − 1), and
  // exactly t_max at the last point.
  if (window == 1 || j == 0) {
    t.ratio = options.t_min;
  } else if (j == window - 1) {
    t.ratio = options.t_max;
  } else {
    const double step = (options.t_max - options.t_min) / static_cast<double>(window - 1);
    t.ratio = options.t_min + static_cast<double>(j) * step;
  }
  if (options.t_min == 0.0 && options.t_max == 1.0) {
    t.count = window == 1 ? 0 : ceil_div(j * block_size, window - 1);
  } else {
    // ⌈t·n⌉ of a double ratio, guarded against t·n landing a rounding error above an integer.
    const double x = t.ratio * static_cast<double>(block_size);
    const double r = std::floor(x + 0.5);
    t.count = static_cast<index_t>(
        std::abs(x - r) <= 1e-9 * static_cast<double>(block_size) ? r : std::ceil(x));
  }
  if (t.count > block_size) t.count = block_size;
  return t;
}

/// Noisy tokens of a trajectory point by `how` (see jacobi_noise_count). Throws invalid_input
/// ("point", length mismatch).
[[nodiscard]] inline index_t count_noisy(std::span<const token_t> point,
                                         std::span<const token_t> fixed_point,
                                         jacobi_noise_count how) {
  if (how == jacobi_noise_count::mismatches) return count_unconverged(point, fixed_point);
  detail::jf_require_length(point.size(), static_cast<index_t>(fixed_point.size()), "point",
                            "one per fixed-point token");
  std::size_t first = 0;
  while (first < point.size() && point[first] == fixed_point[first]) ++first;
  return static_cast<index_t>(point.size() - first);
}

/// Index of the point of one block's trajectory (K points back to back, as in
/// select_trajectory_point) that realises `target` under `options.count` and `options.match`;
/// ties go to the earliest point. Throws invalid_input as select_trajectory_point, and
/// ("target") for a count outside [0, n] or a ratio outside [0, 1].
[[nodiscard]] inline index_t select_noisy_view(std::span<const token_t> trajectory,
                                               std::span<const token_t> fixed_point,
                                               const jacobi_noise_target& target,
                                               const jacobi_noise_options& options) {
  if (options.count == jacobi_noise_count::mismatches &&
      options.match == jacobi_noise_match::ceil_count)
    return select_trajectory_point(trajectory, fixed_point, target.count);
  const index_t points = detail::jf_trajectory_points(trajectory, fixed_point);
  const auto n = static_cast<index_t>(fixed_point.size());
  require_parameter(target.count >= 0 && target.count <= n, "target",
                    static_cast<double>(target.count), "count must be in [0, block size]");
  require_parameter(detail::is_finite(target.ratio) && target.ratio >= 0.0 && target.ratio <= 1.0,
                    "target", target.ratio, "ratio must be in [0, 1]");
  index_t best = 0;
  double best_gap = 2.0;
  for (index_t k = 0; k < points; ++k) {
    const index_t c = count_noisy(
        trajectory.subspan(static_cast<std::size_t>(k * n), static_cast<std::size_t>(n)),
        fixed_point, options.count);
    const double gap =
        options.match == jacobi_noise_match::nearest_ratio
            ? std::abs(static_cast<double>(c) / static_cast<double>(n) - target.ratio)
            : static_cast<double>(c >= target.count ? c - target.count : target.count - c);
    if (k == 0 || gap < best_gap) {
      best_gap = gap;
      best = k;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Packed training sequence (Fig. 2, Appendix C, Fig. 6)
// ---------------------------------------------------------------------------------------------

/// What a packed slot holds.
enum class jacobi_slot_kind : std::uint8_t {
  prompt,  ///< a prompt token
  noisy,   ///< a token of a block's noisy view y_b^{t_b} (student side of Eq. 8)
  clean,   ///< a token of a block's fixed point y_b^* (teacher side of Eq. 8, AR loss)
};

/// A packed slot: its kind, its block (−1 for the prompt) and its offset inside the block (or
/// its prompt position).
struct jacobi_slot {
  jacobi_slot_kind kind = jacobi_slot_kind::prompt;
  index_t block = -1;
  index_t offset = 0;
};

/// Which context a noisy block is conditioned on. Clean blocks and the prompt are the same in
/// all three: the prompt is causal, a clean block sees the prompt, the earlier clean blocks
/// and itself causally.
enum class jacobi_mask_kind : std::uint8_t {
  /// Noise-conditioned (NC), Fig. 2b and Eq. 8, the mask the paper trains with (§4.3): noisy
  /// block b sees the prompt, noisy blocks 0..b−1 and itself causally.
  noise_conditioned,
  /// Clean-conditioned, Fig. 2a (CLLM-style consistency distillation, L_c): noisy block b sees
  /// the prompt, clean blocks 0..b−1 and itself causally.
  clean_conditioned,
  /// NC with intra-window clean context (NC-IC, §4.3, Table 5): noisy block b of window
  /// k = ⌊b / w⌋ sees the prompt, the clean blocks of windows 0..k−1, the noisy blocks
  /// k·w..b−1 of its own window and itself causally.
  noise_conditioned_intra_window_clean,
};

/// The layout of a packed Jacobi Forcing training sequence for a prompt of P tokens and N
/// blocks of n tokens (see the file comment): slots [0, P) are the prompt, then for b = 0..N−1
/// the noisy view of block b at [P + 2·b·n, P + 2·b·n + n) and its clean block at
/// [P + (2b+1)·n, P + (2b+2)·n). A final partial block must be padded to n tokens by the
/// caller (the paper takes N = ⌈L / n⌉).
class jacobi_packing {
 public:
  /// Throws invalid_input ("prompt_length" < 0, "num_blocks" < 0, "block_size" < 1, or
  /// "num_blocks" when P + 2·N·n does not fit in index_t).
  jacobi_packing(index_t prompt_length, index_t num_blocks, index_t block_size)
      : prompt_(prompt_length), blocks_(num_blocks), n_(block_size) {
    require_parameter(prompt_length >= 0, "prompt_length", static_cast<double>(prompt_length),
                      "must be >= 0");
    require_parameter(num_blocks >= 0, "num_blocks", static_cast<double>(num_blocks),
                      "must be >= 0");
    detail::jf_require_block_size(block_size);
    require_parameter(num_blocks <= (detail::jf_index_max - prompt_length) / 2 / block_size,
                      "num_blocks", static_cast<double>(num_blocks),
                      "prompt_length + 2 * num_blocks * block_size must fit in index_t");
  }

  [[nodiscard]] index_t prompt_length() const noexcept { return prompt_; }
  [[nodiscard]] index_t num_blocks() const noexcept { return blocks_; }
  [[nodiscard]] index_t block_size() const noexcept { return n_; }
  /// Tokens of the clean generation: N·n.
  [[nodiscard]] index_t generation_length() const noexcept { return blocks_ * n_; }
  /// Packed slots: P + 2·N·n.
  [[nodiscard]] index_t size() const noexcept { return prompt_ + 2 * blocks_ * n_; }
  /// 64-bit words per bit-packed attention-mask row: ceil(size() / 64).
  [[nodiscard]] index_t mask_words() const noexcept { return (size() + 63) / 64; }

  /// First slot of block b's noisy view: P + 2·b·n. Throws invalid_input ("block").
  [[nodiscard]] index_t noisy_begin(index_t block) const {
    return prompt_ + 2 * check_block(block) * n_;
  }
  /// First slot of block b's clean copy: P + (2b+1)·n. Throws invalid_input ("block").
  [[nodiscard]] index_t clean_begin(index_t block) const {
    return prompt_ + (2 * check_block(block) + 1) * n_;
  }

  /// Kind, block and offset of slot i. Throws invalid_input ("slot") outside [0, size()).
  [[nodiscard]] jacobi_slot slot(index_t i) const {
    if (i < 0 || i >= size())
      throw_if_failed({status::invalid_parameter, i, -1, static_cast<double>(i)}, "slot",
                      ("packing has " + std::to_string(size()) + " slots").c_str());
    if (i < prompt_) return {jacobi_slot_kind::prompt, -1, i};
    const index_t half = (i - prompt_) / n_;  // 2b (noisy) or 2b + 1 (clean)
    return {half % 2 == 0 ? jacobi_slot_kind::noisy : jacobi_slot_kind::clean, half / 2,
            (i - prompt_) % n_};
  }

  /// Position id of every slot: `first` + i for prompt slot i, `first` + P + b·n + r for offset
  /// r of block b in both its noisy view and its clean copy (they share position ids).
  [[nodiscard]] std::vector<index_t> position_ids(index_t first = 0) const {
    std::vector<index_t> pos(static_cast<std::size_t>(size()));
    for (index_t i = 0; i < prompt_; ++i) pos[static_cast<std::size_t>(i)] = first + i;
    for (index_t b = 0; b < blocks_; ++b)
      for (index_t r = 0; r < n_; ++r) {
        const index_t p = first + prompt_ + b * n_ + r;
        pos[static_cast<std::size_t>(prompt_ + 2 * b * n_ + r)] = p;
        pos[static_cast<std::size_t>(prompt_ + (2 * b + 1) * n_ + r)] = p;
      }
    return pos;
  }

  /// Bit-packed attention mask in the format of token_tree::attention_mask: row i
  /// (mask_words() words, little-endian bit order) has bit j set iff slot i attends to slot j.
  /// The prompt is causal; a clean block sees the prompt, the earlier clean blocks and itself
  /// causally; a noisy block sees the prompt, the earlier blocks chosen by `kind` and itself
  /// causally. `window` (w of Eq. 7, >= 1) is used only by
  /// jacobi_mask_kind::noise_conditioned_intra_window_clean. `out` needs size() · mask_words()
  /// words; it is overwritten. Throws invalid_input ("out" too short, "window").
  void attention_mask(std::span<std::uint64_t> out,
                      jacobi_mask_kind kind = jacobi_mask_kind::noise_conditioned,
                      index_t window = 0) const {
    const index_t words = check_mask_size();
    if (kind == jacobi_mask_kind::noise_conditioned_intra_window_clean)
      detail::jf_require_window(window);
    if (static_cast<index_t>(out.size()) < size() * words)
      throw_if_failed(
          {status::length_mismatch, -1, -1, static_cast<double>(out.size())}, "out",
          ("needs size() * mask_words() = " + std::to_string(size() * words) + " words").c_str());
    for (index_t i = 0; i < size(); ++i) {
      std::uint64_t* row = out.data() + i * words;
      for (index_t w = 0; w < words; ++w) row[w] = 0;
      const jacobi_slot s = slot(i);
      if (s.kind == jacobi_slot_kind::prompt) {
        detail::jf_set_bits(row, 0, i + 1);
        continue;
      }
      detail::jf_set_bits(row, 0, prompt_);
      const index_t own =
          s.kind == jacobi_slot_kind::noisy ? noisy_begin(s.block) : clean_begin(s.block);
      detail::jf_set_bits(row, own, own + s.offset + 1);
      for (index_t c = 0; c < s.block; ++c) {
        const index_t from = earlier_block_begin(s, c, kind, window);
        detail::jf_set_bits(row, from, from + n_);
      }
    }
  }

  /// The attention mask as a vector (size() · mask_words() words).
  [[nodiscard]] std::vector<std::uint64_t> attention_mask(
      jacobi_mask_kind kind = jacobi_mask_kind::noise_conditioned, index_t window = 0) const {
    const index_t words = check_mask_size();
    std::vector<std::uint64_t> m(static_cast<std::size_t>(size() * words));
    attention_mask(m, kind, window);
    return m;
  }

  /// Fills the packed token sequence: the prompt (P tokens), then for each block b its noisy
  /// view (noisy[b·n, (b+1)·n)) followed by its clean block (clean[b·n, (b+1)·n)). `clean` is
  /// the converged generation y^* and `noisy` the concatenated noisy views y_b^{t_b}, both N·n
  /// tokens; tokens (padding included) are copied verbatim. `out` needs size() tokens; the
  /// first size() are overwritten. Throws invalid_input ("prompt", "clean", "noisy", "out").
  void pack_tokens(std::span<const token_t> prompt, std::span<const token_t> clean,
                   std::span<const token_t> noisy, std::span<token_t> out) const {
    detail::jf_require_length(prompt.size(), prompt_, "prompt", "prompt_length");
    detail::jf_require_length(clean.size(), generation_length(), "clean",
                              "num_blocks * block_size");
    detail::jf_require_length(noisy.size(), generation_length(), "noisy",
                              "num_blocks * block_size");
    if (static_cast<index_t>(out.size()) < size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(out.size())}, "out",
                      ("needs size() = " + std::to_string(size()) + " tokens").c_str());
    for (index_t i = 0; i < prompt_; ++i)
      out[static_cast<std::size_t>(i)] = prompt[static_cast<std::size_t>(i)];
    for (index_t b = 0; b < blocks_; ++b)
      for (index_t r = 0; r < n_; ++r) {
        const auto src = static_cast<std::size_t>(b * n_ + r);
        out[static_cast<std::size_t>(prompt_ + 2 * b * n_ + r)] = noisy[src];
        out[static_cast<std::size_t>(prompt_ + (2 * b + 1) * n_ + r)] = clean[src];
      }
  }

  /// The packed token sequence as a vector (see the span overload).
  [[nodiscard]] std::vector<token_t> pack_tokens(std::span<const token_t> prompt,
                                                 std::span<const token_t> clean,
                                                 std::span<const token_t> noisy) const {
    std::vector<token_t> out(static_cast<std::size_t>(size()));
    pack_tokens(prompt, clean, noisy, out);
    return out;
  }

  /// Unconverged tokens of each block's noisy view (count_unconverged per block), to compare
  /// with the scheduled progressive_noisy_counts(). Throws invalid_input ("clean", "noisy").
  [[nodiscard]] std::vector<index_t> noisy_counts(std::span<const token_t> clean,
                                                  std::span<const token_t> noisy) const {
    detail::jf_require_length(clean.size(), generation_length(), "clean",
                              "num_blocks * block_size");
    detail::jf_require_length(noisy.size(), generation_length(), "noisy",
                              "num_blocks * block_size");
    std::vector<index_t> c(static_cast<std::size_t>(blocks_));
    for (index_t b = 0; b < blocks_; ++b) {
      const auto at = static_cast<std::size_t>(b * n_);
      const auto len = static_cast<std::size_t>(n_);
      c[static_cast<std::size_t>(b)] =
          count_unconverged(noisy.subspan(at, len), clean.subspan(at, len));
    }
    return c;
  }

 private:
  [[nodiscard]] index_t check_block(index_t block) const {
    if (block < 0 || block >= blocks_)
      throw_if_failed({status::invalid_parameter, block, -1, static_cast<double>(block)}, "block",
                      ("packing has " + std::to_string(blocks_) + " blocks").c_str());
    return block;
  }

  /// mask_words(), after checking that size() · mask_words() fits in index_t.
  [[nodiscard]] index_t check_mask_size() const {
    const index_t words = mask_words();
    require_parameter(words == 0 || size() <= detail::jf_index_max / words, "num_blocks",
                      static_cast<double>(blocks_), "size() * mask_words() must fit in index_t");
    return words;
  }

  /// First slot of the copy of earlier block c (< s.block) that slot s sees under `kind`.
  [[nodiscard]] index_t earlier_block_begin(const jacobi_slot& s, index_t c, jacobi_mask_kind kind,
                                            index_t window) const {
    if (s.kind == jacobi_slot_kind::clean) return clean_begin(c);
    switch (kind) {
      case jacobi_mask_kind::noise_conditioned:
        return noisy_begin(c);
      case jacobi_mask_kind::clean_conditioned:
        return clean_begin(c);
      case jacobi_mask_kind::noise_conditioned_intra_window_clean:
        return c / window == s.block / window ? noisy_begin(c) : clean_begin(c);
    }
    return noisy_begin(c);
  }

  index_t prompt_;
  index_t blocks_;
  index_t n_;
};

}  // namespace specula
