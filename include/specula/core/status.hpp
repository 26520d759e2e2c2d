#pragma once

/// @file
/// Status codes shared by host and device code paths.

#include "specula/core/config.hpp"
#include "specula/core/types.hpp"

namespace specula {

/// Why an input was rejected. Device code reports these; host wrappers turn them into
/// `specula::invalid_input` exceptions.
enum class status : int {
  ok = 0,
  empty_input,             ///< a required array, row or draft has no elements
  length_mismatch,         ///< extents of two arguments disagree
  nan_value,               ///< a NaN entry
  inf_value,               ///< an infinite entry where only finite values are allowed
  negative_value,          ///< a negative probability
  bad_row_sum,             ///< a probability row whose sum is off by more than the tolerance
  token_out_of_range,      ///< a token id outside [0, vocab) that is not padding
  zero_draft_probability,  ///< a drafted token whose proposal probability is 0
  bad_padding,             ///< a real token after padding, or padding where a token is required
  invalid_parameter,       ///< a scalar parameter outside its domain
  no_mass,                 ///< a row with no positive weight to sample from
  shared_stream,           ///< two requests of one call with the same (seed, request_id)
  overlapping_buffers,     ///< an output shares memory with an input it must not alias
};

/// Short human-readable description of a status code.
SPECULA_HOST_DEVICE constexpr const char* describe(status s) noexcept {
  switch (s) {
    case status::ok:
      return "ok";
    case status::empty_input:
      return "empty input";
    case status::length_mismatch:
      return "length mismatch";
    case status::nan_value:
      return "NaN entry";
    case status::inf_value:
      return "infinite entry";
    case status::negative_value:
      return "negative probability";
    case status::bad_row_sum:
      return "row does not sum to 1 within tolerance";
    case status::token_out_of_range:
      return "token id out of range";
    case status::zero_draft_probability:
      return "drafted token has zero proposal probability";
    case status::bad_padding:
      return "misplaced padding (-1)";
    case status::invalid_parameter:
      return "invalid parameter";
    case status::no_mass:
      return "row has no positive mass";
    case status::shared_stream:
      return "random stream shared with another request";
    case status::overlapping_buffers:
      return "overlapping buffers";
  }
  return "unknown status";
}

/// Where a check failed: status plus the offending row/column (-1 when not applicable) and the
/// offending value (row sum, entry or token id) for the message.
struct diagnostic {
  status code = status::ok;
  index_t row = -1;
  index_t column = -1;
  double value = 0.0;

  [[nodiscard]] SPECULA_HOST_DEVICE constexpr bool ok() const noexcept {
    return code == status::ok;
  }
  SPECULA_HOST_DEVICE constexpr explicit operator bool() const noexcept { return !ok(); }
};

}  // namespace specula
