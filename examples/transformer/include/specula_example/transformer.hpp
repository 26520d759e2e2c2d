#pragma once

/// @file
/// A llama-style decoder in plain C++20 (RMSNorm, rotate-half RoPE, SwiGLU MLP, grouped-query
/// attention), loaded from safetensors (docs/model_format.md), with the evaluation shape that
/// speculative verifiers need:
///
/// - `kv_cache`: one request's committed keys/values plus the pending keys/values of the nodes
///   its last evaluation added; `commit(path)` keeps an accepted path and drops the rest,
///   `rollback(n)` truncates the committed context.
/// - `transformer::evaluate(blocks, logits)`: several requests in one call, each a block of new
///   nodes with absolute positions and a bit-packed attention mask over the block (node i sees
///   the whole committed context and the block nodes whose bits are set). Chains, token trees,
///   Jacobi windows and multi-block windows are all such blocks; `tree_block` builds one from a
///   `specula::token_tree`.
/// - `transformer::evaluate_sequences(tokens, length, logits)`: whole sequences without a cache,
///   causal or bidirectional per the model (the masked-diffusion mode).
/// - `dual_kv_cache` and `transformer::evaluate_cached(passes, logits)`: a bidirectional model's
///   dual (prefix and suffix) cache in the style of Fast-dLLM (`specula::dual_cache_model`): a
///   refresh evaluates a whole sequence and keeps the keys/values outside the active window;
///   window passes evaluate only the window's tokens against them.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/core/error.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/tree/builders.hpp"
#include "specula/tree/token_tree.hpp"
#include "specula_example/kernels.hpp"
#include "specula_example/safetensors.hpp"
#include "specula_example/vocab_limit.hpp"

namespace specula::example {

/// Hyperparameters (the `specula.config` metadata of a model file).
struct transformer_config {
  index_t vocab_size = 0;
  index_t d_model = 0;
  index_t n_layers = 0;
  index_t n_heads = 0;
  index_t n_kv_heads = 0;
  index_t d_ff = 0;
  index_t max_seq_len = 0;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool causal = true;
  token_t mask_token = -1;

  [[nodiscard]] index_t head_dim() const noexcept { return d_model / n_heads; }
  [[nodiscard]] index_t kv_dim() const noexcept { return n_kv_heads * head_dim(); }
  [[nodiscard]] index_t q_dim() const noexcept { return n_heads * head_dim(); }

  /// Parses and checks the JSON object; `origin` names the file in errors.
  [[nodiscard]] static transformer_config from_json(const std::string& text,
                                                    const std::string& origin) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw load_error(origin + ": bad JSON in metadata 'specula.config': " + e.what());
    }
    const auto get = [&](const char* key) -> const nlohmann::json& {
      if (!j.is_object() || !j.contains(key))
        throw load_error(origin + ": specula.config has no field '" + key + "'");
      return j[key];
    };
    transformer_config c;
    try {
      if (get("architecture").get<std::string>() != "llama")
        throw load_error(origin + ": specula.config architecture '" +
                         j["architecture"].get<std::string>() + "' is not 'llama'");
      c.vocab_size = get("vocab_size").get<index_t>();
      c.d_model = get("d_model").get<index_t>();
      c.n_layers = get("n_layers").get<index_t>();
      c.n_heads = get("n_heads").get<index_t>();
      c.n_kv_heads = get("n_kv_heads").get<index_t>();
      c.d_ff = get("d_ff").get<index_t>();
      c.max_seq_len = get("max_seq_len").get<index_t>();
      c.rope_theta = get("rope_theta").get<float>();
      c.norm_eps = get("norm_eps").get<float>();
      c.causal = get("causal").get<bool>();
      c.mask_token = get("mask_token").get<token_t>();
    } catch (const nlohmann::json::exception& e) {
      throw load_error(origin + ": specula.config has a field of the wrong type: " + e.what());
    }
    c.check(origin);
    return c;
  }

  /// The JSON object stored as `specula.config`.
  [[nodiscard]] std::string to_json() const {
    const nlohmann::json j = {{"architecture", "llama"},
                              {"vocab_size", vocab_size},
                              {"d_model", d_model},
                              {"n_layers", n_layers},
                              {"n_heads", n_heads},
                              {"n_kv_heads", n_kv_heads},
                              {"d_ff", d_ff},
                              {"max_seq_len", max_seq_len},
                              {"rope_theta", rope_theta},
                              {"norm_eps", norm_eps},
                              {"causal", causal},
                              {"mask_token", mask_token}};
    return j.dump();
  }

  void check(const std::string& origin) const {
    const auto bad = [&](const std::string& why) {
      throw load_error(origin + ": specula.config: " + why);
    };
    if (vocab_size <= 0 || d_model <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 ||
        d_ff <= 0 || max_seq_len <= 0)
      bad("sizes must be positive");
    if (d_model % n_heads != 0 || head_dim() % 2 != 0)
      bad("d_model must be n_heads times an even head size");
    if (n_heads % n_kv_heads != 0) bad("n_kv_heads must divide n_heads");
    if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) bad("rope_theta and norm_eps must be > 0");
    if (mask_token < -1 || mask_token >= vocab_size) bad("mask_token outside [-1, vocab_size)");
  }
};

/// fp32 weights of one decoder block.
struct layer_weights {
  std::vector<float> attention_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2;
};

/// fp32 weights of a model.
struct transformer_weights {
  transformer_config config;
  std::vector<float> tok_embeddings;
  std::vector<layer_weights> layers;
  std::vector<float> norm;
  std::vector<float> output;

  /// Loads a model file, checking every tensor's presence, dtype and shape.
  [[nodiscard]] static transformer_weights load(const safetensors_file& f) {
    transformer_weights w;
    w.config = transformer_config::from_json(f.required_metadata("specula.config"), f.origin());
    const transformer_config& c = w.config;
    const std::int64_t d = c.d_model;
    w.tok_embeddings = f.read_f32("tok_embeddings.weight", {c.vocab_size, d});
    w.layers.resize(static_cast<std::size_t>(c.n_layers));
    for (index_t i = 0; i < c.n_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      layer_weights& l = w.layers[static_cast<std::size_t>(i)];
      l.attention_norm = f.read_f32(p + "attention_norm.weight", {d});
      l.wq = f.read_f32(p + "attention.wq.weight", {c.q_dim(), d});
      l.wk = f.read_f32(p + "attention.wk.weight", {c.kv_dim(), d});
      l.wv = f.read_f32(p + "attention.wv.weight", {c.kv_dim(), d});
      l.wo = f.read_f32(p + "attention.wo.weight", {d, c.q_dim()});
      l.ffn_norm = f.read_f32(p + "ffn_norm.weight", {d});
      l.w1 = f.read_f32(p + "feed_forward.w1.weight", {c.d_ff, d});
      l.w3 = f.read_f32(p + "feed_forward.w3.weight", {c.d_ff, d});
      l.w2 = f.read_f32(p + "feed_forward.w2.weight", {d, c.d_ff});
    }
    w.norm = f.read_f32("norm.weight", {d});
    w.output = f.read_f32("output.weight", {c.vocab_size, d});
    return w;
  }

  [[nodiscard]] static transformer_weights load(const std::filesystem::path& path) {
    return load(safetensors_file::open(path));
  }

  /// The tensors of a model file, weights stored as `type` (F32 or BF16), norms as F32.
  [[nodiscard]] std::vector<tensor_to_write> to_tensors(dtype type = dtype::bf16) const {
    const transformer_config& c = config;
    const std::int64_t d = c.d_model;
    std::vector<tensor_to_write> t;
    t.push_back({"tok_embeddings.weight", {c.vocab_size, d}, type, tok_embeddings, {}});
    for (index_t i = 0; i < c.n_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      const layer_weights& l = layers[static_cast<std::size_t>(i)];
      t.push_back({p + "attention_norm.weight", {d}, dtype::f32, l.attention_norm, {}});
      t.push_back({p + "attention.wq.weight", {c.q_dim(), d}, type, l.wq, {}});
      t.push_back({p + "attention.wk.weight", {c.kv_dim(), d}, type, l.wk, {}});
      t.push_back({p + "attention.wv.weight", {c.kv_dim(), d}, type, l.wv, {}});
      t.push_back({p + "attention.wo.weight", {d, c.q_dim()}, type, l.wo, {}});
      t.push_back({p + "ffn_norm.weight", {d}, dtype::f32, l.ffn_norm, {}});
      t.push_back({p + "feed_forward.w1.weight", {c.d_ff, d}, type, l.w1, {}});
      t.push_back({p + "feed_forward.w3.weight", {c.d_ff, d}, type, l.w3, {}});
      t.push_back({p + "feed_forward.w2.weight", {d, c.d_ff}, type, l.w2, {}});
    }
    t.push_back({"norm.weight", {d}, dtype::f32, norm, {}});
    t.push_back({"output.weight", {c.vocab_size, d}, type, output, {}});
    return t;
  }

  /// Writes a model file (metadata `specula.config` plus `extra_metadata`).
  void save(const std::filesystem::path& path, dtype type = dtype::bf16,
            std::map<std::string, std::string> extra_metadata = {}) const {
    extra_metadata["specula.config"] = config.to_json();
    save_safetensors(path, to_tensors(type), extra_metadata);
  }

  [[nodiscard]] index_t parameters() const noexcept {
    std::size_t n = tok_embeddings.size() + norm.size() + output.size();
    for (const auto& l : layers)
      n += l.attention_norm.size() + l.wq.size() + l.wk.size() + l.wv.size() + l.wo.size() +
           l.ffn_norm.size() + l.w1.size() + l.w3.size() + l.w2.size();
    return static_cast<index_t>(n);
  }
};

namespace detail {

/// The checks of `kv_cache::commit` (shared with the device cache, slot_cache.hpp): with `size`
/// committed positions and pending nodes at `pending_pos` with ancestor mask `pending_mask`
/// (rows of ceil(n / 64) words), `path` must name pending nodes at positions size, size + 1, ...
/// each of which attended to exactly the path nodes before it. Throws invalid_input (argument
/// "path", row k).
inline void check_commit_path(index_t size, std::span<const index_t> pending_pos,
                              std::span<const std::uint64_t> pending_mask,
                              std::span<const index_t> path) {
  const auto n = static_cast<index_t>(pending_pos.size());
  const index_t words = (n + 63) / 64;
  for (std::size_t k = 0; k < path.size(); ++k) {
    const index_t node = path[k];
    const auto row = static_cast<index_t>(k);
    if (node < 0 || node >= n)
      throw_if_failed({status::invalid_parameter, row, -1, static_cast<double>(node)}, "path",
                      ("not one of the " + std::to_string(n) + " pending nodes").c_str());
    if (pending_pos[static_cast<std::size_t>(node)] != size + row)
      throw_if_failed(
          {status::invalid_parameter, row, -1, static_cast<double>(node)}, "path",
          ("node position " + std::to_string(pending_pos[static_cast<std::size_t>(node)]) +
           " is not the next context position " + std::to_string(size + row))
              .c_str());
    const std::uint64_t* m = pending_mask.data() + node * words;
    index_t seen = 0;
    for (index_t w = 0; w < words; ++w) seen += std::popcount(m[w]);
    bool ok = seen == row + 1;
    for (std::size_t j = 0; ok && j <= k; ++j) ok = ((m[path[j] / 64] >> (path[j] % 64)) & 1u) != 0;
    if (!ok)
      throw_if_failed({status::invalid_parameter, row, -1, static_cast<double>(node)}, "path",
                      "the node did not attend to exactly the path nodes before it");
  }
}

/// The checks of one evaluation block (`transformer::evaluate`, shared with the device forward):
/// n tokens in [0, vocab_size), n positions in [0, max_seq_len), n mask rows of ceil(n / 64)
/// words with the diagonal set and no bits beyond n, and no committed context (`cache_size`)
/// for a bidirectional model. `index` is the block's index in errors.
inline void check_block(const transformer_config& c, std::span<const token_t> tokens,
                        std::span<const index_t> positions, std::span<const std::uint64_t> mask,
                        index_t cache_size, index_t index) {
  const auto n = static_cast<index_t>(tokens.size());
  const index_t words = (n + 63) / 64;
  if (static_cast<index_t>(positions.size()) != n)
    throw_if_failed({status::length_mismatch, index, -1, static_cast<double>(positions.size())},
                    "blocks.positions", "one position per token");
  if (static_cast<index_t>(mask.size()) != n * words)
    throw_if_failed({status::length_mismatch, index, -1, static_cast<double>(mask.size())},
                    "blocks.mask", "needs tokens * ceil(tokens / 64) words");
  if (c.causal ? false : cache_size != 0)
    throw_if_failed({status::invalid_parameter, index, -1, static_cast<double>(cache_size)},
                    "blocks.cache", "a bidirectional model has no committed context");
  for (index_t i = 0; i < n; ++i) {
    const token_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab_size)
      throw_if_failed({status::token_out_of_range, index, i, static_cast<double>(t)},
                      "blocks.tokens");
    const index_t p = positions[static_cast<std::size_t>(i)];
    if (p < 0 || p >= c.max_seq_len)
      throw_if_failed({status::invalid_parameter, index, i, static_cast<double>(p)},
                      "blocks.positions",
                      ("outside [0, max_seq_len = " + std::to_string(c.max_seq_len) + ")").c_str());
    const std::uint64_t* row = mask.data() + i * words;
    if (((row[i / 64] >> (i % 64)) & 1u) == 0)
      throw_if_failed({status::invalid_parameter, index, i, 0.0}, "blocks.mask",
                      "a node must attend to itself");
    if (n % 64 != 0 && (row[words - 1] >> (n % 64)) != 0)
      throw_if_failed({status::invalid_parameter, index, i, 0.0}, "blocks.mask",
                      "bits beyond the block's nodes are set");
  }
}

/// RoPE tables (rotate-half): cos and sin of position p times frequency i at [p * half + i],
/// p < max_seq_len, i < head_dim / 2 (the host and the device forward use the same values).
inline void rope_tables(const transformer_config& c, std::vector<float>& cos_out,
                        std::vector<float>& sin_out) {
  const index_t half = c.head_dim() / 2;
  cos_out.resize(static_cast<std::size_t>(c.max_seq_len * half));
  sin_out.resize(cos_out.size());
  for (index_t p = 0; p < c.max_seq_len; ++p)
    for (index_t i = 0; i < half; ++i) {
      const double inv =
          std::pow(static_cast<double>(c.rope_theta),
                   -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim()));
      const double a = static_cast<double>(p) * static_cast<double>(static_cast<float>(inv));
      cos_out[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(a));
      sin_out[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(a));
    }
}

/// The checks of `transformer::evaluate_cached` for pass `index` (shared with the device
/// forward): a cache per pass, a length in [1, max_seq_len], whole node sequences, a non-empty
/// window, tokens in range, a refreshed cache of the same length and window for a pass without
/// refresh, and every node equal to the cached sequence outside the window.
template <class Cache>
void check_cached_pass(const transformer_config& c, std::span<const dual_cache_pass<Cache>> passes,
                       index_t index) {
  const auto& p = passes[static_cast<std::size_t>(index)];
  const auto bad = [&](const char* argument, index_t column, double value, const std::string& why,
                       status code = status::invalid_parameter) {
    throw_if_failed({code, index, column, value}, argument, why.c_str());
  };
  if (p.cache == nullptr) bad("passes.cache", -1, 0.0, "cache is null");
  for (index_t j = 0; j < index; ++j)
    if (passes[static_cast<std::size_t>(j)].cache == p.cache)
      bad("passes.cache", j, 0.0, "the same cache serves two passes");
  if (p.length < 1 || p.length > c.max_seq_len)
    bad("passes.length", -1, static_cast<double>(p.length),
        "must be in [1, max_seq_len = " + std::to_string(c.max_seq_len) + "]");
  if (p.tokens.empty() || p.tokens.size() % static_cast<std::size_t>(p.length) != 0)
    bad("passes.tokens", -1, static_cast<double>(p.tokens.size()),
        "size is not a positive multiple of length " + std::to_string(p.length),
        status::length_mismatch);
  if (p.window_begin < 0 || p.window_begin >= p.window_end || p.window_end > p.length)
    bad("passes.window", -1, static_cast<double>(p.window_begin),
        "the window [" + std::to_string(p.window_begin) + ", " + std::to_string(p.window_end) +
            ") must be a non-empty range in [0, length]");
  for (std::size_t i = 0; i < p.tokens.size(); ++i)
    if (p.tokens[i] < 0 || p.tokens[i] >= c.vocab_size)
      bad("passes.tokens", static_cast<index_t>(i), static_cast<double>(p.tokens[i]),
          "token outside [0, vocab_size)", status::token_out_of_range);
  const Cache& cache = *p.cache;
  if (!p.refresh && (cache.empty() || static_cast<index_t>(cache.tokens().size()) != p.length ||
                     cache.window_begin() != p.window_begin || cache.window_end() != p.window_end))
    bad("passes.cache", -1, 0.0,
        "not refreshed for this length and window (a pass without refresh needs one)");
  // Outside the window, every node must hold the sequence the cached keys/values came from.
  const auto reference =
      p.refresh ? p.tokens.first(static_cast<std::size_t>(p.length)) : cache.tokens();
  for (index_t u = p.refresh ? 1 : 0; u < p.nodes(); ++u)
    for (index_t j = 0; j < p.length; ++j) {
      if (j == p.window_begin) j = p.window_end;
      if (j >= p.length) break;
      if (p.tokens[static_cast<std::size_t>(u * p.length + j)] !=
          reference[static_cast<std::size_t>(j)])
        bad("passes.tokens", u * p.length + j, static_cast<double>(j),
            "node " + std::to_string(u) +
                " differs outside the window from the sequence "
                "the cached keys/values come from");
    }
}

/// All checks of `evaluate_cached` (a bidirectional model, each pass, the logits' shape: one row
/// per pass row, vocab_size columns); returns the longest pass length.
template <class Cache>
index_t check_cached_passes(const transformer_config& c,
                            std::span<const dual_cache_pass<Cache>> passes,
                            batch_view<float> logits) {
  if (c.causal)
    throw_if_failed({status::invalid_parameter, -1, -1, 0.0}, "passes",
                    "a causal model has no dual cache");
  index_t total = 0, max_len = 0;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    check_cached_pass(c, passes, static_cast<index_t>(i));
    total += passes[i].rows();
    max_len = std::max(max_len, passes[i].length);
  }
  if (logits.rows != total || logits.cols != c.vocab_size)
    throw_if_failed(
        {status::length_mismatch, -1, -1, static_cast<double>(logits.rows)}, "logits",
        ("needs " + std::to_string(total) + " rows of " + std::to_string(c.vocab_size) + " columns")
            .c_str());
  return max_len;
}

/// The checks of `evaluate_sequences`: length in [1, max_seq_len], whole sequences.
inline void check_sequences(const transformer_config& c, std::span<const token_t> tokens,
                            index_t length) {
  require_parameter(length > 0 && length <= c.max_seq_len, "length", static_cast<double>(length),
                    "must be in [1, max_seq_len]");
  if (tokens.size() % static_cast<std::size_t>(length) != 0)
    throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(tokens.size())}, "tokens",
                    ("size is not a multiple of length " + std::to_string(length)).c_str());
}

/// The check of `rollback(n)` on a cache of `size` committed positions.
inline void check_rollback(index_t n, index_t size) {
  if (n < 0 || n > size)
    throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(n)}, "n",
                    ("must be in [0, " + std::to_string(size) + "]").c_str());
}

/// What every key/value cache layout shares (kv_cache, slot_cache): the committed size, commit of
/// every pending node as a chain, rollback and clear, over the cache's own `pending()`,
/// `commit(path)` and `drop_pending()`.
template <class Cache>
class cache_bookkeeping {
 public:
  /// Number of committed positions.
  [[nodiscard]] index_t size() const noexcept { return size_; }

  /// Keeps every pending node as a chain (for a block evaluated as a causal chain).
  void commit_all() {
    auto& self = static_cast<Cache&>(*this);
    std::vector<index_t> path(static_cast<std::size_t>(self.pending()));
    for (std::size_t i = 0; i < path.size(); ++i) path[i] = static_cast<index_t>(i);
    self.commit(path);
  }

  /// Drops pending nodes and truncates the committed context to `n` positions.
  void rollback(index_t n) {
    check_rollback(n, size_);
    size_ = n;
    static_cast<Cache&>(*this).drop_pending();
  }

  void clear() {
    size_ = 0;
    static_cast<Cache&>(*this).drop_pending();
  }

 protected:
  index_t size_ = 0;
};

}  // namespace detail

/// One request's key/value cache: the committed context and the pending nodes of the last
/// evaluation.
class kv_cache : public detail::cache_bookkeeping<kv_cache> {
 public:
  /// Number of pending nodes (added by the last evaluation, not yet committed).
  [[nodiscard]] index_t pending() const noexcept { return pending_n_; }

  /// Keeps the pending nodes `path` (in order) and drops the other pending nodes. The path must
  /// be causal and contiguous: node path[k] sits at position size() + k and, among the pending
  /// nodes, saw exactly path[0..k], so its keys/values are those of a sequential evaluation.
  /// Throws invalid_input (argument "path", row k) otherwise.
  void commit(std::span<const index_t> path) {
    detail::check_commit_path(size_, pending_pos_, pending_mask_, path);
    const auto kv = static_cast<std::size_t>(kv_dim_);
    reserve(size_ + static_cast<index_t>(path.size()));
    for (std::size_t l = 0; l < k_.size(); ++l)
      for (std::size_t k = 0; k < path.size(); ++k) {
        const auto src = static_cast<std::size_t>(path[k]) * kv;
        const auto dst = (static_cast<std::size_t>(size_) + k) * kv;
        std::copy_n(pk_[l].begin() + static_cast<std::ptrdiff_t>(src), kv,
                    k_[l].begin() + static_cast<std::ptrdiff_t>(dst));
        std::copy_n(pv_[l].begin() + static_cast<std::ptrdiff_t>(src), kv,
                    v_[l].begin() + static_cast<std::ptrdiff_t>(dst));
      }
    size_ += static_cast<index_t>(path.size());
    drop_pending();
  }

  void drop_pending() noexcept { pending_n_ = 0; }

 private:
  friend class transformer;

  void shape(index_t layers, index_t kv_dim) {
    if (static_cast<index_t>(k_.size()) == layers && kv_dim_ == kv_dim) return;
    if (size_ != 0 || !k_.empty())
      if (static_cast<index_t>(k_.size()) != layers || kv_dim_ != kv_dim)
        throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(kv_dim)}, "cache",
                        "the cache holds keys of another model shape");
    k_.resize(static_cast<std::size_t>(layers));
    v_.resize(static_cast<std::size_t>(layers));
    pk_.resize(static_cast<std::size_t>(layers));
    pv_.resize(static_cast<std::size_t>(layers));
    kv_dim_ = kv_dim;
  }

  void reserve(index_t positions) {
    const auto need = static_cast<std::size_t>(positions * kv_dim_);
    if (!k_.empty() && k_[0].size() >= need) return;
    const std::size_t grown = std::max(need, k_.empty() ? need : 2 * k_[0].size());
    for (auto& x : k_) x.resize(grown);
    for (auto& x : v_) x.resize(grown);
  }

  void begin_pending(std::span<const index_t> positions, std::span<const std::uint64_t> mask) {
    pending_n_ = static_cast<index_t>(positions.size());
    pending_pos_.assign(positions.begin(), positions.end());
    pending_mask_.assign(mask.begin(), mask.end());
    const auto need = static_cast<std::size_t>(pending_n_ * kv_dim_);
    for (auto& x : pk_)
      if (x.size() < need) x.resize(need);
    for (auto& x : pv_)
      if (x.size() < need) x.resize(need);
  }

  index_t kv_dim_ = 0;
  std::vector<std::vector<float>> k_, v_;    // per layer: positions x kv_dim (after RoPE)
  std::vector<std::vector<float>> pk_, pv_;  // per layer: pending nodes x kv_dim
  index_t pending_n_ = 0;
  std::vector<index_t> pending_pos_;
  std::vector<std::uint64_t> pending_mask_;
};

/// One request's block of new nodes for `transformer::evaluate`.
struct node_block {
  kv_cache* cache = nullptr;            ///< the request's cache; receives the pending keys
  std::span<const token_t> tokens;      ///< n new tokens
  std::span<const index_t> positions;   ///< n absolute positions
  std::span<const std::uint64_t> mask;  ///< n rows of ceil(n/64) words; bit j of row i: node
                                        ///< i attends to node j (bit i must be set)
};

/// A token tree's evaluation block: positions cache.size() + depth, the tree's ancestor mask.
/// The returned block refers to `storage` and `tree`, which must outlive it.
struct tree_block_storage {
  std::vector<index_t> positions;
  std::vector<std::uint64_t> mask;
};

/// (`Block`: `node_block` over a `kv_cache`, or the device transformer's `device_node_block`.)
template <class Block = node_block, class Cache>
[[nodiscard]] Block tree_block(Cache& cache, const token_tree& tree, tree_block_storage& storage) {
  storage.positions.resize(static_cast<std::size_t>(tree.size()));
  for (index_t i = 0; i < tree.size(); ++i)
    storage.positions[static_cast<std::size_t>(i)] = cache.size() + tree.depth(i);
  storage.mask.resize(static_cast<std::size_t>(tree.size() * tree.mask_words()));
  tree.attention_mask(storage.mask);
  return {&cache, tree.tokens(), storage.positions, storage.mask};
}

/// One request's dual (prefix and suffix) cache for a bidirectional model, in the style of
/// Fast-dLLM's dual cache: after a refresh (`evaluate_cached`), every layer's keys/values at the
/// positions outside the active window, computed from the whole refreshed sequence, which window
/// passes reuse while only the window's tokens change. `KV` holds the rows (`kv_cache` on the
/// host, `device_kv_cache` on the GPU), `Model` fills them.
template <class KV, class Model>
class basic_dual_cache {
 public:
  /// Whether a refresh has filled the cache.
  [[nodiscard]] bool empty() const noexcept { return tokens_.empty(); }
  /// The sequence of the last refresh.
  [[nodiscard]] std::span<const token_t> tokens() const noexcept { return tokens_; }
  [[nodiscard]] index_t window_begin() const noexcept { return begin_; }
  [[nodiscard]] index_t window_end() const noexcept { return end_; }
  void clear() {
    outside_.clear();
    tokens_.clear();
    begin_ = end_ = 0;
  }

 private:
  friend Model;
  KV outside_;  // committed context: the positions outside the window, in position order
  KV full_;     // pending: the last refresh's whole sequence (where the model needs it apart)
  std::vector<token_t> tokens_;
  index_t begin_ = 0;
  index_t end_ = 0;
};

class transformer;
/// The host transformer's dual cache.
using dual_kv_cache = basic_dual_cache<kv_cache, transformer>;

/// The decoder. Immutable after construction: one instance serves any number of caches, and
/// `evaluate` is safe to call from several threads on distinct caches.
class transformer {
 public:
  explicit transformer(transformer_weights w, matmul_kernel kernel = default_kernel())
      : transformer(std::move(w), backend_options{kernel, best_cpu_isa(), 1}) {}

  /// Packs the weights for `options.kernel` (once, here) and checks `options.isa`.
  transformer(transformer_weights w, backend_options options) : w_(std::move(w)) {
    const transformer_config& c = w_.config;
    require_parameter(cpu_supports(options.isa), "options.isa", static_cast<double>(options.isa),
                      "this CPU (or build) cannot run that instruction set");
    require_parameter(options.kernel == matmul_kernel::builtin || have_blas(), "options.kernel",
                      static_cast<double>(options.kernel), "this build has no BLAS");
    require_parameter(options.threads >= 0, "options.threads", static_cast<double>(options.threads),
                      "must be >= 0");
    options.threads = options.threads == 0 ? hardware_threads() : options.threads;
    options_ = options;
    kc_ = {options.kernel, options.isa, options.threads};
    // Query/key/value and the two MLP inputs are stacked: one product each per layer.
    const auto linear = [&](index_t in, std::initializer_list<std::span<const float>> ws) {
      return detail::linear_weights(options.kernel, in, ws);
    };
    for (const layer_weights& l : w_.layers)
      layers_.push_back({linear(c.d_model, {l.wq, l.wk, l.wv}), linear(c.q_dim(), {l.wo}),
                         linear(c.d_model, {l.w1, l.w3}), linear(c.d_ff, {l.w2})});
    output_ = linear(c.d_model, {w_.output});
    detail::rope_tables(c, rope_cos_, rope_sin_);
  }

  [[nodiscard]] static transformer load(const std::filesystem::path& path,
                                        matmul_kernel kernel = default_kernel()) {
    return transformer(transformer_weights::load(path), kernel);
  }

  [[nodiscard]] static transformer load(const std::filesystem::path& path,
                                        backend_options options) {
    return transformer(transformer_weights::load(path), options);
  }

  [[nodiscard]] static constexpr matmul_kernel default_kernel() noexcept {
    return have_blas() ? matmul_kernel::blas : matmul_kernel::builtin;
  }

  [[nodiscard]] const transformer_config& config() const noexcept { return w_.config; }
  [[nodiscard]] const transformer_weights& weights() const noexcept { return w_; }
  [[nodiscard]] index_t vocab_size() const noexcept { return w_.config.vocab_size; }
  /// The mask token of a bidirectional (masked-diffusion) model, -1 for a causal one.
  [[nodiscard]] token_t mask_token() const noexcept { return w_.config.mask_token; }
  [[nodiscard]] matmul_kernel kernel() const noexcept { return options_.kernel; }
  /// The options in force (`threads` resolved).
  [[nodiscard]] const backend_options& options() const noexcept { return options_; }

  /// Restricts every logit row to tokens [0, limit): the others' logits become -inf
  /// (vocab_limit.hpp; the image model's label tokens). `limit` in [1, vocab_size()];
  /// vocab_size() lifts the limit. Set it before evaluating (not while another thread evaluates).
  void set_vocab_limit(index_t limit) {
    require_parameter(limit >= 1 && limit <= vocab_size(), "limit", static_cast<double>(limit),
                      "must be in [1, vocab_size]");
    vocab_limit_ = limit;
  }
  /// The limit in force (vocab_size() when none).
  [[nodiscard]] index_t vocab_limit() const noexcept {
    return vocab_limit_ > 0 ? vocab_limit_ : vocab_size();
  }

  /// Evaluates the blocks of several requests in one batch. `logits` gets one row per node,
  /// blocks in order (rows = total nodes, cols = vocab_size), or may be empty to only fill the
  /// caches (prefill). Each block's cache receives its nodes as pending keys/values, replacing
  /// any earlier pending nodes. Throws invalid_input naming the argument and index on bad input.
  void evaluate(std::span<const node_block> blocks, batch_view<float> logits) const {
    const transformer_config& c = w_.config;
    index_t total = 0;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      check_block(blocks[b], static_cast<index_t>(b));
      total += static_cast<index_t>(blocks[b].tokens.size());
    }
    if (!logits.empty() && (logits.rows != total || logits.cols != c.vocab_size))
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(logits.rows)}, "logits",
                      ("needs " + std::to_string(total) + " rows of " +
                       std::to_string(c.vocab_size) + " columns")
                          .c_str());
    for (const node_block& b : blocks) {
      b.cache->shape(c.n_layers, c.kv_dim());
      b.cache->begin_pending(b.positions, b.mask);
    }
    if (total == 0) return;
    run(blocks, total, logits);
  }

  /// Evaluates one token tree below `cache`'s committed context (node 0 at position
  /// cache.size()); one logit row per node.
  void evaluate_tree(kv_cache& cache, const token_tree& tree, batch_view<float> logits) const {
    tree_block_storage s;
    const node_block b = tree_block(cache, tree, s);
    evaluate(std::span<const node_block>(&b, 1), logits);
  }

  /// Appends `tokens` to `cache` as committed context (no logits).
  void prefill(kv_cache& cache, std::span<const token_t> tokens) const {
    const token_tree chain = trees::chain(tokens);
    evaluate_tree(cache, chain, {});
    cache.commit_all();
  }

  /// Evaluates `tokens.size() / length` whole sequences of `length` tokens without a cache:
  /// causal or bidirectional per the model. One logit row per token.
  void evaluate_sequences(std::span<const token_t> tokens, index_t length,
                          batch_view<float> logits) const {
    detail::check_sequences(config(), tokens, length);
    const auto count = static_cast<index_t>(tokens.size()) / length;
    const index_t words = (length + 63) / 64;
    std::vector<index_t> positions(static_cast<std::size_t>(length));
    for (index_t i = 0; i < length; ++i) positions[static_cast<std::size_t>(i)] = i;
    std::vector<std::uint64_t> mask(static_cast<std::size_t>(length * words), 0);
    for (index_t i = 0; i < length; ++i)
      for (index_t j = 0; j < length; ++j)
        if (!config().causal || j <= i)
          mask[static_cast<std::size_t>(i * words + j / 64)] |= std::uint64_t{1} << (j % 64);
    std::vector<kv_cache> caches(static_cast<std::size_t>(count));
    std::vector<node_block> blocks(static_cast<std::size_t>(count));
    for (index_t s = 0; s < count; ++s)
      blocks[static_cast<std::size_t>(s)] = {
          &caches[static_cast<std::size_t>(s)],
          tokens.subspan(static_cast<std::size_t>(s * length), static_cast<std::size_t>(length)),
          positions, mask};
    evaluate(blocks, logits);
  }

  /// The per-request cache of `evaluate_cached` (`specula::dual_cache_model`).
  using dual_cache = dual_kv_cache;

  /// Evaluates several requests' dual-cache passes in one call (bidirectional models only; see
  /// `specula::dual_cache_pass`). A refreshing pass evaluates node 0's whole sequence — the rows
  /// `evaluate_sequences` gives — and keeps every layer's keys/values outside the window in its
  /// cache; its other nodes, and every node of a pass without refresh, evaluate only their window
  /// tokens, attending to each other and to the cached keys/values (prefix and suffix). Rows are
  /// concatenated pass by pass, node by node. The refreshed sequences go through the layers
  /// first, then every window in one batch. Throws invalid_input naming the argument and pass on
  /// bad input.
  void evaluate_cached(std::span<const dual_cache_pass<dual_kv_cache>> passes,
                       batch_view<float> logits) const {
    const transformer_config& c = w_.config;
    const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
    const index_t max_len = detail::check_cached_passes(c, passes, logits);
    std::vector<index_t> positions(sz(max_len));
    for (index_t i = 0; i < max_len; ++i) positions[sz(i)] = i;
    const auto all_visible = [&](index_t n) {
      const index_t words = (n + 63) / 64;
      std::vector<std::uint64_t> m(sz(n * words), 0);
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < n; ++j) m[sz(i * words + j / 64)] |= std::uint64_t{1} << (j % 64);
      return m;
    };
    std::map<index_t, std::vector<std::uint64_t>> masks;  // all-visible block masks by size
    const auto mask_of = [&](index_t n) -> std::span<const std::uint64_t> {
      auto it = masks.find(n);
      if (it == masks.end()) it = masks.emplace(n, all_visible(n)).first;
      return it->second;
    };

    // 1. Refreshes: node 0's whole sequence, then its keys/values outside the window.
    std::vector<node_block> blocks;
    index_t rows = 0;
    for (const auto& p : passes) {
      if (!p.refresh) continue;
      const auto L = sz(p.length);
      kv_cache& full = p.cache->full_;
      full.clear();
      full.shape(c.n_layers, c.kv_dim());
      blocks.push_back(
          {&full, p.tokens.first(L), std::span(positions).first(L), mask_of(p.length)});
      full.begin_pending(blocks.back().positions, blocks.back().mask);
      rows += p.length;
    }
    std::vector<float> refreshed(sz(rows * c.vocab_size));
    if (rows > 0) run(blocks, rows, batch_view<float>(refreshed.data(), rows, c.vocab_size));
    for (const auto& p : passes)
      if (p.refresh) keep_outside(*p.cache, p);

    // 2. Every window node against its cache's prefix and suffix.
    blocks.clear();
    rows = 0;
    for (const auto& p : passes) {
      const index_t w = p.window_end - p.window_begin;
      kv_cache& outside = p.cache->outside_;
      const auto window = std::span<const index_t>(positions).subspan(sz(p.window_begin), sz(w));
      outside.begin_pending(window, mask_of(w));
      for (index_t u = p.refresh ? 1 : 0; u < p.nodes(); ++u) {
        blocks.push_back({&outside, p.tokens.subspan(sz(u * p.length + p.window_begin), sz(w)),
                          window, mask_of(w)});
        rows += w;
      }
    }
    std::vector<float> windows(sz(rows * c.vocab_size));
    if (rows > 0) run(blocks, rows, batch_view<float>(windows.data(), rows, c.vocab_size));

    // 3. Rows in pass order.
    const auto V = static_cast<std::ptrdiff_t>(c.vocab_size);
    auto from_refresh = refreshed.begin();
    auto from_window = windows.begin();
    index_t row = 0;
    const auto put = [&](std::vector<float>::iterator& from, index_t n) {
      for (index_t i = 0; i < n; ++i, ++row)
        std::copy_n(from + i * V, V, logits.data + row * logits.row_stride);
      from += n * V;
    };
    for (const auto& p : passes) {
      if (p.refresh) put(from_refresh, p.length);
      const index_t window_nodes = p.nodes() - (p.refresh ? 1 : 0);
      put(from_window, window_nodes * (p.window_end - p.window_begin));
    }
  }

 private:
  /// After a refresh: the whole sequence's keys/values outside the window become the cache's
  /// context, and the sequence and window are remembered.
  void keep_outside(dual_kv_cache& cache, const dual_cache_pass<dual_kv_cache>& p) const {
    const transformer_config& c = w_.config;
    const auto kv = static_cast<std::ptrdiff_t>(c.kv_dim());
    kv_cache& out = cache.outside_;
    out.clear();
    out.shape(c.n_layers, c.kv_dim());
    out.reserve(p.length - (p.window_end - p.window_begin));
    const std::ptrdiff_t before = p.window_begin * kv, after = (p.length - p.window_end) * kv;
    for (std::size_t l = 0; l < out.k_.size(); ++l)
      for (auto [from, to] : {std::pair{&cache.full_.pk_[l], &out.k_[l]},
                              std::pair{&cache.full_.pv_[l], &out.v_[l]}}) {
        std::copy_n(from->begin(), before, to->begin());
        std::copy_n(from->begin() + p.window_end * kv, after, to->begin() + before);
      }
    out.size_ = p.length - (p.window_end - p.window_begin);
    cache.full_.drop_pending();
    cache.tokens_.assign(p.tokens.begin(), p.tokens.begin() + p.length);
    cache.begin_ = p.window_begin;
    cache.end_ = p.window_end;
  }

  void check_block(const node_block& b, index_t index) const {
    if (b.cache == nullptr)
      throw_if_failed({status::invalid_parameter, index, -1, 0.0}, "blocks", "cache is null");
    detail::check_block(w_.config, b.tokens, b.positions, b.mask, b.cache->size(), index);
  }

  /// The forward pass over all blocks' nodes (rows concatenated in block order).
  void run(std::span<const node_block> blocks, index_t total, batch_view<float> logits) const {
    const transformer_config& c = w_.config;
    const index_t d = c.d_model, hd = c.head_dim(), qd = c.q_dim(), kvd = c.kv_dim();
    const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
    const index_t qkv_dim = qd + 2 * kvd;
    std::vector<float> x(sz(total * d)), xn(sz(total * d)), qkv(sz(total * qkv_dim)),
        q(sz(total * qd)), k(sz(total * kvd)), v(sz(total * kvd)), att(sz(total * qd)),
        tmp(sz(total * d)), gate_up(sz(total * 2 * c.d_ff));

    // Embeddings, and each block's first row.
    index_t r = 0;
    std::vector<index_t> block_rows;
    for (const node_block& b : blocks)
      for (block_rows.push_back(r); const token_t t : b.tokens) {
        std::copy_n(w_.tok_embeddings.begin() + static_cast<std::ptrdiff_t>(t * d), d,
                    x.begin() + static_cast<std::ptrdiff_t>(r * d));
        ++r;
      }

    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const index_t group = c.n_heads / c.n_kv_heads;
    const index_t half = hd / 2;

    for (index_t l = 0; l < c.n_layers; ++l) {
      const layer_weights& lw = w_.layers[sz(l)];
      detail::rms_norm(x.data(), total, d, lw.attention_norm.data(), c.norm_eps, xn.data());
      const packed_layer& pl = layers_[sz(l)];
      detail::linear(kc_, xn.data(), total, d, pl.qkv, qkv.data());
      for (index_t i = 0; i < total; ++i) {
        const auto from = qkv.begin() + static_cast<std::ptrdiff_t>(i * qkv_dim);
        std::copy_n(from, qd, q.begin() + static_cast<std::ptrdiff_t>(i * qd));
        std::copy_n(from + qd, kvd, k.begin() + static_cast<std::ptrdiff_t>(i * kvd));
        std::copy_n(from + qd + kvd, kvd, v.begin() + static_cast<std::ptrdiff_t>(i * kvd));
      }

      r = 0;
      for (const node_block& b : blocks) {
        const auto n = static_cast<index_t>(b.tokens.size());
        kv_cache& cache = *b.cache;
        // RoPE, then stash this block's keys/values as the cache's pending nodes.
        for (index_t i = 0; i < n; ++i) {
          const index_t pos = b.positions[sz(i)];
          const float* cs = rope_cos_.data() + pos * half;
          const float* sn = rope_sin_.data() + pos * half;
          for (index_t h = 0; h < c.n_heads; ++h)
            rope(q.data() + (r + i) * qd + h * hd, hd, cs, sn);
          for (index_t h = 0; h < c.n_kv_heads; ++h)
            rope(k.data() + (r + i) * kvd + h * hd, hd, cs, sn);
        }
        std::copy_n(k.begin() + static_cast<std::ptrdiff_t>(r * kvd), n * kvd,
                    cache.pk_[sz(l)].begin());
        std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(r * kvd), n * kvd,
                    cache.pv_[sz(l)].begin());
        r += n;
      }

      // Attention: one task per block and KV head, each serving all of the block's query rows
      // of that head's group with one pass over the keys.
      const auto tasks = static_cast<index_t>(blocks.size()) * c.n_kv_heads;
      const index_t parts = std::min<index_t>(tasks, kc_.threads);
      std::vector<detail::attention_scratch> scratch(static_cast<std::size_t>(parts));
      detail::parallel_parts(kc_, parts, [&](index_t part) {
        for (index_t t = part; t < tasks; t += parts) {
          const node_block& b = blocks[sz(t / c.n_kv_heads)];
          const index_t kvh = t % c.n_kv_heads, first = block_rows[sz(t / c.n_kv_heads)];
          const auto n = static_cast<index_t>(b.tokens.size());
          const kv_cache& cache = *b.cache;
          detail::attend_block(kc_.isa, q.data() + first * qd + kvh * group * hd,
                               att.data() + first * qd + kvh * group * hd, qd, group, hd,
                               cache.k_[sz(l)].data() + kvh * hd, cache.v_[sz(l)].data() + kvh * hd,
                               cache.size(), k.data() + first * kvd + kvh * hd,
                               v.data() + first * kvd + kvh * hd, n, kvd, b.mask.data(), scale,
                               scratch[static_cast<std::size_t>(part)]);
        }
      });

      detail::linear(kc_, att.data(), total, qd, pl.wo, tmp.data());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
      detail::rms_norm(x.data(), total, d, lw.ffn_norm.data(), c.norm_eps, xn.data());
      detail::linear(kc_, xn.data(), total, d, pl.w13, gate_up.data());
      detail::swiglu_rows(kc_.isa, gate_up.data(), total, c.d_ff);
      detail::linear(kc_, gate_up.data(), total, 2 * c.d_ff, pl.w2, tmp.data());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    }

    if (logits.empty()) return;
    detail::rms_norm(x.data(), total, d, w_.norm.data(), c.norm_eps, xn.data());
    if (logits.row_stride == c.vocab_size) {
      detail::linear(kc_, xn.data(), total, d, output_, logits.data);
    } else {
      std::vector<float> out(sz(total * c.vocab_size));
      detail::linear(kc_, xn.data(), total, d, output_, out.data());
      for (index_t i = 0; i < total; ++i)
        std::copy_n(out.begin() + static_cast<std::ptrdiff_t>(i * c.vocab_size), c.vocab_size,
                    logits.data + i * logits.row_stride);
    }
    if (vocab_limit() < c.vocab_size)
      for (index_t i = 0; i < total; ++i)
        detail::vocab_limit_op{vocab_limit()}(logits.data + i * logits.row_stride, c.vocab_size);
  }

  static void rope(float* v, index_t hd, const float* cs, const float* sn) noexcept {
    const index_t half = hd / 2;
    for (index_t i = 0; i < half; ++i) {
      const float x0 = v[i];
      const float x1 = v[i + half];
      v[i] = x0 * cs[i] - x1 * sn[i];
      v[i + half] = x0 * sn[i] + x1 * cs[i];
    }
  }

  /// One layer's weights as the kernels read them (see the constructor).
  struct packed_layer {
    detail::linear_weights qkv, wo, w13, w2;
  };

  transformer_weights w_;
  backend_options options_;
  detail::kernel_context kc_;
  std::vector<packed_layer> layers_;
  detail::linear_weights output_;
  std::vector<float> rope_cos_, rope_sin_;
  index_t vocab_limit_ = 0;  // 0: the whole vocabulary
};

}  // namespace specula::example
