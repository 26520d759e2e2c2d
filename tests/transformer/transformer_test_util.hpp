#pragma once

// Helpers for the example-backend tests: random models and an independent, deliberately naive
// double-precision reference forward pass written straight from docs/model_format.md.

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "specula_example/transformer.hpp"

namespace specula::example::testing {

inline transformer_config small_config(bool causal = true) {
  transformer_config c;
  c.vocab_size = 23;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 48;
  c.max_seq_len = 96;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.causal = causal;
  c.mask_token = causal ? -1 : 22;
  return c;
}

inline std::vector<float> random_vector(std::mt19937_64& g, std::size_t n, float scale,
                                        float offset = 0.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = offset + d(g);
  return v;
}

/// n tokens drawn uniformly from [0, vocab).
inline std::vector<token_t> random_tokens(std::mt19937_64& g, index_t n, index_t vocab) {
  std::uniform_int_distribution<token_t> d(0, static_cast<token_t>(vocab - 1));
  std::vector<token_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = d(g);
  return t;
}

inline transformer_weights random_weights(const transformer_config& c, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  transformer_weights w;
  w.config = c;
  const auto d = static_cast<std::size_t>(c.d_model);
  const float s = 0.5f / std::sqrt(static_cast<float>(c.d_model));
  w.tok_embeddings = random_vector(g, static_cast<std::size_t>(c.vocab_size) * d, 1.0f);
  for (index_t l = 0; l < c.n_layers; ++l) {
    layer_weights lw;
    lw.attention_norm = random_vector(g, d, 0.1f, 1.0f);
    lw.wq = random_vector(g, static_cast<std::size_t>(c.q_dim()) * d, 2.0f * s);
    lw.wk = random_vector(g, static_cast<std::size_t>(c.kv_dim()) * d, 2.0f * s);
    lw.wv = random_vector(g, static_cast<std::size_t>(c.kv_dim()) * d, s);
    lw.wo = random_vector(g, d * static_cast<std::size_t>(c.q_dim()), s);
    lw.ffn_norm = random_vector(g, d, 0.1f, 1.0f);
    lw.w1 = random_vector(g, static_cast<std::size_t>(c.d_ff) * d, 2.0f * s);
    lw.w3 = random_vector(g, static_cast<std::size_t>(c.d_ff) * d, 2.0f * s);
    lw.w2 = random_vector(g, d * static_cast<std::size_t>(c.d_ff), s);
    w.layers.push_back(std::move(lw));
  }
  w.norm = random_vector(g, d, 0.1f, 1.0f);
  w.output = random_vector(g, static_cast<std::size_t>(c.vocab_size) * d, 2.0f * s);
  return w;
}

/// Every layer's keys (after RoPE) and values at every position of a reference evaluation.
struct reference_kv {
  std::vector<std::vector<std::vector<double>>> k, v;  // [layer][position][kv_dim]
};

/// Naive reference: logits (T x V, double) of one whole sequence at positions 0..T-1, each
/// position attending to every position (bidirectional) or to itself and earlier ones (causal).
/// With `kept`, every layer's keys/values are stored there. With `frozen`, the keys/values of the
/// positions outside [begin, end) are taken from it instead (a dual cache's prefix and suffix);
/// then only the rows of [begin, end) are meaningful.
inline std::vector<double> reference_logits(const transformer_weights& w,
                                            std::span<const token_t> tokens,
                                            reference_kv* kept = nullptr,
                                            const reference_kv* frozen = nullptr, index_t begin = 0,
                                            index_t end = 0) {
  const transformer_config& c = w.config;
  const auto T = static_cast<index_t>(tokens.size());
  const index_t d = c.d_model, hd = c.head_dim(), V = c.vocab_size;
  using mat = std::vector<std::vector<double>>;
  const auto matvec = [](const std::vector<float>& m, index_t rows, index_t cols,
                         const std::vector<double>& x) {
    std::vector<double> y(static_cast<std::size_t>(rows), 0.0);
    for (index_t r = 0; r < rows; ++r)
      for (index_t k = 0; k < cols; ++k)
        y[static_cast<std::size_t>(r)] +=
            static_cast<double>(m[static_cast<std::size_t>(r * cols + k)]) *
            x[static_cast<std::size_t>(k)];
    return y;
  };
  const auto rms = [&](const std::vector<double>& x, const std::vector<float>& g) {
    double ss = 0.0;
    for (const double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.norm_eps);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * static_cast<double>(g[i]);
    return y;
  };
  const auto rope = [&](std::vector<double>& v, index_t heads, index_t pos) {
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < hd / 2; ++i) {
        const double f = std::pow(static_cast<double>(c.rope_theta),
                                  -2.0 * static_cast<double>(i) / static_cast<double>(hd));
        const double a = static_cast<double>(pos) * f;
        auto& x0 = v[static_cast<std::size_t>(h * hd + i)];
        auto& x1 = v[static_cast<std::size_t>(h * hd + i + hd / 2)];
        const double y0 = x0 * std::cos(a) - x1 * std::sin(a);
        const double y1 = x0 * std::sin(a) + x1 * std::cos(a);
        x0 = y0;
        x1 = y1;
      }
  };
  mat x(static_cast<std::size_t>(T));
  for (index_t t = 0; t < T; ++t)
    for (index_t i = 0; i < d; ++i)
      x[static_cast<std::size_t>(t)].push_back(
          w.tok_embeddings[static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)] * d + i)]);
  for (const layer_weights& l : w.layers) {
    mat q(static_cast<std::size_t>(T)), k(q), v(q);
    for (index_t t = 0; t < T; ++t) {
      const auto xn = rms(x[static_cast<std::size_t>(t)], l.attention_norm);
      q[static_cast<std::size_t>(t)] = matvec(l.wq, c.q_dim(), d, xn);
      k[static_cast<std::size_t>(t)] = matvec(l.wk, c.kv_dim(), d, xn);
      v[static_cast<std::size_t>(t)] = matvec(l.wv, c.kv_dim(), d, xn);
      rope(q[static_cast<std::size_t>(t)], c.n_heads, t);
      rope(k[static_cast<std::size_t>(t)], c.n_kv_heads, t);
    }
    const auto layer = static_cast<std::size_t>(&l - w.layers.data());
    if (frozen != nullptr)
      for (index_t t = 0; t < T; ++t)
        if (t < begin || t >= end) {
          k[static_cast<std::size_t>(t)] = frozen->k[layer][static_cast<std::size_t>(t)];
          v[static_cast<std::size_t>(t)] = frozen->v[layer][static_cast<std::size_t>(t)];
        }
    if (kept != nullptr) {
      kept->k.push_back(k);
      kept->v.push_back(v);
    }
    for (index_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<std::size_t>(c.q_dim()), 0.0);
      for (index_t h = 0; h < c.n_heads; ++h) {
        const index_t g = h / (c.n_heads / c.n_kv_heads);
        std::vector<double> s;
        double mx = -1e300;
        const index_t last = c.causal ? t : T - 1;
        for (index_t j = 0; j <= last; ++j) {
          double dotp = 0.0;
          for (index_t i = 0; i < hd; ++i)
            dotp += q[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * hd + i)] *
                    k[static_cast<std::size_t>(j)][static_cast<std::size_t>(g * hd + i)];
          s.push_back(dotp / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, s.back());
        }
        double z = 0.0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (index_t j = 0; j <= last; ++j)
          for (index_t i = 0; i < hd; ++i)
            att[static_cast<std::size_t>(h * hd + i)] +=
                s[static_cast<std::size_t>(j)] / z *
                v[static_cast<std::size_t>(j)][static_cast<std::size_t>(g * hd + i)];
      }
      const auto o = matvec(l.wo, d, c.q_dim(), att);
      for (index_t i = 0; i < d; ++i)
        x[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] +=
            o[static_cast<std::size_t>(i)];
    }
    for (index_t t = 0; t < T; ++t) {
      const auto hn = rms(x[static_cast<std::size_t>(t)], l.ffn_norm);
      auto a = matvec(l.w1, c.d_ff, d, hn);
      const auto b = matvec(l.w3, c.d_ff, d, hn);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
      const auto o = matvec(l.w2, d, c.d_ff, a);
      for (index_t i = 0; i < d; ++i)
        x[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] +=
            o[static_cast<std::size_t>(i)];
    }
  }
  std::vector<double> out;
  for (index_t t = 0; t < T; ++t) {
    const auto y = matvec(w.output, V, d, rms(x[static_cast<std::size_t>(t)], w.norm));
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

/// A random tree of n nodes (node 0 the root), depth at most max_depth, with random tokens.
inline token_tree random_tree(std::mt19937_64& g, index_t n, index_t max_depth, index_t vocab,
                              token_t root_token) {
  std::vector<index_t> parents{-1}, depth{0};
  std::vector<token_t> tokens{root_token};
  std::uniform_int_distribution<token_t> tok(0, static_cast<token_t>(vocab - 1));
  while (static_cast<index_t>(parents.size()) < n) {
    std::uniform_int_distribution<index_t> pick(0, static_cast<index_t>(parents.size()) - 1);
    const index_t p = pick(g);
    if (depth[static_cast<std::size_t>(p)] >= max_depth) continue;
    parents.push_back(p);
    depth.push_back(depth[static_cast<std::size_t>(p)] + 1);
    tokens.push_back(tok(g));
  }
  return token_tree(parents, tokens);
}

/// A session whose rows are set to -inf from token `limit` on after each evaluation, as the demo
/// restricts the image model's rows on the host: the reference of a model's vocabulary limit
/// (transformer::set_vocab_limit, device_transformer::set_vocab_limit).
template <class Session>
struct tail_masked_session : Session {
  index_t limit;
  template <class Model>
  tail_masked_session(const Model& m, index_t lim) : Session(m), limit(lim) {}
  void evaluate(const token_tree& nodes, batch_view<float> logits) {
    Session::evaluate(nodes, logits);
    for (index_t i = 0; i < nodes.size(); ++i)
      for (index_t v = limit; v < logits.cols; ++v)
        logits[i][v] = -std::numeric_limits<float>::infinity();
  }
};

}  // namespace specula::example::testing
