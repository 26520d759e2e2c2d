#pragma once

/// @file
/// A safetensors reader: an 8-byte little-endian header length, a JSON header (parsed with
/// nlohmann-json) describing each tensor's dtype, shape and byte range, then the raw tensor
/// bytes. Every defect (truncated file, bad JSON, out-of-range offsets, a missing tensor, a
/// wrong dtype or shape) raises `load_error` with a message naming the file and the tensor.

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::example {

/// A model or data file could not be loaded; the message names the file and what is wrong.
class load_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Element types the reader understands (the safetensors spellings).
enum class dtype { f32, bf16, f16, i32, i64 };

[[nodiscard]] inline std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "F32";
    case dtype::bf16:
      return "BF16";
    case dtype::f16:
      return "F16";
    case dtype::i32:
      return "I32";
    case dtype::i64:
      return "I64";
  }
  return "?";
}

[[nodiscard]] inline std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::bf16:
    case dtype::f16:
      return 2;
    case dtype::i64:
      return 8;
  }
  return 0;
}

/// One tensor's entry in the header.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::size_t begin = 0;  ///< byte offset into the data section
  std::size_t end = 0;

  [[nodiscard]] std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (const auto d : shape) n *= d;
    return n;
  }
};

/// Formats a shape as "[a, b]".
[[nodiscard]] inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace detail {

[[nodiscard]] inline float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

[[nodiscard]] inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

[[nodiscard]] inline std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  if (s == "F32") return dtype::f32;
  if (s == "BF16") return dtype::bf16;
  if (s == "F16") return dtype::f16;
  if (s == "I32") return dtype::i32;
  if (s == "I64") return dtype::i64;
  return std::nullopt;
}

}  // namespace detail

/// A parsed safetensors file held in memory.
class safetensors_file {
 public:
  /// Reads and parses `path`.
  [[nodiscard]] static safetensors_file open(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw load_error(path.string() + ": cannot open file");
    in.seekg(0, std::ios::end);
    const auto size = static_cast<std::size_t>(in.tellg());
    in.seekg(0, std::ios::beg);
    std::vector<std::uint8_t> bytes(size);
    if (size > 0 &&
        !in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
      throw load_error(path.string() + ": read failed");
    return parse(std::move(bytes), path.string());
  }

  /// Parses a file image; `origin` names it in error messages.
  [[nodiscard]] static safetensors_file parse(std::vector<std::uint8_t> bytes, std::string origin) {
    safetensors_file f;
    f.origin_ = std::move(origin);
    f.bytes_ = std::move(bytes);
    f.parse_header();
    return f;
  }

  [[nodiscard]] const std::string& origin() const noexcept { return origin_; }
  [[nodiscard]] const std::map<std::string, tensor_info>& tensors() const noexcept {
    return tensors_;
  }
  [[nodiscard]] const tensor_info* find(std::string_view name) const {
    const auto it = tensors_.find(std::string(name));
    return it == tensors_.end() ? nullptr : &it->second;
  }
  /// The tensor called `name`; load_error "missing tensor" when there is none.
  [[nodiscard]] const tensor_info& at(std::string_view name) const {
    const tensor_info* t = find(name);
    if (t == nullptr) fail("missing tensor '" + std::string(name) + "'");
    return *t;
  }

  /// The `__metadata__` string for `key`, or nullopt.
  [[nodiscard]] std::optional<std::string> metadata(std::string_view key) const {
    const auto it = metadata_.find(std::string(key));
    if (it == metadata_.end()) return std::nullopt;
    return it->second;
  }
  /// The `__metadata__` string for `key`; load_error when absent.
  [[nodiscard]] std::string required_metadata(std::string_view key) const {
    auto v = metadata(key);
    if (!v) fail("missing metadata key '" + std::string(key) + "'");
    return *v;
  }

  /// The floating-point tensor `name` converted to fp32, after checking that its dtype is F32,
  /// BF16 or F16 and its shape is `shape`.
  [[nodiscard]] std::vector<float> read_f32(std::string_view name,
                                            const std::vector<std::int64_t>& shape) const {
    const tensor_info& t = checked(name, shape);
    const std::uint8_t* src = data(t);
    const auto n = static_cast<std::size_t>(t.numel());
    std::vector<float> out(n);
    switch (t.type) {
      case dtype::f32:
        std::memcpy(out.data(), src, n * 4);
        break;
      case dtype::bf16:
      case dtype::f16:
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t h = 0;
          std::memcpy(&h, src + 2 * i, 2);
          out[i] = t.type == dtype::bf16 ? detail::bf16_to_float(h) : detail::f16_to_float(h);
        }
        break;
      default:
        fail("tensor '" + t.name + "' has dtype " + std::string(to_string(t.type)) +
             "; expected F32, BF16 or F16");
    }
    return out;
  }

  /// The integer tensor `name` (I32 or I64) as int32, after checking its shape; an empty
  /// `shape` accepts any shape.
  [[nodiscard]] std::vector<std::int32_t> read_i32(
      std::string_view name, const std::vector<std::int64_t>& shape = {}) const {
    const tensor_info& t = shape.empty() ? at(name) : checked(name, shape);
    const std::uint8_t* src = data(t);
    const auto n = static_cast<std::size_t>(t.numel());
    std::vector<std::int32_t> out(n);
    if (t.type == dtype::i32) {
      std::memcpy(out.data(), src, n * 4);
    } else if (t.type == dtype::i64) {
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t v = 0;
        std::memcpy(&v, src + 8 * i, 8);
        out[i] = static_cast<std::int32_t>(v);
      }
    } else {
      fail("tensor '" + t.name + "' has dtype " + std::string(to_string(t.type)) +
           "; expected I32 or I64");
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& what) const { throw load_error(origin_ + ": " + what); }

 private:
  [[nodiscard]] const tensor_info& checked(std::string_view name,
                                           const std::vector<std::int64_t>& shape) const {
    const tensor_info& t = at(name);
    if (t.shape != shape)
      fail("tensor '" + t.name + "' has shape " + shape_string(t.shape) + "; expected " +
           shape_string(shape));
    return t;
  }

  [[nodiscard]] const std::uint8_t* data(const tensor_info& t) const noexcept {
    return bytes_.data() + data_begin_ + t.begin;
  }

  void parse_header() {
    if (bytes_.size() < 8)
      fail("truncated file: " + std::to_string(bytes_.size()) +
           " bytes, fewer than the 8-byte header length");
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i)
      header_len = (header_len << 8) | bytes_[static_cast<std::size_t>(i)];
    if (header_len > bytes_.size() - 8)
      fail("truncated file: header length " + std::to_string(header_len) + " exceeds the " +
           std::to_string(bytes_.size() - 8) + " bytes after it");
    data_begin_ = 8 + static_cast<std::size_t>(header_len);
    const std::size_t data_size = bytes_.size() - data_begin_;

    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes_.begin() + 8,
                                     bytes_.begin() + static_cast<std::ptrdiff_t>(data_begin_));
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("bad JSON header: ") + e.what());
    }
    if (!header.is_object()) fail("bad JSON header: not an object");

    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object()) fail("bad JSON header: __metadata__ is not an object");
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string()) fail("bad JSON header: __metadata__['" + mk + "'] is not a string");
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      tensors_[key] = parse_entry(key, value, data_size);
    }
  }

  [[nodiscard]] tensor_info parse_entry(const std::string& name, const nlohmann::json& v,
                                        std::size_t data_size) const {
    const auto bad = [&](const std::string& why) {
      fail("bad JSON header: tensor '" + name + "': " + why);
    };
    if (!v.is_object()) bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("no string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("no array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      bad("no 'data_offsets' pair");
    tensor_info t;
    t.name = name;
    const auto type = detail::parse_dtype(v["dtype"].get<std::string>());
    if (!type) bad("unsupported dtype " + v["dtype"].get<std::string>());
    t.type = *type;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) bad("shape has a bad dimension");
      t.shape.push_back(d.get<std::int64_t>());
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) bad("data_offsets are not non-negative integers");
    t.begin = v["data_offsets"][0].get<std::size_t>();
    t.end = v["data_offsets"][1].get<std::size_t>();
    if (t.end < t.begin || t.end > data_size)
      fail("truncated file: tensor '" + name + "' needs bytes [" + std::to_string(t.begin) + ", " +
           std::to_string(t.end) + ") of a " + std::to_string(data_size) + "-byte data section");
    if (static_cast<std::size_t>(t.numel()) * size_of(t.type) != t.end - t.begin)
      bad("shape " + shape_string(t.shape) + " of " + std::string(to_string(t.type)) +
          " does not match its " + std::to_string(t.end - t.begin) + " bytes");
    return t;
  }

  std::string origin_;
  std::vector<std::uint8_t> bytes_;
  std::size_t data_begin_ = 0;
  std::map<std::string, tensor_info> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A tensor to write: fp32 values stored as F32 or BF16 (round to nearest even), or int32 values
/// stored as I32.
struct tensor_to_write {
  std::string name;
  std::vector<std::int64_t> shape;
  dtype type = dtype::f32;
  std::vector<float> values;       ///< F32 / BF16
  std::vector<std::int32_t> ints;  ///< I32
};

namespace detail {

[[nodiscard]] inline std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

}  // namespace detail

/// Serialises tensors and string metadata to a safetensors file image.
[[nodiscard]] inline std::vector<std::uint8_t> serialize_safetensors(
    const std::vector<tensor_to_write>& tensors,
    const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::uint8_t> data;
  for (const tensor_to_write& t : tensors) {
    const std::size_t begin = data.size();
    std::int64_t n = 1;
    for (const auto d : t.shape) n *= d;
    const auto count = static_cast<std::size_t>(n);
    switch (t.type) {
      case dtype::f32:
        if (t.values.size() != count) throw load_error(t.name + ": values do not match shape");
        data.resize(begin + 4 * count);
        std::memcpy(data.data() + begin, t.values.data(), 4 * count);
        break;
      case dtype::bf16:
        if (t.values.size() != count) throw load_error(t.name + ": values do not match shape");
        data.resize(begin + 2 * count);
        for (std::size_t i = 0; i < count; ++i) {
          const std::uint16_t h = detail::float_to_bf16(t.values[i]);
          std::memcpy(data.data() + begin + 2 * i, &h, 2);
        }
        break;
      case dtype::i32:
        if (t.ints.size() != count) throw load_error(t.name + ": ints do not match shape");
        data.resize(begin + 4 * count);
        std::memcpy(data.data() + begin, t.ints.data(), 4 * count);
        break;
      default:
        throw load_error(t.name + ": the writer supports F32, BF16 and I32");
    }
    header[t.name] = {{"dtype", std::string(to_string(t.type))},
                      {"shape", t.shape},
                      {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::vector<std::uint8_t> out(8 + h.size() + data.size());
  const std::uint64_t len = h.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(len >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + h.size(), data.data(), data.size());
  return out;
}

/// Writes a safetensors file.
inline void save_safetensors(const std::filesystem::path& path,
                             const std::vector<tensor_to_write>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  const auto bytes = serialize_safetensors(tensors, metadata);
  std::ofstream out(path, std::ios::binary);
  if (!out || !out.write(reinterpret_cast<const char*>(bytes.data()),
                         static_cast<std::streamsize>(bytes.size())))
    throw load_error(path.string() + ": cannot write file");
}

}  // namespace specula::example
