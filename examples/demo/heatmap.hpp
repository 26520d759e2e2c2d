#pragma once

/// @file
/// Acceptance heat maps for specula_demo (SJD paper, Fig. 13 style): each token cell of an
/// image's grid is coloured by how many tokens the decoding step that produced it emitted
/// (accepted drafts + 1), on a viridis-like ramp, with the count written in the cell and a
/// legend strip of the ramp below the grid.

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "png_writer.hpp"

namespace specula_demo {

/// Per token, the number of tokens emitted by the step that produced it: step s emitted
/// step_tokens[s] tokens, in order. Returns the first n entries; throws if the steps emitted
/// fewer than n tokens.
[[nodiscard]] inline std::vector<index_t> per_token_step_sizes(std::span<const index_t> step_tokens,
                                                               index_t n) {
  std::vector<index_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for (const index_t k : step_tokens)
    for (index_t j = 0; j < k && static_cast<index_t>(out.size()) < n; ++j) out.push_back(k);
  if (static_cast<index_t>(out.size()) < n)
    throw std::runtime_error("per_token_step_sizes: the steps emitted " +
                             std::to_string(out.size()) + " tokens, fewer than " +
                             std::to_string(n));
  return out;
}

/// The ramp colour of value v in [1, vmax] (viridis control points, linear in between).
[[nodiscard]] inline rgb8 heat_colour(index_t v, index_t vmax) {
  static constexpr std::array<std::array<double, 3>, 5> stops = {
      {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};
  const double t =
      vmax <= 1 ? 0.0
                : std::clamp(static_cast<double>(v - 1) / static_cast<double>(vmax - 1), 0.0, 1.0);
  const double x = t * static_cast<double>(stops.size() - 1);
  const auto i = std::min<std::size_t>(static_cast<std::size_t>(x), stops.size() - 2);
  const double f = x - static_cast<double>(i);
  const auto mix = [&](std::size_t c) {
    return static_cast<std::uint8_t>(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]) + 0.5);
  };
  return {mix(0), mix(1), mix(2)};
}

namespace detail {

/// 3x5 bitmap digits, rows top to bottom, 3 bits per row (most significant bit = left column).
inline constexpr std::array<std::uint16_t, 10> digit_glyphs = {
    0b111'101'101'101'111,  // 0
    0b010'110'010'010'111,  // 1
    0b111'001'111'100'111,  // 2
    0b111'001'111'001'111,  // 3
    0b101'101'111'001'001,  // 4
    0b111'100'111'001'111,  // 5
    0b111'100'111'101'111,  // 6
    0b111'001'001'010'010,  // 7
    0b111'101'111'101'111,  // 8
    0b111'101'111'001'111,  // 9
};

/// Width in pixels of `value` written with draw_number at `scale`.
[[nodiscard]] inline index_t number_width(index_t value, index_t scale) {
  const auto digits = static_cast<index_t>(std::to_string(value).size());
  return digits * 3 * scale + (digits - 1) * scale;
}

/// Writes the decimal digits of `value` with their top-left corner at (x, y).
inline void draw_number(rgb8_image& img, index_t x, index_t y, index_t value, index_t scale,
                        rgb8 colour) {
  for (const char ch : std::to_string(value)) {
    if (ch < '0' || ch > '9') continue;
    const std::uint16_t g = digit_glyphs[static_cast<std::size_t>(ch - '0')];
    for (index_t r = 0; r < 5; ++r)
      for (index_t c = 0; c < 3; ++c)
        if (((g >> ((4 - r) * 3 + (2 - c))) & 1u) != 0)
          img.fill_rect(x + c * scale, y + r * scale, scale, scale, colour);
    x += 4 * scale;
  }
}

/// Black or white, whichever reads better on `bg`.
[[nodiscard]] inline rgb8 text_colour(rgb8 bg) {
  const double lum = 0.299 * bg.r + 0.587 * bg.g + 0.114 * bg.b;
  return lum > 140.0 ? rgb8{0, 0, 0} : rgb8{255, 255, 255};
}

}  // namespace detail

/// The heat map of a grid x grid image (tokens in row-major order, `per_token` from
/// per_token_step_sizes), `cell` pixels per token, colours scaled to [1, vmax].
[[nodiscard]] inline rgb8_image acceptance_heatmap(std::span<const index_t> per_token, index_t grid,
                                                   index_t cell, index_t vmax) {
  if (grid < 1 || cell < 4 || static_cast<index_t>(per_token.size()) < grid * grid)
    throw std::invalid_argument("acceptance_heatmap: bad grid, cell size or token count");
  vmax = std::max<index_t>(vmax, 2);
  const rgb8 white{255, 255, 255}, black{0, 0, 0};
  const index_t side = grid * cell;
  const index_t digit_scale = cell >= 24 ? 2 : 1;
  const index_t legend_gap = 8, bar_h = 16, label_h = 5 * 2 + 6;
  rgb8_image img(side, side + legend_gap + bar_h + 4 + label_h, white);

  // Cells, separated by 1-pixel white lines, each with its count.
  for (index_t t = 0; t < grid * grid; ++t) {
    const index_t v = per_token[static_cast<std::size_t>(t)];
    const index_t x0 = (t % grid) * cell, y0 = (t / grid) * cell;
    const rgb8 c = heat_colour(v, vmax);
    img.fill_rect(x0 + 1, y0 + 1, cell - 2, cell - 2, c);
    const index_t w = detail::number_width(v, digit_scale);
    if (w <= cell - 4)
      detail::draw_number(img, x0 + (cell - w) / 2, y0 + (cell - 5 * digit_scale) / 2, v,
                          digit_scale, detail::text_colour(c));
  }

  // Legend: one box per value 1..vmax, labelled below where the labels fit.
  const index_t bar_y = side + legend_gap;
  const index_t box_w = std::max<index_t>(1, side / vmax);
  const index_t label_w = detail::number_width(vmax, 2) + 4;
  const index_t every = std::max<index_t>(1, (label_w + box_w - 1) / box_w);
  for (index_t v = 1; v <= vmax; ++v) {
    const index_t x0 = (v - 1) * box_w;
    img.fill_rect(x0, bar_y, box_w, bar_h, heat_colour(v, vmax));
    if ((v - 1) % every == 0 || v == vmax) {
      const index_t w = detail::number_width(v, 2);
      const index_t lx = std::clamp<index_t>(x0 + (box_w - w) / 2, 0, side - w);
      if (v == vmax || (v - 1) * box_w + box_w / 2 + label_w <= (vmax - 1) * box_w)
        detail::draw_number(img, lx, bar_y + bar_h + 4, v, 2, black);
    }
  }
  return img;
}

}  // namespace specula_demo
