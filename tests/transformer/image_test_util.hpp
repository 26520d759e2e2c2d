#pragma once

// The image task's setup for the vocabulary-limit tests (host stand-ins and device tests):
// image-ar with its label tokens cut from every row, and the greedy window loops' options.

#include <filesystem>

#include "specula/decode/jacobi.hpp"
#include "specula/decode/multiblock.hpp"
#include "specula_example/transformer.hpp"
#include "specula_example/vq_image.hpp"

namespace specula::example::testing {

/// image-ar's weights and codebook; `limit()` is the first label token (the image tokens are
/// [0, limit)).
struct image_task {
  transformer_weights weights;
  vq_codebook vq;
  explicit image_task(const std::filesystem::path& dir)
      : weights(transformer_weights::load(dir / "image-ar.safetensors")),
        vq(vq_codebook::load(dir / "image-vq.safetensors", dir / "image-ar.safetensors")) {}
  [[nodiscard]] index_t limit() const noexcept { return vq.codes(); }
  [[nodiscard]] index_t tokens() const noexcept { return vq.tokens_per_image(); }
  /// A host transformer restricted to the image tokens.
  [[nodiscard]] transformer limited() const {
    transformer m(weights);
    m.set_vocab_limit(limit());
    return m;
  }
};

/// Jacobi with a window of 8, for n tokens.
inline jacobi_options jacobi_window8(index_t n) {
  jacobi_options o;
  o.window = 8;
  o.max_new_tokens = n;
  return o;
}

/// Multi-block decoding with two blocks of 8 (spawn ratio 0.5), for n tokens.
inline multiblock_options two_blocks_of8(index_t n) {
  multiblock_options o;
  o.block_size = 8;
  o.max_blocks = 2;
  o.spawn_ratio = 0.5;
  o.max_new_tokens = n;
  return o;
}

}  // namespace specula::example::testing
