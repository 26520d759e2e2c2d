#pragma once
// Shared helper of the bad-input tests: a call must throw invalid_input naming the argument,
// row and column, with all three and the status in its message.

#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "specula/core/error.hpp"
#include "specula/core/status.hpp"
#include "specula/core/types.hpp"

namespace specula::test {

struct expected_error {
  status code;
  std::string argument;
  index_t row;
  index_t column;
};

inline void require_error(const std::function<void()>& call, const expected_error& e) {
  try {
    call();
    FAIL("no exception; expected " << e.argument << ": " << describe(e.code));
  } catch (const invalid_input& err) {
    INFO(err.what());
    CHECK(err.code() == e.code);
    CHECK(err.argument() == e.argument);
    CHECK(err.row() == e.row);
    CHECK(err.column() == e.column);
    const std::string msg = err.what();
    CHECK(msg.find(e.argument) != std::string::npos);
    CHECK(msg.find(describe(e.code)) != std::string::npos);
    if (e.row >= 0) CHECK(msg.find("[row " + std::to_string(e.row) + "]") != std::string::npos);
    if (e.column >= 0)
      CHECK(msg.find("[column " + std::to_string(e.column) + "]") != std::string::npos);
  }
}

}  // namespace specula::test
