#pragma once

/// @file
/// The VQ image tokenizer of the shipped image model: a codebook of 4x4 RGB patches
/// (image-vq.safetensors, tensor `codebook` [codes, patch*patch*3], each patch flattened in
/// (row, col, channel) order, pixels in [0, 1]) and the layout described by the file's
/// `specula.image` metadata: an image is a grid x grid array of codes in row-major order, and a
/// model sequence is [label token] + grid*grid image tokens. A model over larger images of the
/// same patches (image-ar-256: 64x64, a 16x16 grid) gives its own layout in the `specula.image`
/// metadata of its weights file; load(codebook, model) reads the codebook in that layout.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/core/error.hpp"
#include "specula/core/types.hpp"
#include "specula_example/safetensors.hpp"

namespace specula::example {

/// The codebook and image layout.
class vq_codebook {
 public:
  [[nodiscard]] static vq_codebook load(const std::filesystem::path& path) {
    const safetensors_file f = safetensors_file::open(path);
    vq_codebook c = layout_of(f);
    c.codebook_ = f.read_f32("codebook", {c.codes_, c.patch_dim()});
    return c;
  }

  /// The codebook of `codebook_path` in the image layout of the `specula.image` metadata of
  /// `model_path` (a model's weights file). The patch size, codebook size, classes and label
  /// tokens must match the codebook's; image_size and grid come from the model.
  [[nodiscard]] static vq_codebook load(const std::filesystem::path& codebook_path,
                                        const std::filesystem::path& model_path) {
    vq_codebook c = load(codebook_path);
    const safetensors_file m = safetensors_file::open(model_path);
    const vq_codebook layout = layout_of(m);
    if (layout.patch_ != c.patch_ || layout.codes_ != c.codes_ ||
        layout.label_base_ != c.label_base_ || layout.null_label_ != c.null_label_ ||
        layout.classes_ != c.classes_)
      m.fail(
          "specula.image: patch, codebook size, classes and label tokens must match the "
          "codebook's (" +
          codebook_path.string() + ")");
    c.image_size_ = layout.image_size_;
    c.grid_ = layout.grid_;
    return c;
  }

  [[nodiscard]] index_t image_size() const noexcept { return image_size_; }
  [[nodiscard]] index_t grid() const noexcept { return grid_; }
  [[nodiscard]] index_t patch() const noexcept { return patch_; }
  [[nodiscard]] index_t codes() const noexcept { return codes_; }
  [[nodiscard]] index_t patch_dim() const noexcept { return patch_ * patch_ * 3; }
  [[nodiscard]] index_t tokens_per_image() const noexcept { return grid_ * grid_; }
  [[nodiscard]] const std::vector<std::string>& classes() const noexcept { return classes_; }
  /// The codebook vector of image token t (patch_dim() values, (row, col, channel) order).
  [[nodiscard]] std::span<const float> code(token_t t) const {
    require_parameter(t >= 0 && t < codes_, "token", static_cast<double>(t),
                      "outside the codebook");
    return {codebook_.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(patch_dim()),
            static_cast<std::size_t>(patch_dim())};
  }
  /// The label token of class `c`, or the null (unconditional) label for c = -1.
  [[nodiscard]] token_t label_token(index_t c) const {
    if (c == -1) return null_label_;
    require_parameter(c >= 0 && c < static_cast<index_t>(classes_.size()), "class",
                      static_cast<double>(c), "outside [-1, number of classes)");
    return label_base_ + static_cast<token_t>(c);
  }

  /// RGB pixels in [0, 1] (image_size x image_size x 3, row-major) of grid*grid image tokens.
  [[nodiscard]] std::vector<float> decode(std::span<const token_t> tokens) const {
    check_tokens(tokens);
    const index_t n = image_size_;
    std::vector<float> rgb(static_cast<std::size_t>(n * n * 3));
    for (index_t t = 0; t < tokens_per_image(); ++t) {
      const float* code = codebook_.data() + tokens[static_cast<std::size_t>(t)] * patch_dim();
      const index_t gy = t / grid_, gx = t % grid_;
      for (index_t r = 0; r < patch_; ++r)
        for (index_t c = 0; c < patch_; ++c)
          for (index_t ch = 0; ch < 3; ++ch)
            rgb[static_cast<std::size_t>(((gy * patch_ + r) * n + gx * patch_ + c) * 3 + ch)] =
                code[(r * patch_ + c) * 3 + ch];
    }
    return rgb;
  }

  /// 8-bit RGB of decode(tokens).
  [[nodiscard]] std::vector<std::uint8_t> decode_rgb8(std::span<const token_t> tokens) const {
    const auto rgb = decode(tokens);
    std::vector<std::uint8_t> out(rgb.size());
    for (std::size_t i = 0; i < rgb.size(); ++i)
      out[i] = static_cast<std::uint8_t>(std::lround(std::clamp(rgb[i], 0.0f, 1.0f) * 255.0f));
    return out;
  }

  /// The nearest code (squared distance, ties to the lowest id) of every patch of an RGB image.
  [[nodiscard]] std::vector<token_t> encode(std::span<const float> rgb) const {
    const index_t n = image_size_;
    if (static_cast<index_t>(rgb.size()) != n * n * 3)
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(rgb.size())}, "rgb",
                      "needs image_size * image_size * 3 values");
    std::vector<token_t> out(static_cast<std::size_t>(tokens_per_image()));
    std::vector<float> p(static_cast<std::size_t>(patch_dim()));
    for (index_t t = 0; t < tokens_per_image(); ++t) {
      const index_t gy = t / grid_, gx = t % grid_;
      for (index_t r = 0; r < patch_; ++r)
        for (index_t c = 0; c < patch_; ++c)
          for (index_t ch = 0; ch < 3; ++ch)
            p[static_cast<std::size_t>((r * patch_ + c) * 3 + ch)] =
                rgb[static_cast<std::size_t>(((gy * patch_ + r) * n + gx * patch_ + c) * 3 + ch)];
      double best = INFINITY;
      for (index_t k = 0; k < codes_; ++k) {
        double dist = 0.0;
        for (index_t i = 0; i < patch_dim(); ++i) {
          const double diff = p[static_cast<std::size_t>(i)] -
                              codebook_[static_cast<std::size_t>(k * patch_dim() + i)];
          dist += diff * diff;
        }
        if (dist < best) {
          best = dist;
          out[static_cast<std::size_t>(t)] = static_cast<token_t>(k);
        }
      }
    }
    return out;
  }

 private:
  /// The layout fields of a file's `specula.image` metadata (no codebook).
  [[nodiscard]] static vq_codebook layout_of(const safetensors_file& f) {
    vq_codebook c;
    try {
      const nlohmann::json d = nlohmann::json::parse(f.required_metadata("specula.image"));
      c.image_size_ = d.at("image_size").get<index_t>();
      c.patch_ = d.at("patch").get<index_t>();
      c.grid_ = d.at("grid").get<index_t>();
      c.codes_ = d.at("codebook_size").get<index_t>();
      c.label_base_ = d.at("label_token_base").get<token_t>();
      c.null_label_ = d.at("null_label_token").get<token_t>();
      c.classes_ = d.at("classes").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      f.fail(std::string("bad specula.image metadata: ") + e.what());
    }
    if (c.grid_ <= 0 || c.grid_ * c.patch_ != c.image_size_ || c.codes_ <= 0)
      f.fail("specula.image: grid * patch must equal image_size");
    return c;
  }

  void check_tokens(std::span<const token_t> tokens) const {
    if (static_cast<index_t>(tokens.size()) != tokens_per_image())
      throw_if_failed({status::length_mismatch, -1, -1, static_cast<double>(tokens.size())},
                      "tokens", "needs grid * grid image tokens");
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || tokens[i] >= codes_)
        throw_if_failed({status::token_out_of_range, -1, static_cast<index_t>(i),
                         static_cast<double>(tokens[i])},
                        "tokens", "image tokens are codebook ids");
  }

  index_t image_size_ = 0, patch_ = 0, grid_ = 0, codes_ = 0;
  token_t label_base_ = 0, null_label_ = 0;
  std::vector<std::string> classes_;
  std::vector<float> codebook_;
};

}  // namespace specula::example
