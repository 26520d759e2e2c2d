#pragma once

/// @file
/// Token and index types.

#include <cstdint>

#include "specula/core/config.hpp"

namespace specula {

/// A token id. Valid ids are in [0, vocab_size); `no_token` (-1) marks padding and "no output".
using token_t = std::int32_t;

/// Sizes, offsets and strides (signed so that differences are well defined).
using index_t = std::int64_t;

/// Padding / "no token" marker. It is never used as an index into a row.
inline constexpr token_t no_token = -1;

}  // namespace specula
