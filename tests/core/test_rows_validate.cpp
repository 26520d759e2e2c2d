// Row and batch views; validation scans and the errors they raise.

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <vector>

#include "specula/core/row.hpp"
#include "specula/core/validate.hpp"

using namespace specula;

TEST_CASE("row_view and batch_view address rows by stride", "[core]") {
  std::vector<float> data(12);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  const batch_view<float> b(data.data(), 3, 3, 4);  // 3 rows of 3, stride 4
  CHECK(b.row(1)[0] == 4.0f);
  CHECK(b.row(2)[2] == 10.0f);
  CHECK(b[2].size == 3);
  const batch_view<const float> cb = b;  // const conversion
  CHECK(cb.row(1)[1] == 5.0f);
  row_view<const float> r = data;  // from a container
  CHECK(r.size == 12);
  CHECK(r.subview(3, 2)[1] == 4.0f);
  const row_view<float> m(data.data(), 4);
  const row_view<const float> c = m;
  CHECK(c.end() - c.begin() == 4);
  CHECK(row_view<const float>{}.empty());
}

TEST_CASE("probability row checks", "[core][bad_input]") {
  std::vector<double> ok = {0.2, 0.3, 0.5};
  CHECK(check_probability_row<double>(ok, 1e-9).ok());

  auto bad = ok;
  bad[1] = std::numeric_limits<double>::quiet_NaN();
  auto d = check_probability_row<double>(bad, 1e-9, 4);
  CHECK(d.code == status::nan_value);
  CHECK(d.row == 4);
  CHECK(d.column == 1);

  bad = ok;
  bad[2] = -std::numeric_limits<double>::infinity();
  CHECK(check_probability_row<double>(bad, 1e-9).code == status::inf_value);

  bad = ok;
  bad[0] = -0.2;
  bad[1] = 0.7;
  d = check_probability_row<double>(bad, 1e-9);
  CHECK(d.code == status::negative_value);
  CHECK(d.column == 0);

  bad = {0.2, 0.3, 0.4};
  d = check_probability_row<double>(bad, 1e-3);
  CHECK(d.code == status::bad_row_sum);
  CHECK(d.value == Approx(0.9));
  CHECK(check_probability_row<double>(bad, 0.2).ok());

  CHECK(check_probability_row<double>(row_view<const double>{}, 1e-3).code == status::empty_input);
}

TEST_CASE("logit row checks", "[core][bad_input]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> ok = {1.0f, -inf, 2.0f};
  CHECK(check_logit_row<float>(ok).ok());
  std::vector<float> pos_inf = {1.0f, inf};
  CHECK(check_logit_row<float>(pos_inf).code == status::inf_value);
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  CHECK(check_logit_row<float>(nan).code == status::nan_value);
  std::vector<float> all_masked = {-inf, -inf};
  CHECK(check_logit_row<float>(all_masked).code == status::no_mass);
}

TEST_CASE("token checks treat -1 as padding only when allowed", "[core][bad_input]") {
  CHECK(check_token(3, 4, 0, false).ok());
  CHECK(check_token(4, 4, 0, false).code == status::token_out_of_range);
  CHECK(check_token(no_token, 4, 0, true).ok());
  CHECK(check_token(no_token, 4, 0, false).code == status::token_out_of_range);
  CHECK(check_token(-2, 4, 0, true).code == status::token_out_of_range);
}

TEST_CASE("validate_* throws invalid_input naming argument, row and column", "[core][bad_input]") {
  std::vector<float> rows = {0.5f, 0.25f, 0.25f, 0.25f, -0.5f, 1.25f};
  const batch_view<const float> b(rows.data(), 2, 3);
  try {
    validate_probability_rows(b, "target_probs");
    FAIL("expected invalid_input");
  } catch (const invalid_input& e) {
    CHECK(e.code() == status::negative_value);
    CHECK(e.argument() == "target_probs");
    CHECK(e.row() == 1);
    CHECK(e.column() == 1);
    CHECK(std::string(e.what()) ==
          "specula: target_probs[row 1][column 1]: negative probability (value -0.5)");
  }
  CHECK_THROWS_AS(validate_extent(3, 4, "draft_tokens", "length"), invalid_input);
  CHECK_THROWS_WITH(validate_extent(3, 4, "draft_tokens", "length"),
                    Catch::Contains("draft_tokens") && Catch::Contains("expected 4"));
  std::vector<float> logits = {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  CHECK_THROWS_WITH(validate_logit_rows(batch_view<const float>(logits.data(), 1, 2), "logits"),
                    Catch::Contains("logits[row 0][column 0]: NaN entry"));
  CHECK_THROWS_AS(require_parameter(false, "temperature", -1.0, "must be > 0"), invalid_input);
}
