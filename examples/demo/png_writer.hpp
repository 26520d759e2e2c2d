#pragma once

/// @file
/// 8-bit RGB images for specula_demo: a pixel buffer, nearest-neighbour upscaling and a PNG
/// writer (libpng's simplified write API).

#include <png.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "specula/core/types.hpp"

namespace specula_demo {

using specula::index_t;

/// One 8-bit RGB colour.
struct rgb8 {
  std::uint8_t r = 0, g = 0, b = 0;
};

/// An 8-bit RGB image, row-major, 3 bytes per pixel.
struct rgb8_image {
  index_t width = 0;
  index_t height = 0;
  std::vector<std::uint8_t> pixels;

  rgb8_image() = default;
  rgb8_image(index_t w, index_t h, rgb8 fill = {})
      : width(w), height(h), pixels(static_cast<std::size_t>(w * h * 3)) {
    fill_rect(0, 0, w, h, fill);
  }

  void set(index_t x, index_t y, rgb8 c) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    const auto i = static_cast<std::size_t>((y * width + x) * 3);
    pixels[i] = c.r;
    pixels[i + 1] = c.g;
    pixels[i + 2] = c.b;
  }
  [[nodiscard]] rgb8 at(index_t x, index_t y) const {
    const auto i = static_cast<std::size_t>((y * width + x) * 3);
    return {pixels[i], pixels[i + 1], pixels[i + 2]};
  }
  /// Fills [x, x + w) x [y, y + h), clipped to the image.
  void fill_rect(index_t x, index_t y, index_t w, index_t h, rgb8 c) {
    for (index_t yy = y; yy < y + h; ++yy)
      for (index_t xx = x; xx < x + w; ++xx) set(xx, yy, c);
  }
};

/// Each pixel becomes a factor x factor block (factor >= 1).
[[nodiscard]] inline rgb8_image upscale_nearest(const rgb8_image& in, index_t factor) {
  if (factor < 1) throw std::invalid_argument("upscale_nearest: factor must be >= 1");
  rgb8_image out(in.width * factor, in.height * factor);
  for (index_t y = 0; y < out.height; ++y)
    for (index_t x = 0; x < out.width; ++x) out.set(x, y, in.at(x / factor, y / factor));
  return out;
}

/// Writes `img` as an 8-bit RGB PNG; throws std::runtime_error naming the file on failure.
inline void write_png(const std::filesystem::path& path, const rgb8_image& img) {
  if (img.width <= 0 || img.height <= 0 ||
      img.pixels.size() != static_cast<std::size_t>(img.width * img.height * 3))
    throw std::runtime_error("write_png: " + path.string() + ": bad image size");
  png_image desc{};
  desc.version = PNG_IMAGE_VERSION;
  desc.opaque = nullptr;
  desc.width = static_cast<png_uint_32>(img.width);
  desc.height = static_cast<png_uint_32>(img.height);
  desc.format = PNG_FORMAT_RGB;
  const int ok = png_image_write_to_file(&desc, path.string().c_str(), 0, img.pixels.data(),
                                         static_cast<png_int_32>(img.width * 3), nullptr);
  const std::string message = desc.message;
  png_image_free(&desc);
  if (ok == 0) throw std::runtime_error("cannot write " + path.string() + ": " + message);
}

}  // namespace specula_demo
