#pragma once

/// @file
/// The exception thrown by checked host entry points.

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "specula/core/status.hpp"

namespace specula {

/// Bad input detected by a checked entry point. The message names the argument and, where there
/// is one, the row and column, e.g.
/// `specula: draft_probs[row 3][column 17]: negative probability (value -0.25)`.
class invalid_input : public std::invalid_argument {
 public:
  invalid_input(status code, std::string argument, index_t row, index_t column,
                const std::string& message)
      : std::invalid_argument(message),
        code_(code),
        argument_(std::move(argument)),
        row_(row),
        column_(column) {}

  [[nodiscard]] status code() const noexcept { return code_; }
  [[nodiscard]] const std::string& argument() const noexcept { return argument_; }
  /// Row (or request / element) index of the offending entry; -1 when not applicable.
  [[nodiscard]] index_t row() const noexcept { return row_; }
  /// Column (token) index of the offending entry; -1 when not applicable.
  [[nodiscard]] index_t column() const noexcept { return column_; }

 private:
  status code_;
  std::string argument_;
  index_t row_;
  index_t column_;
};

namespace detail {

inline std::string format_diagnostic(const char* argument, const diagnostic& d,
                                     const char* detail_text) {
  std::ostringstream os;
  os.precision(17);
  os << "specula: " << argument;
  if (d.row >= 0) os << "[row " << d.row << "]";
  if (d.column >= 0) os << "[column " << d.column << "]";
  os << ": " << describe(d.code);
  switch (d.code) {
    case status::nan_value:
    case status::empty_input:
    case status::shared_stream:
    case status::overlapping_buffers:
      break;
    default:
      os << " (value " << d.value << ")";
  }
  if (detail_text != nullptr && detail_text[0] != '\0') os << "; " << detail_text;
  return os.str();
}

}  // namespace detail

/// Throws `invalid_input` for a failed diagnostic; does nothing for `status::ok`.
inline void throw_if_failed(const diagnostic& d, const char* argument,
                            const char* detail_text = "") {
  if (d.ok()) return;
  throw invalid_input(d.code, argument, d.row, d.column,
                      detail::format_diagnostic(argument, d, detail_text));
}

/// Throws `invalid_input` with `status::invalid_parameter` unless `condition` holds.
inline void require_parameter(bool condition, const char* argument, double value,
                              const char* requirement) {
  if (condition) return;
  throw_if_failed(diagnostic{status::invalid_parameter, -1, -1, value}, argument, requirement);
}

}  // namespace specula
