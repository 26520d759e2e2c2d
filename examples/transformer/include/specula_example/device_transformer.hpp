#pragma once

/// @file
/// The example transformer on a CUDA GPU (target `specula_example_cuda`, built when CUDA is
/// enabled; this header needs no CUDA headers): the same llama-style forward pass as
/// transformer.hpp, with fp32 weights uploaded once, the linear layers as a tiled fp32 GEMM
/// kernel, RMSNorm / rotate-half RoPE / SwiGLU as small kernels and one attention kernel for
/// all query nodes of a batch of blocks (chains, token trees, Jacobi and multi-block windows:
/// any ancestor mask) against device key/value caches.
///
/// - `device_kv_cache`: a `slot_cache` (slot_cache.hpp) whose rows live on the GPU: commit of an
///   accepted path and rollback as `kv_cache`, the rows moved by one small kernel.
/// - `device_transformer::evaluate(blocks, logits)`: as `transformer::evaluate`, logits copied
///   to the host; `evaluate_device(blocks)` leaves them on the GPU (rows x vocab, fp32) for
///   `specula::cuda::logits_to_probs_async` and the device verifiers.
/// - `device_transformer` is a `masked_model` and a `dual_cache_model` (`device_dual_cache`)
///   for a bidirectional file, and `device_session` a `session_model`, so every decoding loop
///   of include/specula/decode runs on it unchanged.
///
/// All work of one model (its caches included) is enqueued on the model's own stream; a call
/// that returns host data synchronises it. Not thread-safe: one model serves one thread.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/decode/row_top.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula_example/sessions.hpp"
#include "specula_example/slot_cache.hpp"
#include "specula_example/transformer.hpp"

namespace specula::example {

namespace device_detail {
struct context;
}

/// Whether a CUDA device is present (false, never an error, without one or without a driver).
[[nodiscard]] bool cuda_device_available() noexcept;

/// A `slot_storage` on the GPU: per layer, keys and values of `capacity()` slots of kv_dim
/// floats. Bound to a model by its first evaluation; moves but does not copy.
class device_slot_storage {
 public:
  device_slot_storage() = default;
  device_slot_storage(device_slot_storage&& o) noexcept;
  device_slot_storage& operator=(device_slot_storage&& o) noexcept;
  device_slot_storage(const device_slot_storage&) = delete;
  device_slot_storage& operator=(const device_slot_storage&) = delete;
  ~device_slot_storage();

  void reserve(index_t slots, index_t keep);
  void gather(index_t at, std::span<const index_t> from);
  [[nodiscard]] index_t capacity() const noexcept { return capacity_; }
  /// Layer `layer`'s keys (or values) of slots [0, slots) copied to the host (tests).
  [[nodiscard]] std::vector<float> download(index_t layer, bool values, index_t slots) const;

 private:
  friend class device_transformer;
  void release() noexcept;
  device_detail::context* ctx_ = nullptr;
  float* data_ = nullptr;
  index_t capacity_ = 0;
  std::int32_t* from_ = nullptr;  // device copy of a gather's sources
  index_t from_capacity_ = 0;
};

static_assert(slot_storage<device_slot_storage>);

/// One request's key/value cache on the GPU.
using device_kv_cache = slot_cache<device_slot_storage>;

/// One request's block of new nodes for `device_transformer::evaluate` (as `node_block`).
struct device_node_block {
  device_kv_cache* cache = nullptr;
  std::span<const token_t> tokens;
  std::span<const index_t> positions;
  std::span<const std::uint64_t> mask;
};

class device_transformer;
/// A bidirectional model's dual (prefix and suffix) cache on the GPU (`full_` stays unused: the
/// refresh's rows are stashed in `outside_` itself and compacted there).
using device_dual_cache = basic_dual_cache<device_kv_cache, device_transformer>;

/// What one evaluation moved between host and device (accumulated; `device_transformer::traffic`).
struct device_traffic {
  std::uint64_t evaluations = 0;
  std::uint64_t bytes_to_device = 0;  ///< tokens, positions, masks, block table, gather lists
  std::uint64_t bytes_to_host = 0;    ///< logits copied back (0 for evaluate_device)
};

/// The forward pass on the GPU (see file comment).
class device_transformer {
 public:
  /// Uploads `w` (fp32) to the current CUDA device. Throws specula::invalid_input without one.
  explicit device_transformer(const transformer_weights& w);
  device_transformer(device_transformer&&) noexcept;
  device_transformer& operator=(device_transformer&&) noexcept;
  ~device_transformer();

  [[nodiscard]] static device_transformer load(const std::filesystem::path& path) {
    return device_transformer(transformer_weights::load(path));
  }

  [[nodiscard]] const transformer_config& config() const noexcept;
  [[nodiscard]] index_t vocab_size() const noexcept { return config().vocab_size; }
  [[nodiscard]] token_t mask_token() const noexcept { return config().mask_token; }

  /// As `transformer::evaluate`: one logit row per node (blocks in order) copied to `logits`,
  /// or none when `logits` is empty; each block's cache receives its nodes as pending nodes.
  void evaluate(std::span<const device_node_block> blocks, batch_view<float> logits) const;
  /// The same, logits left on the device: rows x vocab fp32, contiguous, valid until the next
  /// evaluation; enqueued on `stream()` without synchronising.
  [[nodiscard]] const float* evaluate_device(std::span<const device_node_block> blocks) const;

  /// One token tree below `cache`'s committed context (node 0 at position cache.size()).
  void evaluate_tree(device_kv_cache& cache, const token_tree& tree,
                     batch_view<float> logits) const;
  /// The same, logits left on the device (as `evaluate_device`).
  [[nodiscard]] const float* evaluate_tree_device(device_kv_cache& cache,
                                                  const token_tree& tree) const;
  /// evaluate_tree with only each row's summary copied back (`specula::detail::row_top`, 16
  /// bytes per node; see evaluate_sequences_tops).
  void evaluate_tree_tops(device_kv_cache& cache, const token_tree& tree,
                          std::span<specula::detail::row_top> tops) const;
  /// Appends `tokens` to `cache` as committed context.
  void prefill(device_kv_cache& cache, std::span<const token_t> tokens) const;

  /// `masked_model`: whole sequences without a cache, causal or bidirectional per the model.
  void evaluate_sequences(std::span<const token_t> tokens, index_t length,
                          batch_view<float> logits) const;

  /// `dual_cache_model`: as `transformer::evaluate_cached`.
  using dual_cache = device_dual_cache;
  void evaluate_cached(std::span<const dual_cache_pass<device_dual_cache>> passes,
                       batch_view<float> logits) const;

  /// evaluate_sequences / evaluate_cached with only each row's summary copied back: its argmax
  /// and softmax probability (`specula::detail::row_top`, computed on the device by the same
  /// function as on the host), 16 bytes per row instead of the row's 4 V.
  void evaluate_sequences_tops(std::span<const token_t> tokens, index_t length,
                               std::span<specula::detail::row_top> tops) const;
  void evaluate_cached_tops(std::span<const dual_cache_pass<device_dual_cache>> passes,
                            std::span<specula::detail::row_top> tops) const;

  /// The model's CUDA stream (a `cudaStream_t`).
  [[nodiscard]] void* stream() const noexcept;
  /// Waits for the model's stream.
  void synchronize() const;
  /// Host <-> device bytes of the evaluations so far.
  [[nodiscard]] const device_traffic& traffic() const noexcept;

  /// CUDA graphs for the forward pass's launch sequence: with them on, each pass shape (rows,
  /// blocks, attention keys rounded up to 256) is captured once (up to 64 shapes; others are
  /// launched directly) and replayed with one cudaGraphLaunch; the same kernels with the same
  /// parameters, so the logits are the same bit for bit. Off by default (on when the
  /// environment sets SPECULA_CUDA_GRAPHS=1 at construction).
  void set_graphs(bool on);
  [[nodiscard]] bool graphs() const noexcept;

  /// As `transformer::set_vocab_limit`: every logit row (evaluate, evaluate_device, the row
  /// summaries) restricted to tokens [0, limit) on the GPU, the others' logits -inf (one kernel
  /// after the vocabulary GEMM). `limit` in [1, vocab_size()]; vocab_size() lifts it.
  void set_vocab_limit(index_t limit);
  [[nodiscard]] index_t vocab_limit() const noexcept;

 private:
  /// The forward pass over all blocks' nodes; with `stash`, each block's keys/values become its
  /// cache's pending nodes (else caches are only read). Returns the device logits.
  const float* run(std::span<const device_node_block> blocks, bool stash) const;
  /// Where evaluate_sequences / evaluate_cached put their rows (defined with them).
  struct row_sink;
  void sequences_to(std::span<const token_t> tokens, index_t length, row_sink& sink) const;
  void cached_to(std::span<const dual_cache_pass<device_dual_cache>> passes, row_sink& sink) const;
  std::unique_ptr<device_detail::context> ctx_;
};

/// One request of a device transformer as a `specula::session_model`.
using device_session = basic_session<device_transformer, device_kv_cache>;
/// Several requests of a device transformer in one forward pass (`batched_session_model`; e.g.
/// classifier-free guidance's conditional and unconditional streams under `specula::cfg_model`).
using device_batch = basic_batch<device_transformer, device_kv_cache, device_node_block>;

static_assert(session_model<device_session>);
static_assert(batched_session_model<device_batch>);
static_assert(masked_model<device_transformer>);
static_assert(dual_cache_model<device_transformer>);

}  // namespace specula::example
