#pragma once

/// @file
/// specula's decoding loops over llama.cpp: `specula::example::llama_model` is a GGUF model in
/// one llama.cpp context seen through the loops' concepts, both
///
/// - `specula::session_model` (one request: `prefill`, `evaluate(tree, logits)`, `commit(path)`,
///   `rollback(n)`, `context_size()`), for chains, token trees and Jacobi windows alike; and
/// - `specula::batched_session_model` (several requests in one `llama_decode` call, the same
///   operations with the request index first), the batched loops' model.
///
/// It depends on llama.h only (the release pinned by scripts/llama_cpp.sh; the `llama_memory_*`
/// API, llama.cpp >= b5700 or so) and is meant to be copied into an engine as it is.
///
/// How a token tree maps onto llama.cpp's memory (KV cache)
/// --------------------------------------------------------
/// Request r owns the sequence ids [r * max_leaves, (r + 1) * max_leaves); its committed context
/// lives in the first of them (its "main" sequence) at positions 0 .. n - 1. `evaluate` gives
/// each leaf of the tree its own sequence id, copies the committed context into those sequences
/// (`llama_memory_seq_cp`: in a unified cache this only tags the cells, nothing is copied), and
/// puts every node into the batch at position n + depth with the ids of all leaves below it. A
/// node then attends to the cells of its first sequence id up to its own position: the committed
/// context, its ancestors and itself, which is tree attention. `commit(path)` keeps the path's
/// cells (the first len positions of a sequence through the path's last node) and removes the
/// other nodes (`llama_memory_seq_rm`), leaving the main sequence only; `rollback(n)` is one
/// `llama_memory_seq_rm`.
///
/// Settings exactness needs (what `llama_model_options::exact` sets, the default)
/// -----------------------------------------------------------------------------
/// - F32 weights (tools/to_gguf.py writes F32) and an F32 KV cache (`type_k = type_v = F32`);
/// - flash attention off (`flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED`);
/// - `kv_unified = true` (required: tree sequences share the context's cells) and
///   `n_seq_max = requests * max_leaves` (llama.cpp allows at most 256 sequence ids);
/// - `n_ubatch = n_batch` (a tree is one physical batch).
/// With them llama.cpp's logits match specula's example backend to ~1e-5 on the shipped models,
/// so greedy loops reproduce greedy decoding and held-out NLLs match the cards. llama.cpp's
/// defaults (F16 cache, flash attention auto) move logits by ~1e-2, and BF16/F16 weights by
/// ~4e-2: still a valid model, but then greedy outputs may flip at near-ties relative to another
/// engine (never relative to plain greedy decoding over the same settings, which is what the
/// lossless loops guarantee). `exact = false` keeps llama.cpp's defaults for the cache and
/// attention.
///
/// The GGUF files come from tools/to_gguf.py (tokenizer "none": token ids are fed directly;
/// llama.cpp's tokenizer is never called).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <ggml-backend.h>
#include <llama.h>

#include "specula/core/error.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/decode/concepts.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula::example {

/// Options of a `llama_model` (see file comment).
struct llama_model_options {
  index_t requests = 1;          ///< requests served by the context (batched API), >= 1
  index_t max_leaves = 64;       ///< leaves of one request's tree; requests * max_leaves <= 256
  index_t max_tree_nodes = 512;  ///< nodes of one evaluate call, all requests together (n_batch)
  index_t context = 0;           ///< KV cells per request; 0: the model's training context
  int threads = 1;               ///< llama.cpp threads (n_threads and n_threads_batch)
  bool exact = true;             ///< F32 KV cache, flash attention off (see file comment)
};

namespace detail {

/// Silences llama.cpp's log unless SPECULA_LLAMA_LOG is set; initialises its backends once.
inline void llama_init_once() {
  static const bool done = [] {
    if (std::getenv("SPECULA_LLAMA_LOG") == nullptr)
      llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    llama_backend_init();
    return true;
  }();
  (void)done;
}

/// Whether a CPU backend feature named `name` (e.g. "LLAMAFILE", "AVX512") is on in the loaded
/// llama.cpp (its ggml CPU backend's `ggml_backend_get_features`); false without a CPU backend.
inline bool llama_cpu_feature(const char* name) {
  ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
  if (reg == nullptr) return false;
  auto get = reinterpret_cast<ggml_backend_get_features_t>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
  if (get == nullptr) return false;
  for (const ggml_backend_feature* f = get(reg); f->name != nullptr; ++f)
    if (std::string(f->name) == name) return std::string(f->value) != "0";
  return false;
}

struct llama_model_deleter {
  void operator()(::llama_model* m) const noexcept { llama_model_free(m); }
};
struct llama_context_deleter {
  void operator()(::llama_context* c) const noexcept { llama_free(c); }
};
struct llama_batch_deleter {
  void operator()(::llama_batch* b) const noexcept {
    llama_batch_free(*b);
    delete b;
  }
};

}  // namespace detail

/// A GGUF model in one llama.cpp context, as a `session_model` (request 0) and a
/// `batched_session_model` (see file comment). Not copyable; movable.
class llama_model {
 public:
  explicit llama_model(const std::filesystem::path& gguf, const llama_model_options& options = {})
      : options_(options) {
    require_parameter(options.requests >= 1, "requests", static_cast<double>(options.requests),
                      "must be >= 1");
    require_parameter(options.max_leaves >= 1, "max_leaves",
                      static_cast<double>(options.max_leaves), "must be >= 1");
    require_parameter(options.requests * options.max_leaves <= 256, "max_leaves",
                      static_cast<double>(options.max_leaves),
                      "requests * max_leaves must be <= 256 (llama.cpp's sequence ids)");
    require_parameter(options.max_tree_nodes >= 1, "max_tree_nodes",
                      static_cast<double>(options.max_tree_nodes), "must be >= 1");
    require_parameter(options.threads >= 1, "threads", static_cast<double>(options.threads),
                      "must be >= 1");
    detail::llama_init_once();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model_.reset(llama_model_load_from_file(gguf.string().c_str(), mp));
    if (!model_) throw std::runtime_error("llama_model: cannot load '" + gguf.string() + "'");
    vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_.get()));
    const index_t per_request =
        options.context > 0 ? options.context : llama_model_n_ctx_train(model_.get());

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<std::uint32_t>(options.requests * per_request + options.max_tree_nodes);
    cp.n_batch = cp.n_ubatch = static_cast<std::uint32_t>(options.max_tree_nodes);
    cp.n_seq_max = static_cast<std::uint32_t>(options.requests * options.max_leaves);
    cp.n_threads = cp.n_threads_batch = options.threads;
    cp.kv_unified = true;
    cp.no_perf = true;
    if (options.exact) {
      cp.type_k = cp.type_v = GGML_TYPE_F32;
      cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    context_.reset(llama_init_from_model(model_.get(), cp));
    if (!context_) throw std::runtime_error("llama_model: cannot create a llama.cpp context");
    batch_.reset(new ::llama_batch(
        llama_batch_init(static_cast<std::int32_t>(options.max_tree_nodes), 0, cp.n_seq_max)));
    requests_.resize(static_cast<std::size_t>(options.requests));
  }

  [[nodiscard]] index_t vocab_size() const noexcept { return vocab_; }
  [[nodiscard]] index_t batch_size() const noexcept { return options_.requests; }
  [[nodiscard]] const llama_model_options& options() const noexcept { return options_; }
  [[nodiscard]] ::llama_context* context() const noexcept { return context_.get(); }
  /// `llama_decode` calls so far.
  [[nodiscard]] std::int64_t decode_calls() const noexcept { return decode_calls_; }

  // ---- session_model (request 0) ----
  void prefill(std::span<const token_t> prompt) { prefill(0, prompt); }
  [[nodiscard]] index_t context_size() const { return context_size(0); }
  void rollback(index_t n) { rollback(0, n); }
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    const index_t r = 0;
    evaluate(std::span<const index_t>(&r, 1), std::span<const token_tree>(&nodes, 1), logits);
  }
  void commit(std::span<const index_t> path) { commit(0, path); }

  // ---- batched_session_model ----

  /// Starts request `request`: drops its memory and commits all of `prompt` but its last token
  /// (the root of its first tree).
  void prefill(index_t request, std::span<const token_t> prompt) {
    request_state& q = state(request);
    if (prompt.empty()) throw_if_failed({status::empty_input, request, -1, 0.0}, "prompt");
    check_tokens(prompt, "prompt");
    clear_tree_sequences(request, q.pending ? q.leaves : 1);
    llama_memory_seq_rm(memory(), main_seq(request), -1, -1);
    q.size = 0;
    q.pending = false;
    const index_t n = static_cast<index_t>(prompt.size()) - 1;
    for (index_t begin = 0; begin < n; begin += options_.max_tree_nodes) {
      const index_t end = std::min(n, begin + options_.max_tree_nodes);
      llama_batch& b = *batch_;
      b.n_tokens = 0;
      for (index_t i = begin; i < end; ++i) {
        const std::int32_t k = b.n_tokens++;
        b.token[k] = prompt[static_cast<std::size_t>(i)];
        b.pos[k] = static_cast<llama_pos>(i);
        b.n_seq_id[k] = 1;
        b.seq_id[k][0] = main_seq(request);
        b.logits[k] = 0;
      }
      decode("prefill");
    }
    q.size = n;
  }

  [[nodiscard]] index_t context_size(index_t request) const {
    return requests_[checked(request)].size;
  }

  /// Keeps the first n committed tokens of request `request` (drops any pending tree).
  void rollback(index_t request, index_t n) {
    request_state& q = state(request);
    if (n < 0 || n > q.size)
      throw_if_failed({status::invalid_parameter, request, -1, static_cast<double>(n)}, "n",
                      "outside [0, context_size]");
    if (q.pending) clear_tree_sequences(request, q.leaves);
    llama_memory_seq_rm(memory(), main_seq(request), static_cast<llama_pos>(n), -1);
    q.size = n;
    q.pending = false;
  }

  /// One `llama_decode` over the listed requests' trees (distinct requests, in list order); one
  /// logit row per node, requests' nodes concatenated in list order.
  void evaluate(std::span<const index_t> requests, std::span<const token_tree> trees,
                batch_view<float> logits) {
    if (requests.size() != trees.size())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(trees.size())}, "trees",
                      "one tree per listed request");
    index_t total = 0;
    for (std::size_t i = 0; i < trees.size(); ++i) {
      (void)checked(requests[i]);
      for (std::size_t j = 0; j < i; ++j)
        if (requests[j] == requests[i])
          throw_if_failed({status::invalid_parameter, static_cast<index_t>(i), -1,
                           static_cast<double>(requests[i])},
                          "requests", "listed twice");
      total += trees[i].size();
    }
    if (logits.rows != total || logits.cols != vocab_)
      throw_if_failed(
          {status::length_mismatch, -1, -1, static_cast<double>(logits.rows)}, "logits",
          ("needs " + std::to_string(total) + " rows of " + std::to_string(vocab_)).c_str());
    if (total > options_.max_tree_nodes)
      throw_if_failed({status::invalid_parameter, -1, -1, static_cast<double>(total)}, "trees",
                      "more nodes than llama_model_options::max_tree_nodes");

    llama_batch& b = *batch_;
    b.n_tokens = 0;
    for (std::size_t i = 0; i < trees.size(); ++i) add_tree(requests[i], trees[i], b);
    decode("evaluate");
    for (index_t k = 0; k < total; ++k) {
      const float* row = llama_get_logits_ith(context_.get(), static_cast<std::int32_t>(k));
      if (row == nullptr) throw std::runtime_error("llama_model: llama.cpp returned no logits");
      std::copy_n(row, vocab_, logits.row(k).data);
    }
  }

  /// Commits request `request`'s accepted path (local node ids of its last tree, root first)
  /// and drops the rest of that tree (an empty path drops all of it).
  void commit(index_t request, std::span<const index_t> path) {
    request_state& q = state(request);
    const index_t len = static_cast<index_t>(path.size());
    if (len == 0) {  // commits nothing; drops the pending tree
      if (q.pending) rollback(request, q.size);
      return;
    }
    if (!q.pending)
      throw_if_failed({status::invalid_parameter, request, -1, 0.0}, "path",
                      "no evaluated tree to commit from");
    const auto nodes = static_cast<index_t>(q.parent.size());
    for (index_t i = 0; i < len; ++i) {
      const index_t u = path[static_cast<std::size_t>(i)];
      const index_t expected_parent = i == 0 ? -1 : path[static_cast<std::size_t>(i - 1)];
      if (u < 0 || u >= nodes || q.parent[static_cast<std::size_t>(u)] != expected_parent)
        throw_if_failed({status::invalid_parameter, i, -1, static_cast<double>(u)}, "path",
                        "not a root-to-node path of the evaluated tree");
    }
    const llama_seq_id s = q.seq_of[static_cast<std::size_t>(path.back())];
    const llama_seq_id main = main_seq(request);
    const auto n = static_cast<llama_pos>(q.size);
    llama_memory_t mem = memory();
    // s holds the committed context and the path at positions n .. n + len - 1.
    llama_memory_seq_rm(mem, s, n + static_cast<llama_pos>(len), -1);
    if (s != main) {
      llama_memory_seq_rm(mem, main, n, -1);
      llama_memory_seq_cp(mem, s, main, n, n + static_cast<llama_pos>(len));
    }
    clear_tree_sequences(request, q.leaves);
    q.size += len;
    q.pending = false;
  }

 private:
  struct request_state {
    index_t size = 0;                  // committed tokens
    bool pending = false;              // an evaluated tree not yet committed
    index_t leaves = 0;                // sequences the pending tree used
    std::vector<index_t> parent;       // the pending tree's parents
    std::vector<llama_seq_id> seq_of;  // a sequence through each node (its first leaf's)
  };

  [[nodiscard]] std::size_t checked(index_t request) const {
    if (request < 0 || request >= options_.requests)
      throw_if_failed({status::invalid_parameter, request, -1, static_cast<double>(request)},
                      "request", "outside [0, batch_size)");
    return static_cast<std::size_t>(request);
  }
  [[nodiscard]] request_state& state(index_t request) { return requests_[checked(request)]; }
  [[nodiscard]] llama_seq_id main_seq(index_t request) const {
    return static_cast<llama_seq_id>(request * options_.max_leaves);
  }
  [[nodiscard]] llama_memory_t memory() const { return llama_get_memory(context_.get()); }

  void check_tokens(std::span<const token_t> tokens, const char* what) const {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || tokens[i] >= vocab_)
        throw_if_failed({status::token_out_of_range, static_cast<index_t>(i), -1,
                         static_cast<double>(tokens[i])},
                        what, "outside [0, vocab_size)");
  }

  /// Empties the first `used` sequences of request `request` but its main one (outside a
  /// pending tree, the others are empty: commit and rollback empty them).
  void clear_tree_sequences(index_t request, index_t used) {
    for (index_t k = 1; k < used; ++k)
      llama_memory_seq_rm(memory(), main_seq(request) + static_cast<llama_seq_id>(k), -1, -1);
  }

  void add_tree(index_t request, const token_tree& tree, llama_batch& b) {
    request_state& q = state(request);
    const index_t nodes = tree.size();
    check_tokens(tree.tokens(), "tree tokens");
    // A tree evaluated over a pending one replaces it.
    const llama_seq_id main = main_seq(request);
    llama_memory_t mem = memory();
    if (q.pending) {
      llama_memory_seq_rm(mem, main, static_cast<llama_pos>(q.size), -1);
      clear_tree_sequences(request, q.leaves);
    }
    // Leaves get sequence ids main, main + 1, ...; each node carries the ids of the leaves
    // below it (its first: the first leaf below it, in node order).
    std::vector<std::vector<llama_seq_id>>& ids = ids_;
    ids.assign(static_cast<std::size_t>(nodes), {});
    index_t leaves = 0;
    for (index_t u = 0; u < nodes; ++u) {
      if (tree.num_children(u) > 0) continue;
      if (leaves == options_.max_leaves)
        throw_if_failed({status::invalid_parameter, request, -1, static_cast<double>(leaves + 1)},
                        "trees", "more leaves than llama_model_options::max_leaves");
      const llama_seq_id s = main + static_cast<llama_seq_id>(leaves++);
      for (index_t v = u; v >= 0; v = tree.parent(v)) ids[static_cast<std::size_t>(v)].push_back(s);
    }
    for (index_t k = 1; k < leaves; ++k)
      llama_memory_seq_cp(mem, main, main + static_cast<llama_seq_id>(k), -1, -1);
    q.parent.assign(tree.parents().begin(), tree.parents().end());
    q.seq_of.resize(static_cast<std::size_t>(nodes));
    for (index_t u = 0; u < nodes; ++u) {
      const auto& s = ids[static_cast<std::size_t>(u)];
      const std::int32_t k = b.n_tokens++;
      b.token[k] = tree.token(u);
      b.pos[k] = static_cast<llama_pos>(q.size + tree.depth(u));
      b.n_seq_id[k] = static_cast<std::int32_t>(s.size());
      std::copy(s.begin(), s.end(), b.seq_id[k]);
      b.logits[k] = 1;
      q.seq_of[static_cast<std::size_t>(u)] = s.front();
    }
    q.leaves = leaves;
    q.pending = true;
  }

  void decode(const char* what) {
    if (batch_->n_tokens == 0) return;
    ++decode_calls_;
    const std::int32_t rc = llama_decode(context_.get(), *batch_);
    if (rc != 0)
      throw std::runtime_error(
          std::string("llama_model: llama_decode failed in ") + what + " (code " +
          std::to_string(rc) +
          (rc == 1 ? ": no KV cache slot; raise llama_model_options::context" : "") + ")");
  }

  llama_model_options options_;
  std::unique_ptr<::llama_model, detail::llama_model_deleter> model_;
  std::unique_ptr<::llama_context, detail::llama_context_deleter> context_;
  std::unique_ptr<::llama_batch, detail::llama_batch_deleter> batch_;
  index_t vocab_ = 0;
  std::vector<request_state> requests_;
  std::vector<std::vector<llama_seq_id>> ids_;
  std::int64_t decode_calls_ = 0;
};

/// Whether the loaded llama.cpp multiplies F32 (and F16/BF16) weights by two or more tokens with
/// llamafile's tinyBLAS (`GGML_LLAMAFILE=ON`, llama.cpp's default and scripts/llama_cpp.sh's;
/// `SPECULA_LLAMA_CPP_LLAMAFILE=0` builds without it). With it, a pass of n >= 2 tokens sums each
/// logit in another order than a one-token pass (which always uses ggml's dot products): the rows
/// of a chain differ from one-token passes' by rounding (~5e-6 on the shipped models), so greedy
/// SD over llama.cpp equals plain greedy decoding over it except at near-ties that rounding can
/// flip. Without it, ggml's dot product computes every (weight row, token) pair the same way in
/// every pass, and the rows of a chain are, bit for bit, the rows that one-token passes give.
/// Cost: docs/RESULTS.md (tinyBLAS is slower for passes of 2-7 tokens and faster from ~9).
inline bool llama_uses_llamafile() {
  detail::llama_init_once();
  return detail::llama_cpu_feature("LLAMAFILE");
}

static_assert(session_model<llama_model>);
static_assert(batched_session_model<llama_model>);

}  // namespace specula::example
