#pragma once

/// @file
/// Toy autoregressive models with small vocabularies whose full sequence law is known exactly.
///
/// A `toy_ar_model` is a table: for every prefix of length t < horizon it holds a probability
/// row over the vocabulary (double precision, normalised). The law of a whole sequence is the
/// product of its conditionals, so sequence_law() enumerates all vocab^horizon sequences
/// exactly. Rows are generated from a seed with Philox and include zeros (controlled by
/// `sparsity`), so speculative decoding meets disjoint supports and q = 0 off-support.
/// `perturbed()` builds a draft model that differs from a target in a controlled way.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "specula/core/rng.hpp"
#include "specula/core/row.hpp"
#include "specula/core/types.hpp"
#include "specula/tree/token_tree.hpp"

namespace specula::testing {

/// A random probability row of length `vocab` from the stream (seed, id): entries u^3 for
/// uniform u (skewed, like real next-token rows), each zeroed with probability `sparsity`,
/// at least one entry kept; normalised in double.
inline std::vector<double> random_probability_row(index_t vocab, std::uint64_t seed,
                                                  std::uint32_t id, double sparsity = 0.0) {
  if (vocab <= 0) throw std::invalid_argument("specula::testing: vocab must be positive");
  std::vector<double> row(static_cast<std::size_t>(vocab));
  const request_rng rng{seed, id, 0};
  double sum = 0.0;
  for (index_t i = 0; i < vocab; ++i) {
    const double u = uniform_at(rng, draw_id{static_cast<std::uint32_t>(i), 0});
    const double keep = uniform_at(rng, draw_id{static_cast<std::uint32_t>(i), 1});
    const double v = keep < sparsity ? 0.0 : u * u * u;
    row[static_cast<std::size_t>(i)] = v;
    sum += v;
  }
  if (sum == 0.0) {
    const auto i =
        static_cast<std::size_t>(uniform_at(rng, draw_id{0, 2}) * static_cast<double>(vocab));
    row[i] = 1.0;
    sum = 1.0;
  }
  for (double& v : row) v /= sum;
  return row;
}

/// A table-driven autoregressive model over sequences of length `horizon`.
class toy_ar_model {
 public:
  /// Random model: every prefix row from random_probability_row(vocab, seed, prefix id).
  toy_ar_model(index_t vocab, index_t horizon, std::uint64_t seed, double sparsity = 0.3)
      : vocab_(vocab), horizon_(horizon) {
    check_shape();
    rows_.reserve(static_cast<std::size_t>(num_prefixes() * vocab_));
    for (index_t id = 0; id < num_prefixes(); ++id) {
      const auto row =
          random_probability_row(vocab_, seed, static_cast<std::uint32_t>(id), sparsity);
      rows_.insert(rows_.end(), row.begin(), row.end());
    }
  }

  /// Draft model: every row is (1 - mix) * base row + mix * a random row from `seed`. With
  /// sparsity > 0 the random rows have zeros, so the draft's support can differ from the
  /// target's when mix = 1.
  static toy_ar_model perturbed(const toy_ar_model& base, double mix, std::uint64_t seed,
                                double sparsity = 0.3) {
    if (!(mix >= 0.0 && mix <= 1.0))
      throw std::invalid_argument("specula::testing: mix must be in [0, 1]");
    toy_ar_model m = base;
    for (index_t id = 0; id < m.num_prefixes(); ++id) {
      const auto noise =
          random_probability_row(m.vocab_, seed, static_cast<std::uint32_t>(id), sparsity);
      double sum = 0.0;
      for (index_t y = 0; y < m.vocab_; ++y) {
        double& v = m.rows_[static_cast<std::size_t>(id * m.vocab_ + y)];
        v = (1.0 - mix) * v + mix * noise[static_cast<std::size_t>(y)];
        sum += v;
      }
      for (index_t y = 0; y < m.vocab_; ++y)
        m.rows_[static_cast<std::size_t>(id * m.vocab_ + y)] /= sum;
    }
    return m;
  }

  [[nodiscard]] index_t vocab_size() const noexcept { return vocab_; }
  [[nodiscard]] index_t horizon() const noexcept { return horizon_; }

  /// Number of prefixes with a row: sum_{t < horizon} vocab^t.
  [[nodiscard]] index_t num_prefixes() const noexcept {
    index_t n = 0;
    index_t p = 1;
    for (index_t t = 0; t < horizon_; ++t, p *= vocab_) n += p;
    return n;
  }

  /// The next-token row after `prefix` (length < horizon, tokens in range).
  [[nodiscard]] std::span<const double> row(std::span<const token_t> prefix) const {
    const index_t id = prefix_id(prefix);
    return {rows_.data() + id * vocab_, static_cast<std::size_t>(vocab_)};
  }

  /// Probability of a full sequence of length horizon.
  [[nodiscard]] double sequence_probability(std::span<const token_t> seq) const {
    if (static_cast<index_t>(seq.size()) != horizon_)
      throw std::invalid_argument("specula::testing: sequence length must equal the horizon");
    double p = 1.0;
    for (index_t t = 0; t < horizon_; ++t)
      p *= row(seq.first(
          static_cast<std::size_t>(t)))[static_cast<std::size_t>(seq[static_cast<std::size_t>(t)])];
    return p;
  }

  /// Number of full sequences: vocab^horizon.
  [[nodiscard]] index_t num_sequences() const noexcept {
    index_t n = 1;
    for (index_t t = 0; t < horizon_; ++t) n *= vocab_;
    return n;
  }

  /// Exact law of full sequences, indexed by sequence_index().
  [[nodiscard]] std::vector<double> sequence_law() const {
    std::vector<double> law(static_cast<std::size_t>(num_sequences()));
    std::vector<token_t> seq(static_cast<std::size_t>(horizon_));
    for (index_t s = 0; s < num_sequences(); ++s) {
      index_t k = s;
      for (index_t t = horizon_ - 1; t >= 0; --t) {
        seq[static_cast<std::size_t>(t)] = static_cast<token_t>(k % vocab_);
        k /= vocab_;
      }
      law[static_cast<std::size_t>(s)] = sequence_probability(seq);
    }
    return law;
  }

  /// Base-vocab index of a sequence (first token most significant).
  [[nodiscard]] index_t sequence_index(std::span<const token_t> seq) const {
    index_t k = 0;
    for (token_t t : seq) {
      if (t < 0 || t >= vocab_)
        throw std::invalid_argument("specula::testing: token out of range in sequence_index");
      k = k * vocab_ + t;
    }
    return k;
  }

 private:
  void check_shape() const {
    if (vocab_ < 1 || horizon_ < 1)
      throw std::invalid_argument("specula::testing: vocab and horizon must be positive");
    double n = std::pow(static_cast<double>(vocab_), static_cast<double>(horizon_));
    if (n > 1e7) throw std::invalid_argument("specula::testing: vocab^horizon too large");
  }

  [[nodiscard]] index_t prefix_id(std::span<const token_t> prefix) const {
    const auto t = static_cast<index_t>(prefix.size());
    if (t >= horizon_)
      throw std::invalid_argument("specula::testing: prefix must be shorter than the horizon");
    index_t offset = 0;
    index_t p = 1;
    for (index_t i = 0; i < t; ++i, p *= vocab_) offset += p;
    index_t k = 0;
    for (token_t tok : prefix) {
      if (tok < 0 || tok >= vocab_)
        throw std::invalid_argument("specula::testing: token out of range in prefix");
      k = k * vocab_ + tok;
    }
    return offset + k;
  }

  index_t vocab_;
  index_t horizon_;
  std::vector<double> rows_;
};

namespace detail {

/// The cache both toy session models keep: the committed tokens, and the tree last evaluated,
/// pending until one of its root-to-node paths is committed or it is dropped (prefill,
/// rollback). Their prefill / rollback / commit, with the checks that refuse misuse.
class toy_session_cache {
 public:
  [[nodiscard]] index_t context_size() const noexcept {
    return static_cast<index_t>(context_.size());
  }
  [[nodiscard]] std::span<const token_t> context() const noexcept { return context_; }

  void prefill(std::span<const token_t> prompt) {
    if (prompt.empty()) throw std::invalid_argument("specula::testing: empty prompt");
    context_.assign(prompt.begin(), prompt.end() - 1);
    pending_.clear();
  }
  void rollback(index_t n) {
    if (n < 0 || n > context_size())
      throw std::invalid_argument("specula::testing: rollback beyond the context");
    context_.resize(static_cast<std::size_t>(n));
    pending_.clear();
  }
  void commit(std::span<const index_t> path) {
    for (std::size_t k = 0; k < path.size(); ++k) {
      const index_t node = path[k];
      if (node < 0 || node >= static_cast<index_t>(pending_.size()) ||
          pending_parent_[static_cast<std::size_t>(node)] != (k == 0 ? -1 : path[k - 1]))
        throw std::invalid_argument("specula::testing: commit path is not a root-to-node path");
      context_.push_back(pending_[static_cast<std::size_t>(node)]);
    }
    pending_.clear();
  }

 protected:
  /// An evaluation's start: refuses rows that are not nodes x `vocab` and keeps `nodes` pending.
  void begin_evaluate(const token_tree& nodes, batch_view<float> logits, index_t vocab) {
    if (logits.rows != nodes.size() || logits.cols != vocab)
      throw std::invalid_argument("specula::testing: logits must be nodes x vocab");
    pending_.assign(nodes.tokens().begin(), nodes.tokens().end());
    pending_parent_.assign(nodes.parents().begin(), nodes.parents().end());
  }

  std::vector<token_t> context_, pending_;
  std::vector<index_t> pending_parent_;
};

}  // namespace detail

/// A toy_ar_model as a decoding-loop model (specula::session_model): sequences start with one
/// BOS token (any id; the model ignores it), so the row of the node at sequence position k
/// (BOS at 0) is the toy row of the k tokens after BOS. Logits are log-probabilities (-inf
/// where the toy row is 0); past the horizon every row is uniform. Evaluation is exact table
/// lookup, so decoding loops run on it with a known output law.
class toy_model_session : public detail::toy_session_cache {
 public:
  explicit toy_model_session(const toy_ar_model& model) : model_(&model) {}

  [[nodiscard]] index_t vocab_size() const noexcept { return model_->vocab_size(); }

  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    const index_t V = vocab_size();
    begin_evaluate(nodes, logits, V);
    for (index_t i = 0; i < nodes.size(); ++i) {
      // Full sequence: context, then the path root .. i; the prefix drops the BOS token (the
      // root's when there is no context). Buffers kept between calls: no allocation per node.
      path_.clear();
      for (index_t u = i; u >= 0; u = nodes.parent(u)) path_.push_back(u);  // i .. root
      prefix_.assign(context_.begin() + (context_.empty() ? 0 : 1), context_.end());
      for (std::size_t k = path_.size() - (context_.empty() ? 1 : 0); k-- > 0;)
        prefix_.push_back(nodes.token(path_[k]));
      auto row = logits.row(i);
      if (static_cast<index_t>(prefix_.size()) >= model_->horizon()) {
        for (index_t y = 0; y < V; ++y) row[y] = 0.0f;
        continue;
      }
      const auto p = model_->row(prefix_);
      for (index_t y = 0; y < V; ++y) {
        const double v = p[static_cast<std::size_t>(y)];
        row[y] = v > 0.0 ? static_cast<float>(std::log(v)) : -INFINITY;
      }
    }
  }

 private:
  const toy_ar_model* model_;
  std::vector<index_t> path_;
  std::vector<token_t> prefix_;
};

/// A toy masked (diffusion) model for testing decoders of masked models (`masked_model`): token
/// ids 0 .. vocab - 2 plus the mask token vocab - 1. The logit row at position i is a
/// pseudo-random function of (seed, i, the tokens at i - 1 and i + 1), so unmasking one
/// position changes only its neighbours' rows — drafts taken from stale rows are often, not
/// always, still right, as with real diffusion models.
class toy_masked_model {
 public:
  toy_masked_model(index_t vocab, std::uint64_t seed) : vocab_(vocab), seed_(seed) {
    if (vocab < 2) throw std::invalid_argument("specula::testing: vocab must be >= 2");
  }
  [[nodiscard]] index_t vocab_size() const noexcept { return vocab_; }
  [[nodiscard]] token_t mask_token() const noexcept { return static_cast<token_t>(vocab_ - 1); }

  void evaluate_sequences(std::span<const token_t> tokens, index_t length,
                          batch_view<float> logits) const {
    if (length <= 0 || tokens.size() % static_cast<std::size_t>(length) != 0 ||
        logits.rows != static_cast<index_t>(tokens.size()) || logits.cols != vocab_)
      throw std::invalid_argument("specula::testing: toy_masked_model shapes");
    for (index_t r = 0; r < logits.rows; ++r) {
      const index_t i = r % length;
      const auto at = [&](index_t j) -> std::uint32_t {
        return j < 0 || j >= length
                   ? 0xFFFFu
                   : static_cast<std::uint32_t>(tokens[static_cast<std::size_t>(r - i + j)]);
      };
      const request_rng rng{seed_, static_cast<std::uint32_t>(i), (at(i - 1) << 16) | at(i + 1)};
      auto row = logits.row(r);
      for (index_t y = 0; y < vocab_; ++y)
        row[y] = y == vocab_ - 1
                     ? -INFINITY
                     : static_cast<float>(
                           4.0 * uniform_at(rng, draw_id{static_cast<std::uint32_t>(y), 0}));
    }
  }

 private:
  index_t vocab_;
  std::uint64_t seed_;
};

/// A first-order Markov toy model as a `session_model` whose evaluation costs one row copy per
/// node: the logit row of a node depends on its own token only (row t of a random vocab x vocab
/// table, shared by copies). Its cache is the committed token list, 4 bytes per token. For load
/// tests and benchmarks of the loops' own overhead (thousands of requests, long generations),
/// where toy_model_session's exact sequence law is not needed.
class toy_markov_session : public detail::toy_session_cache {
 public:
  toy_markov_session(index_t vocab, std::uint64_t seed)
      : vocab_(vocab), table_(std::make_shared<std::vector<float>>()) {
    if (vocab < 1) throw std::invalid_argument("specula::testing: vocab must be positive");
    table_->resize(static_cast<std::size_t>(vocab * vocab));
    for (index_t t = 0; t < vocab; ++t) {
      const auto row = random_probability_row(vocab, seed, static_cast<std::uint32_t>(t), 0.0);
      for (index_t y = 0; y < vocab; ++y)
        (*table_)[static_cast<std::size_t>(t * vocab + y)] =
            static_cast<float>(std::log(row[static_cast<std::size_t>(y)]));
    }
  }

  [[nodiscard]] index_t vocab_size() const noexcept { return vocab_; }
  [[nodiscard]] std::size_t capacity_bytes() const noexcept {
    return (context_.capacity() + pending_.capacity()) * sizeof(token_t) +
           pending_parent_.capacity() * sizeof(index_t);
  }

  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    begin_evaluate(nodes, logits, vocab_);
    for (index_t i = 0; i < nodes.size(); ++i) {
      const float* row = table_->data() + static_cast<std::ptrdiff_t>(nodes.token(i)) * vocab_;
      std::copy(row, row + vocab_, logits.data + i * logits.row_stride);
    }
  }

 private:
  index_t vocab_;
  std::shared_ptr<std::vector<float>> table_;
};

}  // namespace specula::testing
